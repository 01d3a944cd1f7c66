"""Creation and random factories against torch 2.13: each is a node of a compiled or graph-traced
program (not a constant baked in, not an error), and takes torch's argument forms (0-d tensor
endpoints and bounds, ``layout=``, ``size=``, ``randint(high, size)``, ``requires_grad``...)."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world


def _t(x):
    return x.to_torch() if isinstance(x, flow.Tensor) else x


# name -> fn(lib, x): a factory called inside a forward (x: its (2, 3) input, read by some)
DETERMINISTIC = {
    "eye": lambda L, x: L.eye(3, 2),
    "eye_square": lambda L, x: L.eye(2, dtype=L.float64),
    "linspace": lambda L, x: L.linspace(0, 1, 5),
    "linspace_tensor_ends": lambda L, x: L.linspace(x[0, 0], x[0, 1], 4),
    "logspace": lambda L, x: L.logspace(0, 1, 3, 2.0),
    "logspace_tensor_ends": lambda L, x: L.logspace(x[1, 0], x[1, 1], 3, base=2.0, dtype=L.float64),
    "zeros": lambda L, x: L.zeros(2, 3),
    "ones_size_kw": lambda L, x: L.ones(size=(2,)),
    "full": lambda L, x: L.full((2,), 3),
    "arange": lambda L, x: L.arange(1, 7, 2),
    "tensor": lambda L, x: L.tensor([1.0, 2.0]),
    "as_tensor": lambda L, x: L.as_tensor([1, 2]),
    "asarray": lambda L, x: L.asarray([1.0, 2.0], dtype=L.float64),
    "scalar_tensor": lambda L, x: L.scalar_tensor(2, dtype=L.int32),
    "tril_indices": lambda L, x: L.tril_indices(3, 4, 1),
    "triu_indices": lambda L, x: L.triu_indices(3, 3, -1, dtype=L.int32),
    "hann_window": lambda L, x: L.hann_window(5),
    "kaiser_window": lambda L, x: L.kaiser_window(6, periodic=False, beta=10.0, dtype=L.float64),
    "range": lambda L, x: L.range(0, 3),
    "full_like": lambda L, x: L.full_like(x, 2, dtype=L.int32),
    "zeros_like": lambda L, x: L.zeros_like(x),
    # tensor() of values computed in the function: torch reads each one-element tensor's value in
    # its own dtype (a float64 element gives float64, int32 and an int give int64)
    "tensor_of_elements": lambda L, x: L.tensor([x.sum(), 2.0, x[0, 0]]),
    "tensor_of_elements_nested": lambda L, x: L.tensor([[x.sum().double(), 1], [x.mean(), 2]]),
    "tensor_of_elements_int": lambda L, x: L.tensor([(x > 0).sum().int(), 2]),
}
INDUCTOR = ("eye", "linspace_tensor_ends")   # (the rest compile with backend="eager": the same trace, faster;
# Inductor draws random numbers its own way, as torch.compile does)
RANDOM = {
    "rand": lambda L, x: L.rand(3),
    "randn": lambda L, x: L.randn(2, 2),
    "randint": lambda L, x: L.randint(0, 9, (3,)),
    "randperm": lambda L, x: L.randperm(4),
    "normal": lambda L, x: L.normal(0.0, 2.0, (3,)),
    "normal_tensor_mean": lambda L, x: L.normal(x, 1.0),
    "randn_like": lambda L, x: L.randn_like(x),
}


def _module(fn):
    class M(flow.nn.Module):
        def forward(self, x):
            return fn(flow, x)
    return M()


def _graph(fn):
    class G(flow.nn.Graph):
        def build(self, x):
            return fn(flow, x)
    return G()


def _seeded(fn, *args):
    flow.manual_seed(0)
    return fn(*args)


@pytest.mark.parametrize("name", sorted(DETERMINISTIC) + sorted(RANDOM))
def test_factory_inside_compile_and_graph_is_a_node_with_eager_and_torch_values(name):
    fn = {**DETERMINISTIC, **RANDOM}[name]
    backend = "inductor" if name in INDUCTOR else "eager"
    compiled = flow.compile(_module(fn), fullgraph=True, backend=backend)   # (fullgraph: raises if not traced)
    g = _graph(fn)
    for x in (flow.randn(2, 3), flow.randn(2, 3)):   # new endpoints each call: read, not baked in
        eager = _seeded(fn, flow, x)
        torch.manual_seed(0)
        want = fn(torch, x.to_torch())
        for got in (_seeded(compiled, x), _seeded(g, x)):
            assert got.dtype == eager.dtype and not got.requires_grad
            torch.testing.assert_close(_t(got), want)   # (Inductor may round otherwise)
        torch.testing.assert_close(_t(eager), want, rtol=0, atol=0)
    ir = next(iter(g._compiled.values())).ir
    assert len(ir.state) == 0 and ir.nodes   # no constant: the creation is a node


def test_empty_strided_in_a_graph_is_a_node_with_torch_strides():
    def fn(L, x):
        return L.empty_strided((2, 3), (1, 2), dtype=L.float64)
    got = _graph(fn)(flow.randn(2, 3))
    assert got.shape == (2, 3) and got.dtype == flow.float64
    assert _t(got).stride() == torch.empty_strided((2, 3), (1, 2)).stride()
    compiled = flow.compile(_module(fn), fullgraph=True)
    assert compiled(flow.randn(2, 3)).shape == (2, 3)


# -- linspace / logspace --------------------------------------------------------------------------

@pytest.mark.parametrize("fn", ["linspace", "logspace"])
def test_zero_dim_tensor_endpoints_as_torch(fn):
    for s, e, kw in [(0.0, 1.0, {}), (-2, 3, {"dtype": "float64"}), (1.5, -1.0, {"dtype": "int64"})]:
        want = getattr(torch, fn)(torch.tensor(s), torch.tensor(e), 5, **{k: getattr(torch, v) for k, v in kw.items()})
        got = getattr(flow, fn)(flow.tensor(s), flow.tensor(e), 5, **{k: getattr(flow, v) for k, v in kw.items()})
        assert got.dtype == flow.from_torch(want).dtype
        torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match=f"holoflow.{fn}.*0-dimensional"):
        getattr(flow, fn)(flow.tensor([0.0]), 1.0, 3)


def test_logspace_takes_linspaces_keywords():
    want = torch.logspace(0, 2, 4, base=3, dtype=torch.float64, requires_grad=True)
    got = flow.logspace(0, 2, 4, base=3, dtype=flow.float64, device="cpu", requires_grad=True)
    assert got.requires_grad and got.is_leaf and got.dtype == flow.float64
    torch.testing.assert_close(got.detach().to_torch(), want.detach(), rtol=0, atol=0)
    got.sum().backward()
    assert got.grad.tolist() == [1.0] * 4


def test_global_logspace_eye_and_linspace():
    def run(rank):
        place = flow.placement("cpu", [0, 1])
        lg = flow.logspace(0, 3, 4, 2.0, placement=place, sbp=S(0))
        ey = flow.eye(4, placement=place, sbp=S(1))
        ls = flow.linspace(flow.tensor(0.0), flow.tensor(1.0), 4, placement=place, sbp=B)
        return (lg.sbp, lg.to_local().tolist(), ey.sbp, ey.to_local().to_torch(), ls.to_local().tolist())
    for rank, (lsbp, lg, esbp, ey, ls) in enumerate(world.simulate(2, run)):
        assert lsbp == (S(0),) and lg == [[1.0, 2.0], [4.0, 8.0]][rank]
        assert esbp == (S(1),) and torch.equal(ey, torch.eye(4)[:, 2 * rank:2 * rank + 2])
        assert ls == torch.linspace(0, 1, 4).tolist()


# -- layout= / pin_memory= / out= -------------------------------------------------------------------

FACTORIES = {
    "zeros": lambda L, **k: L.zeros(2, **k), "ones": lambda L, **k: L.ones(2, **k),
    "empty": lambda L, **k: L.empty(2, **k).zero_(), "full": lambda L, **k: L.full((2,), 1.0, **k),
    "arange": lambda L, **k: L.arange(3, **k), "linspace": lambda L, **k: L.linspace(0, 1, 3, **k),
    "logspace": lambda L, **k: L.logspace(0, 1, 3, **k), "eye": lambda L, **k: L.eye(2, **k),
    "rand": lambda L, **k: L.rand(2, **k), "randn": lambda L, **k: L.randn(2, **k),
    "randint": lambda L, **k: L.randint(0, 5, (3,), **k), "randperm": lambda L, **k: L.randperm(4, **k),
    "normal": lambda L, **k: L.normal(0.0, 1.0, (3,), **k), "scalar_tensor": lambda L, **k: L.scalar_tensor(1, **k),
    "empty_strided": lambda L, **k: L.empty_strided((2,), (1,), **k).zero_(),
    "tril_indices": lambda L, **k: L.tril_indices(2, 2, **{a: b for a, b in k.items() if a != "pin_memory"}),
    "hann_window": lambda L, **k: L.hann_window(4, **k),
    "zeros_like": lambda L, **k: L.zeros_like(L.ones(2), **k), "rand_like": lambda L, **k: L.rand_like(L.ones(2), **k),
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_strided_layout_and_unpinned_memory_accepted_as_torch(name):
    fn = FACTORIES[name]
    torch.manual_seed(0)
    want = fn(torch, layout=torch.strided, pin_memory=False)
    flow.manual_seed(0)
    got = fn(flow, layout=flow.strided, pin_memory=False)
    torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_other_layouts_raise_naming_the_op_and_strided(name):
    with pytest.raises(NotImplementedError, match=f"holoflow.{name}: layout=torch.sparse_coo .*strided"):
        FACTORIES[name](flow, layout=torch.sparse_coo)


@pytest.mark.parametrize("dtype", ["float32", "float64", "int32"])
@pytest.mark.parametrize("name", ["zeros", "full", "arange", "rand", "normal", "eye", "randint", "linspace"])
def test_out_takes_the_new_tensor_as_torch(name, dtype):
    """``torch.arange(5, out=x)``: made in out's dtype, written into x (resized), x returned
    (holoflow refused out= here)."""
    results = []
    for lib in (torch, flow):
        out = lib.empty(3, dtype=getattr(lib, dtype))
        lib.manual_seed(0)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")   # (torch's resize warning: tested in tests/lib/test_out_arg.py)
                returned = FACTORIES[name](lib, out=out)
            results.append((returned is out, str(out.dtype).split(".")[-1], out.tolist()))
        except Exception as e:  # noqa: BLE001 - the class is compared
            results.append(type(e))
    assert results[1] == results[0]


# -- argument forms torch accepts ---------------------------------------------------------------------

ARGUMENT_FORMS = {
    "arange_tensor_end": lambda L: L.arange(L.tensor(5)),
    "arange_tensor_bounds": lambda L: L.arange(L.tensor(1), L.tensor(7.0), L.tensor(2)),
    "full_like_tensor_value": lambda L: L.full_like(L.ones(2), L.tensor(7.0)),
    "randint_like_tensor_bound": lambda L: L.randint_like(L.ones(4), L.tensor(9)),
    "randint_high_size": lambda L: L.randint(10, (4,)),
    "randint_tensor_bounds": lambda L: L.randint(L.tensor(3), L.tensor(10), (4,)),
    "randint_requires_grad": lambda L: L.randint(0, 10, (4,), dtype=L.float32, requires_grad=True),
    "randperm_requires_grad": lambda L: L.randperm(5, dtype=L.float64, requires_grad=True),
    "randperm_tensor_n": lambda L: L.randperm(L.tensor(5)),
    "randn_size_kw": lambda L: L.randn(size=(2, 2)),
    "zeros_size_kw": lambda L: L.zeros(size=(2,), dtype=L.int32),
    "rand_like_generator": lambda L: L.rand_like(L.ones(3), generator=L.Generator().manual_seed(3)),
    "range_tensor_bounds": lambda L: L.range(L.tensor(0), L.tensor(3)),
    "zeros_like_channels_last": lambda L: L.zeros_like(L.ones(1, 2, 2, 3), memory_format=L.channels_last),
    "empty_like_channels_last": lambda L: L.empty_like(L.ones(1, 2, 2, 3), memory_format=L.channels_last).zero_(),
    "scalar_tensor_of_tensor": lambda L: L.scalar_tensor(L.tensor(2.5)),
    "normal_requires_grad": lambda L: L.normal(0.0, 1.0, (2,), requires_grad=True),
}


@pytest.mark.parametrize("name", sorted(ARGUMENT_FORMS))
def test_argument_forms_as_torch(name):
    fn = ARGUMENT_FORMS[name]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # (torch.range's deprecation)
        torch.manual_seed(0)
        want = fn(torch)
        flow.manual_seed(0)
        got = fn(flow)
    assert got.dtype == flow.from_torch(want.detach()).dtype and got.requires_grad == want.requires_grad
    assert _t(got).stride() == want.stride()
    torch.testing.assert_close(got.detach().to_torch(), want.detach(), rtol=0, atol=0)


@pytest.mark.parametrize("mean_t,std_t", [(True, False), (False, True), (True, True)])
def test_normal_of_tensors_is_differentiable_with_torchs_zero_gradient(mean_t, std_t):
    def run(L):
        L.manual_seed(0)
        m = L.tensor([0.0, 1.0, 2.0], requires_grad=True) if mean_t else 0.5
        s = L.tensor([1.0, 2.0, 3.0], requires_grad=True) if std_t else 2.0
        y = L.normal(m, s)
        (y * y).sum().backward()
        return y, [t.grad for t in (m, s) if isinstance(t, (torch.Tensor, flow.Tensor))]
    (want, wgrads), (got, ggrads) = run(torch), run(flow)
    assert got.requires_grad and want.requires_grad
    torch.testing.assert_close(got.detach().to_torch(), want.detach(), rtol=0, atol=0)
    for g, w in zip(ggrads, wgrads, strict=True):
        torch.testing.assert_close(g.to_torch(), w, rtol=0, atol=0)


# -- recurrent layers under CPU autocast ------------------------------------------------------------

RNNS = [("LSTM", {}), ("LSTM", {"bidirectional": True, "num_layers": 2}), ("LSTM", {"proj_size": 3, "num_layers": 2}),
        ("GRU", {}), ("GRU", {"bidirectional": True, "num_layers": 2}), ("RNN", {"num_layers": 2}),
        ("RNN", {"nonlinearity": "relu", "bidirectional": True})]


def _rnn_pair(name, kw):
    torch.manual_seed(0)
    ref = getattr(torch.nn, name)(4, 5, **kw)
    mod = getattr(flow.nn, name)(4, 5, **kw)
    mod.load_state_dict({k: flow.from_torch(v.detach().clone()) for k, v in ref.state_dict().items()})
    return mod, ref


def _flat(out):
    return [t for o in out for t in (_flat(o) if isinstance(o, tuple) else [o])]


@pytest.mark.parametrize("name,kw", RNNS + [("GRU", {"bidirectional": True, "computed_input": True}),
                                            ("LSTM", {"bidirectional": True, "computed_input": True})])
def test_rnn_under_cpu_bf16_autocast_has_torchs_dtypes_values_and_gradients(name, kw):
    """torch's CPU autocast: oneDNN's LSTM runs in bf16; GRU's state math in float32 (a float32
    output); an LSTM with projections keeps a float32 cell state. (An input that is no leaf is
    cast per direction, a leaf once: the gradients' rounding differs.)"""
    kw = dict(kw)
    computed = kw.pop("computed_input", False)
    mod, ref = _rnn_pair(name, kw)
    x = torch.randn(3, 2, 4, requires_grad=True)
    fx = flow.from_torch(x.detach().clone()).requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)   # (torch: LSTM projections not with oneDNN)
        want = _flat(ref(x * 3 if computed else x))
    with flow.autocast("cpu", dtype=flow.bfloat16):
        got = _flat(mod(fx * 3 if computed else fx))
    for g, w in zip(got, want, strict=True):
        assert g.dtype == flow.from_torch(w.detach()).dtype
        torch.testing.assert_close(g.detach().to_torch(), w.detach(), rtol=0, atol=0)
    sum((w.float() * (i + 1)).sum() for i, w in enumerate(want)).backward()
    sum((g.float() * (i + 1)).sum() for i, g in enumerate(got)).backward()
    assert fx.grad.dtype == flow.float32
    torch.testing.assert_close(fx.grad.to_torch(), x.grad, rtol=0, atol=0)
    for p, q in zip(mod.parameters(), ref.parameters(), strict=True):
        torch.testing.assert_close(p.grad.to_torch(), q.grad, rtol=0, atol=0)


@pytest.mark.parametrize("name,kw", [("LSTM", {"num_layers": 2}), ("GRU", {}), ("LSTM", {"proj_size": 3})])
def test_rnn_autocast_in_graphs_and_compile_as_eager_torch(name, kw):
    mod, ref = _rnn_pair(name, kw)
    x = torch.randn(3, 2, 4)
    with torch.autocast("cpu", dtype=torch.bfloat16), warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        want = ref(x)[0]

    class Traced(flow.nn.Graph):
        def __init__(self, amp=False):
            super().__init__()
            self.m = mod
            if amp:
                self.config.enable_amp(True, dtype=flow.bfloat16)

        def build(self, x):
            return self.m(x)[0]
    with flow.autocast("cpu", dtype=flow.bfloat16):
        outs = [Traced()(flow.from_torch(x)), flow.compile(mod, fullgraph=True, backend="eager")(flow.from_torch(x))[0]]
    outs.append(Traced(amp=True)(flow.from_torch(x)))   # (the graph's AMP rewrite)
    for got in outs:
        assert got.dtype == flow.from_torch(want.detach()).dtype
        torch.testing.assert_close(got.to_torch(), want.detach(), rtol=0, atol=0)


def test_rnn_dtype_mismatch_outside_autocast_still_raises():
    mod, _ = _rnn_pair("LSTM", {})
    with pytest.raises(TypeError, match="holoflow.nn.LSTM: input must have the type"):
        mod(flow.randn(3, 2, 4, dtype=flow.float64))


def test_as_tensor_of_a_tensor_converts_it_differentiably_as_torch():
    t = torch.tensor([1.0, 2.0], requires_grad=True)
    f = flow.tensor([1.0, 2.0], requires_grad=True)
    want, got = torch.as_tensor(t, dtype=torch.float64), flow.as_tensor(f, dtype=flow.float64)
    assert got.dtype == flow.float64 and got.requires_grad and want.requires_grad
    (want * want).sum().backward()
    (got * got).sum().backward()
    torch.testing.assert_close(f.grad.to_torch(), t.grad, rtol=0, atol=0)
    assert flow.as_tensor(f) is f


NEW_METHODS = {
    "new_zeros": lambda x, **k: x.new_zeros(2, 3, **k), "new_ones_size_kw": lambda x, **k: x.new_ones(size=(2,), **k),
    "new_empty": lambda x, **k: x.new_empty((2,), **k).zero_(), "new_full": lambda x, **k: x.new_full((2,), 3.0, **k),
    "empty_permuted": lambda x, **k: (flow if isinstance(x, flow.Tensor) else torch).empty_permuted(
        (2, 3), (1, 0), **k).zero_(),
}


@pytest.mark.parametrize("name", sorted(NEW_METHODS))
def test_new_methods_and_empty_permuted_take_layout_and_pin_memory(name):
    fn = NEW_METHODS[name]
    want = fn(torch.ones(2, dtype=torch.float64), layout=torch.strided, pin_memory=False)
    got = fn(flow.ones(2, dtype=flow.float64), layout=flow.strided, pin_memory=False)
    assert got.dtype == flow.from_torch(want).dtype and _t(got).stride() == want.stride()
    torch.testing.assert_close(got.to_torch(), want, rtol=0, atol=0)
    with pytest.raises(NotImplementedError, match="layout=torch.sparse_coo is not supported"):
        fn(flow.ones(2), layout=torch.sparse_coo)


BAD_TYPES = {
    "linspace": lambda L: L.linspace("a", 1, 3), "full": lambda L: L.full((2,), "a"),
    "scalar_tensor": lambda L: L.scalar_tensor("x"), "full_like": lambda L: L.full_like(L.ones(2), "a"),
    "arange": lambda L: L.arange("a"), "eye": lambda L: L.eye(2, "b"),
}


@pytest.mark.parametrize("name", sorted(BAD_TYPES))
def test_bad_argument_types_raise_torchs_type_error_naming_the_op(name):
    with pytest.raises(TypeError):
        BAD_TYPES[name](torch)
    with pytest.raises(TypeError, match=f"holoflow.{name}"):
        BAD_TYPES[name](flow)


@pytest.mark.parametrize("kw", [{"size": (2,)}, {"dtype": "float64"}, {"requires_grad": True}, {"device": "cpu"}])
def test_normal_of_a_tensor_refuses_what_torch_refuses(kw):
    with pytest.raises(TypeError):
        torch.normal(torch.zeros(2), 1.0, **{k: getattr(torch, v) if k == "dtype" else v for k, v in kw.items()})
    with pytest.raises(TypeError, match="holoflow.normal: with a tensor mean or std"):
        flow.normal(flow.zeros(2), 1.0, **{k: getattr(flow, v) if k == "dtype" else v for k, v in kw.items()})


def test_tensor_of_elements_refuses_a_many_element_one_as_torch():
    """torch.tensor([t]) reads t as a number: a t of several elements is a ValueError, eagerly and
    inside a trace (holoflow built a larger tensor from its values before)."""
    with pytest.raises(ValueError, match="only one element tensors"):
        torch.tensor([torch.ones(2)])
    with pytest.raises(ValueError, match="only one element tensors"):
        flow.tensor([flow.ones(2)])
    with pytest.raises(ValueError, match="only one element tensors"):
        _graph(lambda L, x: L.tensor([x.sum(), x[0]]))(flow.randn(2, 3))


def test_tensor_of_global_elements_in_a_global_graph_as_eager():
    """tensor([x.sum(), 2.0], placement=, sbp=) of a global x: the graph's result equals eager's
    on every rank (each rank its shard of the whole values); without placement eager reads the
    global value into a local tensor, which a global graph's one program cannot: a clear error
    naming placement= (before: a 'mixes a local tensor' error from inside stack)."""
    import numpy as np

    def run(rank):
        P = flow.placement("cpu", ranks=[0, 1])
        x = flow.tensor(np.arange(8.0).reshape(4, 2)).to_global(placement=P, sbp=[B]).to_global(sbp=[S(0)])
        made = _graph(lambda L, x: L.tensor([x.sum(), 2.0], placement=P, sbp=[S(0)]))(x)
        eager = flow.tensor([x.sum(), 2.0], placement=P, sbp=[S(0)])
        assert made.sbp == eager.sbp == (S(0),)
        with pytest.raises(NotImplementedError, match="pass placement= and sbp="):   # (the build error's class)
            _graph(lambda L, x: L.tensor([x.sum(), 2.0]))(x)
        return made.to_local().numpy().tolist(), eager.to_local().numpy().tolist()
    got = world.simulate(2, run)
    assert got == [([28.0], [28.0]), ([2.0], [2.0])]

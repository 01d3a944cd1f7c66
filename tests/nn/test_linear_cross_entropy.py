"""F.linear_cross_entropy / nn.LinearCrossEntropyLoss / nn.LinearCrossEntropyOptions against
torch 2.13's: the reference path (every cross_entropy feature, K-dimensional losses) and the
chunked path (values, gradients, chunk sizes, warnings, errors), on global tensors of simulated
ranks and inside nn.Graph."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from holoflow.core.errors import UnsupportedError
from holoflow.distributed import world
from holoflow.sbp import B, S

F64 = torch.float64
TO = torch.nn.LinearCrossEntropyOptions
FO = flow.nn.LinearCrossEntropyOptions
_FIELDS = ("allow_retain_graph", "batch_chunk_size", "chunking_method", "acc_policy", "acc_dtype")


def _flow_options(opts):
    return None if opts is None else FO(**{f: getattr(opts, f) for f in _FIELDS})


def _inputs(n=37, i=8, c=23, out=(), bias=True, unbatched=False, dtype=F64, ignore=True, prob=False,
            class_weight=False, seed=0):
    g = torch.Generator().manual_seed(seed)
    batch = () if unbatched else (n,)
    x = torch.randn(*batch, i, generator=g, dtype=F64).to(dtype)
    w = torch.randn(c, *out, i, generator=g, dtype=F64).to(dtype)
    b = torch.randn(c, *out, generator=g, dtype=F64).to(dtype) if bias else None
    if prob:
        t = torch.randn(*batch, c, *out, generator=g, dtype=F64).softmax(len(batch)).to(dtype)
    else:
        t = torch.randint(0, c, (*batch, *out), generator=g)
        if ignore and t.dim():
            t.view(-1)[::4] = -100
    cw = (torch.rand(c, generator=g, dtype=F64) + 0.5).to(dtype) if class_weight else None
    return x, w, b, t, cw


def _both(kwargs, inputs, opts=None, chunked=None):
    """(torch loss, holoflow loss, torch grads, holoflow grads) for one call and a random seed
    gradient; ``chunked``: whether holoflow must have taken the chunked path."""
    x, w, b, t, cw = inputs
    tx = [a.clone().requires_grad_() if a is not None else None for a in (x, w, b)]
    fx = [flow.from_torch(a.clone()).requires_grad_() if a is not None else None for a in (x, w, b)]
    want = torch.nn.functional.linear_cross_entropy(tx[0], tx[1], t, linear_bias=tx[2], weight=cw, options=opts,
                                                    **kwargs)
    got = flow.nn.functional.linear_cross_entropy(fx[0], fx[1], flow.from_torch(t), linear_bias=fx[2],
                                                  weight=None if cw is None else flow.from_torch(cw),
                                                  options=_flow_options(opts), **kwargs)
    if chunked is not None:
        names = {n.op.name for n in _nodes(got.grad_fn)}
        assert ("linear_cross_entropy" in names) == chunked, names
    seed = torch.randn(want.shape, generator=torch.Generator().manual_seed(1), dtype=F64).to(want.dtype)
    want.backward(seed)
    got.backward(flow.from_torch(seed))
    return want.detach(), got.to_torch(), [a.grad for a in tx if a is not None], \
        [a.grad.to_torch() for a in fx if a is not None]


def _nodes(fn) -> list:
    seen, stack = [], [fn]
    while stack:
        n = stack.pop()
        if n is not None and not isinstance(n, flow.Tensor) and n not in seen:
            seen.append(n)
            stack += [e[0] for e in n.edges if type(e) is tuple]
    return seen


def _close(want, got, want_grads, got_grads, **tol):
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, equal_nan=True, **tol)
    for a, b in zip(got_grads, want_grads):
        torch.testing.assert_close(a, b, equal_nan=True, **tol)


SHAPES = {   # name -> _inputs kwargs
    "2d": {}, "2d-no-bias": dict(bias=False), "2d-class-weight": dict(class_weight=True),
    "unbatched": dict(unbatched=True, ignore=False), "one-row": dict(n=1, ignore=False),
    "all-ignored": dict(n=4, seed=3),
}


@pytest.mark.parametrize("chunk", [None, 1, 5, 37, 100], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("shape", list(SHAPES))
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
def test_chunked_path_matches_torch(reduction, shape, chunk):
    inputs = _inputs(**SHAPES[shape])
    if shape == "all-ignored":
        inputs[3].fill_(-100)
    opts = TO(batch_chunk_size=chunk) if chunk is not None else TO()
    _close(*_both(dict(reduction=reduction), inputs, opts, chunked=True))


@pytest.mark.parametrize("kwargs,shape", [
    (dict(reduction="mean"), dict(out=(3, 2), class_weight=True)),
    (dict(reduction="none"), dict(out=(4,))),
    (dict(reduction="sum", label_smoothing=0.2), dict(class_weight=True)),
    (dict(reduction="mean"), dict(prob=True)),
    (dict(reduction="none"), dict(prob=True, out=(2,))),
    (dict(reduction="mean", ignore_index=3), dict(ignore=False)),
    (dict(reduction="sum"), dict(unbatched=True, ignore=False, prob=True)),
], ids=["kdim-weight", "kdim-none", "smoothing", "prob", "prob-kdim", "ignore3", "unbatched-prob"])
@pytest.mark.parametrize("with_options", [False, True], ids=["reference", "options"])
def test_reference_path_and_its_fallback_match_torch(kwargs, shape, with_options):
    """Without options: linear + cross_entropy. With options that the chunked path does not take
    (K-dim, smoothing, probabilities), torch warns and falls back; so does holoflow."""
    inputs = _inputs(**shape)
    opts = TO(batch_chunk_size=4) if with_options else None
    falls_back = with_options and (shape.get("out") or kwargs.get("label_smoothing") or shape.get("prob"))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        result = _both(kwargs, inputs, opts, chunked=with_options and not falls_back)
    said = [str(w.message) for w in caught if "options`` ignored" in str(w.message)]
    assert len(said) == (2 if falls_back else 0), said   # torch's warning and holoflow's
    _close(*result)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, dict(rtol=1e-5, atol=1e-5)),
                                       (torch.bfloat16, dict(rtol=2e-2, atol=5e-2))])
def test_low_precision_chunked_matches_torch(dtype, tol):
    inputs = _inputs(n=64, i=16, c=50, dtype=dtype)
    _close(*_both(dict(reduction="mean"), inputs, TO(batch_chunk_size=16), chunked=True), **tol)
    _close(*_both(dict(reduction="none"), inputs, TO(), chunked=True), **tol)


def test_mixed_dtypes_follow_the_input():
    """bfloat16 input, float32 weight (torch's chunked op takes them): a bfloat16 loss, float32
    accumulation, gradients in each operand's dtype."""
    x, w, b, t, _ = _inputs(n=16, i=8, c=12, dtype=torch.float32)
    _close(*_both(dict(reduction="sum"), (x.to(torch.bfloat16), w, b, t, None), TO(batch_chunk_size=4)),
           rtol=2e-2, atol=5e-2)


@pytest.mark.parametrize("kw", [
    dict(), dict(chunking_method="aspect_ratio"), dict(chunking_method="aspect_ratio:3"),
    dict(chunking_method=None), dict(chunking_method=None, batch_chunk_size=7), dict(batch_chunk_size=5000),
    dict(acc_policy="compact"), dict(acc_dtype=torch.float64)])
@pytest.mark.parametrize("dims", [(1000, 64, 50000), (37, 8, 23), (4096, 512, 128), (1, 4, 3), (0, 4, 3)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_chunk_rows_and_accumulation_dtype_are_torchs(kw, dims, dtype):
    n, i, c = dims
    want = TO(**kw)._adjust(num_batches=n, in_features=i, num_classes=c, dtype=dtype, device=torch.device("cpu"))
    got = FO(**kw)
    assert got.chunk_rows(n, i, c, dtype, "cpu") == want.batch_chunk_size
    assert got.accumulation_dtype(dtype) == want.acc_dtype


def test_conflicting_chunk_size_and_method_are_refused_as_torch():
    with pytest.raises(ValueError) as want:
        TO(batch_chunk_size=7, chunking_method="aspect_ratio")._adjust(
            num_batches=100, in_features=8, num_classes=23, dtype=torch.float32, device=torch.device("cpu"))
    with pytest.raises(ValueError) as got:
        FO(batch_chunk_size=7, chunking_method="aspect_ratio").chunk_rows(100, 8, 23, torch.float32, "cpu")
    assert str(got.value) == str(want.value)


@pytest.mark.parametrize("kw", [dict(acc_policy="fast"), dict(chunking_method="aspect"),
                                dict(chunking_method="aspect_ratio:0"), dict(batch_chunk_size=0),
                                dict(batch_chunk_size=2.5), dict(acc_dtype=torch.int32)])
def test_bad_options_raise_torchs_error(kw):
    with pytest.raises(ValueError) as want:
        TO(**kw)
    with pytest.raises(ValueError) as got:
        FO(**kw)
    assert str(got.value).split(" (")[0] == str(want.value).split(" (")[0]


@pytest.mark.parametrize("call,match", [
    (lambda m, x, w, t: m.nn.functional.linear_cross_entropy(x.reshape(1, 37, 8), w, t), "dimensionality 1 or 2"),
    (lambda m, x, w, t: m.nn.functional.linear_cross_entropy(x, w[0], t), "at least 2"),
    (lambda m, x, w, t: m.nn.functional.linear_cross_entropy(x[:, :4], w, t), "in_features"),
    (lambda m, x, w, t: m.nn.functional.linear_cross_entropy(x, w, t, linear_bias=w[:, 0][:5]), "linear_bias shape"),
    (lambda m, x, w, t: m.nn.functional.linear_cross_entropy(x[0], w.reshape(23, 1, 8), t[0]), "requires batched"),
])
def test_bad_shapes_raise_torchs_errors(call, match):
    x, w, _, t, _ = _inputs()
    with pytest.raises(RuntimeError, match=match):
        call(torch, x, w, t)
    with pytest.raises(RuntimeError, match=match):
        call(flow, flow.from_torch(x), flow.from_torch(w), flow.from_torch(t))


def test_chunked_path_names_a_target_out_of_range():
    x, w, _, t, _ = _inputs(ignore=False)
    t[3] = 23
    with pytest.raises(RuntimeError, match="linear_cross_entropy.*out of bounds"):
        flow.nn.functional.linear_cross_entropy(flow.from_torch(x), flow.from_torch(w), flow.from_torch(t),
                                                options=FO(batch_chunk_size=8))


def test_chunked_backward_twice_and_double_backward():
    """holoflow's backward recomputes, so a second backward works without allow_retain_graph (torch
    raises there); higher-order gradients are refused by name, as torch refuses them."""
    x, w, b, t, _ = _inputs()
    fx, fw = flow.from_torch(x).requires_grad_(), flow.from_torch(w).requires_grad_()
    loss = flow.nn.functional.linear_cross_entropy(fx, fw, flow.from_torch(t), options=FO(batch_chunk_size=6))
    loss.backward(retain_graph=True)
    first = fw.grad.to_torch().clone()
    loss.backward()
    torch.testing.assert_close(fw.grad.to_torch(), 2 * first)
    tw = w.clone().requires_grad_()
    tl = torch.nn.functional.linear_cross_entropy(x, tw, t, options=TO(batch_chunk_size=6))
    tl.backward(retain_graph=True)
    torch.testing.assert_close(first, tw.grad)
    loss = flow.nn.functional.linear_cross_entropy(fx, fw, flow.from_torch(t), options=FO(batch_chunk_size=6))
    (gx,) = flow.autograd.grad(loss, [fx], create_graph=True)
    with pytest.raises(UnsupportedError, match="no second derivative; pass options=None"):
        gx.sum().backward()


def test_chunked_path_only_computes_wanted_gradients():
    x, w, b, t, _ = _inputs()
    fx, fw, fb = flow.from_torch(x), flow.from_torch(w).requires_grad_(), flow.from_torch(b)
    loss = flow.nn.functional.linear_cross_entropy(fx, fw, flow.from_torch(t), linear_bias=fb, options=FO())
    (gw,) = flow.autograd.grad(loss, [fw])
    tw = w.clone().requires_grad_()
    want = torch.autograd.grad(torch.nn.functional.linear_cross_entropy(x, tw, t, linear_bias=b), [tw])[0]
    torch.testing.assert_close(gw.to_torch(), want)


def test_eval_mode_runs_no_backward_state():
    x, w, _, t, _ = _inputs()
    with flow.no_grad():
        got = flow.nn.functional.linear_cross_entropy(flow.from_torch(x), flow.from_torch(w).requires_grad_(),
                                                      flow.from_torch(t), options=FO(batch_chunk_size=3))
    assert got.grad_fn is None and not got.requires_grad
    torch.testing.assert_close(got.to_torch(), torch.nn.functional.linear_cross_entropy(x, w, t))


@pytest.mark.parametrize("kw", [dict(), dict(bias=True, out_features=(3,), reduction="none"),
                                dict(ignore_index=2, label_smoothing=0.1, reduction="sum"),
                                dict(options="chunk"), dict(bias=True, options="chunk", reduction="none")],
                         ids=["default", "kdim-bias", "smoothing", "chunked", "chunked-bias"])
def test_module_matches_torchs(kw):
    kw = dict(kw)
    opts = kw.pop("options", None)
    torch.manual_seed(0)
    tm = torch.nn.LinearCrossEntropyLoss(8, 11, options=TO(batch_chunk_size=4) if opts else None,
                                         weight=torch.linspace(0.5, 2, 11), **kw)
    fm = flow.nn.LinearCrossEntropyLoss(8, 11, options=FO(batch_chunk_size=4) if opts else None,
                                        weight=flow.linspace(0.5, 2, 11), **kw)
    fm.load_state_dict({k: flow.from_torch(v) for k, v in tm.state_dict().items()})
    assert [n for n, _ in fm.named_parameters()] == [n for n, _ in tm.named_parameters()]
    assert repr(fm).replace("holoflow.", "torch.") == repr(tm)
    x = torch.randn(10, 8, generator=torch.Generator().manual_seed(2))
    t = torch.randint(0, 11, (10, *kw.get("out_features", ())), generator=torch.Generator().manual_seed(3))
    want, got = tm(x, t), fm(flow.from_torch(x), flow.from_torch(t))
    torch.testing.assert_close(got.to_torch(), want.detach())
    want.sum().backward()
    got.sum().backward()
    for (name, tp), (_, fp) in zip(tm.named_parameters(), fm.named_parameters()):
        torch.testing.assert_close(fp.grad.to_torch(), tp.grad, msg=name)


def test_module_refuses_a_weight_of_the_wrong_shape():
    with pytest.raises(RuntimeError, match=r"expected weight shape to be \(11,\)"):
        flow.nn.LinearCrossEntropyLoss(8, 11, weight=flow.ones(10))


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("sbp", [B, S(0)], ids=["B", "S0"])
def test_chunked_path_on_global_tensors_matches_one_process(sbp, reduction):
    """Rows split over 2 simulated ranks: each rank runs its chunks; 'mean' divides a partial sum
    by the global total weight."""
    x, w, b, t, cw = _inputs(n=10, class_weight=True)
    want = _both(dict(reduction=reduction), (x, w, b, t, cw), TO(batch_chunk_size=3))

    def run(rank):
        place = flow.placement("cpu", [0, 1])

        def glob(a, split=True, grad=False):
            g = flow.from_torch(a).to_global(placement=place, sbp=[B])
            g = g.to_global(sbp=[sbp if split else B])
            return g.detach().requires_grad_() if grad else g
        gx, gw, gb = glob(x, grad=True), glob(w, split=False, grad=True), glob(b, split=False, grad=True)
        loss = flow.nn.functional.linear_cross_entropy(gx, gw, glob(t), linear_bias=gb, weight=glob(cw, split=False),
                                                       reduction=reduction, options=FO(batch_chunk_size=3))
        seed = torch.randn(want[0].shape, generator=torch.Generator().manual_seed(1), dtype=F64)
        loss.backward(flow.from_torch(seed).to_global(placement=place, sbp=[B]).to_global(sbp=loss.sbp))
        local = [a.to_global(sbp=[B]).to_local().detach().to_torch() for a in (loss, gx.grad, gw.grad, gb.grad)]
        return local[0], local[1:]
    for got, grads in world.simulate(2, run):
        _close(want[0], got, want[2], grads)


def test_chunked_loss_in_a_graph_trains_as_eager():
    """nn.Graph of a model ending in LinearCrossEntropyLoss(options=...): the two chunked ops are
    traced and run by the plan; three SGD steps equal eager's."""
    def model():
        flow.manual_seed(0)
        return flow.nn.ModuleDict({"body": flow.nn.Linear(6, 8), "head": flow.nn.LinearCrossEntropyLoss(
            8, 13, bias=True, options=FO(batch_chunk_size=5))})

    def loss_of(m, x, t):
        return m["head"](m["body"](x).tanh(), t)
    x = flow.randn(12, 6, generator=flow.Generator().manual_seed(1))
    t = flow.randint(0, 13, (12,), generator=flow.Generator().manual_seed(2))
    eager, traced = model(), model()
    opt_e = flow.optim.SGD(eager.parameters(), lr=0.5)
    opt_g = flow.optim.SGD(traced.parameters(), lr=0.5)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = traced
            self.add_optimizer(opt_g)

        def build(self, x, t):
            loss = loss_of(self.m, x, t)
            loss.backward()
            return loss
    g = Train()
    for _ in range(3):
        opt_e.zero_grad()
        want = loss_of(eager, x, t)
        want.backward()
        opt_e.step()
        torch.testing.assert_close(g(x, t).to_torch(), want.detach().to_torch())
    for (name, a), (_, b) in zip(eager.named_parameters(), traced.named_parameters()):
        torch.testing.assert_close(b.to_torch(), a.detach().to_torch(), msg=name)
    ir = next(iter(g._compiled.values())).ir
    assert {"linear_cross_entropy", "linear_cross_entropy_backward"} <= {n.op for n in ir.nodes}


def test_chunked_path_never_holds_more_than_a_chunk_of_logits(monkeypatch):
    """Every logits block the forward and the backward compute has at most ``chunk`` rows."""
    from holoflow.ops import linear_loss
    rows, real = [], linear_loss._logits

    def probe(x, w, b, acc):
        out = real(x, w, b, acc)
        rows.append(out.shape)
        return out
    monkeypatch.setattr(linear_loss, "_logits", probe)
    x, w, b, t, _ = _inputs(n=37, c=23)
    _both(dict(reduction="sum"), (x, w, b, t, None), TO(batch_chunk_size=8), chunked=True)
    assert rows == [(8, 23)] * 4 + [(5, 23)] + [(8, 23)] * 4 + [(5, 23)]   # forward, then backward


@pytest.mark.parametrize("chunked", [False, True], ids=["reference", "chunked"])
def test_under_autocast_matches_torch(chunked):
    """bfloat16 autocast on CPU: the reference path as its parts (a bf16 linear, a float32 loss);
    the chunked path's matmuls as torch's run them."""
    x, w, b, t, _ = _inputs(n=16, i=8, c=12, dtype=torch.float32)
    with torch.autocast("cpu", torch.bfloat16):
        want = torch.nn.functional.linear_cross_entropy(x, w, t, linear_bias=b,
                                                        options=TO(batch_chunk_size=5) if chunked else None)
    with flow.autocast("cpu", flow.bfloat16):
        got = flow.nn.functional.linear_cross_entropy(
            flow.from_torch(x), flow.from_torch(w), flow.from_torch(t), linear_bias=flow.from_torch(b),
            options=FO(batch_chunk_size=5) if chunked else None)
    assert got.to_torch().dtype == want.dtype
    torch.testing.assert_close(got.to_torch(), want, rtol=1e-5, atol=1e-5)

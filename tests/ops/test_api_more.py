"""torch APIs added together: atleast_Nd, column/row/dstack, combinations, cumulative_trapezoid,
chain_matmul, pdist, threshold, rrelu, poisson, binomial, the creation functions (tril/triu_indices,
scalar_tensor, empty_strided, asarray, the windows), Tensor methods (allclose, isclose, bincount,
ravel, prelu, is_nonzero, is_same_size), torch's top-level in-place functions and ``vmap``."""
import warnings

import pytest
import torch

import holoflow as flow
from harness import Case, error_like_torch, parametrize, positive, randn

I64 = torch.int64


def lib_of(t):
    return flow if isinstance(t, flow.Tensor) else torch


def _clone(out):
    if isinstance(out, flow.Tensor):
        return out.clone()
    return type(out)(_clone(o) for o in out) if isinstance(out, (list, tuple)) else out


def same(name: str, fn, make, **kw) -> Case:
    """A case written once for both libraries; holoflow's outputs are cloned (the gradcheck
    perturbs inputs in place, which a returned view would follow)."""
    return Case(name, lambda *a, **k: _clone(fn(*a, **k)), fn, make, **kw)


def inputs(*shapes, low=None):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt, low=low) for s in shapes), {})


def _chain_matmul(lib, *ms):
    with warnings.catch_warnings():   # torch.chain_matmul is deprecated (it warns once)
        warnings.simplefilter("ignore")
        return lib.chain_matmul(*ms)


CASES = []
for _n in (1, 2, 3):
    for _shape in ((), (3,), (2, 3), (2, 3, 2)):
        CASES.append(same(f"atleast_{_n}d{list(_shape)}", lambda x, n=_n: getattr(lib_of(x), f"atleast_{n}d")(x),
                          inputs(_shape)))
    CASES.append(same(f"atleast_{_n}d-several", lambda x, y, n=_n: getattr(lib_of(x), f"atleast_{n}d")(x, y),
                      inputs((), (4,))))
    CASES.append(same(f"atleast_{_n}d-list", lambda x, y, n=_n: getattr(lib_of(x), f"atleast_{n}d")([x, y]),
                      inputs((2, 2), (4,))))
CASES += [
    same("column_stack", lambda x, y, z: lib_of(x).column_stack([x, y, z]), inputs((3,), (3, 2), (3,))),
    same("column_stack-0d", lambda x, y: lib_of(x).column_stack((x, y)), inputs((), ())),
    same("row_stack", lambda x, y, z: lib_of(x).row_stack([x, y, z]), inputs((3,), (2, 3), (3,))),
    same("dstack", lambda x, y, z: lib_of(x).dstack([x, y, z]), inputs((2, 3), (2, 3, 2), (2, 3))),
    same("dstack-1d", lambda x, y: lib_of(x).dstack([x, y]), inputs((4,), (4,))),
    same("combinations", lambda x: lib_of(x).combinations(x), inputs((4,))),
    same("combinations-r3", lambda x: lib_of(x).combinations(x, 3), inputs((5,))),
    same("combinations-replacement", lambda x: lib_of(x).combinations(x, 2, with_replacement=True), inputs((3,))),
    same("combinations-r-too-large", lambda x: lib_of(x).combinations(x, 4), inputs((3,))),
    same("cumulative_trapezoid", lambda y: lib_of(y).cumulative_trapezoid(y), inputs((3, 5))),
    same("cumulative_trapezoid-dx-dim0", lambda y: lib_of(y).cumulative_trapezoid(y, dx=0.3, dim=0), inputs((4, 2))),
    same("cumulative_trapezoid-x1d", lambda y, x: lib_of(y).cumulative_trapezoid(y, x), inputs((3, 5), (5,))),
    same("cumulative_trapezoid-x-same-shape", lambda y, x: lib_of(y).cumulative_trapezoid(y, x, dim=0),
         inputs((4, 3), (4, 3))),
    same("cumulative_trapezoid-empty", lambda y: lib_of(y).cumulative_trapezoid(y), inputs((2, 0))),
    same("chain_matmul", lambda a, b, c: _chain_matmul(lib_of(a), a, b, c), inputs((2, 3), (3, 4), (4, 2))),
    same("chain_matmul-one", lambda a: _chain_matmul(lib_of(a), a), inputs((2, 3))),
    same("pdist", lambda x: lib_of(x).pdist(x), inputs((5, 3))),
    same("pdist-p1", lambda x: lib_of(x).pdist(x, 1), inputs((4, 3)), gradcheck=False),   # |.| at 0 is not smooth
    same("pdist-p3.5", lambda x: lib_of(x).pdist(x, 3.5), inputs((4, 2))),
    same("pdist-inf", lambda x: lib_of(x).pdist(x, float("inf")), inputs((4, 3)), gradcheck=False),
    same("pdist-one-row", lambda x: lib_of(x).pdist(x), inputs((1, 3))),
    same("nn.functional.pdist", lambda x: lib_of(x).nn.functional.pdist(x), inputs((3, 2))),
    same("threshold", lambda x: lib_of(x).threshold(x, 0.1, -2.0), inputs((4, 5))),
    same("nn.functional.threshold", lambda x: lib_of(x).nn.functional.threshold(x, -0.2, 7.0), inputs((3, 4))),
    same("rrelu-eval", lambda x: lib_of(x).rrelu(x, 0.1, 0.3), inputs((4, 5))),
    same("nn.functional.rrelu-eval", lambda x: lib_of(x).nn.functional.rrelu(x), inputs((4, 5))),
    same("rrelu-training", lambda x: lib_of(x).rrelu(x, 0.1, 0.3, training=True), inputs((6, 5)), random=True),
    same("nn.functional.rrelu-training", lambda x: lib_of(x).nn.functional.rrelu(x, training=True),
         inputs((3, 4, 2)), random=True),
    same("poisson", lambda x: lib_of(x).poisson(x * 4), lambda dt, g: ((positive(5, 6, gen=g, dtype=dt),), {}),
         random=True, grad=False),
    same("binomial", lambda n, p: lib_of(n).binomial(n.round() * 5, p - 0.5),
         lambda dt, g: ((positive(4, 6, gen=g, dtype=dt), positive(4, 6, gen=g, dtype=dt)), {}),
         random=True, grad=False),
    same("Tensor.prelu", lambda x, w: x.prelu(w), inputs((2, 3, 4), (3,))),
    same("Tensor.ravel", lambda x: x.ravel(), inputs((2, 3))),
    same("Tensor.isclose", lambda x, y: x.isclose(y, atol=0.5), inputs((3, 4), (3, 4)), grad=False),
    same("Tensor.bincount", lambda x: x.bincount(minlength=7),
         lambda dt, g: ((torch.randint(0, 5, (9,), generator=g),), {}), grad=False, dtypes=(torch.float32,)),
]
globals().update(parametrize(CASES))


# -- creation ---------------------------------------------------------------------------------------

CREATIONS = {
    "tril_indices": lambda m: m.tril_indices(4, 3),
    "tril_indices-offset-dtype": lambda m: m.tril_indices(3, 5, -1, dtype=m.int32),
    "triu_indices": lambda m: m.triu_indices(4, 4, 1),
    "scalar_tensor": lambda m: m.scalar_tensor(2.5),
    "scalar_tensor-int-dtype": lambda m: m.scalar_tensor(3, dtype=m.int64),
    "scalar_tensor-requires_grad": lambda m: m.scalar_tensor(1.5, dtype=m.float64, requires_grad=True),
    "asarray-list": lambda m: m.asarray([[1, 2], [3, 4]]),
    "asarray-list-dtype": lambda m: m.asarray([1.5, 2], dtype=m.float64),
    "asarray-scalar": lambda m: m.asarray(3.5),
    "asarray-tensor-dtype": lambda m: m.asarray(m.ones(3), dtype=m.int32),
    "asarray-requires_grad": lambda m: m.asarray([1.0, 2.0], requires_grad=True),
}
for _w in ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"):
    CREATIONS[_w] = lambda m, w=_w: getattr(m, w)(7)
    CREATIONS[f"{_w}-symmetric-float64"] = lambda m, w=_w: getattr(m, w)(6, False, dtype=m.float64)
    CREATIONS[f"{_w}-keyword-requires_grad"] = lambda m, w=_w: getattr(m, w)(5, periodic=False, requires_grad=True)
    CREATIONS[f"{_w}-length-1"] = lambda m, w=_w: getattr(m, w)(1)
    CREATIONS[f"{_w}-length-0"] = lambda m, w=_w: getattr(m, w)(0)
CREATIONS["hamming_window-alpha-beta"] = lambda m: m.hamming_window(8, True, 0.5, 0.4)
CREATIONS["kaiser_window-beta"] = lambda m: m.kaiser_window(8, False, 5.0)


@pytest.mark.parametrize("name", sorted(CREATIONS))
def test_creation_like_torch(name):
    got, want = CREATIONS[name](flow), CREATIONS[name](torch)
    assert isinstance(got, flow.Tensor)
    assert got.to_torch().dtype == want.dtype and tuple(got.shape) == tuple(want.shape)
    assert got.requires_grad == want.requires_grad and got.is_leaf
    torch.testing.assert_close(got.to_torch().detach(), want.detach())


def test_empty_strided_like_torch():
    got = flow.empty_strided((2, 3), (1, 2), dtype=flow.float64, requires_grad=True)
    want = torch.empty_strided((2, 3), (1, 2), dtype=torch.float64, requires_grad=True)
    assert (tuple(got.shape), got.stride(), got.to_torch().dtype, got.requires_grad) == \
        (tuple(want.shape), want.stride(), want.dtype, want.requires_grad)


def test_asarray_shares_memory_like_torch():
    x = flow.ones(3, requires_grad=True)
    assert flow.asarray(x) is x
    copy = flow.asarray(x, copy=True)
    assert copy is not x and copy.requires_grad
    y = flow.zeros(2)
    flow.asarray(y).add_(1)
    assert y.tolist() == [1.0, 1.0]
    assert not flow.asarray(x, requires_grad=False).requires_grad


# -- Tensor methods ---------------------------------------------------------------------------------

def test_bound_tensor_methods_like_torch():
    a, b = torch.randn(3, 4), torch.randn(3, 4)
    fa, fb = flow.from_torch(a), flow.from_torch(b)
    assert fa.allclose(fa + 1e-9) is True and fa.allclose(fb) == a.allclose(b)
    assert fa.allclose(fb, atol=10.0) == a.allclose(b, atol=10.0)
    assert flow.tensor([0.5]).is_nonzero() is True and flow.tensor([0]).is_nonzero() is False
    assert fa.is_same_size(fb) and not fa.is_same_size(fb[1:])


def test_vmap_is_func_vmap():
    assert flow.vmap is flow.func.vmap
    x = torch.randn(4, 3)
    got = flow.vmap(lambda r: (r * r).sum())(flow.from_torch(x))
    torch.testing.assert_close(got.to_torch(), torch.vmap(lambda r: (r * r).sum())(x))


# -- top-level in-place functions -------------------------------------------------------------------

def _ints(lib, *values):
    return lib.tensor(values, dtype=lib.int64)


# name -> (input factory, extra args of lib); the input is a float tensor with values in (0.1, 0.9)
# unless the factory says otherwise
def _float(lib):
    return lib.tensor([[0.15, 0.3, 0.45], [0.6, 0.75, 0.85], [0.2, 0.5, 0.35]])


INPLACE_ARGS = {
    "clamp_": lambda lib: (0.3, 0.7), "clamp_max_": lambda lib: (0.5,), "clamp_min_": lambda lib: (0.5,),
    "clip_": lambda lib: (0.2, 0.6), "ldexp_": lambda lib: (lib.tensor([1.0, 2.0, -1.0]),),
    "logit_": lambda lib: (0.2,), "xlogy_": lambda lib: (lib.tensor([0.5, 2.0, 3.0]),),
    "fill_": lambda lib: (2.5,), "index_put_": lambda lib: ((_ints(lib, 0, 1),), lib.tensor([9.0, 8.0, 7.0])),
    "round_": lambda lib: (), "nan_to_num_": lambda lib: (0.0, 1.0, -1.0),
}
INTEGER_INPUT = {"gcd_": lambda lib: (_ints(lib, 4, 6, 9),), "lcm_": lambda lib: (_ints(lib, 4, 6, 9),)}
ALL_INPLACE = (
    "abs_ acos_ acosh_ asin_ asinh_ atan_ atanh_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ ceil_ clamp_ "
    "clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ rad2deg_ erf_ erfc_ exp_ exp2_ expm1_ fix_ floor_ frac_ gcd_ "
    "lcm_ i0_ ldexp_ log_ log10_ log1p_ log2_ logit_ nan_to_num_ neg_ negative_ reciprocal_ round_ rsqrt_ "
    "sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_ zero_ fill_ index_put_ detach_ relu_ selu_ "
    "celu_ threshold_ rrelu_").split()
EXTRA_ARGS = {"threshold_": lambda lib: (0.4, -1.0), "celu_": lambda lib: (0.7,)}


def _inplace_input(lib, name):
    if name in INTEGER_INPUT:
        return lib.tensor([[12, 10, 3], [5, 8, 27], [2, 4, 6]], dtype=lib.int64), INTEGER_INPUT[name](lib)
    return _float(lib) * (1.0 if name not in ("acosh_", "arccosh_") else 3.0), \
        {**INPLACE_ARGS, **EXTRA_ARGS}.get(name, lambda lib: ())(lib)


def _run_inplace(lib, name, through_view: bool):
    base, args = _inplace_input(lib, name)
    target = base[1:] if through_view else base
    out = getattr(lib, name)(target, *args)
    assert out is target, f"{name} must return its input"
    return base


@pytest.mark.parametrize("through_view", [False, True], ids=["fresh", "view"])
@pytest.mark.parametrize("name", ALL_INPLACE)
def test_top_level_inplace_like_torch(name, through_view):
    if name == "detach_" and through_view:   # torch refuses it: so must holoflow
        error_like_torch(lambda lib: _run_inplace(lib, name, through_view), "detach_ of a view")
        return
    got = _run_inplace(flow, name, through_view)
    want = _run_inplace(torch, name, through_view)
    assert got.to_torch().dtype == want.dtype
    torch.testing.assert_close(got.to_torch(), want, equal_nan=True)


@pytest.mark.parametrize("name, args", [("dropout_", (0.4, True)), ("alpha_dropout_", (0.3, True)),
                                        ("feature_alpha_dropout_", (0.3, True)), ("dropout_", (0.4, False)),
                                        ("rrelu_", (0.1, 0.3, True))])
def test_top_level_random_inplace_like_torch(name, args):
    x = torch.randn(4, 6, 3)
    results = []
    for lib in (flow, torch):
        t = flow.from_torch(x.clone()) if lib is flow else x.clone()
        lib.manual_seed(5)
        assert getattr(lib, name)(t, *args) is t
        results.append(t)
    torch.testing.assert_close(results[0].to_torch(), results[1])


def test_inplace_functions_keep_autograd_like_torch():
    grads = []
    for lib in (flow, torch):
        x = lib.tensor([0.2, -0.5, 1.5], requires_grad=True)
        y = x * 2
        lib.sin_(y)
        lib.threshold_(y, 0.5, 0.0)
        y.sum().backward()
        grads.append(x.grad)
    torch.testing.assert_close(grads[0].to_torch(), grads[1])


# -- errors -----------------------------------------------------------------------------------------

ERRORS = {
    "combinations(2-d)": lambda m: m.combinations(m.zeros(2, 2)),
    "combinations(r=-1)": lambda m: m.combinations(m.zeros(3), -1),
    "chain_matmul(1-d)": lambda m: _chain_matmul(m, m.zeros(2, 2), m.zeros(2)),
    "chain_matmul()": lambda m: _chain_matmul(m),
    "chain_matmul(shapes)": lambda m: _chain_matmul(m, m.zeros(2, 3), m.zeros(2, 3)),
    "pdist(1-d)": lambda m: m.pdist(m.zeros(3)),
    "pdist(p=-1)": lambda m: m.pdist(m.zeros(2, 3), -1.0),
    "pdist(int)": lambda m: m.pdist(m.zeros(2, 3, dtype=m.int64)),
    "cumulative_trapezoid(x mismatch)": lambda m: m.cumulative_trapezoid(m.zeros(3), m.zeros(2)),
    "cumulative_trapezoid(dim)": lambda m: m.cumulative_trapezoid(m.zeros(3), dim=2),
    "atleast_1d(3)": lambda m: m.atleast_1d(3),
    "column_stack([])": lambda m: m.column_stack([]),
    "dstack(shapes)": lambda m: m.dstack([m.zeros(2), m.zeros(3)]),
    "hann_window(int dtype)": lambda m: m.hann_window(4, dtype=m.int64),
    "kaiser_window(-1)": lambda m: m.kaiser_window(-1),
    "tril_indices(float dtype)": lambda m: m.tril_indices(3, 3, dtype=m.float32),
    "empty_strided(mismatch)": lambda m: m.empty_strided((2, 3), (1,)),
    "poisson(negative rate)": lambda m: m.poisson(m.tensor([-1.0])),
    "abs_(int)": lambda m: m.abs_(3),
    "sqrt_(leaf)": lambda m: m.sqrt_(m.ones(2, requires_grad=True)),
    "threshold_(leaf)": lambda m: m.threshold_(m.ones(2, requires_grad=True), 0.5, 0.0),
    "rrelu_(leaf)": lambda m: m.rrelu_(m.ones(2, requires_grad=True), 0.1, 0.3, True),
    "Tensor.bincount(float)": lambda m: m.ones(3).bincount(),
    "Tensor.is_nonzero(2 elements)": lambda m: m.ones(2).is_nonzero(),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_like_torch(name):
    error_like_torch(ERRORS[name], name)


def test_tensor_to_copy_and_positional_flags_like_torch():
    """``to(..., copy=True)`` with nothing to change returns a copy (it returned the input's
    storage: writing the copy changed the original); positional bools are non_blocking, copy;
    the dtype methods and as_strided_ take torch's keywords (memory_format, storage_offset)."""
    def run(lib):
        x = lib.arange(120.0).reshape(2, 3, 4, 5)
        outs = [x.to(lib.float32, copy=True), x.to("cpu", copy=True), x.to("cpu", lib.float32, False, True),
                x.to(x, True, True), x.to(lib.float64, False, False)]
        for o in outs:
            o.add_(1)
        flags = [o.data_ptr() == x.data_ptr() for o in outs] + [x.to("cpu", lib.float32, False, False) is x]
        layouts = [y.is_contiguous(memory_format=lib.channels_last)
                   for y in (x.double(memory_format=lib.channels_last), x.cfloat(memory_format=lib.channels_last),
                             x.half(memory_format=lib.preserve_format))]
        s = lib.arange(9.0)
        s.as_strided_((2, 2), (1, 2), storage_offset=1)
        return x.sum().item(), flags, layouts, s.tolist()
    assert run(flow) == run(torch)

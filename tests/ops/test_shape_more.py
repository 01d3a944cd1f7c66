"""More shape and scatter ops vs torch: index_put (accumulate), index_reduce, the view inverses
slice/select/diagonal_scatter, fill_diagonal_, split_with_sizes, h/v/dsplit, unsafe splits,
sum_to_size, narrow_copy, unique_consecutive, adjoint/mH/H, the in-place shape methods
(squeeze_, unsqueeze_, t_, transpose_, swapaxes_, swapdims_), resize_, new_empty_strided, the
samplers cauchy_/log_normal_/geometric_ and the trivial Tensor properties."""
import pytest
import torch

import holoflow as flow
from harness import Case, error_like_torch, parametrize, raised, randn

C64 = torch.complex64


def one(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def lib_of(t):
    return flow if isinstance(t, flow.Tensor) else torch


def idx(*values):
    return torch.tensor(values, dtype=torch.int64)


def _clone(out):
    if isinstance(out, flow.Tensor):
        return out.clone()
    return type(out)(_clone(o) for o in out) if isinstance(out, (list, tuple)) else out


def same(name: str, fn, make, **kw) -> Case:
    """A case written once for both libraries (methods, or ``lib_of``). holoflow's outputs are
    cloned: the gradcheck perturbs inputs in place and reads the outputs afterwards, which a view
    would follow (as in test_shape.py)."""
    return Case(name, lambda *a, **k: _clone(fn(*a, **k)), fn, make, **kw)


# -- index_put --------------------------------------------------------------------------------------

def _put(dst_shape, val_shape, *indices):
    return lambda dt, g: ((randn(*dst_shape, gen=g, dtype=dt), randn(*val_shape, gen=g, dtype=dt),
                           *(idx(*i) for i in indices)), {})


def _put_through_view(x, v, i, accumulate):
    """``b[1:].index_put_(...)`` writes into ``b``: both see it, the gradient reaches x and v."""
    b = x * 1
    b[1:].index_put_((i,), v, accumulate=accumulate)
    return b


CASES = [
    same("index_put", lambda x, v, i: lib_of(x).index_put(x, (i,), v), _put((5, 3), (3, 3), (4, 0, -3))),
    same("index_put-two-indices-broadcast", lambda x, v, i, j: x.index_put((i, j), v),
         _put((4, 5), (1,), (0, 3, -1), (4, -5, 2))),
    same("index_put-accumulate-duplicates", lambda x, v, i: lib_of(x).index_put(x, (i,), v, accumulate=True),
         _put((5, 3), (4, 3), (0, 2, 0, -1))),
    same("index_put-accumulate-broadcast", lambda x, v, i, j: x.index_put((i, j), v, True),
         _put((3, 4, 2), (2,), (1, 1, 0), (3, 3, -4))),
    same("index_put_-through-view", lambda x, v, i: _put_through_view(x, v, i, False),
         _put((5, 3), (2, 3), (3, 0))),
    same("index_put_-accumulate-through-view", lambda x, v, i: _put_through_view(x, v, i, True),
         _put((5, 3), (3, 3), (1, 1, -1))),
]


# -- index_reduce -----------------------------------------------------------------------------------

def _reduce_inputs(dst, src, index):
    return lambda dt, g: ((randn(*dst, gen=g, dtype=dt), randn(*src, gen=g, dtype=dt), idx(*index)), {})


for _mode in ("prod", "mean", "amax", "amin"):
    for _self in (True, False):
        CASES.append(same(f"index_reduce-{_mode}-include_self={_self}",
                          lambda x, s, i, m=_mode, inc=_self: lib_of(x).index_reduce(x, 0, i, s, m, include_self=inc),
                          _reduce_inputs((5, 3), (4, 3), (0, 2, 0, 4))))
CASES += [
    same("index_reduce-neg-dim", lambda x, s, i: x.index_reduce(-1, i, s, "amax", include_self=False),
         _reduce_inputs((3, 5), (3, 4), (4, 1, 4, 0))),
    same("index_reduce_-through-view", lambda x, s, i: _reduce_through_view(x, s, i),
         _reduce_inputs((5, 3), (3, 3), (2, 0, 2))),
]


def _reduce_through_view(x, s, i):
    b = x * 1
    b[1:].index_reduce_(0, i, s, "prod")
    return b


# -- slice / select / diagonal scatter, fill_diagonal_ -------------------------------------------------

def _into(dst, src):
    return lambda dt, g: ((randn(*dst, gen=g, dtype=dt), randn(*src, gen=g, dtype=dt)), {})


def _fill_diagonal(x, value, wrap=False):
    b = x * 1
    b.fill_diagonal_(value, wrap=wrap)
    return b * x


def _fill_diagonal_through_view(x):
    b = x * 1
    b[1:].fill_diagonal_(0.5)
    return b


CASES += [
    same("slice_scatter", lambda x, s: lib_of(x).slice_scatter(x, s, 1, 1, 5, 2), _into((4, 6), (4, 2))),
    same("slice_scatter-defaults-neg-dim",
         lambda x, s: (x.slice_scatter(s), x.slice_scatter(s[:2], 0, 2), x.slice_scatter(s[:, :1], -1, -1)),
         _into((4, 3), (4, 3))),
    same("select_scatter", lambda x, s: (lib_of(x).select_scatter(x, s[0], 0, -1), x.select_scatter(s[:, 0], -1, 1)),
         _into((3, 4), (3, 4))),
    same("diagonal_scatter", lambda x, s: (lib_of(x).diagonal_scatter(x, s[0], 0),
                                           x.diagonal_scatter(s[1, :2], -1, 0, 1)),
         _into((3, 4), (3, 3))),
    same("diagonal_scatter-3d-neg-dims", lambda x, s: x.diagonal_scatter(s, 1, -1, 0), _into((3, 2, 5), (2, 2))),
    same("fill_diagonal_", lambda x: _fill_diagonal(x, 2.5), one(4, 4)),
    same("fill_diagonal_-wrap", lambda x: _fill_diagonal(x, -1.0, wrap=True), one(7, 3)),
    same("fill_diagonal_-wide-3d", lambda x, y: (_fill_diagonal(x, 0.0, True), _fill_diagonal(y, 3.0)),
         _into((3, 7), (3, 3, 3))),
    same("fill_diagonal_-through-view", _fill_diagonal_through_view, one(4, 3)),
]


# -- splits, sum_to_size, narrow_copy, unique_consecutive, adjoint --------------------------------------

def _inplace_shapes(x):
    """In-place shape methods on a non-view and, through a view, on its base."""
    y = x * 2
    y.unsqueeze_(1).transpose_(0, -1)
    y.swapaxes_(1, 0).squeeze_()
    y.t_()
    z = x * 3
    v = z[1:]
    v.swapdims_(0, 1)
    v.unsqueeze_(0).squeeze_(0)
    v.mul_(y[:2].t())
    return y * x, z


def _unsafe_inplace(x):
    """unsafe_split's pieces may be written in place while autograd records (split's may not)."""
    y = x * 1
    a, b = lib_of(x).unsafe_split(y, 2)
    a.mul_(2)
    return (a * b[:1]).sum() + y.sum()


CASES += [
    same("split_with_sizes", lambda x: (x.split_with_sizes([1, 3, 0], -1), lib_of(x).split_with_sizes(x, [2, 1])),
         one(3, 4)),
    same("hsplit-vsplit-dsplit", lambda x: (x.hsplit(2), lib_of(x).vsplit(x, [1, 1]), x.dsplit([3]),
                                            lib_of(x).hsplit(x[0, 0], 5)), one(2, 4, 5)),
    same("unsafe_split-chunk-sizes", lambda x: (lib_of(x).unsafe_split(x, 2, 1), x.unsafe_chunk(2, -1),
                                                lib_of(x).unsafe_split_with_sizes(x, [1, 2])), one(3, 5)),
    # unsafe by design: y's history misses the write through its piece (torch's too), so finite
    # differences disagree with autograd; the gradients are compared with torch's
    same("unsafe_split-inplace", _unsafe_inplace, one(4, 3), gradcheck=False),
    same("sum_to_size", lambda x: (x.sum_to_size(1, 4), x.sum_to_size((4,)), x.sum_to_size(1, 3, 1),
                                   x.sum_to_size(2, 3, 4)), one(2, 3, 4)),
    same("narrow_copy", lambda x: (lib_of(x).narrow_copy(x, -1, 1, 2), x.narrow_copy(0, -2, 1)), one(3, 4)),
    same("adjoint-mH-H", lambda x, m: (lib_of(x).adjoint(x), x.mH, m.H, m.adjoint()), _into((2, 3, 4), (3, 5))),
    same("adjoint-complex", lambda z: (z.adjoint(), z.mH, z[0].H),
         lambda dt, g: ((torch.randn(2, 3, 4, generator=g, dtype=C64),), {}), grad=False, dtypes=(C64,)),
    same("inplace-shape-methods", _inplace_shapes, one(3, 4)),
    same("unique_consecutive", lambda x: (lib_of(x).unique_consecutive(x), x.unique_consecutive(return_inverse=True),
                                          lib_of(x).unique_consecutive(x, return_counts=True, return_inverse=True)),
         lambda dt, g: ((torch.tensor([1, 1, 2, 2, 3, 1, 1, 4], dtype=dt),), {}), grad=False),
    same("unique_consecutive-dim", lambda x: (x.unique_consecutive(return_counts=True, dim=0),
                                              lib_of(x).unique_consecutive(x, True, True, dim=-1)),
         lambda dt, g: ((torch.tensor([[1, 1, 2, 5], [1, 1, 2, 5], [3, 3, 0, 5]], dtype=dt),), {}), grad=False),
]


# -- samplers (same draws as torch under one seed) ---------------------------------------------------------

for _name, _args in (("cauchy_", ()), ("cauchy_", (0.5, 2.0)), ("log_normal_", ()), ("log_normal_", (0.2, 0.5)),
                     ("geometric_", (0.3,))):
    CASES.append(same(f"{_name}{_args}", lambda x, n=_name, a=_args: getattr(x.clone(), n)(*a), one(4, 5),
                      random=True, grad=False))


globals().update(parametrize(CASES))


# -- errors: torch's exception classes, holoflow's messages ------------------------------------------------


def _like_torch(make, fn):
    """``fn(lib, x)`` raises under holoflow what it raises under torch (the same class)."""
    return error_like_torch(lambda lib: fn(lib, make(lib)), "it")


def _m(lib, *shape, rg=False):
    return lib.zeros(*shape, requires_grad=rg)


def _i(lib, *v):
    return lib.tensor(v)


ERRORS = {
    "index_put-float-values": (lambda m: _m(m, 4, 3), lambda m, x: m.index_put(x, (_i(m, 0),), 1.0)),
    "index_put-dtype": (lambda m: _m(m, 4, 3), lambda m, x: x.index_put((_i(m, 0),), m.ones(3, dtype=m.float64))),
    "index_put-not-tuple": (lambda m: _m(m, 4, 3), lambda m, x: m.index_put(x, _i(m, 0), m.ones(3))),
    "index_put-out-of-bounds": (lambda m: _m(m, 4, 3), lambda m, x: m.index_put(x, (_i(m, 7),), m.ones(3), True)),
    "index_put-float-index": (lambda m: _m(m, 4, 3), lambda m, x: m.index_put(x, (m.ones(1),), m.ones(3))),
    "index_put-shape": (lambda m: _m(m, 4, 3), lambda m, x: m.index_put(x, (_i(m, 0, 1),), m.ones(5))),
    "index_put_-leaf": (lambda m: _m(m, 4, 3, rg=True), lambda m, x: x.index_put_((_i(m, 0),), m.ones(3))),
    "index_reduce-sum": (lambda m: _m(m, 4, 3), lambda m, x: x.index_reduce(0, _i(m, 0), m.ones(1, 3), "sum")),
    "index_reduce-dtype": (lambda m: _m(m, 4, 3),
                           lambda m, x: x.index_reduce(0, _i(m, 0), m.ones(1, 3, dtype=m.float64), "prod")),
    "index_reduce-count": (lambda m: _m(m, 4, 3), lambda m, x: x.index_reduce(0, _i(m, 0, 1), m.ones(3, 3), "mean")),
    "index_reduce-out-of-range": (lambda m: _m(m, 4, 3),
                                  lambda m, x: x.index_reduce(0, _i(m, 9), m.ones(1, 3), "amax")),
    "index_reduce-dim": (lambda m: _m(m, 4, 3), lambda m, x: x.index_reduce(2, _i(m, 0), m.ones(1, 3), "amax")),
    "slice_scatter-size": (lambda m: _m(m, 4, 3), lambda m, x: m.slice_scatter(x, m.ones(1, 3), 0, 1, 3)),
    "slice_scatter-no-broadcast": (lambda m: _m(m, 4, 3), lambda m, x: m.slice_scatter(x, m.ones(3), 0, 1, 2)),
    "slice_scatter-step": (lambda m: _m(m, 4, 3), lambda m, x: m.slice_scatter(x, m.ones(4, 1), 1, 0, 1, 0)),
    "slice_scatter-dim": (lambda m: _m(m, 4, 3), lambda m, x: m.slice_scatter(x, m.ones(4, 3), 2)),
    "select_scatter-index": (lambda m: _m(m, 4, 3), lambda m, x: m.select_scatter(x, m.ones(3), 0, 4)),
    "select_scatter-size": (lambda m: _m(m, 4, 3), lambda m, x: m.select_scatter(x, m.ones(4), 0, 1)),
    "diagonal_scatter-size": (lambda m: _m(m, 4, 3), lambda m, x: m.diagonal_scatter(x, m.ones(4))),
    "diagonal_scatter-dims": (lambda m: _m(m, 4, 3), lambda m, x: m.diagonal_scatter(x, m.ones(3), 0, 1, 1)),
    "fill_diagonal_-1d": (lambda m: _m(m, 3), lambda m, x: x.fill_diagonal_(1.0)),
    "fill_diagonal_-unequal": (lambda m: _m(m, 3, 3, 2), lambda m, x: x.fill_diagonal_(1.0)),
    "fill_diagonal_-leaf": (lambda m: _m(m, 3, 3, rg=True), lambda m, x: x.fill_diagonal_(1.0)),
    "hsplit-0d": (lambda m: m.tensor(1.0), lambda m, x: m.hsplit(x, 2)),
    "hsplit-uneven": (lambda m: _m(m, 3, 4), lambda m, x: x.hsplit(3)),
    "vsplit-1d": (lambda m: _m(m, 6), lambda m, x: m.vsplit(x, 3)),
    "dsplit-2d": (lambda m: _m(m, 6, 2), lambda m, x: x.dsplit(2)),
    "split_with_sizes-sum": (lambda m: _m(m, 5), lambda m, x: m.split_with_sizes(x, [2, 2])),
    "split_with_sizes-negative": (lambda m: _m(m, 4), lambda m, x: x.split_with_sizes([-1, 5])),
    "split_with_sizes-int": (lambda m: _m(m, 4), lambda m, x: x.split_with_sizes(2)),
    "sum_to_size": (lambda m: _m(m, 2, 3), lambda m, x: x.sum_to_size(2, 2)),
    "sum_to_size-longer": (lambda m: _m(m, 2, 3), lambda m, x: x.sum_to_size(4, 2, 3)),
    "narrow_copy": (lambda m: _m(m, 4, 3), lambda m, x: m.narrow_copy(x, 0, 3, 2)),
    "squeeze_-dim": (lambda m: _m(m, 1, 3, 1), lambda m, x: x.squeeze_(3)),
    "unsqueeze_-dim": (lambda m: _m(m, 1, 3), lambda m, x: x.unsqueeze_(3)),
    "transpose_-dim": (lambda m: _m(m, 1, 3), lambda m, x: x.transpose_(0, 2)),
    "t_-3d": (lambda m: _m(m, 1, 3, 1), lambda m, x: x.t_()),
    "t_-leaf": (lambda m: _m(m, 2, 3, rg=True), lambda m, x: x.t_()),
    "unsqueeze_-view-of-leaf": (lambda m: _m(m, 2, 3, rg=True), lambda m, x: x[0].unsqueeze_(0)),
    "unsqueeze_-split-piece": (lambda m: _m(m, 4, 3, rg=True) * 1, lambda m, x: x.split(2)[0].unsqueeze_(0)),
    "resize_-requires-grad": (lambda m: _m(m, 3, rg=True), lambda m, x: x.resize_(2, 2)),
    "resize_-non-leaf": (lambda m: _m(m, 3, rg=True) * 1, lambda m, x: x.resize_(3)),
    "resize_-negative": (lambda m: _m(m, 3), lambda m, x: x.resize_(-1)),
    "H-3d": (lambda m: _m(m, 2, 3, 4), lambda m, x: x.H),
    "mH-1d": (lambda m: _m(m, 3), lambda m, x: x.mH),
    "adjoint-1d": (lambda m: _m(m, 3), lambda m, x: m.adjoint(x)),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_like_torch(name):
    make, fn = ERRORS[name]
    _like_torch(make, fn)


# -- in-place shape methods and autograd ---------------------------------------------------------------

def _grads(lib, program):
    g = torch.Generator().manual_seed(0)
    x0 = torch.randn(3, 4, generator=g, dtype=torch.float64)
    x = (flow.from_torch(x0.clone()) if lib is flow else x0.clone()).requires_grad_()
    out = program(lib, x)
    out.backward()
    return out.detach().numpy(), x.grad.numpy()


def _t_then_use(lib, x):
    y = x * 1
    y.t_()
    return (y * lib.arange(3.0, dtype=lib.float64)).sum()


def _view_t_then_write(lib, x):
    y = x * 1
    v = y[1:]
    v.t_()
    v.mul_(3)
    return (y * lib.arange(4.0, dtype=lib.float64)).sum()


def _rows_unsqueezed_then_base_written(lib, x):
    y = x * 1
    r = y[0]
    r.unsqueeze_(0)
    y.mul_(2)
    return (r * 3).sum()


@pytest.mark.parametrize("program", [_t_then_use, _view_t_then_write, _rows_unsqueezed_then_base_written],
                         ids=lambda p: p.__name__)
def test_inplace_shape_methods_grads_like_torch(program):
    for got, want in zip(_grads(flow, program), _grads(torch, program)):
        torch.testing.assert_close(torch.as_tensor(got), torch.as_tensor(want))


def test_inplace_shape_method_returns_self_and_bumps_the_version():
    for lib in (torch, flow):
        x = lib.zeros(2, 3)
        v0 = x._version
        assert x.t_() is x and tuple(x.shape) == (3, 2) and x._version == v0 + 1
        assert x.unsqueeze_(0).squeeze_(0) is x and not x.is_contiguous()


def test_inplace_shape_change_of_a_saved_tensor_fails_in_backward_like_torch():
    for lib in (torch, flow):
        x = lib.ones(3, 4, requires_grad=True)
        y = x * 1
        z = y * y   # saves y
        y.t_()
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            z.sum().backward()


def test_inplace_shape_change_no_grad_leaf_like_torch():
    for lib in (torch, flow):
        x = lib.ones(3, 4, requires_grad=True)
        with lib.no_grad():
            x.t_()
        assert tuple(x.shape) == (4, 3) and x.requires_grad and x.is_leaf


def test_inplace_shape_change_refused_where_holoflow_cannot_follow_old_views():
    """torch re-derives views from strides; holoflow from their base by ops, so views taken before
    an in-place shape change of their base would follow the new shape: refused while recording."""
    y = flow.ones(3, 4, requires_grad=True) * 1
    v = y[1:]
    with pytest.raises(RuntimeError, match=r"holoflow\.t_: this tensor has views"):
        y.t_()
    del v
    assert tuple(y.t_().shape) == (4, 3)     # no view left: fine
    with flow.no_grad():                     # no history to re-derive: fine
        w = y[1:]
        y.t_()
    assert tuple(w.shape) == (3, 3) and tuple(y.shape) == (3, 4)


def test_inplace_shape_method_on_global_is_unsupported():
    x = flow.zeros(2, 2).to_global(flow.placement("cpu", [0]), flow.sbp.broadcast)
    with pytest.raises(NotImplementedError, match=r"holoflow\.t_"):
        x.t_()


# -- resize_, new_empty_strided -----------------------------------------------------------------------------

def test_resize_like_torch():
    for shape in ((2, 2), (3, 3), (6,), (0,)):
        t, f = torch.arange(6.0), flow.arange(6.0)
        assert f.resize_(*shape) is f
        t.resize_(*shape)
        assert tuple(f.shape) == tuple(t.shape) and f.stride() == t.stride()
        n = min(6, t.numel())
        assert f.flatten()[:n].tolist() == t.flatten()[:n].tolist()   # the kept elements (the rest are uninitialised)
    f = flow.zeros(4, 3).t()
    assert f.resize_(3, 4) is f and f.stride() == (1, 3)              # the same shape: unchanged
    assert tuple(flow.ones(3).resize_as_(flow.ones(2, 2)).shape) == (2, 2)


def test_resize_growing_keeps_views_aliased():
    x = flow.arange(4.0)
    v = x.view(2, 2)
    x.resize_(3, 3)
    x.fill_(7.0)
    assert v.tolist() == [[7.0, 7.0], [7.0, 7.0]]


def test_resize_of_a_view_to_another_shape_is_unsupported():
    x = flow.zeros(4, 3)
    with pytest.raises(NotImplementedError, match=r"holoflow\.resize_: cannot resize a view"):
        x[1:].resize_(5, 5)
    assert tuple(x[1:].resize_(3, 3).shape) == (3, 3)


def test_new_empty_strided_like_torch():
    for lib in (torch, flow):
        x = lib.ones(2, dtype=lib.float64)
        y = x.new_empty_strided((2, 3), (1, 2))
        assert tuple(y.shape) == (2, 3) and y.stride() == (1, 2) and y.dtype == lib.float64
        z = x.new_empty_strided((2,), (3,), dtype=lib.int32, requires_grad=False)
        assert z.stride() == (3,) and z.dtype == lib.int32


# -- index_put with masks, in place on a leaf under no_grad ---------------------------------------------------

def test_index_put_bool_mask_and_inplace_like_torch():
    for accumulate in (False, True):
        outs = []
        for lib in (torch, flow):
            x = lib.zeros(4, 3)
            m = lib.tensor([True, False, True, True])
            y = lib.index_put(x, (m,), lib.ones(3) * 2, accumulate=accumulate)
            with lib.no_grad():
                x.index_put_((lib.tensor([0, 0]), lib.tensor([1, 1])), lib.tensor([1.0, 2.0]), accumulate)
            outs.append((y.tolist(), x.tolist()))
        assert outs[0] == outs[1]


# -- trivial properties -----------------------------------------------------------------------------------

@pytest.mark.parametrize("dtype", ["float32", "int64", "uint8", "bool"])
def test_trivial_properties_like_torch(dtype):
    t = torch.ones(2, 3, dtype=getattr(torch, dtype))
    f = flow.ones(2, 3, dtype=getattr(flow, dtype))
    for name in ("ndimension", "get_device", "is_signed", "is_conj", "is_neg", "is_pinned", "is_shared"):
        assert getattr(f, name)() == getattr(t, name)(), name
    assert f.is_cpu == t.is_cpu
    assert f.resolve_conj() is f and f.resolve_neg() is f
    assert f.share_memory_() is f and f.is_shared() == t.share_memory_().is_shared()


def test_retains_grad_like_torch():
    for lib in (torch, flow):
        leaf = lib.ones(2, requires_grad=True)
        y = leaf * 2
        assert not y.retains_grad
        y.retain_grad()
        leaf.retain_grad()
        assert y.retains_grad and not leaf.retains_grad
        y.sum().backward()
        assert y.grad.tolist() == [1.0, 1.0]


def test_pin_memory_like_torch():
    t, f = torch.ones(2), flow.ones(2)
    want, got = raised(t.pin_memory), raised(f.pin_memory)
    if want is None:   # a CUDA build with a device: a pinned copy
        assert got is None and f.pin_memory().is_pinned() and not f.is_pinned()
    else:              # no accelerator: torch's error
        assert isinstance(got, type(want)) and "holoflow.pin_memory" in str(got)
    with pytest.raises(NotImplementedError, match=r"holoflow\.pin_memory"):
        flow.ones(2, requires_grad=True).pin_memory()


def test_cat_and_stack_gradients_keep_each_inputs_dtype():
    """cat/stack promote mixed dtypes; each input's gradient comes back in its own dtype, as torch's
    (a float32 input of a float64 cat once got a float64 gradient, a real input of a complex one a
    complex gradient)."""
    for lib in (torch, flow):
        a = lib.ones(2, 3, requires_grad=True)
        b = lib.ones(1, 3, dtype=lib.float64, requires_grad=True)
        (lib.cat([a, b]) * 2).sum().backward()
        assert str(a.grad.dtype).endswith("float32") and str(b.grad.dtype).endswith("float64")
        assert a.grad.tolist() == [[2.0] * 3] * 2
        r = lib.ones(3, requires_grad=True)
        z = lib.zeros(3, dtype=lib.complex64)
        lib.view_as_real(lib.stack([r, z]) * (1 + 2j)).sum().backward()
        assert str(r.grad.dtype).endswith("float32") and r.grad.tolist() == [3.0] * 3


@pytest.mark.parametrize("start", [(2, 3, 4, 5), (5,), (2, 3, 4, 5, "cl")])
def test_resize_with_a_memory_format_restrides_as_torch_even_at_the_same_shape(start):
    """``x.resize_(x.shape, memory_format=channels_last)`` returned x unchanged (contiguous)."""
    for lib in (torch, flow):
        x = lib.zeros(*[s for s in start if s != "cl"])
        if "cl" in start:
            x = x.contiguous(memory_format=lib.channels_last)
        y = x.resize_(2, 3, 4, 5, memory_format=lib.channels_last)
        assert y.stride() == (60, 1, 15, 3)
        y = x.resize_(2, 3, 4, 5, memory_format=lib.contiguous_format)
        assert y.stride() == (60, 20, 5, 1)

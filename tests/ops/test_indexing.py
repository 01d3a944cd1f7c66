"""Indexing ops vs torch: getitem/setitem (basic and advanced), gather/scatter, index_*, masked_*,
nonzero, sort/topk/unique/searchsorted; plus the grad ops called directly so their SBP rules are
validated too (the harness records forward ops only)."""
import pytest
import torch

import holoflow as flow
from harness import BF16, F32, F64, Case, parametrize, randn
from holoflow.core.dispatch import apply
from holoflow.ops import indexing as I
from holoflow.ops import layout as SH
from holoflow.ops import scatter as SC

ALL = (F32, F64, BF16)
LONG = torch.int64


def one(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


def idx(*vals):
    return torch.tensor(vals, dtype=LONG)


def get(index, shape=(3, 4, 5), **kw):
    """A getitem case with a fixed index (tensors in the index are torch; converted per side)."""
    def conv(lib):
        def c(v):
            if isinstance(v, torch.Tensor):
                return flow.from_torch(v) if lib is flow else v
            if isinstance(v, tuple):
                return tuple(c(x) for x in v)
            return v
        return c(index)
    return Case(f"getitem{index!r}".replace(" ", "")[:60], lambda x: x[conv(flow)], lambda x: x[conv(torch)],
                one(*shape), **kw)


MASK = torch.tensor([[True, False, True, True], [False, False, True, False], [True, True, False, True]])

CASES = [
    # basic indexing: ints, negative ints, slices with steps, None, Ellipsis
    get(1, dtypes=ALL), get(-1), get((slice(None), 2)), get((slice(None), slice(1, 3), -2)),
    get((slice(None, None, 2), slice(None), slice(1, None, 3))), get((None, 0, None, slice(None))),
    get((Ellipsis, 1)), get((1, Ellipsis, None)), get((slice(5, 9),)), get(Ellipsis),
    get((slice(None), slice(None), slice(None)), shape=(0, 2, 3)),
    # advanced: int tensors/lists, combined with slices and ints; bool masks
    get(idx(0, 2, 2, 1), dtypes=ALL), get((slice(None), idx(3, 0, 0))), get((slice(None), [1, 1], slice(None))),
    get((idx(0, 2), slice(None), idx(1, 4))), get((slice(None), idx(0, 1), idx(2, 2))),
    get((idx(0, 1), None, idx(2, 3))), get((1, slice(None), idx(4, 0, 4))), get((Ellipsis, idx(-1, 0))),
    get(torch.tensor([[0, 1], [2, 2]])), get((slice(None), torch.tensor([[0], [3]]), torch.tensor([1, 2]))),
    get(MASK), get((MASK, slice(1, 4))), get((slice(None), MASK[0])), get((MASK[:, 0], 1, idx(0, 0))),
    get((slice(None), torch.zeros(0, dtype=LONG))),
    # narrow / select
    Case("narrow-select", lambda x: (x.narrow(1, 1, 2), flow.narrow(x, -1, 0, 3), x.select(0, -1), flow.select(x, 2, 1)),
         lambda x: (x.narrow(1, 1, 2), torch.narrow(x, -1, 0, 3), x.select(0, -1), torch.select(x, 2, 1)),
         one(3, 4, 5), dtypes=ALL),
    # gather / scatter
    Case("gather", lambda x, i: flow.gather(x, 1, i), lambda x, i: torch.gather(x, 1, i),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), torch.randint(0, 4, (3, 6), generator=g)), {}), dtypes=ALL),
    Case("gather-dim0-small", lambda x, i: x.gather(0, i), lambda x, i: x.gather(0, i),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), torch.randint(0, 4, (2, 3), generator=g)), {})),
    Case("take_along_dim", lambda x, i: flow.take_along_dim(x, i, 0), lambda x, i: torch.take_along_dim(x, i, 0),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), torch.randint(0, 4, (5, 3), generator=g)), {})),
    Case("scatter-src", lambda x, i, s: flow.scatter(x, 1, i, s), lambda x, i, s: torch.scatter(x, 1, i, s),
         lambda dt, g: ((randn(3, 5, gen=g, dtype=dt), torch.tensor([[0, 2], [4, 1], [3, 3]]),
                         randn(3, 2, gen=g, dtype=dt)), {}), gradcheck=False),
    Case("scatter-unique", lambda x, i, s: x.scatter(0, i, s), lambda x, i, s: x.scatter(0, i, s),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), torch.tensor([[0, 1, 2], [3, 0, 1]]),
                         randn(2, 3, gen=g, dtype=dt)), {}), dtypes=ALL),
    Case("scatter-value", lambda x, i: flow.scatter(x, 0, i, value=2.5), lambda x, i: torch.scatter(x, 0, i, value=2.5),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), torch.tensor([[0, 1, 2], [3, 0, 1]])), {})),
    Case("scatter_add", lambda x, i, s: flow.scatter_add(x, 1, i, s), lambda x, i, s: torch.scatter_add(x, 1, i, s),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), torch.randint(0, 4, (3, 6), generator=g),
                         randn(3, 6, gen=g, dtype=dt)), {}), dtypes=ALL),
    # index_select / index_add / index_fill
    Case("index_select", lambda x, i: (flow.index_select(x, 1, i), x.index_select(0, i[3:])),
         lambda x, i: (torch.index_select(x, 1, i), x.index_select(0, i[3:])),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), idx(3, 0, 3, 1, 0)), {}), dtypes=ALL),
    Case("index_select-empty", lambda x, i: x.index_select(1, i), lambda x, i: x.index_select(1, i),
         lambda dt, g: ((randn(0, 4, gen=g, dtype=dt), idx(1, 1)), {})),
    Case("index_add", lambda x, i, s: flow.index_add(x, 0, i, s, alpha=2), lambda x, i, s: torch.index_add(x, 0, i, s, alpha=2),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), idx(1, 3, 1), randn(3, 3, gen=g, dtype=dt)), {})),
    Case("index_fill", lambda x, i: (flow.index_fill(x, 1, i, -1.0), x.index_fill(0, i[:1], 0.0)),
         lambda x, i: (torch.index_fill(x, 1, i, -1.0), x.index_fill(0, i[:1], 0.0)),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), idx(0, 2)), {})),
    # (a 0-d tensor value was a TypeError; its gradient is what the filled entries receive,
    # each once under duplicate indices)
    Case("index_fill-tensor-value", lambda x, i, v: (flow.index_fill(x, 1, i, v), x.index_fill(0, i[:1], v * 2)),
         lambda x, i, v: (torch.index_fill(x, 1, i, v), x.index_fill(0, i[:1], v * 2)),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), idx(0, 2, 0), randn(gen=g, dtype=dt)), {})),
    Case("index_fill_-tensor-value", lambda x, i, v: (x * 1).index_fill_(1, i, v),
         lambda x, i, v: (x * 1).index_fill_(1, i, v),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), idx(3, 1), randn(gen=g, dtype=dt)), {})),
    # masked_fill / masked_select
    Case("masked_fill", lambda x, m: (flow.masked_fill(x, m, 0.5), x.masked_fill(m, 0.0)),
         lambda x, m: (torch.masked_fill(x, m, 0.5), x.masked_fill(m, 0.0)),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(4, gen=g) > 0), {}), dtypes=ALL),
    Case("masked_fill-tensor-value", lambda x, m, v: x.masked_fill(m, v), lambda x, m, v: x.masked_fill(m, v),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(3, 4, gen=g) > 0, randn(gen=g, dtype=dt)), {})),
    Case("masked_select", lambda x, m: flow.masked_select(x, m), lambda x, m: torch.masked_select(x, m),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(3, 4, gen=g) > 0), {}), dtypes=ALL),
    Case("masked_select-broadcast", lambda x, m: x.masked_select(m), lambda x, m: x.masked_select(m),
         lambda dt, g: ((randn(4, gen=g, dtype=dt), randn(3, 4, gen=g) > 0), {})),
    # nonzero
    Case("nonzero", lambda x: (flow.nonzero(x), x.nonzero(as_tuple=True), flow.where(x > 0)),
         lambda x: (torch.nonzero(x), x.nonzero(as_tuple=True), torch.where(x > 0)),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt).round(),), {}), grad=False),
    # (a 0-d input's as_tuple form raised from a reshape of its (n, 0) result)
    Case("nonzero-0d", lambda x, z: (flow.nonzero(x, as_tuple=True), z.nonzero(as_tuple=True), flow.nonzero(x)),
         lambda x, z: (torch.nonzero(x, as_tuple=True), z.nonzero(as_tuple=True), torch.nonzero(x)),
         lambda dt, g: ((torch.tensor(2.5, dtype=dt), torch.tensor(0.0, dtype=dt)), {}), grad=False),
    # sorting
    Case("sort", lambda x: (flow.sort(x, dim=1, stable=True), x.sort(dim=0, descending=True, stable=True)),
         lambda x: (torch.sort(x, dim=1, stable=True), x.sort(dim=0, descending=True, stable=True)), one(3, 5), dtypes=ALL),
    Case("sort-ties-stable", lambda x: flow.sort(x, stable=True, descending=True),
         lambda x: torch.sort(x, stable=True, descending=True),
         lambda dt, g: ((torch.tensor([1.0, 2.0, 1.0, 2.0, 0.0], dtype=dt),), {}), gradcheck=False),
    Case("argsort", lambda x: (flow.argsort(x), x.argsort(0, descending=True)),
         lambda x: (torch.argsort(x), x.argsort(0, descending=True)), one(4, 3), grad=False),
    Case("topk", lambda x: (flow.topk(x, 2), x.topk(3, 0, largest=False)),
         lambda x: (torch.topk(x, 2), x.topk(3, 0, largest=False)), one(4, 5), dtypes=ALL),
    Case("unique", lambda x: (flow.unique(x), flow.unique(x, return_inverse=True, return_counts=True),
                              x.unique(return_counts=True, dim=0)),
         lambda x: (torch.unique(x), torch.unique(x, return_inverse=True, return_counts=True),
                    x.unique(return_counts=True, dim=0)),
         lambda dt, g: ((torch.tensor([[1, 3, 1], [2, 2, 0], [1, 3, 1]]),), {}), grad=False, dtypes=(F32,)),
    Case("searchsorted", lambda s, v: (flow.searchsorted(s, v), flow.searchsorted(s, v, right=True)),
         lambda s, v: (torch.searchsorted(s, v), torch.searchsorted(s, v, right=True)),
         lambda dt, g: ((torch.tensor([0.0, 1.0, 1.0, 3.0], dtype=dt), torch.tensor([[1.0, 2.5], [-1.0, 9.0]], dtype=dt)), {}),
         grad=False),
    Case("searchsorted-batched", lambda s, v: flow.searchsorted(s, v), lambda s, v: torch.searchsorted(s, v),
         lambda dt, g: ((torch.sort(randn(3, 5, gen=g, dtype=dt), -1).values, randn(3, 2, gen=g, dtype=dt)), {}),
         grad=False),
    # (sorter and a number as the value were TypeErrors; a bad side was read as 'left')
    Case("searchsorted-sorter", lambda s, v, o: (flow.searchsorted(s, v, sorter=o),
                                                 flow.searchsorted(s, v, side="right", sorter=o)),
         lambda s, v, o: (torch.searchsorted(s, v, sorter=o), torch.searchsorted(s, v, side="right", sorter=o)),
         lambda dt, g: ((torch.tensor([[3.0, 1.0, 2.0, 1.0], [0.0, 5.0, 4.0, -2.0]], dtype=dt),
                         torch.tensor([[1.0, 2.5, 9.0], [4.0, -3.0, 0.5]], dtype=dt),
                         torch.tensor([[1, 3, 2, 0], [3, 0, 2, 1]])), {}),
         grad=False),
    Case("searchsorted-sorter-1d", lambda s, v, o: flow.searchsorted(s, v, sorter=o, out_int32=True),
         lambda s, v, o: torch.searchsorted(s, v, sorter=o, out_int32=True),
         lambda dt, g: ((torch.tensor([3.0, 1.0, 2.0, 0.0], dtype=dt), torch.tensor([[1.5, 2.0], [-1.0, 4.0]], dtype=dt),
                         torch.tensor([3, 1, 2, 0])), {}),
         grad=False),
    Case("searchsorted-number", lambda s: (flow.searchsorted(s, 1.0), flow.searchsorted(s, 1, side="right")),
         lambda s: (torch.searchsorted(s, 1.0), torch.searchsorted(s, 1, side="right")),
         lambda dt, g: ((torch.tensor([0.0, 1.0, 1.0, 3.0], dtype=dt),), {}), grad=False),
]


# -- setitem: out-of-place wrappers (clone, then write) so the harness can compare and differentiate --

def setitem_case(name, index, vshape, xshape=(3, 4, 5), scalar=None, **kw):
    def fn(lib):
        def run(x, v=None):
            y = x * 1  # a non-leaf target, as an in-place write on a leaf needing grad is an error
            ix = tuple(flow.from_torch(i) if lib is flow and isinstance(i, torch.Tensor) else i for i in index) \
                if isinstance(index, tuple) else index
            y[ix] = scalar if v is None else v
            return y
        return run

    def make(dt, g):
        x = randn(*xshape, gen=g, dtype=dt)
        return ((x,) if vshape is None else (x, randn(*vshape, gen=g, dtype=dt))), {}
    return Case(f"setitem-{name}", fn(flow), fn(torch), make, **kw)


CASES += [
    setitem_case("int-scalar", (1,), None, scalar=2.0, dtypes=ALL),
    setitem_case("slice-tensor", (slice(None), slice(1, 3)), (3, 2, 5), dtypes=ALL),
    setitem_case("broadcast", (Ellipsis, 0), (4,)),
    setitem_case("leading-ones", (0,), (1, 4, 5)),
    setitem_case("adv", (slice(None), idx(3, 0)), (3, 2, 5)),
    setitem_case("adv-scalar", (idx(0, 2), slice(None), idx(1, 4)), None, scalar=-1.0),
    setitem_case("mask", (MASK,), (5,)),
    setitem_case("step-none", (slice(None, None, 2), None, 1), (2, 1, 5)),
]



def put(index):
    def run(x, v):
        y = x.clone()
        y[index] = v
        return y
    return run


# index_put (setitem's op) called directly: under no_grad setitem writes in place without dispatch
_IP = torch.tensor([3, 0])
CASES += [
    Case("index_put-slices", lambda x, v: apply(I.INDEX_PUT, x, v, spec=(slice(None), slice(1, 3))),
         put((slice(None), slice(1, 3))), lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt), randn(3, 2, 5, gen=g, dtype=dt)), {})),
    Case("index_put-adv-broadcast", lambda x, v, i: apply(I.INDEX_PUT, x, v, i, spec=(slice(None), "T")),
         lambda x, v, i: put((slice(None), i))(x, v),
         lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt), randn(5, gen=g, dtype=dt), _IP), {})),
    Case("index_put-scalar", lambda x, i: apply(I.INDEX_PUT, x, 2.0, i, spec=(Ellipsis, "T")),
         lambda x, i: put((Ellipsis, i))(x, 2.0), lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt), _IP), {})),
]

# the grad ops, called directly with torch equivalents, so every signature they declare is validated
_G = torch.Generator().manual_seed(3)
CASES += [
    Case("getitem_backward", lambda d: apply(I.GETITEM_BACKWARD, d, spec=(slice(None), 1, slice(0, 4, 2)), shape=(3, 4, 5)),
         lambda d: torch.zeros(3, 4, 5, dtype=d.dtype, device=d.device).index_put(
             (torch.arange(3, device=d.device)[:, None], torch.tensor(1, device=d.device),
              torch.tensor([0, 2], device=d.device)), d),
         one(3, 2)),
    Case("index_backward", lambda d, i: apply(I.INDEX_BACKWARD, d, i, spec=(slice(None), "T"), shape=(3, 4, 2)),
         lambda d, i: torch.zeros(3, 4, 2, dtype=d.dtype, device=d.device).index_add(1, i.reshape(-1), d.reshape(3, -1, 2)),
         lambda dt, g: ((randn(3, 2, 3, 2, gen=g, dtype=dt), torch.tensor([[0, 3, 3], [1, 0, 3]])), {})),
    Case("index_backward-mask", lambda d, m: apply(I.INDEX_BACKWARD, d, m, spec=("T",), shape=(3, 4)),
         lambda d, m: torch.zeros(3, 4, dtype=d.dtype, device=d.device).masked_scatter(m, d),
         lambda dt, g: ((randn(int(MASK.sum()), gen=g, dtype=dt), MASK), {})),
    Case("gather_backward", lambda d, i: apply(SC.GATHER_BACKWARD, d, i, dim=1, shape=(3, 4)),
         lambda d, i: torch.zeros(3, 4, dtype=d.dtype, device=d.device).scatter_add(1, i, d),
         lambda dt, g: ((randn(3, 6, gen=g, dtype=dt), torch.randint(0, 4, (3, 6), generator=g)), {})),
    Case("index_select_backward", lambda d, i: apply(SC.INDEX_SELECT_BACKWARD, d, i, dim=1, shape=(3, 4)),
         lambda d, i: torch.zeros(3, 4, dtype=d.dtype, device=d.device).index_add(1, i, d),
         lambda dt, g: ((randn(3, 5, gen=g, dtype=dt), idx(3, 0, 3, 1, 0)), {})),
    Case("masked_select_backward", lambda d, m: apply(I.MASKED_SELECT_BACKWARD, d, m, shape=(3, 4)),
         lambda d, m: torch.zeros(3, 4, dtype=d.dtype, device=d.device).masked_scatter(m, d),
         lambda dt, g: ((randn(int(MASK.sum()), gen=g, dtype=dt), MASK), {})),
    Case("diagonal_backward", lambda d: apply(SH.DIAGONAL_BACKWARD, d, shape=(3, 4, 5), offset=1, dim1=0, dim2=2),
         lambda d: torch.diagonal_scatter(torch.zeros(3, 4, 5, dtype=d.dtype, device=d.device), d, 1, 0, 2), one(4, 3)),
    Case("pad_backward", lambda d: apply(SH.PAD_BACKWARD, d, pad=(2, 1, 1, 0), mode="reflect"),
         lambda d: torch.autograd.grad(torch.nn.functional.pad(
             x := torch.zeros(2, 3, 4, dtype=d.dtype, device=d.device, requires_grad=True), (2, 1, 1, 0), "reflect"), x, d,
             create_graph=True)[0], one(2, 4, 7)),
]


def cloned(fn):
    """Clones outputs: the harness's gradcheck perturbs inputs in place and reads the outputs after
    restoring them, which a view output would follow (its finite difference would read 0)."""
    def run(*args, **kwargs):
        out = fn(*args, **kwargs)
        if isinstance(out, flow.Tensor):
            return out.clone()
        if isinstance(out, tuple) and not hasattr(out, "_fields"):
            return tuple(o.clone() if isinstance(o, flow.Tensor) else o for o in out)
        return out
    return run


for _case in CASES:
    _case.flow_fn = cloned(_case.flow_fn)
globals().update(parametrize(CASES))


# -- errors and semantics beyond the table --------------------------------------------------------------

def test_out_of_range_index_is_clear():
    x = flow.randn(3, 4)
    with pytest.raises(IndexError, match=r"^holoflow\.getitem: index 5 is out of bounds for dim 0 with size 3$"):
        x[5]
    with pytest.raises(IndexError, match=r"index -5 is out of bounds for dim 1 with size 4"):
        x[..., -5]
    with pytest.raises(IndexError, match=r"index 4 is out of bounds for dim 1 with size 4"):
        x[:, flow.tensor([0, 4])]
    with pytest.raises(IndexError, match=r"index 3 is out of bounds for dim 0 with size 3"):
        x[[3]] = 1.0
    with pytest.raises(IndexError, match="too many indices"):
        x[0, 0, 0]
    with pytest.raises(IndexError, match="long, int, byte or bool"):
        x[flow.tensor([0.0])]


def test_getitem_basic_is_a_view_and_setitem_writes_through():
    x = flow.zeros(3, 4)
    row = x[1]
    x[1, 2:] = 7.0
    assert row.tolist() == [0.0, 0.0, 7.0, 7.0]
    v = x[:, 1]
    v[0] = 5.0    # setitem on a view writes into the base
    assert x[0, 1].item() == 5.0


def test_setitem_grad_flows_to_value_and_target():
    for lib in (torch, flow):
        x = lib.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], requires_grad=True)
        v = lib.tensor([10.0, 20.0], requires_grad=True)
        y = x * 2
        y[:, 1] = v * v
        y[0, 0] = 0.0
        (y * lib.tensor([1.0, 2.0, 3.0])).sum().backward() if lib is torch else \
            (y * lib.tensor([1.0, 2.0, 3.0])).backward(lib.ones(2, 3))
        if lib is torch:
            want = (x.grad.clone(), v.grad.clone())
    torch.testing.assert_close(x.grad.to_torch(), want[0])
    torch.testing.assert_close(v.grad.to_torch(), want[1])


def test_getitem_duplicate_indices_accumulate_grad():
    x = flow.tensor([1.0, 2.0, 3.0], requires_grad=True)
    y = x[[0, 0, 2, 0]]
    y.backward(flow.ones(4))
    assert x.grad.tolist() == [3.0, 0.0, 1.0]


def test_leaf_setitem_needs_no_grad():
    x = flow.ones(3, requires_grad=True)
    with pytest.raises(RuntimeError, match="leaf tensor that requires grad"):
        x[0] = 2.0
    with flow.no_grad():
        x[0] = 2.0
    assert x.tolist() == [2.0, 1.0, 1.0]


def test_inplace_scatter_family_matches_torch():
    t = torch.zeros(3, 4)
    f = flow.zeros(3, 4)
    i = torch.tensor([[0, 1], [2, 3], [1, 1]])
    s = torch.arange(6.0).reshape(3, 2)
    for fn in (lambda x, ii, ss: x.scatter_(1, ii, ss), lambda x, ii, ss: x.scatter_add_(1, ii, ss),
               lambda x, ii, ss: x.scatter_(1, ii, value=9.0), lambda x, ii, ss: x.index_add_(0, ii[0], ss[:2].repeat(1, 2)),
               lambda x, ii, ss: x.index_fill_(1, ii[0], -2.0), lambda x, ii, ss: x.masked_fill_(x > 3, 0.5),
               lambda x, ii, ss: x.index_fill_(0, ii[2], ss[2, 1])):
        fn(t, i, s)
        fn(f, flow.from_torch(i), flow.from_torch(s))
        torch.testing.assert_close(f.to_torch(), t)


def test_sort_returns_namedtuple():
    out = flow.sort(flow.tensor([3.0, 1.0, 2.0]))
    assert out.values.tolist() == [1.0, 2.0, 3.0] and out.indices.tolist() == [1, 2, 0]
    v, i = flow.topk(flow.tensor([3.0, 1.0, 2.0]), 1)
    assert v.tolist() == [3.0] and i.tolist() == [0]
    with pytest.raises(IndexError, match=r"holoflow\.topk: k=4"):
        flow.topk(flow.tensor([3.0, 1.0, 2.0]), 4)


def test_masked_fill_rejects_non_scalar_tensor_value():
    with pytest.raises(ValueError, match=r"holoflow\.masked_fill: value must be a number or a 0-d tensor"):
        flow.masked_fill(flow.zeros(3), flow.tensor([True, False, True]), flow.ones(3))


@pytest.mark.parametrize("kwargs, match", [
    (dict(side="middle"), "side can only be 'left' or 'right'"),
    (dict(side="left", right=True), "side and right can't be set to opposites"),
    (dict(sorter=[3.0, 1.0, 2.0, 0.0]), "sorter must be a tensor of long dtype"),
    (dict(sorter=[3, 1, 2]), "boundary and sorter must have the same size"),
])
def test_searchsorted_refuses_torchs_bad_arguments(kwargs, match):
    """(a side other than 'left'/'right' was read as 'left', a side contradicting right won)"""
    for lib in (torch, flow):
        kw = {k: lib.tensor(v) if k == "sorter" else v for k, v in kwargs.items()}
        with pytest.raises(RuntimeError, match=match):
            lib.searchsorted(lib.tensor([3.0, 1.0, 2.0, 0.0]), lib.tensor([1.5]), **kw)
    with pytest.raises(RuntimeError, match="scalar only when boundaries tensor dimension is 1"):
        flow.searchsorted(flow.zeros(2, 3), 1.0)


def test_index_fill_refuses_a_value_tensor_with_dims_as_torch():
    for lib in (torch, flow):
        with pytest.raises(RuntimeError, match="only supports a 0-dimensional value tensor"):
            lib.ones(3, 4).index_fill(1, lib.tensor([0]), lib.tensor([1.0, 2.0]))

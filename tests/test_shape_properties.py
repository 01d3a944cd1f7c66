"""Property tests (hypothesis) for broadcasting, reshape/view and indexing, against torch."""
import math

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import holoflow as flow

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dims = st.lists(st.integers(0, 4), min_size=0, max_size=4)


def _torch_error(fn):
    try:
        fn()
    except (RuntimeError, ValueError, IndexError) as e:
        return e
    return None


@st.composite
def shape_pairs(draw):
    """A shape and a second one derived from it (often broadcastable, sometimes not)."""
    a = draw(dims)
    b = []
    for d in a[draw(st.integers(0, len(a))):]:
        b.append(draw(st.sampled_from([d, 1, d, draw(st.integers(0, 4))])))
    lead = draw(st.lists(st.integers(1, 3), max_size=2))
    return tuple(a), tuple(lead + b)


@SETTINGS
@given(shape_pairs(), st.booleans())
def test_broadcasting_matches_torch(shapes, swap):
    sa, sb = shapes[::-1] if swap else shapes
    ta, tb = torch.randn(sa), torch.randn(sb)
    err = _torch_error(lambda: torch.add(ta, tb))
    if err is None:
        got = flow.add(flow.from_torch(ta), flow.from_torch(tb))
        assert tuple(got.shape) == tuple(torch.add(ta, tb).shape)
        torch.testing.assert_close(got.to_torch(), ta + tb)
    else:
        try:
            flow.add(flow.from_torch(ta), flow.from_torch(tb))
        except (RuntimeError, ValueError) as e:
            assert str(e).startswith("holoflow."), str(e)
            assert str(sa) in str(e) or str(tuple(sa)) in str(e)
        else:
            raise AssertionError(f"holoflow broadcast {sa} with {sb}; torch refused: {err}")


def _factor(n: int) -> list[int]:
    out, p = [], 2
    while n > 1 and p * p <= n:
        while n % p == 0:
            out.append(p)
            n //= p
        p += 1
    return out + ([n] if n > 1 else [])


@st.composite
def reshapes(draw):
    """A shape and a random factorization of its numel (with 1s, maybe one -1)."""
    shape = tuple(draw(st.lists(st.integers(1, 6), min_size=0, max_size=4)))
    factors = draw(st.permutations(_factor(math.prod(shape))))
    cuts = sorted(draw(st.lists(st.integers(0, len(factors)), max_size=3)))
    target, prev = [], 0
    for c in cuts + [len(factors)]:
        target.append(math.prod(factors[prev:c]))
        prev = c
    for _ in range(draw(st.integers(0, 2))):
        target.insert(draw(st.integers(0, len(target))), 1)
    if target and draw(st.booleans()):
        target[draw(st.integers(0, len(target) - 1))] = -1
    return shape, tuple(target)


@SETTINGS
@given(reshapes(), st.booleans())
def test_reshape_and_view_to_factorizations(case, use_view):
    shape, target = case
    t = torch.randn(shape, dtype=torch.float64)
    x = flow.from_torch(t.clone()).requires_grad_()
    y = x.view(target) if use_view else flow.reshape(x, target)
    want = t.view(target)
    assert tuple(y.shape) == tuple(want.shape)
    torch.testing.assert_close(y.to_torch(), want)
    up = torch.randn(want.shape, dtype=torch.float64)
    y.backward(flow.from_torch(up))
    torch.testing.assert_close(x.grad.to_torch(), up.reshape(shape))


@SETTINGS
@given(st.lists(st.integers(1, 5), max_size=3), st.lists(st.integers(0, 6), min_size=1, max_size=3))
def test_reshape_to_illegal_size_is_clear(shape, target):
    n = math.prod(shape)
    if math.prod(target) == n:
        target = target + [2]
    x = flow.randn(*shape)
    for fn in (x.reshape, x.view):
        try:
            fn(*target)
        except ValueError as e:
            assert str(e).startswith(("holoflow.reshape: cannot reshape", "holoflow.view: cannot reshape")), str(e)
            assert f"({n} elements)" in str(e) and str(tuple(target)) in str(e)
        else:
            raise AssertionError(f"reshape {tuple(shape)} -> {target} did not fail")


@st.composite
def index_exprs(draw):
    """A tensor shape and an index mixing ints, slices with steps, None, ..., lists, bool masks."""
    shape = tuple(draw(st.lists(st.integers(1, 4), min_size=1, max_size=4)))
    items, d = [], 0
    use_ellipsis = draw(st.booleans())
    while d < len(shape) and draw(st.integers(0, 4)) > 0:
        n = shape[d]
        kind = draw(st.sampled_from(["int", "slice", "none", "list", "mask", "ellipsis" if use_ellipsis else "slice"]))
        if kind == "int":
            items.append(draw(st.integers(-n, n - 1)))
        elif kind == "slice":
            a, b = draw(st.one_of(st.none(), st.integers(-n - 1, n + 1))), draw(st.one_of(st.none(), st.integers(-n - 1, n + 1)))
            items.append(slice(a, b, draw(st.one_of(st.none(), st.integers(1, 3)))))
        elif kind == "none":
            items.append(None)
            continue
        elif kind == "list":
            items.append(draw(st.lists(st.integers(-n, n - 1), min_size=1, max_size=3)))
        elif kind == "mask":
            items.append(torch.tensor(draw(st.lists(st.booleans(), min_size=n, max_size=n))))
        else:
            items.append(Ellipsis)
            use_ellipsis = False
            d = len(shape) - draw(st.integers(0, len(shape) - d - 1))
            continue
        d += 1
    return shape, tuple(items)


def _to_flow_index(index):
    return tuple(flow.from_torch(i) if isinstance(i, torch.Tensor) else i for i in index)


@SETTINGS
@given(index_exprs())
def test_indexing_matches_torch(case):
    shape, index = case
    t = torch.randn(shape, dtype=torch.float64)
    err = _torch_error(lambda: t[index])
    x = flow.from_torch(t.clone()).requires_grad_()
    if err is not None:   # e.g. broadcasting index lists of different lengths
        try:
            x[_to_flow_index(index)]
        except (IndexError, RuntimeError, ValueError) as e:
            assert str(e).startswith("holoflow."), str(e)
            return
        raise AssertionError(f"holoflow accepted {index!r}; torch refused: {err}")
    want = t.clone().requires_grad_()
    w = want[index]
    y = x[_to_flow_index(index)]
    assert tuple(y.shape) == tuple(w.shape), f"{index!r}: {tuple(y.shape)} vs torch {tuple(w.shape)}"
    torch.testing.assert_close(y.to_torch(), w.detach())
    up = torch.randn(w.shape, dtype=torch.float64)
    w.backward(up)
    y.backward(flow.from_torch(up))
    torch.testing.assert_close(x.grad.to_torch(), want.grad)


@SETTINGS
@given(index_exprs(), st.booleans())
def test_setitem_matches_torch(case, scalar):
    shape, index = case
    t = torch.randn(shape, dtype=torch.float64)
    if _torch_error(lambda: t[index]) is not None:
        return
    sub_shape = t[index].shape
    value = 1.5 if scalar else torch.randn(sub_shape[1:] if sub_shape else (), dtype=torch.float64)
    want = t.clone()
    want[index] = value
    x = flow.from_torch(t.clone())
    x[_to_flow_index(index)] = flow.from_torch(value) if isinstance(value, torch.Tensor) else value
    torch.testing.assert_close(x.to_torch(), want)

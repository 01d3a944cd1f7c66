"""The shape ops' fast argument paths (plain int sizes, one -1, in-range dims) give torch's
results and views, and every other argument still reaches the checks and errors of the slow path."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.core.errors import ShapeError
from holoflow.ops.shape import infer_shape


def _pair(shape=(2, 3, 4), rg=False):
    a = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
    return torch.tensor(a, requires_grad=rg), flow.tensor(a, requires_grad=rg)


@pytest.mark.parametrize("src, shape", [
    ((2, 3, 4), (6, 4)), ((2, 3, 4), (-1,)), ((2, 3, 4), (2, -1, 2)), ((2, 3, 4), (-1, 4)),
    ((0, 3), (0, 3)), ((0, 3), (3, 0)), ((0, 3), (-1, 3)), ((), ()), ((), (1, 1)), ((1,), ()),
    ((1,), (-1,)), ((2, 3, 4), (4, 1, -1, 1)),
])
def test_infer_shape_matches_torch(src, shape):
    assert infer_shape("view", src, shape) == tuple(torch.empty(src).view(shape).shape)


@pytest.mark.parametrize("src, shape", [
    ((2, 3, 4), (5, 4)), ((2, 3, 4), (-1, -1)), ((2, 3, 4), (-2, -12)), ((2, 3, 4), (-1, 5)),
    ((0, 3), (0, -1)), ((2, 3), (-1, -6)), ((2, 3), (6, -1, -1)), ((6,), (-3, -2)),
])
def test_infer_shape_rejects_what_torch_rejects(src, shape):
    with pytest.raises(RuntimeError):
        torch.empty(src).view(shape)
    with pytest.raises(ShapeError):
        infer_shape("view", src, shape)


@pytest.mark.parametrize("sizes", [((6, 4),), (6, 4), ((-1,),), (-1,), (torch.Size([4, 6]),),
                                   ((np.int64(6), 4),), (np.int64(24),)])
def test_view_reshape_size_forms(sizes):
    t, f = _pair()
    for name in ("view", "reshape"):
        got = getattr(f, name)(*sizes)
        want = getattr(t, name)(*sizes)
        assert tuple(got.shape) == tuple(want.shape)
        np.testing.assert_array_equal(got.numpy(), want.numpy())
        assert got._view is not None and got._view.base is f       # a view of f's storage


def test_size_of_a_wrong_type_still_raises():
    _, f = _pair()
    with pytest.raises(TypeError):
        f.view(6.0, 4)
    with pytest.raises(TypeError):
        f.reshape((True, 24))


@pytest.mark.parametrize("d0, d1", [(0, 1), (1, 0), (-1, 0), (2, -3), (1, 1), (-1, -1)])
def test_transpose_matches_torch(d0, d1):
    t, f = _pair()
    np.testing.assert_array_equal(f.transpose(d0, d1).numpy(), t.transpose(d0, d1).numpy())
    assert f.transpose(d0, d1).stride() == t.transpose(d0, d1).stride()


def test_transpose_bad_dims_and_0d():
    t, f = _pair()
    for d0, d1 in ((3, 0), (0, -4)):
        with pytest.raises(IndexError):
            f.transpose(d0, d1)
    with pytest.raises(TypeError):
        f.transpose(0.0, 1)
    np.testing.assert_array_equal(f.transpose(np.int64(0), 2).numpy(), t.transpose(0, 2).numpy())
    s = flow.tensor(3.0)
    assert s.transpose(0, -1).item() == torch.tensor(3.0).transpose(0, -1).item()


@pytest.mark.parametrize("dims", [(2, 0, 1), (-1, 0, 1), (0, 1, 2), (-3, -2, -1)])
def test_permute_matches_torch(dims):
    t, f = _pair()
    np.testing.assert_array_equal(f.permute(*dims).numpy(), t.permute(*dims).numpy())
    np.testing.assert_array_equal(f.permute(dims).numpy(), t.permute(dims).numpy())


@pytest.mark.parametrize("dims, err", [((0, 1), Exception), ((0, 0, 1), Exception), ((3, 0, 1), IndexError),
                                       ((-4, 0, 1), IndexError), ((0, 1, 2, 3), Exception)])
def test_permute_rejects_what_torch_rejects(dims, err):
    t, f = _pair()
    with pytest.raises(RuntimeError if err is Exception else err):
        t.permute(*dims)
    with pytest.raises(err):
        f.permute(*dims)


def test_split_sizes_and_views():
    t, f = _pair((2, 3, 10))
    for arg in (4, 10, 3, [2, 8], (1, 4, 5)):
        got, want = f.split(arg, dim=2), t.split(arg, dim=2)
        assert isinstance(got, tuple) and len(got) == len(want)
        for g, w in zip(got, want):
            np.testing.assert_array_equal(g.numpy(), w.numpy())
            assert g._view is not None and g._view.base is f


def _attention_like(lib, a):
    """split -> view -> transpose chains (GPT's attention) and, on another copy, a view chain that
    goes stale when its base is written in place; backward through all of them."""
    base = a * 1.0
    q, k, v = base.split(4, dim=2)
    q = q.view(2, 3, 2, 2).transpose(1, 2)
    k = k.reshape(2, 3, 2, -1).permute(0, 2, 3, 1)
    att = q @ k
    other = a * 1.0
    w = other.view(6, 12)[1:].transpose(0, 1).reshape(-1, 5)
    other.mul_(2.0)                  # w is stale: its history re-derives from other's new one
    y = (att * att).sum() + (v * v).sum() + q.transpose(-1, -2).sum() + (w * w).sum()
    y.backward()
    return y.detach().numpy()


def test_view_chains_inplace_and_autograd_match_torch():
    t, f = _pair((2, 3, 12), rg=True)
    np.testing.assert_allclose(_attention_like(flow, f), _attention_like(torch, t), rtol=1e-5)
    np.testing.assert_allclose(f.grad.numpy(), t.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_inplace_through_a_transposed_view_matches_torch():
    t, f = _pair((4, 6), rg=True)
    grads = []
    for lib, a in ((torch, t), (flow, f)):
        base = a * 1.0
        v = base.view(2, 2, 6).transpose(0, 2)     # a view of a view
        v.add_(1.0)                                # rebases base onto the write
        w = base.reshape(-1)
        (w * w).sum().backward()
        grads.append(a.grad.numpy() if lib is flow else a.grad.detach().numpy())
    np.testing.assert_allclose(grads[1], grads[0], rtol=1e-6)


def test_split_output_written_in_place_raises_as_torch():
    t, f = _pair((2, 6), rg=True)
    with pytest.raises(RuntimeError):
        (t * 1.0).split(3, dim=1)[0].mul_(2.0)
    with pytest.raises(RuntimeError):
        (f * 1.0).split(3, dim=1)[0].mul_(2.0)

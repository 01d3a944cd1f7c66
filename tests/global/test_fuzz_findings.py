"""Regression tests of what differential fuzzing (test_fuzz_global.py) found in eager global
tensors, each against torch on the whole tensor, on 2 simulated ranks."""
import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, P, S

W = np.arange(24.0).reshape(4, 6) / 5


def _on_two(fn):
    return world.simulate(2, lambda r: fn(flow.placement("cpu", [0, 1])))


@pytest.mark.parametrize("to", [S(0), S(1), P])
def test_a_new_layout_is_a_new_tensor(to):
    """``x.to_global(sbp=...)`` to another SBP shares no memory with ``x``: writing either later
    leaves the other as it was (B -> S(0) was a slice of x's storage, B -> P kept rank 0's)."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B])
        y = x.to_global(sbp=[to])
        x.mul_(10)
        y.add_(1)
        return x.to_local().numpy(), y.to_global(sbp=[B]).to_local().numpy()
    for xs, ys in _on_two(run):
        np.testing.assert_allclose(xs, W * 10)
        np.testing.assert_allclose(ys, W + 1)


def test_detach_of_a_boxed_view_reads_its_source_now():
    """``x.reshape(-1)`` of a column-split tensor is a copy standing for a view; after a write to
    ``x`` its ``detach()`` gives the new values (it gave the old ones), as torch's view does."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)])
        r = x.reshape(-1)
        x[3:] = 0.5
        return r.detach().to_global(sbp=[B]).to_local().numpy()
    want = W.copy()
    want[3:] = 0.5
    for got in _on_two(run):
        np.testing.assert_allclose(got, want.reshape(-1))


def test_a_reshape_torch_copies_is_a_copy_on_split_tensors():
    """``a.t().reshape(-1)`` copies in torch (no view can reshape a transposed tensor): writing
    the result in place neither fails as a write through a leaf's view nor reaches ``a``."""
    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        r = a.t().reshape(-1)
        r.add_(r)
        (r * flow.tensor(np.arange(24.0)).to_global(placement=place, sbp=[B])).sum().backward()
        return r.to_global(sbp=[B]).to_local().detach().numpy(), a.grad.to_global(sbp=[B]).to_local().numpy()
    ta = torch.tensor(W, requires_grad=True)
    tr = ta.t().reshape(-1)
    tr.add_(tr)
    (tr * torch.arange(24.0, dtype=torch.float64)).sum().backward()
    for r, g in _on_two(run):
        np.testing.assert_allclose(r, tr.detach().numpy())
        np.testing.assert_allclose(g, ta.grad.numpy())


def test_a_stale_boxed_view_written_whole_takes_the_value_and_its_history():
    """A row slice of a row-split tensor is a boxed copy; after another write through the base it
    is stale; ``copy_`` into it then carries the source's gradient into the base (the write was
    lost: the stale copy was re-derived over it)."""
    def run(place):
        b = flow.tensor(np.ones((4, 6))).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        c = flow.tensor(np.arange(6.0)).to_global(placement=place, sbp=[B]).requires_grad_()
        t = b[3:]
        b[3:].mul_(2)
        t.copy_(c * 2)
        b.sum().backward()
        return t.requires_grad, b.to_global(sbp=[B]).to_local().detach().numpy(), c.grad.to_local().numpy()
    want = np.ones((4, 6))
    want[3:] = np.arange(6.0) * 2
    for rg, bs, cg in _on_two(run):
        assert rg
        np.testing.assert_allclose(bs, want)
        np.testing.assert_allclose(cg, np.full(6, 2.0))


def test_a_piece_of_chunk_that_was_boxed_is_refused_in_place_as_torchs():
    def run(place):
        c = flow.tensor(np.arange(6.0)).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        c.requires_grad_()
        piece = c.tanh().chunk(2, 0)[1]
        with pytest.raises(RuntimeError, match="one of several views"):
            piece.mul_(2)
        return True
    assert all(_on_two(run))


def test_a_boxed_piece_of_split_used_after_its_base_changed_is_refused_as_torchs():
    """A piece of ``chunk`` that had to be boxed is a copy re-derived from its source; once the
    source was written, autograd refuses to use it, as torch refuses the view (it re-derived it
    silently); reading its values (``detach``) stays allowed, as torch's."""
    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        x = a * 1.0
        piece = x.chunk(2, 1)[0]   # (columns across the split: boxed)
        assert "_copy_of" in piece.__dict__
        x.mul_(2)
        np.testing.assert_allclose(piece.detach().to_global(sbp=[B]).to_local().numpy(), (W * 2)[:, :3])
        with pytest.raises(RuntimeError, match="several views"):
            piece.to_global(sbp=[B])
        with pytest.raises(RuntimeError, match="several views"):
            piece * 2
        return True
    ta = torch.tensor(W, requires_grad=True)
    tx = ta * 1.0
    tp = tx.chunk(2, 1)[0]
    tx.mul_(2)
    with pytest.raises(RuntimeError, match="multiple views"):
        tp * 2
    assert all(_on_two(run))


def test_one_hot_infers_its_classes_on_a_global_tensor():
    """``one_hot(x)`` (classes from the data) on a broadcast global tensor: the meta kernel that
    gives output shapes reads a value (``.item()``), which is a data-dependent shape, not an
    error (it raised "item() cannot be called on meta tensors"; found when the Gloo op-table
    sample shifted onto it)."""
    idx = np.array([0, 3, 1, 2, 3])

    def run(place):
        x = flow.tensor(idx).to_global(placement=place, sbp=[B])
        return flow.nn.functional.one_hot(x).to_local().numpy()
    want = torch.nn.functional.one_hot(torch.tensor(idx)).numpy()
    for got in _on_two(run):
        np.testing.assert_array_equal(got, want)

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


@pytest.mark.parametrize("ranks", [2, 4])
def test_a_reshape_of_a_column_slice_copies_as_torchs(ranks):
    """``a.chunk(2, 1)[1].reshape(-1)`` of a row-split leaf: torch's piece has ``a``'s strides, so
    its reshape copies: a write to it is allowed and does not reach ``a``. Whether it views was
    asked of a dense tensor in the shard's order of dims (a view), and on 4 ranks the shard's own
    reshape (one row) aliased: the write was refused as one through a leaf's view (fuzz seed 1090,
    HOLOFLOW_FUZZ_UNEVEN)."""
    w = np.arange(1.0, 13.0)

    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]).requires_grad_()
        r = a.chunk(2, 1)[1].reshape(-1)
        r.mul_(2)
        (r * flow.tensor(w).to_global(placement=place, sbp=[B])).sum().backward()
        return (r.to_global(sbp=[B]).to_local().detach().numpy(), a.to_global(sbp=[B]).to_local().detach().numpy(),
                a.grad.to_global(sbp=[B]).to_local().numpy())
    ta = torch.tensor(W, requires_grad=True)
    tr = ta.chunk(2, 1)[1].reshape(-1)
    tr.mul_(2)
    (tr * torch.tensor(w)).sum().backward()
    for r, a, g in world.simulate(ranks, lambda r: run(flow.placement("cpu", list(range(ranks))))):
        np.testing.assert_allclose(r, tr.detach().numpy())
        np.testing.assert_allclose(a, W)
        np.testing.assert_allclose(g, ta.grad.numpy())


def test_a_new_tensor_like_a_column_slice_reshapes_as_a_view():
    """``zeros_like(a[:, 3:])`` is dense in torch, so its ``reshape(-1)`` views it: a write to the
    reshape reaches it (the slice's strides, kept for what stands for a view, must not follow
    its global meta onto a new tensor)."""
    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        z = flow.zeros_like(a[:, 3:])
        z.reshape(-1).add_(1)
        return z.to_global(sbp=[B]).to_local().numpy()
    for got in _on_two(run):
        np.testing.assert_allclose(got, np.ones((4, 3)))


def test_an_empty_shard_of_a_new_layout_is_a_new_tensor():
    """``m.to_global(sbp=S(0))`` of a 1-element broadcast tensor: rank 1's shard is empty, and it
    was a slice of ``m``'s storage (only non-empty ones were copied), so writing it moved ``m``'s
    version on rank 1 alone: backward through an op that saved ``m`` failed there while rank 0
    waited for it (fuzz seed 651 on the 2x2 mesh, seen as a hang of the seeds after it)."""
    def run(place):
        c = flow.tensor([0.5]).to_global(placement=place, sbp=[B]).requires_grad_()
        m = c * 1.0
        y = m.sin()   # (saves m)
        r = m.to_global(sbp=[S(0)])
        r.zero_()
        y.sum().backward()
        return c.grad.to_local().numpy()
    for g in world.simulate(2, lambda r: run(flow.placement("cpu", [0, 1])), timeout=10):
        np.testing.assert_allclose(g, np.cos([0.5]))


def test_a_view_of_a_boxed_view_reads_its_source_now():
    """``y.narrow(0, 0, 2).t()`` of a row-split ``y``: the narrow is a boxed copy standing for a
    view, the ``t()`` a view of that copy. After a write to ``y`` the copy was re-derived only
    when read itself, so ``t()`` gave the old values and history (fuzz seed 4852 with
    HOLOFLOW_FUZZ_STEPS=16, as a piece of ``chunk`` torch refuses to use after the write)."""
    w = np.arange(12.0).reshape(6, 2)

    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]).requires_grad_()
        y = x * 1.0
        z = y.narrow(0, 0, 2).t()
        y.mul_(3)
        out = z * flow.tensor(w).to_global(placement=place, sbp=[B])
        out.sum().backward()
        piece = y.chunk(2, 0)[0].t()
        y.mul_(2)
        with pytest.raises(RuntimeError, match="several views"):
            piece * 2
        return out.to_global(sbp=[B]).to_local().detach().numpy(), x.grad.to_global(sbp=[B]).to_local().numpy()
    tx = torch.tensor(W, requires_grad=True)
    ty = tx * 1.0
    tz = ty.narrow(0, 0, 2).t()
    ty.mul_(3)
    tout = tz * torch.tensor(w)
    tout.sum().backward()
    tp = ty.chunk(2, 0)[0].t()
    ty.mul_(2)
    with pytest.raises(RuntimeError, match="multiple views"):
        tp * 2
    for out, g in _on_two(run):
        np.testing.assert_allclose(out, tout.detach().numpy())
        np.testing.assert_allclose(g, tx.grad.numpy())


def test_a_boxed_piece_of_chunk_requires_grad_once_its_source_does():
    """A piece of ``chunk`` boxed across a column split is a copy standing for a view of ``x``;
    once ``x.copy_(c)`` with ``c`` requiring grad, torch's piece requires grad too (its base
    does), though autograd refuses to use it; holoflow's stayed False, as its history may not be
    re-derived (fuzz seed 1530, HOLOFLOW_FUZZ_UNEVEN)."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)])
        c = flow.tensor(np.arange(6.0)).to_global(placement=place, sbp=[B]).requires_grad_()
        piece = x.chunk(2, 1)[0]
        assert "_copy_of" in piece.__dict__
        pt = piece.t()   # (a view of the copy follows it)
        x.copy_(c)
        with pytest.raises(RuntimeError, match="several views"):
            piece * 2
        return piece.requires_grad and pt.requires_grad
    tx = torch.tensor(W)
    tp = tx.chunk(2, 1)[0]
    tpt = tp.t()
    tx.copy_(torch.arange(6.0, dtype=torch.float64, requires_grad=True))
    assert tp.requires_grad and tpt.requires_grad
    with pytest.raises(RuntimeError, match="multiple views"):
        tp * 2
    assert all(_on_two(run))


def test_a_detached_boxed_piece_of_chunk_takes_a_write_as_torchs():
    """``x.chunk(2, 1)[0].detach()`` of a column-split ``x`` is no view for autograd in torch
    (a write to it is allowed and recorded, and reaches ``x``); holoflow's detached copy standing
    for the piece refused it as a write to one of several views (fuzz seed 7146,
    HOLOFLOW_FUZZ_UNEVEN)."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        c = flow.tensor(np.arange(3.0)).to_global(placement=place, sbp=[B]).requires_grad_()
        piece = x.chunk(2, 1)[0].detach()
        piece.copy_(c * 2)
        piece.sum().backward()
        return c.grad.to_local().numpy(), x.to_global(sbp=[B]).to_local().detach().numpy()
    tx = torch.tensor(W, requires_grad=True)
    tc = torch.arange(3.0, dtype=torch.float64, requires_grad=True)
    tp = tx.chunk(2, 1)[0].detach()
    tp.copy_(tc * 2)
    tp.sum().backward()
    for g, x in _on_two(run):
        np.testing.assert_allclose(g, tc.grad.numpy())
        np.testing.assert_allclose(x, tx.detach().numpy())


def test_an_in_place_op_on_a_stale_boxed_view_reads_its_source_now():
    """``y.narrow(0, 0, 1)`` of a row-split ``y`` is a boxed copy (partial sum); after ``y.add_``
    it is stale, and ``z.mul_(2)`` (mul saves its input: applied to a clone of ``z``) computed on
    the old values, then wrote them back into ``y``: the add was lost there, silently (fuzz seed
    1980 with HOLOFLOW_FUZZ_STEPS=16)."""
    v = np.array([0.3, -0.5, 0.7, 0.1, 0.2, 0.4])

    def run(place):
        x = flow.tensor(v).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]).requires_grad_()
        y = x * 1.0
        z = y.narrow(0, 0, 1)
        y.add_(1.0)
        z.mul_(2)
        (y * flow.tensor(v).to_global(placement=place, sbp=[B])).sum().backward()
        return y.to_global(sbp=[B]).to_local().detach().numpy(), x.grad.to_global(sbp=[B]).to_local().numpy()
    tx = torch.tensor(v, requires_grad=True)
    ty = tx * 1.0
    tz = ty.narrow(0, 0, 1)
    ty.add_(1.0)
    tz.mul_(2)
    (ty * torch.tensor(v)).sum().backward()
    for got, g in _on_two(run):
        np.testing.assert_allclose(got, ty.detach().numpy())
        np.testing.assert_allclose(g, tx.grad.numpy())


def test_detach_of_a_view_of_a_boxed_view_reads_its_source_now():
    """As test_a_view_of_a_boxed_view_reads_its_source_now, read by ``detach()`` (it re-derived the
    view's own copy only, not the one the view aliases: the old values)."""
    def run(place):
        y = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        z = y.narrow(0, 0, 2).t()
        y.add_(1.0)
        return z.detach().to_global(sbp=[B]).to_local().numpy()
    ty = torch.tensor(W)
    tz = ty.narrow(0, 0, 2).t()
    ty.add_(1.0)
    for got in _on_two(run):
        np.testing.assert_allclose(got, tz.detach().numpy())


def test_a_boxed_view_refuses_detach_in_place_as_torchs_view():
    """``x[3:]`` of a row-split tensor is a copy standing for a view: ``detach_()`` on it is
    torch's error for a view ("use detach() instead"); its ``detach()`` may be detached again."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        v = x[3:]
        assert "_copy_of" in v.__dict__   # (else this tests an ordinary view)
        with pytest.raises(RuntimeError, match="can't detach a view in place"):
            v.detach_()
        return v.detach().detach_().to_global(sbp=[B]).to_local().numpy()
    with pytest.raises(RuntimeError, match="Can't detach views in-place"):
        torch.tensor(W)[3:].detach_()
    for got in _on_two(run):
        np.testing.assert_allclose(got, W[3:])


def test_a_boxed_view_of_a_source_detached_and_written_since_passes_no_gradient():
    """A copy standing for a view whose source was ``detach_()``ed and written since still
    requires grad, and no gradient goes past it (torch regenerates the view's grad_fn from its
    base's, which is none); before the write it keeps its history, as torch's view does."""
    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        x = a * 2
        kept, cut = x.reshape(-1), x.reshape(-1)
        assert "_copy_of" in kept.__dict__
        x.detach_()
        y = kept * 3             # (before the write: through x's old history to a)
        x.add_(1.0)
        flags = (kept.requires_grad, cut.requires_grad)
        ((cut * 5).sum() + y.sum()).backward()
        return flags, a.grad.to_global(sbp=[B]).to_local().numpy()
    ta = torch.tensor(W, requires_grad=True)
    tx = ta * 2
    t_kept, t_cut = tx.reshape(-1), tx.reshape(-1)
    tx.detach_()
    ty = t_kept * 3
    tx.add_(1.0)
    want_flags = (t_kept.requires_grad, t_cut.requires_grad)
    ((t_cut * 5).sum() + ty.sum()).backward()
    for flags, g in _on_two(run):
        assert flags == want_flags == (True, True)
        np.testing.assert_allclose(g, ta.grad.numpy())


def test_a_write_into_a_boxed_view_of_a_detached_source_is_refused_as_torchs():
    """A source ``detach_()``ed after a copy standing for its view was taken is a leaf, and the
    copy still has history: writing it in place (or a view of it) is torch's "view of a leaf"
    error, as for an ordinary view."""
    def run(place):
        b = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]).requires_grad_() * 1
        v = b.narrow(0, 1, 3)
        assert "_copy_of" in v.__dict__
        b.detach_()
        for target in (v, v[0:]):
            with pytest.raises(RuntimeError, match="view of a leaf"):
                target.mul_(-1.5)
        return True
    tb = torch.tensor(W, requires_grad=True) * 1
    tv = tb.narrow(0, 1, 3)
    tb.detach_()
    with pytest.raises(RuntimeError, match="view of a leaf"):
        tv[0:].mul_(-1.5)
    assert all(_on_two(run))


@pytest.mark.parametrize("sbp", [B, S(0), S(1)])
def test_a_write_into_an_expanded_global_tensor_writes_the_region_as_torchs(sbp):
    """``e[..., 0:1] = c`` on ``e = x.unsqueeze(-1).expand(...)``: the indexed region alone is
    written, which reaches ``x`` (every element of ``e`` shares one of ``x``'s), as torch's; it was
    refused as a write that differs between shared elements (global graph fuzzer, seed 435)."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp])
        e = x.unsqueeze(-1).expand(4, 6, 2)
        e[..., 0:1] = -0.5
        return x.to_global(sbp=[B]).to_local().numpy(), e.to_global(sbp=[B]).to_local().numpy()
    tx = torch.tensor(W)
    te = tx.unsqueeze(-1).expand(4, 6, 2)
    te[..., 0:1] = -0.5
    for x, e in _on_two(run):
        np.testing.assert_array_equal(x, tx.numpy())
        np.testing.assert_array_equal(e, te.numpy())


def test_copy_of_a_number_into_a_split_tensor_fills_every_shard():
    """``x.copy_(0.5)`` (torch takes a number) on a split tensor: the number is a constant of the
    placement; it was copied as a local tensor of the logical shape into each shard (a raw torch
    size error)."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        x.copy_(0.5)
        return x.to_global(sbp=[B]).to_local().numpy()
    for got in _on_two(run):
        np.testing.assert_array_equal(got, np.full((4, 6), 0.5))


def test_detach_of_a_view_of_a_boxed_view_reads_its_source_after_a_write():
    """``w[..., 0:4][..., 1:2].detach()`` of a tensor split along dim 1 (the slice is a copy
    standing for a view, the second slice a view of it): torch's shares ``w``'s storage, so it
    shows a later write to ``w``; holoflow's was a plain tensor with the old values (global graph
    fuzzer, seed 1126 on a 2x2 mesh, reading a parameter's view after the optimizer's step)."""
    def run(place):
        w = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)])
        z = w[..., 0:4][..., 1:2].detach()
        with flow.no_grad():
            w.mul_(3)
        return z.to_global(sbp=[B]).to_local().numpy(), z.detach().to_global(sbp=[B]).to_local().numpy()
    tw = torch.tensor(W)
    tz = tw[..., 0:4][..., 1:2].detach()
    tw.mul_(3)
    for got, again in _on_two(run):
        np.testing.assert_array_equal(got, tz.numpy())
        np.testing.assert_array_equal(again, tz.numpy())


def test_a_write_to_a_detached_view_of_a_boxed_view_reaches_its_source():
    """``w[..., 0:4][..., 1:2].detach()`` of a column-split ``w`` aliases the storage of the copy
    standing for ``w[..., 0:4]``; torch's aliases ``w``'s, so writing it writes ``w`` (and bumps
    the version its saved uses check). holoflow wrote the copy only: ``w`` kept its old values,
    silently."""
    def run(place):
        w = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        y = w * w
        z = w[..., 0:4][..., 1:2].detach()
        z.mul_(3)
        with pytest.raises(RuntimeError, match="modified by an in-place operation"):
            y.sum().backward()
        (w * 2).sum().backward()
        return (w.to_global(sbp=[B]).to_local().detach().numpy(), z.to_global(sbp=[B]).to_local().numpy(),
                w.grad.to_global(sbp=[B]).to_local().numpy(), z.requires_grad)
    tw = torch.tensor(W, requires_grad=True)
    tz = tw[..., 0:4][..., 1:2].detach()
    tz.mul_(3)
    (tw * 2).sum().backward()
    for got, z, g, rg in _on_two(run):
        np.testing.assert_array_equal(got, tw.detach().numpy())
        np.testing.assert_array_equal(z, tz.numpy())
        np.testing.assert_array_equal(g, tw.grad.numpy())
        assert not rg


@pytest.mark.parametrize("first", ["copy", "detached"])
def test_a_boxed_view_and_its_detach_re_derive_their_storage_once(first):
    """``v = t[..., 0:4]`` of a column-split ``t`` is a copy standing for a view; ``d = v.detach()``
    shares its storage. After a write to ``t`` each re-derived the storage on its next read, so the
    second read wrote it again and bumped the version the first one's readers saved: backward
    raised "modified by an in-place operation" where torch's views write nothing (global fuzzer,
    seed 37936 on a 2x2 mesh: ``var`` of the view along its split dim, which saves the
    gathered view, then ``requires_grad`` of its detach)."""
    w = np.linspace(-1, 1, 16).reshape(4, 4)

    def program(L, x, weight):
        t = x * 2
        v = t[..., 0:4]
        d = v.detach()
        t.zero_()
        t.add_(x)
        if first == "copy":
            s = v.var(1)
            assert not d.requires_grad
            u = d * x[..., 0:4]
        else:
            u = d * x[..., 0:4]
            s = v.var(1)
        ((s * s).sum() + (u * weight).sum()).backward()
        return x.grad

    tx = torch.tensor(W, requires_grad=True)
    want = program(torch, tx, torch.tensor(w)).numpy()

    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        g = program(flow, x, flow.tensor(w).to_global(placement=place, sbp=[B]))
        return g.to_global(sbp=[B]).to_local().numpy(), tuple(g.sbp)
    for got, sbp in _on_two(run):
        np.testing.assert_allclose(got, want, rtol=1e-12)
        assert sbp == (S(1),)


def test_a_view_of_a_boxed_piece_of_chunk_reads_its_values_after_a_write_as_torchs():
    """``v = t.chunk(2, 1)[0][1:]`` of a column-split ``t`` (the piece is a copy standing for a
    view, ``v`` a view of it); after a write to ``t``, ``v.detach()`` raised the multi-output
    refusal, which torch raises only when autograd would use ``v`` (global fuzzer, seed 39650 on
    a 2x2 mesh, reading every tensor's value at the end). Now the values, as torch's; an op
    recording autograd on ``v`` is still refused."""
    def program(L, x):
        t = x * 1
        v = t.chunk(2, 1)[0][1:]
        t.mul_(2)
        values = v.detach()
        with pytest.raises(RuntimeError, match="modified"):
            v * 2
        return values

    want = program(torch, torch.tensor(W, requires_grad=True)).numpy()

    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(1)]).requires_grad_()
        return program(flow, x).to_global(sbp=[B]).to_local().numpy()
    for got in _on_two(run):
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("piece", ["narrow", "chunk"])
def test_a_boxed_view_of_a_view_follows_its_base_written_through_another_boxed_view(piece):
    """``t = b[:, 2:4]`` (a view of a row-split ``b``; or ``b.chunk(3, 1)[1]``, a piece of a
    multi-output op), ``r = t[0]`` (a copy standing for a view: row 0 lives on one rank), then
    ``b.narrow(0, 0, 1).add_(c)`` through another boxed view: ``b`` and its views require grad now,
    and ``r`` must too. It stayed False: its re-derivation read its source's stale flag (fuzz seed
    62781). ``r`` takes ``c``'s gradient, or, from the chunk's piece, is refused by autograd as torch's."""
    w = np.array([0.5, -2.0])

    def program(lib, b, c):
        t = b[:, 2:4] if piece == "narrow" else b.chunk(3, 1)[1]
        r = t[0]
        b.narrow(0, 0, 1).add_(c)
        return t, r

    def run(place):
        b = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        c = flow.tensor(np.arange(6.0)).to_global(placement=place, sbp=[B]).requires_grad_()
        t, r = program(flow, b, c)
        flags = (r.requires_grad, t.requires_grad, b.requires_grad)   # (r first: before t refreshes)
        values = r.detach().to_global(sbp=[B]).to_local().numpy()
        if piece == "chunk":
            with pytest.raises(RuntimeError, match="modified in place since"):
                r * 2
            return flags, values, None
        (r * flow.tensor(w).to_global(placement=place, sbp=[B])).sum().backward()
        return flags, values, c.grad.to_local().numpy()

    tb, tc = torch.tensor(W), torch.arange(6.0, dtype=torch.float64, requires_grad=True)
    tt, tr = program(torch, tb, tc)
    want_flags, want_values = (tr.requires_grad, tt.requires_grad, tb.requires_grad), tr.detach().numpy()
    assert want_flags == (True, True, True)
    if piece == "chunk":
        with pytest.raises(RuntimeError, match="multiple views"):
            tr * 2
    else:
        (tr * torch.tensor(w)).sum().backward()
    for flags, values, grad in _on_two(run):
        assert flags == want_flags
        np.testing.assert_allclose(values, want_values)
        if piece == "narrow":
            np.testing.assert_allclose(grad, tc.grad.numpy())


@pytest.mark.parametrize("read", [False, True])
def test_a_view_written_through_a_boxed_view_of_it_follows_its_base_detached_later(read):
    """``t5 = t4.reshape(-1)`` (a view of a row-split ``t4``), ``t5[12:].mul_(2)`` (a boxed copy:
    its write goes into ``t5``, then ``t4``), then ``t4.detach_()``: torch regenerates ``t5``'s
    grad_fn at its next use, from the now detached base, so no gradient reaches ``a``, unless it
    was read before the detach (``read``: then it keeps the write's history). holoflow re-derived
    ``t5`` at the write, so its history survived the detach: a wrong, non-None gradient of ``a``,
    silently (fuzz seed 69942, 1-D and the 4-rank mesh)."""
    def program(a, weights):
        t4 = a * -1.5
        t5 = t4.reshape(-1)
        t5[12:].mul_(2)
        if read:
            t5.grad_fn  # noqa: B018 - torch's getter regenerates the view's history here
        t4.detach_()
        (t5 * weights).sum().backward()
        return a.grad

    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)]).detach().requires_grad_()
        g = program(a, flow.tensor(np.arange(24.0)).to_global(placement=place, sbp=[B]))
        return None if g is None else g.to_global(sbp=[B]).to_local().numpy()
    want = program(torch.tensor(W, requires_grad=True), torch.arange(24.0, dtype=torch.float64))
    assert (want is None) == (not read)
    for got in _on_two(run):
        if want is None:
            assert got is None
        else:
            np.testing.assert_allclose(got, want.numpy())


@pytest.mark.parametrize("sbp", [P, S(0), S(1), B])
def test_a_boxed_input_keeps_its_layout_so_a_reshape_copies_as_torchs(sbp):
    """``b.t().tanh()``: torch's tanh lays its output out as its transposed input, so
    ``reshape(-1)`` of it is a copy and a write into the tanh leaves it alone. A partial-sum ``b``
    is boxed for tanh, and the boxing made the shard contiguous: the reshape became a view, and
    the write showed through it, silently (fuzz seed 84748). Boxing keeps the shard's layout."""
    def program(b):
        y = b.t().tanh()
        flat = y.reshape(-1)
        y[3:] = -1.5
        return flat

    def run(place):
        b = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp])
        return program(b).to_global(sbp=[B]).to_local().numpy()
    want = program(torch.tensor(W)).numpy()
    for got in _on_two(run):
        np.testing.assert_allclose(got, want)


@pytest.mark.parametrize("sbp", [B, S(0), S(1), P])
def test_a_global_view_written_with_itself_stays_global(sbp):
    """``v.add_(v)`` on a view of a tensor that requires grad reads ``v`` as it was through an
    alias; the alias was made local, so a global ``v`` raised "mixes a local tensor" (seed 86642).
    Values and the gradient as torch's."""
    def fn(lib, a):
        x = a * 1.0
        v = x[1:]
        v.add_(v)
        (x * x).sum().backward()
        return x

    ta = torch.tensor(W, requires_grad=True)
    want = fn(torch, ta).detach().numpy()

    def run(place):
        a = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp]).detach().requires_grad_()
        x = fn(flow, a)
        return x.to_global(sbp=[B]).to_local().detach().numpy(), a.grad.to_global(sbp=[B]).to_local().numpy()
    for xs, grad in _on_two(run):
        np.testing.assert_allclose(xs, want)
        np.testing.assert_allclose(grad, ta.grad.numpy(), rtol=1e-6)


@pytest.mark.parametrize("requires_grad", [False, True])
@pytest.mark.parametrize("sbp", [B, S(0), S(1)])
def test_a_write_into_overlapping_windows_of_a_global_tensor_leaves_torchs_values(sbp, requires_grad):
    """``x.unfold(1, 2, 1).mul_(2)`` then ``.add_(t)`` (t of the windows' shape, broadcast: laid
    out as the windows for the kernel): torch's kernel
    writes the windows element after element, so an element held by two windows is written
    twice. A global target was computed out of place and copied in (written once), silently;
    each shard is now written by torch's kernel (S(1): the windows cross shards, a copy standing
    for the view takes the write and hands it back to x)."""
    t_np = np.arange(40.0).reshape(4, 5, 2) / 7

    def program(lib, x, t):
        x = x * 1.0
        u = x.unfold(1, 2, 1)
        u.mul_(2)
        u.add_(t)
        return x

    want = program(torch, torch.tensor(W), torch.tensor(t_np)).numpy()

    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[sbp]).requires_grad_(requires_grad)
        t = flow.tensor(t_np).to_global(placement=place, sbp=[B])
        return program(flow, x, t).detach().to_global(sbp=[B]).to_local().numpy()
    for got in _on_two(run):
        np.testing.assert_allclose(got, want, rtol=1e-12)


def test_a_write_into_overlapping_windows_of_partial_sums_or_with_broadcast_operands_is_refused():
    """Partial sums can't be written element after element shard by shard (torch's result on
    the sum is not the sum of the shards' results), nor a split target with an operand it
    broadcasts: refused, naming what would work."""
    def run(place):
        x = flow.tensor(W).to_global(placement=place, sbp=[P])
        with pytest.raises(RuntimeError, match=r"mul_: .*overlapping windows.*partial sums.*clone\(\)"):
            x.unfold(1, 2, 1).mul_(2)
        y = flow.tensor(W).to_global(placement=place, sbp=[B]).to_global(sbp=[S(0)])
        t = flow.ones(2).to_global(placement=place, sbp=[B])
        with pytest.raises(RuntimeError, match=r"add_: .*not \(2,\).*expand\(\) the operands"):
            y.unfold(1, 2, 1).add_(t)
        return True
    assert all(_on_two(run))


@pytest.mark.parametrize("dim", [0, 1])
def test_repeat_interleave_of_an_unevenly_split_dim_boxes_as_it_must(dim):
    """``repeat_interleave(2, dim)`` of a dim of 3 split over 2 ranks (2 + 1): the split kept its
    signature, whose shards (4 + 2) are not the output's balanced split (3 + 3), and the op
    failed with an internal SBP error; a signature now holds only where every shard computes its
    balanced piece of the output (found by the per-signature backward sweep of the op tables).
    Values and gradient against torch."""
    x, up = torch.randn(3, 3, dtype=torch.float64), torch.randn(6, 3, dtype=torch.float64)
    up = up if dim == 0 else up.reshape(3, 6)

    def run(place):
        g = flow.from_torch(x).to_global(place, (B,)).to_global(sbp=(S(dim),)).requires_grad_()
        y = g.repeat_interleave(2, dim=dim)
        gx, = flow.autograd.grad([y], [g], [flow.from_torch(up).to_global(place, (B,))])
        return y.to_global(sbp=(B,)).to_local().to_torch(), gx.to_global(sbp=(B,)).to_local().to_torch()
    tx = x.clone().requires_grad_()
    ty = tx.repeat_interleave(2, dim=dim)
    tg, = torch.autograd.grad([ty], [tx], [up])
    for y, gx in _on_two(run):
        torch.testing.assert_close(y, ty.detach())
        torch.testing.assert_close(gx, tg)


def test_group_norm_double_backward_on_an_empty_shard_of_the_batch():
    """group_norm's double backward on a batch of 1 split over 2 ranks: rank 1's shard is empty,
    and its view (N, G, C/G, -1) of 0 elements could not infer the -1 (a ShapeError; torch
    gives zeros for an empty batch). Gradients of the gradients' sum against torch."""
    x, w, b = (torch.randn(*s, dtype=torch.float64) for s in ((1, 6, 2, 3), (6,), (6,)))

    def second(lib, xs):
        y = lib.nn.functional.group_norm(xs[0], 3, xs[1], xs[2])
        gs = lib.autograd.grad([(y * y).sum()], xs, create_graph=True)
        return lib.autograd.grad([sum(g.sum() for g in gs)], xs)

    def run(place):
        xs = [flow.from_torch(t).to_global(place, (B,)) for t in (x, w, b)]
        xs[0] = xs[0].to_global(sbp=(S(0),))
        xs = [t.requires_grad_() for t in xs]
        return [g.to_global(sbp=(B,)).to_local().to_torch() for g in second(flow, xs)]
    want = second(torch, [t.clone().requires_grad_() for t in (x, w, b)])
    for got in _on_two(run):
        for g, t in zip(got, want):
            torch.testing.assert_close(g, t)

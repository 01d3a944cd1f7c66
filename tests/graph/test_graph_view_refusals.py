"""Views and in-place writes in traced programs (``holoflow.compile``, ``nn.Graph``) against torch
and eager holoflow, minimized from tests/graph/test_fuzz_compile_views.py's seeds:

- a write into a view that torch and eager refuse (taken before its base required grad, a piece
  of ``split`` among them: seeds 2925, 4727, 5382, 5850; made under ``no_grad``) is refused while
  tracing with eager's error (a trace skipped ``dispatch.check_view_target`` and computed it), so
  a compiled call runs eagerly and raises it, and ``nn.Graph`` reports it;
- an output requiring grad whose history reaches no input (a view of a base written and
  ``detach_()``ed since: seed 4023) requires grad compiled too, and its backward runs;
- a view written whole with a value that has history sends zeros (not None) to what its base
  held (seed 3554): the written view is re-derived from its base's new history, as eager's;
- a view read between its base's write and the base's ``detach_()`` (seed 1633): a read that
  records nothing (``detach()``) re-derives its value only, as eager's leaves its history stale
  (torch regenerates it lazily: after the ``detach_()`` it leads nowhere); a ``grad_fn`` read
  re-derives its history, as eager's (the trace re-derived it for any read, and for no
  ``grad_fn`` read: gradients other than torch's, silent)."""
from __future__ import annotations

import warnings

import numpy as np
import pytest
import torch

import holoflow as flow


def _split_piece(lib, x, w):   # seed 4727: the piece is a leaf once its base requires grad
    p = x.split([1, 2])[0]
    x[1:] = w[1:] * 1
    p.relu_()


def _nograd_piece(lib, x, w):   # a view made under no_grad, written with grad mode on
    x.add_(w)
    with lib.no_grad():
        p = x.unbind(0)[0]
    p.mul_(2)


def _view_of_leaf(lib, x, w):   # a leaf the call makes, required grad after its view was taken
    v = x[0]
    x.requires_grad_()
    v.mul_(2)


REFUSED = [_split_piece, _nograd_piece, _view_of_leaf]


def _program(lib, write):
    def fn(w):
        x = lib.zeros(3, 2, dtype=w.dtype)
        write(lib, x, w)
        return (x * w).sum()
    return fn


def _eager_error(lib, write) -> Exception:
    w = lib.tensor(np.linspace(-1.0, 1.0, 6).reshape(3, 2), requires_grad=True)
    with pytest.raises(RuntimeError) as info:
        _program(lib, write)(w)
    return info.value


@pytest.mark.parametrize("write", REFUSED, ids=lambda f: f.__name__.strip("_"))
def test_a_write_eager_refuses_is_refused_traced(write):
    _eager_error(torch, write)
    want = str(_eager_error(flow, write))
    w = flow.tensor(np.linspace(-1.0, 1.0, 6).reshape(3, 2), requires_grad=True)
    with pytest.raises(RuntimeError, match="cannot be traced whole") as info:
        flow.compile(_program(flow, write), backend="eager", fullgraph=True)(w)
    assert want in str(info.value)
    with pytest.warns(UserWarning, match="runs eagerly"), pytest.raises(RuntimeError) as info:
        flow.compile(_program(flow, write), backend="eager")(w)
    assert str(info.value) == want

    class Train(flow.nn.Graph):
        def __init__(self, m):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=0.1))

        def build(self):
            loss = _program(flow, write)(self.m.w)
            loss.backward()
            return loss
    m = flow.nn.Module()
    m.w = flow.nn.Parameter(w.detach().clone())
    with pytest.raises(RuntimeError) as info:
        Train(m)()
    assert want in str(info.value)


def _run(lib, fn, compiled: bool):
    a = lib.tensor([1.0, -2.0, 3.0], requires_grad=True)
    c = lib.tensor([0.5, 1.5, -1.0], requires_grad=True)
    if compiled:
        with warnings.catch_warnings():
            warnings.simplefilter("error")   # (traced, not run eagerly)
            v, loss = flow.compile(fn, backend="eager")(a, c)
    else:
        v, loss = fn(a, c)
    loss.backward()
    grads = [None if t.grad is None else t.grad.numpy().copy() for t in (a, c)]
    return v.detach().numpy().copy(), v.requires_grad, loss.requires_grad, grads


def _same(got, want):
    np.testing.assert_array_equal(got[0], want[0])
    assert got[1:3] == want[1:3]
    for g, w in zip(got[3], want[3]):
        assert (g is None) == (w is None), (g, w)
        if w is not None:
            np.testing.assert_array_equal(g, w)


def _stale_written_detached(a, c):   # seed 2752: a stale view written through a detach()ed alias
    x = a * 1
    v = x.unsqueeze(0)
    x.mul_(c)
    v.detach().relu_()
    return v, (v * 2).sum()


def _leads_nowhere(a, c):   # seed 4023
    x = a * 1
    v = x[1:]
    x.detach_()
    x.zero_()
    return v, (v * 2).sum()


def _written_whole(a, c):   # seed 3554
    x = a * 1
    v = x.view(-1)
    v.copy_(c * 1)
    return v, (v * 2).sum()


@pytest.mark.parametrize("fn", [_leads_nowhere, _written_whole, _stale_written_detached],
                         ids=lambda f: f.__name__.strip("_"))
def test_gradients_of_written_views_compiled_agree_with_torch(fn):
    want = _run(torch, fn, False)
    _same(_run(flow, fn, False), want)
    _same(_run(flow, fn, True), want)


def _read_between(read):
    def fn(a, c):   # seed 1633
        x = a * 1
        v = x.unsqueeze(0)
        x.mul_(c)
        read(v)
        x.detach_()
        return v, (v * 2).sum() + (c * a).sum()
    return fn


READS = {"detach": lambda v: v.detach(), "grad_fn": lambda v: v.grad_fn,
         "written_detached": lambda v: v.detach().relu_()}   # (its storage written: re-derived at its next use)


@pytest.mark.parametrize("read", list(READS))
def test_a_view_read_between_its_bases_write_and_detach_compiled_agrees_with_torch(read):
    fn = _read_between(READS[read])
    want = _run(torch, fn, False)
    _same(_run(flow, fn, False), want)
    _same(_run(flow, fn, True), want)

    def step(lib, a, c):   # nn.Graph: the parameter's gradient, through SGD's step
        a.grad = None
        fn(a, c)[1].backward()
        with lib.no_grad():
            a -= a.grad
        return a.detach().numpy()
    theirs = step(torch, torch.tensor([1.0, -2.0, 3.0], requires_grad=True), torch.tensor([0.5, 1.5, -1.0]))
    m = flow.nn.Module()
    m.w = flow.nn.Parameter(flow.tensor([1.0, -2.0, 3.0]))

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(flow.optim.SGD(m.parameters(), lr=1.0))

        def build(self):
            loss = fn(self.m.w, flow.tensor([0.5, 1.5, -1.0]))[1]
            loss.backward()
            return loss
    Train()()
    np.testing.assert_array_equal(m.w.detach().numpy(), theirs)


# -- a piece of unbind/split/chunk used by autograd after its base was written -------------------

def _pieces(kind):
    return {"unbind": lambda b: b.unbind(0), "split": lambda b: b.split(1, 0), "chunk": lambda b: b.chunk(3, 0),
            "split_with_sizes": lambda b: b.split_with_sizes([1, 2], 0)}[kind]


USED_AFTER = {
    "base written": lambda lib, b, ps: b.mul_(2.0),
    "another piece written under no_grad": lambda lib, b, ps: _no_grad(lib, lambda: ps[1].mul_(2.0)),
    "base written through a view": lambda lib, b, ps: b[1:].add_(1.0),
    "base written through detach()": lambda lib, b, ps: b.detach().mul_(2.0),
}


def _no_grad(lib, f):
    with lib.no_grad():
        f()


def _used_after(lib, kind, write, no_grad_pieces):
    def fn(w):
        b = w * 1.0
        if no_grad_pieces:   # (torch's error names the no_grad view then)
            with lib.no_grad():
                ps = _pieces(kind)(b)
        else:
            ps = _pieces(kind)(b)
        USED_AFTER[write](lib, b, ps)
        return (ps[0] * 3.0).sum() + b.sum()
    return fn


@pytest.mark.parametrize("no_grad_pieces", [False, True], ids=["pieces", "no_grad pieces"])
@pytest.mark.parametrize("write", list(USED_AFTER))
@pytest.mark.parametrize("kind", ["unbind", "split", "chunk", "split_with_sizes"])
def test_a_piece_used_after_its_base_was_written_is_refused_traced(kind, write, no_grad_pieces):
    # torch and eager refuse; a trace compared storage versions, which its writes (new values
    # bound to the base) never move, and computed the piece's gradient from its base's new history
    def w_of(lib):
        return lib.tensor(np.linspace(-1.0, 1.0, 6).reshape(3, 2), requires_grad=True)
    fn = _used_after(torch, kind, write, no_grad_pieces)
    with pytest.raises(RuntimeError, match="modified inplace"):
        fn(w_of(torch))
    want = str(_raised(lambda: _used_after(flow, kind, write, no_grad_pieces)(w_of(flow))))
    with pytest.raises(RuntimeError, match="cannot be traced whole") as info:
        flow.compile(_used_after(flow, kind, write, no_grad_pieces), backend="eager", fullgraph=True)(w_of(flow))
    assert want in str(info.value)


def _raised(f) -> Exception:
    with pytest.raises(RuntimeError) as info:
        f()
    return info.value


def test_tensor_splits_pieces_are_slices_eager_and_traced():
    # torch's tensor_split (hsplit, vsplit, dsplit) returns slices, each a view of its own: a
    # piece may be written, and used after its base was; holoflow's were split's several outputs,
    # so both were refused (eager and traced)
    def fn(lib):
        def f(w):
            b = w * 1.0
            p, q = b.tensor_split([1], 0)
            q.mul_(2.0)
            b.add_(1.0)
            return (p * 3.0).sum() + (q * q).sum() + b.hsplit(2)[1].sum()
        return f
    w = torch.tensor(np.linspace(-1.0, 1.0, 6).reshape(3, 2), requires_grad=True)
    fn(torch)(w).backward()
    for compiled in (False, True):
        v = flow.tensor(np.linspace(-1.0, 1.0, 6).reshape(3, 2), requires_grad=True)
        f = flow.compile(fn(flow), backend="eager", fullgraph=True) if compiled else fn(flow)
        out = f(v)
        out.backward()
        np.testing.assert_allclose(out.detach().numpy(), fn(torch)(w.detach()).numpy(), rtol=1e-12)
        np.testing.assert_allclose(v.grad.numpy(), w.grad.numpy(), rtol=1e-12)

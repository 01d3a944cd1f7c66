"""A view written in place shows its re-derived history at once, against torch: torch's
rebase_history regenerates the view's grad_fn right after the write (from its base's CopySlices),
not at the view's next use. holoflow re-derives a view by replaying its chain of view ops, as torch
does with view replay on (``torch._C._set_view_replay_enabled``); by default torch shows one
``AsStridedBackward0`` for the whole chain, so the chain is compared with torch's replayed one,
and the rest (the node's edge, its creation number, hooks, gradients) with torch's default."""
from __future__ import annotations

import contextlib

import numpy as np
import pytest
import torch

import holoflow as flow

VIEWS = {
    "slice": lambda b: b[1:],
    "transpose": lambda b: b.t(),
    "view": lambda b: b.view(2, 6),
    "select": lambda b: b.select(0, 1),
    "diagonal": lambda b: b.diagonal(),
    "as_strided": lambda b: b.as_strided((2, 2), (4, 1), 1),
    "view_of_view": lambda b: b[1:].t()[1:],
}
WRITES = {
    "mul_": lambda v, lib, w: v.mul_(2.0),
    "add_": lambda v, lib, w: v.add_(w[:v.numel()].reshape(v.shape)),
    "fill_": lambda v, lib, w: v.fill_(3.0),
}


@contextlib.contextmanager
def _view_replay(lib, on: bool):
    if lib is not torch:
        yield
        return
    was = torch._C._is_view_replay_enabled()
    torch._C._set_view_replay_enabled(on)
    try:
        yield
    finally:
        torch._C._set_view_replay_enabled(was)


def _hops(fn, target) -> int:
    """How many first edges lead from ``fn`` to ``target`` (-1: never)."""
    for k in range(8):
        if fn is target:
            return k
        if not fn.next_functions:
            return -1
        fn = fn.next_functions[0][0]
    return -1


def _written(lib, view: str, write: str):
    x = lib.tensor(np.arange(12.0).reshape(3, 4) / 7, dtype=lib.float32, requires_grad=True)
    w = lib.tensor(np.linspace(-1, 1, 12), dtype=lib.float32, requires_grad=True)
    a = x * 1.0
    v = VIEWS[view](a)
    WRITES[write](v, lib, w)
    return x, w, a, v


@pytest.mark.parametrize("write", sorted(WRITES))
@pytest.mark.parametrize("view", sorted(VIEWS))
def test_written_view_shows_its_history_rederived_from_the_base(view, write):
    got = {}
    for lib in (torch, flow):
        with _view_replay(lib, True):
            _, _, a, v = _written(lib, view, write)
            fn = v.grad_fn
            got[lib] = (_hops(fn, a.grad_fn), "Mul" in fn.name() or "Add" in fn.name() or "Fill" in fn.name(),
                        fn._sequence_nr() > a.grad_fn._sequence_nr())
        if lib is torch:   # torch's default: one node, whose edge is the base's new history
            _, _, a, v = _written(lib, view, write)
            assert v.grad_fn.next_functions[0][0] is a.grad_fn
    assert got[flow] == got[torch]
    assert got[flow][0] >= 1 and not got[flow][1]


def test_a_node_made_after_the_write_runs_before_the_rederived_view():
    """The view's node is made at the write, so one made between the write and the view's next
    use is younger and runs first (it ran after when the view was re-derived at its next use)."""
    def run(lib):
        order = []
        x = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=True)
        a = x * 1.0
        v = a[:2]
        v.mul_(2.0)
        w = x * 3.0
        w.register_hook(lambda g: order.append("w"))
        v.register_hook(lambda g: order.append("v"))
        u = v * 4.0
        (u.sum() + w.sum()).backward()
        return order, x.grad.tolist()
    assert run(flow) == run(torch)

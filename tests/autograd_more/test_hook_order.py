"""The order backward fires hooks in, against torch: random graphs (fan-out, shared
subexpressions, multi-output views, several roots) with tensor hooks, ``retain_grad``, node pre-
and post-hooks and post-accumulate hooks, run by ``backward()``, ``autograd.backward`` of several
roots, ``backward(inputs=...)``, ``autograd.grad`` and twice with ``retain_graph``; every program
runs in torch and in holoflow, which must fire the same hooks in the same order and give the
same gradients. torch's engine (CPU) runs the ready node made last first, a leaf's
AccumulateGrad before any node, and leaves ready together in its priority queue's order.
"""
from __future__ import annotations

import random

import numpy as np
import pytest
import torch

import holoflow as flow

# shape-keeping ops on tensors of shape (4,): name -> f(lib, a, b)
UNARY = {
    "sin": lambda L, a: a.sin(), "tanh": lambda L, a: a.tanh(), "neg": lambda L, a: -a,
    "clone": lambda L, a: a.clone(), "scale": lambda L, a: a * 1.5, "shift": lambda L, a: a + 0.5,
    "square": lambda L, a: a.square(), "sigmoid": lambda L, a: a.sigmoid(), "cumsum": lambda L, a: a.cumsum(0),
    "flip": lambda L, a: a.flip(0), "expand_sum": lambda L, a: a[None].expand(2, 4).sum(0),
}
BINARY = {
    "add": lambda L, a, b: a + b, "mul": lambda L, a, b: a * b, "sub": lambda L, a, b: a - b,
    "div": lambda L, a, b: a / (b * b + 1.0), "maximum": lambda L, a, b: L.maximum(a, b),
    "where": lambda L, a, b: L.where(a > 0, a, b), "lerp": lambda L, a, b: L.lerp(a, b, 0.25),
    "addcmul": lambda L, a, b: L.addcmul(a, a, b), "halves": lambda L, a, b: L.cat([a[2:], b[:2]]),
    "stack": lambda L, a, b: (L.stack([a, b], 1) * L.tensor([1.0, -2.0])).sum(1),
}


class Log:
    def __init__(self) -> None:
        self.calls: list[str] = []

    def tensor_hook(self, name: str, scale: bool):
        def fn(g):
            self.calls.append(("T:" if g is not None else "T0:") + name)   # (None: no gradient came)
            return g * 2.0 if scale and g is not None else None
        return fn

    def node_prehook(self, name: str):
        return lambda gs: self.calls.append("P:" + name)

    def node_hook(self, name: str):
        return lambda gi, go: self.calls.append("Q:" + name)

    def post_acc(self, name: str):
        return lambda t: self.calls.append("A:" + name)


def _hooks(rng: random.Random, log: Log, name: str, t, leaf: bool) -> None:
    if rng.random() < 0.45:
        t.register_hook(log.tensor_hook(name, rng.random() < 0.2))
    if leaf:
        if rng.random() < 0.3:
            t.register_post_accumulate_grad_hook(log.post_acc(name))
        return
    if rng.random() < 0.2:
        t.retain_grad()
    if rng.random() < 0.25:
        t.grad_fn.register_prehook(log.node_prehook(name))
    if rng.random() < 0.25:
        t.grad_fn.register_hook(log.node_hook(name))


def _build(L, rng: random.Random, log: Log) -> list:
    """A random graph: its tensors as (name, tensor, is_leaf), leaves first."""
    pool, whole = [], []   # (whole: the tensors of shape (4,), which ops take)
    for i in range(rng.randint(1, 3)):
        x = L.tensor([round(rng.uniform(-2, 2), 2) for _ in range(4)], requires_grad=True)
        _hooks(rng, log, f"x{i}", x, True)
        pool.append((f"x{i}", x, True))
        whole.append(x)
    for i in range(rng.randint(2, 8)):
        a = rng.choice(whole)
        kind = rng.random()
        if kind < 0.35:
            out = [UNARY[rng.choice(sorted(UNARY))](L, a)]
        elif kind < 0.8:
            out = [BINARY[rng.choice(sorted(BINARY))](L, a, rng.choice(whole))]
        else:   # a multi-output view op: each piece a tensor of its own, then joined
            pieces = list(a.split(2) if rng.random() < 0.5 else a.unbind())
            for j, p in enumerate(pieces):
                _hooks(rng, log, f"y{i}.{j}", p, False)
                pool.append((f"y{i}.{j}", p, False))
            order = pieces[::-1] if rng.random() < 0.5 else pieces
            out = [L.cat(order) if pieces[0].dim() else L.stack(order)[[3, 2, 1, 0]] * 1.0]
        _hooks(rng, log, f"y{i}", out[0], False)
        pool.append((f"y{i}", out[0], False))
        whole.append(out[0])
    return pool


def _roots(L, rng: random.Random, pool: list, seed_rng: random.Random) -> tuple[list, list]:
    roots, grads = [], []
    for _ in range(rng.randint(1, 3)):
        _, t, _ = rng.choice(pool)
        if rng.random() < 0.5:
            roots.append((t * L.tensor([1.0, -2.0, 0.5, 3.0][:t.numel()]).reshape(t.shape)).sum())
            grads.append(None)
        else:
            roots.append(t)
            grads.append(L.tensor([round(seed_rng.uniform(-1, 1), 2) for _ in range(t.numel())]).reshape(t.shape))
    return roots, grads


def _backward(L, rng: random.Random, pool: list, retain: bool) -> list:
    """One backward pass of a random kind; what it returns (autograd.grad's gradients)."""
    roots, grads = _roots(L, rng, pool, random.Random(rng.random()))
    kind = rng.choice(["one", "many", "inputs", "grad"])
    wanted = [t for _, t, _ in rng.sample(pool, rng.randint(1, min(3, len(pool))))]
    if kind == "one":
        total = roots[0] if grads[0] is None else (roots[0] * grads[0]).sum()
        for r, g in zip(roots[1:], grads[1:]):
            total = total + (r if g is None else (r * g).sum())
        total.backward(retain_graph=retain)
    elif kind == "many":
        L.autograd.backward(roots, [g if g is not None else L.ones(()) for g in grads], retain_graph=retain)
    elif kind == "inputs":
        L.autograd.backward(roots, [g if g is not None else L.ones(()) for g in grads], retain_graph=retain,
                            inputs=wanted)
    else:
        return list(L.autograd.grad(roots, wanted, [g if g is not None else L.ones(()) for g in grads],
                                    retain_graph=retain, allow_unused=True))
    return []


def _run(L, seed: int) -> tuple:
    rng, log = random.Random(seed), Log()
    pool = _build(L, rng, log)
    got = []
    retain = rng.random() < 0.4
    got += _backward(L, rng, pool, retain)
    log.calls.append("|")
    if retain:   # the same graph again: every hook fires again
        got += _backward(L, rng, pool, False)
    grads = [(name, t.grad) for name, t, leaf in pool if leaf or t.retains_grad]
    return log.calls, got, grads, [t.retains_grad for _, t, leaf in pool if not leaf]


def _np(t):
    return None if t is None else np.asarray(t.tolist(), dtype=np.float64)


def _same(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return np.allclose(_np(a), _np(b), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("block", range(5))
def test_hook_order_matches_torch_on_random_graphs(block):
    for seed in range(block * 100, block * 100 + 100):
        want, got = _run(torch, seed), _run(flow, seed)
        assert got[0] == want[0], f"seed {seed}: hook order"
        assert len(got[1]) == len(want[1]) and all(map(_same, got[1], want[1])), f"seed {seed}: autograd.grad"
        assert [n for n, _ in got[2]] == [n for n, _ in want[2]], f"seed {seed}: which tensors have .grad"
        assert all(_same(g, w) for (_, g), (_, w) in zip(got[2], want[2])), f"seed {seed}: .grad"
        assert got[3] == want[3], f"seed {seed}: retains_grad"


def test_independent_branches_run_the_last_made_first():
    def run(L):
        x, order = L.ones(3, requires_grad=True), []
        y1 = x * 2
        y1.register_hook(lambda g: order.append("y1"))
        y2 = x * 3
        y2.register_hook(lambda g: order.append("y2"))
        y3 = x.sin()
        y3.register_hook(lambda g: order.append("y3"))
        (y2.sum() + y1.sum() + y3.sum()).backward()
        return order
    assert run(flow) == run(torch)


@pytest.mark.parametrize("n", [4, 5, 6, 8])
def test_leaves_ready_together_fire_in_torchs_order(n):
    def run(L):
        xs, order = [L.ones(2, requires_grad=True) for _ in range(n)], []
        for i, x in enumerate(xs):
            x.register_hook(lambda g, i=i: order.append(i))
        L.cat(xs).sum().backward()
        return order
    assert run(flow) == run(torch)


def test_captured_gradient_is_the_one_before_hooks():
    """autograd.grad of a tensor whose node also runs (a leaf lies past it) captures the gradient
    as it came, before the tensor's hooks (torch's engine)."""
    def run(L):
        x = L.tensor([1.0, 2.0], requires_grad=True)
        a = x * 2
        a.register_hook(lambda g: g * 10)
        return L.autograd.grad((a * a).sum(), [a, x])
    for g, w in zip(run(flow), run(torch)):
        assert _same(g, w)


def test_a_leaf_given_twice_as_a_root_takes_the_sum_once():
    def run(L):
        x, calls = L.ones(3, requires_grad=True), []
        x.register_hook(lambda g: calls.append(g.tolist()))
        x.register_post_accumulate_grad_hook(lambda t: calls.append("acc"))
        L.autograd.backward([x, x], [L.ones(3), L.ones(3) * 2])
        return calls, x.grad.tolist()
    assert run(flow) == run(torch)


def test_backward_inputs_runs_a_non_leaf_inputs_node_and_retains_it():
    def run(L):
        x, calls = L.ones(3, requires_grad=True), []
        x.register_post_accumulate_grad_hook(lambda t: calls.append("x-acc"))
        a = x * 2
        a.grad_fn.register_prehook(lambda gs: calls.append("a-pre"))
        a.grad_fn.register_hook(lambda gi, go: calls.append("a-post"))
        b = (a * a).sum()
        b.backward(inputs=[a, x], retain_graph=True)
        b.backward()
        return calls, a.retains_grad, a.grad.tolist(), x.grad.tolist()
    assert run(flow) == run(torch)


def test_hooks_of_a_gradient_that_never_came_see_none():
    """A node that runs calls the hooks of an output no gradient reached with None (a piece of
    unbind), and a leaf a rule gave None calls its hooks and post-accumulate hooks (torch's
    AccumulateGrad runs with an undefined gradient); a hook may not replace None."""
    def run(L):
        calls = []

        class Half(L.autograd.Function):
            @staticmethod
            def forward(ctx, a, b):
                return a + b

            @staticmethod
            def backward(ctx, g):
                return g, None
        x, z = L.ones(4, requires_grad=True), L.ones(4, requires_grad=True)
        z.register_hook(lambda g: calls.append(("z", g is None)))
        z.register_post_accumulate_grad_hook(lambda t: calls.append(("z-acc", t.grad is None)))
        pieces = Half.apply(x, z).unbind()
        for i, p in enumerate(pieces):
            p.register_hook(lambda g, i=i: calls.append((i, g is None)))
        pieces[2].sum().backward(retain_graph=True)
        pieces[0].register_hook(lambda g: L.ones(()))
        with pytest.raises(RuntimeError, match="can't replace a None gradient"):
            pieces[3].sum().backward()
        return calls
    assert run(flow) == run(torch)

"""A leaf requiring grad that a compiled call makes itself (``ones(3, requires_grad=True)``),
against torch.compile: a fresh leaf each call, whose gradient flows; an output computed from it
requires grad and has the compiled call's node (whose edges reach the leaf), an output that is
the leaf is the leaf itself, the inputs' gradients flow as in eager; under no_grad the leaf still
requires grad and what is computed from it does not. Both compile with ``backend="aot_eager"``
(torch's autograd semantics without Inductor's code generation, to keep torch's compile short)."""
from __future__ import annotations

import warnings

import torch

import holoflow as flow


def _fn(lib):
    def f(x):
        w = lib.ones(3, requires_grad=True)
        z = lib.zeros(3).requires_grad_()
        return w, (w * x + z).sin()
    return f


def _leaves_of(node) -> list:
    return [n.variable for n, _ in node.next_functions if n is not None and "AccumulateGrad" in n.name()]


def _run(lib) -> list:
    got = []
    cf = lib.compile(_fn(lib), backend="aot_eager")
    x = lib.tensor([0.5, 1.0, -2.0])
    w, y = cf(x)
    made = _leaves_of(y.grad_fn)
    got.append((w.is_leaf, w.requires_grad, w.grad_fn is None, y.requires_grad, y.is_leaf, len(made),
                sum(m is w for m in made)))
    y.sum().backward()
    got.append(w.grad.tolist())
    w2, _ = cf(x)
    got.append((w2 is w, w2.grad is None, w.grad.tolist()))
    xr = lib.tensor([0.5, 1.0, -2.0], requires_grad=True)
    w, y = cf(xr)
    got.append((len(_leaves_of(y.grad_fn)), sum(m is xr for m in _leaves_of(y.grad_fn))))
    (y * lib.tensor([1.0, 10.0, 100.0])).sum().backward()
    got += [[round(v, 5) for v in xr.grad.tolist()], [round(v, 5) for v in w.grad.tolist()]]
    with lib.no_grad():
        w, y = cf(x)
    got.append((w.requires_grad, w.is_leaf, y.requires_grad))
    return got


def test_a_leaf_made_inside_a_compiled_call_is_torch_compiles():
    with warnings.catch_warnings():
        warnings.simplefilter("error", UserWarning)   # (holoflow's: a signature that runs eagerly)
        got = _run(flow)
    assert got == _run(torch)

"""Differential fuzzing of ``holoflow.compile``: the random training programs of the graph fuzzer
(tests/graph/test_fuzz_graph.py: random ops over inputs, parameters and intermediates, in-place
writes, buffer updates under no_grad, a loss, backward, an optimizer step) run with the module
compiled and uncompiled, eager training loop around both, for 3 steps (with gradient
accumulation over two micro-batches for some seeds); losses, outputs, parameters and buffers
must agree. A program that cannot be traced runs eagerly (its warning is expected); at least
most programs must trace."""
from __future__ import annotations

import os
import warnings

import pytest

import holoflow as flow
from test_fuzz_graph import BATCH, TRAIN_STEPS, _assert_close, _generate, _np, _optimizer, _pools, _program, \
    _state, _weights

# CI runs 60 programs; HOLOFLOW_FUZZ_SEEDS=N runs N (a longer local hunt)
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))
SEEDS = range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 60)))


def _run(seed: int, program, weights, opt_kind: str, acc: int, compiled: bool) -> tuple:
    flow.manual_seed(0)
    m = _weights(flow, seed)
    opt = _optimizer(flow, m, opt_kind)
    call = flow.compile(m, backend="eager") if compiled else m
    x, z = (flow.tensor(v) for v in _pools(seed, BATCH))
    losses, outs = [], []
    for _ in range(TRAIN_STEPS):
        opt.zero_grad(set_to_none=True)
        for xc, zc in zip(x.chunk(acc, 0), z.chunk(acc, 0)):
            loss, out = call(xc, zc, program, weights)
            losses.append(float(loss.detach()))
            if loss.requires_grad:
                (loss / acc if acc > 1 else loss).backward()
        opt.step()
        outs.append(_np(out))
    traced = compiled and any(type(p).__name__ == "_Plan" for p in call._compiler.plans.values())
    return (losses, outs, _state(m)), traced


@pytest.mark.parametrize("seed", SEEDS)
def test_random_program_compiled_agrees_with_eager(seed):
    program, weights, config, opt = _generate(seed)
    acc = 2 if seed % 3 == 0 else 1
    want, _ = _run(seed, program, weights, opt, acc, compiled=False)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="holoflow.compile")
        got, traced = _run(seed, program, weights, opt, acc, compiled=True)
    _assert_close(got, want, 1e-5, f"compiled vs eager (traced: {traced})\n{_program(seed)}")


def test_most_random_programs_trace():
    """The fuzzer above would pass trivially if every program ran eagerly."""
    traced = 0
    for seed in range(12):
        program, weights, _, opt = _generate(seed)
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message="holoflow.compile")
            traced += _run(seed, program, weights, opt, 1, compiled=True)[1]
    assert traced >= 8, f"{traced} of 12 programs traced"

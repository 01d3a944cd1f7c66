"""holoflow.quasirandom.SobolEngine against torch.quasirandom.SobolEngine: the same points for the
same arguments (plain, scrambled with a seed, scrambled from the default generator), in sequence
across draw / draw_base2 / fast_forward / reset, dtypes and out=, torch's errors, repr, and the
module's place in the facade (holoflow.quasirandom, under mock_torch as torch.quasirandom)."""
from __future__ import annotations

import inspect

import pytest
import torch

import holoflow as flow


def _same(got, want) -> None:
    assert isinstance(got, flow.Tensor)
    t = got.to_torch()
    assert t.dtype == want.dtype and t.shape == want.shape
    assert torch.equal(t, want)


def _pair(*args, **kwargs):
    return flow.quasirandom.SobolEngine(*args, **kwargs), torch.quasirandom.SobolEngine(*args, **kwargs)


@pytest.mark.parametrize("args", [dict(dimension=1), dict(dimension=5), dict(dimension=3, scramble=True, seed=7),
                                  dict(dimension=40, scramble=True, seed=0), dict(dimension=21201)],
                         ids=["d1", "d5", "scrambled", "scrambled-d40", "max-dim"])
def test_draw_sequences_equal_torch(args):
    f, t = _pair(**args)
    for n in (1, 1, 5, 16, 3):
        _same(f.draw(n), t.draw(n))
    assert f.num_generated == t.num_generated == 26
    f.reset()
    t.reset()
    _same(f.draw(4), t.draw(4))


def test_first_draw_of_many_and_base2_equal_torch():
    f, t = _pair(6, scramble=True, seed=11)
    _same(f.draw_base2(3), t.draw_base2(3))
    _same(f.draw_base2(3), t.draw_base2(3))   # 8 + 8: still a power of 2
    _same(f.draw_base2(4), t.draw_base2(4))
    f, t = _pair(2)
    _same(f.draw(9), t.draw(9))                # n > 1 on the first draw: the first point, then n - 1


def test_scrambling_draws_from_the_default_generator_like_torch():
    torch.manual_seed(5)
    t = torch.quasirandom.SobolEngine(4, scramble=True)
    after_torch = torch.rand(2)
    flow.manual_seed(5)
    f = flow.quasirandom.SobolEngine(4, scramble=True)
    after_flow = flow.rand(2)
    _same(f.draw(10), t.draw(10))
    assert torch.equal(after_flow.to_torch(), after_torch)   # the same numbers consumed
    assert torch.equal(f.shift.to_torch(), t.shift) and torch.equal(f.sobolstate.to_torch(), t.sobolstate)


def test_fast_forward_equals_torch():
    f, t = _pair(3, scramble=True, seed=2)
    assert f.fast_forward(5) is f
    t.fast_forward(5)
    _same(f.draw(3), t.draw(3))
    f.fast_forward(4)
    t.fast_forward(4)
    _same(f.draw(2), t.draw(2))
    assert f.num_generated == t.num_generated == 14
    f2 = flow.quasirandom.SobolEngine(3, scramble=True, seed=2)
    f2.draw(14)
    _same(flow.quasirandom.SobolEngine(3, scramble=True, seed=2).fast_forward(14).draw(1), t.draw(1))
    _same(f2.draw(1), torch.quasirandom.SobolEngine(3, scramble=True, seed=2).fast_forward(14).draw(1))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_dtypes_and_default_dtype_like_torch(dtype):
    f, t = _pair(3)
    _same(f.draw(4, dtype=getattr(flow, dtype)), t.draw(4, dtype=getattr(torch, dtype)))
    _same(f.draw(2, dtype=getattr(torch, dtype)), t.draw(2, dtype=getattr(torch, dtype)))   # torch's dtype too
    old = torch.get_default_dtype()
    try:
        torch.set_default_dtype(torch.float64)
        _same(f.draw(3), t.draw(3))
    finally:
        torch.set_default_dtype(old)


def test_half_precision_draws_fail_like_torch():
    # torch's kernel draws float32 and float64; only the very first point is converted
    for dtype in ("float16", "bfloat16"):
        f, t = _pair(3)
        _same(f.draw(1, dtype=getattr(flow, dtype)), t.draw(1, dtype=getattr(torch, dtype)))
        with pytest.raises(NotImplementedError, match="not implemented for"):
            t.draw(2, dtype=getattr(torch, dtype))
        with pytest.raises(NotImplementedError, match="^holoflow.quasirandom.SobolEngine.draw: .*not implemented for"):
            f.draw(2, dtype=getattr(flow, dtype))


def test_out_is_resized_and_filled_like_torch():
    f, t = _pair(4, scramble=True, seed=1)
    fo, to = flow.zeros(1), torch.zeros(1)
    assert f.draw(5, out=fo) is fo
    t.draw(5, out=to)
    _same(fo, to)
    fo, to = flow.zeros(2, 2, dtype=flow.float64), torch.zeros(2, 2, dtype=torch.float64)
    f, t = _pair(4, scramble=True, seed=1)
    f.draw_base2(0, out=fo, dtype=flow.float64)
    t.draw_base2(0, out=to, dtype=torch.float64)
    _same(fo, to)
    with pytest.raises(TypeError, match="^holoflow.quasirandom.SobolEngine.draw: out must be a local holoflow Tensor"):
        f.draw(1, out=torch.zeros(1))


def test_errors_and_repr_like_torch():
    for bad in (0, 21202):
        with pytest.raises(ValueError, match="Supported range of dimensionality"):
            torch.quasirandom.SobolEngine(bad)
        with pytest.raises(ValueError, match="^holoflow.quasirandom.SobolEngine: Supported range of dimensionality "
                                             "for SobolEngine is \\[1, 21201\\]"):
            flow.quasirandom.SobolEngine(bad)
    f, t = _pair(3)
    f.draw(3)
    t.draw(3)
    with pytest.raises(ValueError, match="require n to be a power of 2. 3 points have been previously generated"):
        t.draw_base2(2)
    with pytest.raises(ValueError, match="^holoflow.quasirandom.SobolEngine.draw_base2: The balance properties of "
                                         "Sobol' points require n to be a power of 2. 3 points have been previously"):
        f.draw_base2(2)
    for args in (dict(dimension=3), dict(dimension=3, scramble=True), dict(dimension=3, scramble=True, seed=4)):
        f, t = _pair(**args)
        assert repr(f) == repr(t)
    assert f.MAXBIT == t.MAXBIT and f.MAXDIM == t.MAXDIM


def test_api_matches_torch():
    T, F = torch.quasirandom.SobolEngine, flow.quasirandom.SobolEngine
    for name in ("__init__", "draw", "draw_base2", "reset", "fast_forward"):
        tp = inspect.signature(getattr(T, name)).parameters
        fp = inspect.signature(getattr(F, name)).parameters
        assert [(p.name, p.default) for p in fp.values()] == [(p.name, p.default) for p in tp.values()], name
    assert flow.quasirandom.__all__ == ["SobolEngine"]


def test_facade_and_mock_torch_expose_it():
    assert flow.quasirandom.SobolEngine is flow.quasirandom.__dict__["SobolEngine"]
    from holoflow import mock_torch
    with mock_torch.enable():
        import torch as mocked
        engine = mocked.quasirandom.SobolEngine(2)
    assert isinstance(engine, flow.quasirandom.SobolEngine)

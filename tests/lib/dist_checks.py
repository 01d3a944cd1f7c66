"""Helpers the distributions tests share: parameters as torch leaves and holoflow twins, and
comparisons of values and parameter gradients against torch's."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow

F64, F32 = torch.float64, torch.float32


def tt(a, dtype=F64) -> torch.Tensor:
    return a.to(dtype) if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype)


def ft(a, dtype=F64) -> flow.Tensor:
    return flow.from_torch(tt(a, dtype))


def params(arrays, dtype=F64) -> tuple[list, list]:
    """Each array as a torch leaf requiring grad, and a holoflow leaf of the same values."""
    ts = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    fs = [flow.from_torch(t.detach().clone()).requires_grad_() for t in ts]
    return ts, fs


def close(got, want, what: str, **tol) -> None:
    got = got.to_torch() if isinstance(got, flow.Tensor) else got
    want = want.detach() if isinstance(want, torch.Tensor) else want
    assert tuple(got.shape) == tuple(want.shape), f"{what}: shape {tuple(got.shape)} vs torch {tuple(want.shape)}"
    assert got.dtype == want.dtype, f"{what}: dtype {got.dtype} vs torch {want.dtype}"
    torch.testing.assert_close(got.detach(), want, equal_nan=True, msg=lambda m: f"{what}: {m}", **tol)


def grads_close(fouts, touts, fp, tp, what: str) -> None:
    """Gradients of the sum of the finite entries of the outputs, w.r.t. every parameter; where
    torch has no such derivative (igamma's in its input), holoflow raises as torch does."""
    tl = sum(torch.where(o.isfinite(), o, 0).sum() for o in touts)
    fl = sum(flow.where(o.isfinite(), o, 0).sum() for o in fouts)
    try:
        tg = torch.autograd.grad(tl, tp, allow_unused=True)
    except NotImplementedError:
        with pytest.raises(NotImplementedError):
            flow.autograd.grad(fl, fp, allow_unused=True)
        return
    fg = flow.autograd.grad(fl, fp, allow_unused=True)
    for i, (f, t) in enumerate(zip(fg, tg)):
        if t is None or not bool(t.ne(0).any()):
            assert f is None or not bool(f.to_torch().ne(0).any()), f"{what}: grad {i} should be None/zero"
        else:
            assert f is not None, f"{what}: no gradient for parameter {i}"
            close(f, t, f"{what} grad {i}")


def both(fn_t, fn_f, what: str = "") -> tuple:
    """Calls both; where torch raises, holoflow raises the same class (then (None, None));
    returns (torch's, holoflow's)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            want = fn_t()
    except Exception as e:  # noqa: BLE001 - the class is what is compared
        with pytest.raises(type(e)):
            fn_f()
        return None, None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return want, fn_f()

"""Helpers the distributions tests share: parameters as torch leaves and holoflow twins, and
comparisons of values and parameter gradients against torch's."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow

F64, F32 = torch.float64, torch.float32

# matrices the matrix-valued families take (two batch entries): covariances, their Cholesky
# factors, correlation matrices and theirs
S_MATS = [[[2.0, 0.3, 0.1], [0.3, 1.0, -0.2], [0.1, -0.2, 1.5]], [[1.0, -0.2, 0.0], [-0.2, 0.5, 0.1], [0.0, 0.1, 0.8]]]
CORR = torch.tensor([[[1.0, 0.3, -0.2], [0.3, 1.0, 0.4], [-0.2, 0.4, 1.0]],
                     [[1.0, -0.5, 0.1], [-0.5, 1.0, 0.2], [0.1, 0.2, 1.0]]], dtype=F64)
L_CORR = torch.linalg.cholesky(CORR)
TRIL = torch.linalg.cholesky(torch.tensor(S_MATS, dtype=F64)).tolist()


def tt(a, dtype=F64) -> torch.Tensor:
    return a.to(dtype) if isinstance(a, torch.Tensor) else torch.tensor(a, dtype=dtype)


def ft(a, dtype=F64) -> flow.Tensor:
    return flow.from_torch(tt(a, dtype))


def params(arrays, dtype=F64) -> tuple[list, list]:
    """Each array as a torch leaf requiring grad, and a holoflow leaf of the same values."""
    ts = [torch.tensor(a, dtype=dtype, requires_grad=True) for a in arrays]
    fs = [flow.from_torch(t.detach().clone()).requires_grad_() for t in ts]
    return ts, fs


def build(spec, TD, FD) -> tuple:
    """``(torch's, holoflow's distribution, torch's and holoflow's parameters, the value)`` of a
    spec ``(maker(D, params, T), parameter arrays, a value in the support[, dtype])``."""
    make, arrays, value, *rest = spec
    dtype = rest[0] if rest else F64
    tp, fp = params(arrays, dtype)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (Wishart's low-df warning)
        td, fd = make(TD, tp, tt), make(FD, fp, ft)
    return td, fd, tp, fp, tt(value, dtype)


def sample(d, seed: int, lib_is_torch: bool, *args, method: str = "sample"):
    """``d.sample(*args)`` (or ``method``) right after seeding its library with ``seed``."""
    (torch if lib_is_torch else flow).manual_seed(seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return getattr(d, method)(*args)


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

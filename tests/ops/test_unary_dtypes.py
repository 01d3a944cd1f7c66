"""Every torch function holoflow also has, called on one tensor of each dtype (bool, integers,
half, bfloat16, float, double, complex): where torch gives a tensor, holoflow gives one of the
same dtype, shape and values, and where torch differentiates it (float64, complex128), the same
gradient (found: round of an integer tensor was refused)."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow

DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int32, torch.int64, torch.float16, torch.bfloat16,
          torch.float32, torch.float64, torch.complex64]
# not one-tensor functions (creation, randomness, several inputs or outputs, settings)
SKIP = set("""
Generator Size Tensor allclose alpha_dropout aminmax arange argsort argwhere as_tensor asarray atleast_1d
atleast_2d atleast_3d autocast bernoulli bincount block_diag broadcast_shapes broadcast_tensors bucketize
can_cast cartesian_prod cat cdist chunk clone column_stack combinations compile concat concatenate cond cuda
detach device dropout dsplit dstack dtype einsum empty empty_like empty_permuted empty_strided enable_grad
equal eye feature_alpha_dropout feature_dropout frexp from_file from_numpy frombuffer full full_like
get_default_dtype get_device get_num_threads get_rng_state histc histogram histogramdd hsplit hstack
inference_mode initial_seed is_complex is_conj is_floating_point is_grad_enabled is_inference_mode_enabled
is_neg is_nonzero is_same_size is_signed is_storage is_tensor isclose istft kthvalue linspace load lobpcg
logspace lu lu_unpack manual_seed max median meshgrid min mode msort multinomial nanmedian nanquantile no_grad
nonzero normal numel ones ones_like pca_lowrank poisson promote_types quantile rand rand_like randint
randint_like randn randn_like randperm range result_type row_stack rrelu save searchsorted seed
set_default_device set_default_dtype set_default_tensor_type set_flush_denormal set_grad_enabled
set_num_interop_threads set_num_threads set_printoptions set_rng_state set_warn_always sort sparse_coo_tensor
split stack std_mean stft svd_lowrank sym_float sym_int sym_ite sym_max sym_min sym_not sym_sqrt sym_sum
tensor tensor_split topk tril_indices triu_indices typename unbind unique unique_consecutive
use_deterministic_algorithms var_mean vmap vsplit vstack where zeros zeros_like
""".split())
NAMES = sorted(n for n in dir(torch) if not n.startswith("_") and callable(getattr(torch, n))
               and hasattr(flow, n) and n not in SKIP)


def _values(dt: torch.dtype) -> torch.Tensor:
    if dt == torch.bool:
        return torch.tensor([True, False, True])
    if dt.is_complex:
        return torch.tensor([0.5 + 1j, 2 - 1j, -3 + 0.25j], dtype=dt)
    if dt.is_floating_point:
        return torch.tensor([0.5, -2.0, 3.0], dtype=dt)
    return torch.tensor([1, 2, 3], dtype=dt)


@pytest.mark.parametrize("name", NAMES)
def test_one_tensor_functions_match_torch_for_every_dtype(name):
    tf, ff = getattr(torch, name), getattr(flow, name)
    for dt in DTYPES:
        t = _values(dt)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                want = tf(t)
        except Exception:   # torch refuses this dtype (or needs more arguments)
            continue
        if not isinstance(want, torch.Tensor):
            continue
        got = ff(flow.from_torch(t))
        assert isinstance(got, flow.Tensor), f"holoflow.{name}({dt}) gave {type(got).__name__}"
        g = got.to_torch()
        assert (g.dtype, g.shape) == (want.dtype, want.shape), f"holoflow.{name}({dt}): {g.dtype} {tuple(g.shape)}"
        low = dt in (torch.float16, torch.bfloat16)
        torch.testing.assert_close(g, want, equal_nan=True, rtol=1e-2 if low else 1e-5, atol=1e-3 if low else 1e-6,
                                   msg=lambda m: f"holoflow.{name}({dt}): {m}")


# the legacy typed constructors (``torch.DoubleTensor(x)``) return torch's own aliasing quirks
LEGACY = {"DoubleTensor", "FloatTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor", "ShortTensor",
          "CharTensor", "ByteTensor", "BoolTensor"}


@pytest.mark.parametrize("dtype", [torch.float64, torch.complex128])
def test_one_tensor_functions_gradients_match_torch(dtype):
    """Every shared one-tensor function torch differentiates, on real and complex inputs (torch's
    conjugate convention for the complex gradient of a real loss)."""
    x0 = torch.tensor([[0.5, -0.3, 0.8], [0.2, 0.6, -0.7]], dtype=torch.float64)
    if dtype.is_complex:
        x0 = x0 + 1j * torch.tensor([[0.3, 0.4, -0.2], [0.1, -0.5, 0.25]], dtype=torch.float64)
    mismatches, checked = [], 0
    for name in NAMES:
        if name in LEGACY:
            continue
        x = x0.clone().requires_grad_()
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                y = getattr(torch, name)(x)
                if not isinstance(y, torch.Tensor) or not y.requires_grad:
                    continue
                w = torch.randn(y.shape, dtype=y.dtype, generator=torch.Generator().manual_seed(1))
                want, = torch.autograd.grad((y * w).real.sum() if y.is_complex() else (y * w).sum(), x)
        except Exception:   # torch does not differentiate it (or needs more arguments)
            continue
        checked += 1
        fx = flow.from_torch(x0.clone()).requires_grad_()
        fy = getattr(flow, name)(fx)
        fw = flow.from_torch(w)
        got, = flow.autograd.grad((fy * fw).real.sum() if fy.is_complex() else (fy * fw).sum(), fx)
        if not torch.allclose(got.to_torch(), want, rtol=1e-6, atol=1e-8, equal_nan=True):
            mismatches.append(f"{name}: gradient differs by {(got.to_torch() - want).abs().max().item()}")
    assert not mismatches, "\n".join(mismatches)
    assert checked > 80

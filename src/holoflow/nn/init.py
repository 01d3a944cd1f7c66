"""``nn.init``: in-place initialisers, with torch's formulas and torch's RNG consumption.

Each fills the tensor's storage under ``no_grad`` with the same kernel calls, in the same order,
as ``torch.nn.init``; holoflow draws from torch's global RNG, so under one ``manual_seed`` the
values are torch's exactly (on a simulated rank's thread, from the rank's own: core/generators.py).
"""
from __future__ import annotations

import functools
import math
import warnings
from typing import Any, Callable

import torch

from ..core import generators
from ..core.tensor import Tensor

__all__ = ["calculate_gain", "uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_",
           "eye_", "dirac_", "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_",
           "orthogonal_", "sparse_", "uniform", "normal", "constant", "eye", "dirac", "xavier_uniform",
           "xavier_normal", "kaiming_uniform", "kaiming_normal", "orthogonal", "sparse"]


def _gen(generator: Any, t: torch.Tensor) -> torch.Generator | None:
    """The generator drawing into ``t``: the caller's, else a simulated rank's own, else torch's."""
    return generators.for_kernel(generator, t.device)


def _storage(tensor: Tensor) -> torch.Tensor:
    if not isinstance(tensor, Tensor):
        raise TypeError(f"holoflow.nn.init: expected a holoflow Tensor, got {type(tensor).__name__}")
    return tensor._data


def _global_aware(fn: Callable) -> Callable:
    """A global tensor is initialised as its logical whole (the same random draws as the single
    process), then each rank keeps its shard: a model built inside ``global_mode`` starts from
    the single-process weights."""
    @functools.wraps(fn)
    def init(tensor, *args, **kwargs):
        g = tensor._global if isinstance(tensor, Tensor) else None
        if g is None:
            return fn(tensor, *args, **kwargs)
        whole = Tensor._make(torch.empty(tuple(g.shape), dtype=tensor._data.dtype, device=tensor._data.device))
        fn(whole, *args, **kwargs)
        shard = g.placement.interpreter.from_full(whole._data, g.placement, g.sbp)
        with torch.no_grad():
            tensor._data.copy_(shard._data)
        return tensor
    return init


def calculate_gain(nonlinearity: str, param: float | None = None) -> float:
    """The recommended gain for ``nonlinearity`` (torch's table)."""
    linear_fns = ["linear", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
                  "conv_transpose3d"]
    if nonlinearity in linear_fns or nonlinearity == "sigmoid":
        return 1
    if nonlinearity == "tanh":
        return 5.0 / 3
    if nonlinearity == "relu":
        return math.sqrt(2.0)
    if nonlinearity == "leaky_relu":
        if param is None:
            negative_slope = 0.01
        elif not isinstance(param, bool) and isinstance(param, (int, float)):
            negative_slope = param
        else:
            raise ValueError(f"negative_slope {param} not a valid number")
        return math.sqrt(2.0 / (1 + negative_slope**2))
    if nonlinearity == "selu":
        return 3.0 / 4
    raise ValueError(f"Unsupported nonlinearity {nonlinearity}")


def _calculate_fan_in_and_fan_out(tensor: Tensor) -> tuple[int, int]:
    shape = tuple(tensor.shape)
    if len(shape) < 2:
        raise ValueError("Fan in and fan out can not be computed for tensor with fewer than 2 dimensions")
    receptive = math.prod(shape[2:])
    return shape[1] * receptive, shape[0] * receptive


def _calculate_correct_fan(tensor: Tensor, mode: str) -> int:
    mode = mode.lower()
    if mode not in ("fan_in", "fan_out"):
        raise ValueError(f"Mode {mode} not supported, please use one of fan_in, fan_out")
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    return fan_in if mode == "fan_in" else fan_out


def uniform_(tensor: Tensor, a: float = 0.0, b: float = 1.0, generator: Any = None) -> Tensor:
    """Fills ``tensor`` from U(a, b)."""
    with torch.no_grad():
        t = _storage(tensor)
        t.uniform_(a, b, generator=_gen(generator, t))
    return tensor


def normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, generator: Any = None) -> Tensor:
    """Fills ``tensor`` from N(mean, std²)."""
    with torch.no_grad():
        t = _storage(tensor)
        t.normal_(mean, std, generator=_gen(generator, t))
    return tensor


def trunc_normal_(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                  generator: Any = None) -> Tensor:
    """Fills ``tensor`` from N(mean, std²) truncated to [a, b], by rejection sampling as torch
    does (normal draws when [a, b] holds most of the mass, uniform proposals otherwise)."""
    def norm_cdf(x: float) -> float:
        return (1.0 + math.erf(x / math.sqrt(2.0))) / 2.0

    if (mean < a - 2 * std) or (mean > b + 2 * std):
        warnings.warn("mean is more than 2 std from [a, b] in nn.init.trunc_normal_. "
                      "The distribution of values may be incorrect.", stacklevel=2)
    t = _storage(tensor)
    g = _gen(generator, t)
    with torch.no_grad():
        if norm_cdf((b - mean) / std) - norm_cdf((a - mean) / std) > 0.3:
            _trunc_by_normal(t, mean, std, a, b, g)
        else:
            _trunc_by_uniform(t, mean, std, a, b, g)
    return tensor


def _trunc_by_normal(t: torch.Tensor, mean: float, std: float, a: float, b: float, g: Any) -> None:
    lo, hi = t.new_tensor(a, device="cpu").item(), t.new_tensor(b, device="cpu").item()
    result = t.normal_(mean, std, generator=g)
    while True:
        mask = (result < lo) | (result > hi)
        if not mask.any():
            break
        result = torch.where(mask, torch.empty_like(result).normal_(mean, std, generator=g), result)
    if t is not result:
        t.copy_(result)


def _trunc_by_uniform(t: torch.Tensor, mean: float, std: float, a: float, b: float, g: Any) -> None:
    log_peak = -0.5 * ((max(a, min(mean, b)) - mean) / std) ** 2
    candidates, accept = torch.empty_like(t), torch.empty_like(t)
    t.uniform_(a, b, generator=g)
    candidates.copy_(t)
    candidates.sub_(mean).div_(std).pow_(2).mul_(-0.5).sub_(log_peak)
    pending = accept.uniform_(generator=g).log_().gt(candidates)
    result = t
    while pending.any():
        candidates.uniform_(a, b, generator=g)
        result = torch.where(pending, candidates, result)
        candidates.sub_(mean).div_(std).pow_(2).mul_(-0.5).sub_(log_peak)
        pending = torch.where(pending, accept.uniform_(generator=g).log_().gt(candidates), pending)
    if result is not t:
        t.copy_(result)


def constant_(tensor: Tensor, val: float) -> Tensor:
    """Fills ``tensor`` with ``val``."""
    with torch.no_grad():
        _storage(tensor).fill_(val)
    return tensor


def ones_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 1.0)


def zeros_(tensor: Tensor) -> Tensor:
    return constant_(tensor, 0.0)


def eye_(tensor: Tensor) -> Tensor:
    """Fills a 2-D ``tensor`` with the identity matrix."""
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    with torch.no_grad():
        t = _storage(tensor)
        t.copy_(torch.eye(*t.shape, dtype=t.dtype, device=t.device))
    return tensor


def dirac_(tensor: Tensor, groups: int = 1) -> Tensor:
    """Fills a 3/4/5-D conv weight with the Dirac delta (identity convolution)."""
    with torch.no_grad():
        torch.nn.init.dirac_(_storage(tensor), groups)
    return tensor


def xavier_uniform_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot uniform: U(-a, a), ``a = gain * sqrt(6 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    a = math.sqrt(3.0) * std
    return uniform_(tensor, -a, a, generator)


def xavier_normal_(tensor: Tensor, gain: float = 1.0, generator: Any = None) -> Tensor:
    """Glorot normal: N(0, std²), ``std = gain * sqrt(2 / (fan_in + fan_out))``."""
    fan_in, fan_out = _calculate_fan_in_and_fan_out(tensor)
    std = gain * math.sqrt(2.0 / float(fan_in + fan_out))
    return normal_(tensor, 0.0, std, generator)


def _kaiming_std(tensor: Tensor, a: float, mode: str, nonlinearity: str) -> float | None:
    if 0 in tuple(tensor.shape):
        warnings.warn("Initializing zero-element tensors is a no-op", stacklevel=3)
        return None
    fan = _calculate_correct_fan(tensor, mode)
    return calculate_gain(nonlinearity, a) / math.sqrt(fan)


def kaiming_uniform_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                     generator: Any = None) -> Tensor:
    """He uniform: U(-bound, bound), ``bound = gain * sqrt(3 / fan)``."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    bound = math.sqrt(3.0) * std
    return uniform_(tensor, -bound, bound, generator)


def kaiming_normal_(tensor: Tensor, a: float = 0, mode: str = "fan_in", nonlinearity: str = "leaky_relu",
                    generator: Any = None) -> Tensor:
    """He normal: N(0, std²), ``std = gain / sqrt(fan)``."""
    std = _kaiming_std(tensor, a, mode, nonlinearity)
    if std is None:
        return tensor
    return normal_(tensor, 0.0, std, generator)


def orthogonal_(tensor: Tensor, gain: float = 1, generator: Any = None) -> Tensor:
    """A (semi-)orthogonal matrix from the QR decomposition of a normal sample, as torch."""
    if tensor.dim() < 2:
        raise ValueError("Only tensors with 2 or more dimensions are supported")
    if tensor.numel() == 0:
        return tensor
    t = _storage(tensor)
    rows = t.size(0)
    cols = t.numel() // rows
    flat = t.new_empty((rows, cols)).normal_(0, 1, generator=_gen(generator, t))
    if rows < cols:
        flat.t_()
    q, r = torch.linalg.qr(flat)
    q *= torch.diag(r, 0).sign()
    if rows < cols:
        q.t_()
    with torch.no_grad():
        t.view_as(q).copy_(q)
        t.mul_(gain)
    return tensor


def sparse_(tensor: Tensor, sparsity: float, std: float = 0.01, generator: Any = None) -> Tensor:
    """A 2-D ``tensor`` from N(0, std²) with ``ceil(sparsity * rows)`` entries of each column set to
    zero, the rows chosen by a ``randperm`` per column, drawn in torch's order (as torch's, only the
    normal draws use ``generator``; the permutations come from the global RNG)."""
    if tensor.dim() != 2:
        raise ValueError("Only tensors with 2 dimensions are supported")
    t = _storage(tensor)
    if t.is_meta:
        return tensor
    rows, cols = t.shape
    num_zeros = int(math.ceil(sparsity * rows))
    with torch.no_grad():
        t.normal_(0, std, generator=_gen(generator, t))
        perms = _gen(None, torch.empty(0))   # (the default device's default generator)
        for col in range(cols):
            zero_rows = torch.randperm(rows, generator=perms)[:num_zeros]
            t[zero_rows, col] = 0
    return tensor


for _name in ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_", "dirac_",
              "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_",
              "sparse_"):
    globals()[_name] = _global_aware(globals()[_name])


def _deprecated(fn: Callable) -> Callable:
    """torch's deprecated spelling without the trailing underscore, warning as torch's does."""
    new_name = fn.__name__
    old_name = new_name[:-1]

    def old(*args: Any, **kwargs: Any) -> Tensor:
        warnings.warn(f"`nn.init.{old_name}` is now deprecated in favor of `nn.init.{new_name}`.",
                      FutureWarning, stacklevel=2)
        return fn(*args, **kwargs)
    old.__name__ = old.__qualname__ = old_name
    old.__doc__ = f"{old_name}(...): deprecated in favor of :func:`{new_name}` (as torch's)."
    return old


# (made after the global-aware wrapping above, so the old spellings initialise global tensors too)
uniform, normal, constant = _deprecated(uniform_), _deprecated(normal_), _deprecated(constant_)
eye, dirac = _deprecated(eye_), _deprecated(dirac_)
xavier_uniform, xavier_normal = _deprecated(xavier_uniform_), _deprecated(xavier_normal_)
kaiming_uniform, kaiming_normal = _deprecated(kaiming_uniform_), _deprecated(kaiming_normal_)
orthogonal, sparse = _deprecated(orthogonal_), _deprecated(sparse_)

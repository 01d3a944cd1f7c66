"""``holoflow.nn.utils.parametrizations``: ``weight_norm`` and ``spectral_norm`` as
parametrizations (torch's current API; the state-dict keys are
``parametrizations.weight.original0/1`` and ``parametrizations.weight.original`` +
``parametrizations.weight.0._u/_v``)."""
from __future__ import annotations

import torch
import torch.nn.functional as TF

from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...ops.creation import empty
from ...ops.reduction import vector_norm
from .. import init
from ..module import Module
from .parametrize import register_parametrization

__all__ = ["weight_norm", "spectral_norm"]


def norm_except_dim(v: Tensor, pow: float = 2, dim: int = 0) -> Tensor:  # noqa: A002
    """The ``pow``-norm over every dim but ``dim`` (kept as size 1); ``dim=-1``: the whole norm."""
    if dim == -1:
        return vector_norm(v, pow)
    dims = tuple(d for d in range(v.dim()) if d != dim)
    return vector_norm(v, pow, dims, keepdim=True) if dims else v.abs()


def normalize(x: Tensor, dim: int = 0, eps: float = 1e-12) -> Tensor:
    """``x / max(||x||_2, eps)`` with the 2-norm kernel ``F.normalize`` uses (bitwise torch's)."""
    return x / vector_norm(x, 2, dim, keepdim=True).clamp_min(eps)


class _WeightNorm(Module):
    def __init__(self, dim: int | None = 0) -> None:
        super().__init__()
        self.dim = -1 if dim is None else dim

    def forward(self, weight_g: Tensor, weight_v: Tensor) -> Tensor:
        return weight_v * (weight_g / norm_except_dim(weight_v, 2, self.dim))

    def right_inverse(self, weight: Tensor) -> tuple[Tensor, Tensor]:
        return norm_except_dim(weight, 2, self.dim), weight


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """``module.<name> = g * v / ||v||`` with magnitude ``original0`` (g) and direction
    ``original1`` (v), norms over every dim but ``dim`` (None: the whole tensor)."""
    return register_parametrization(module, name, _WeightNorm(dim), unsafe=True)


class _SpectralNorm(Module):
    def __init__(self, weight: Tensor, n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        super().__init__()
        ndim = weight.dim()
        if dim >= ndim or dim < -ndim:
            raise IndexError("Dimension out of range (expected to be in range of "
                             f"[-{ndim}, {ndim - 1}] but got {dim})")
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.dim = dim if dim >= 0 else dim + ndim
        self.eps = eps
        if ndim > 1:
            self.n_power_iterations = n_power_iterations
            mat = self._reshape_weight_to_matrix(weight.detach())
            h, w = mat.shape
            u = init.normal_(empty(h, dtype=mat.dtype, device=mat.device), 0.0, 1.0)
            v = init.normal_(empty(w, dtype=mat.dtype, device=mat.device), 0.0, 1.0)
            self.register_buffer("_u", normalize(u, dim=0, eps=self.eps))
            self.register_buffer("_v", normalize(v, dim=0, eps=self.eps))
            self._power_method(mat, 15)

    def _reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.dim()) if d != self.dim))
        return weight.flatten(1)

    def _power_method(self, mat: Tensor, n: int) -> None:
        """``n`` power-iteration steps updating the ``_u``/``_v`` buffers in place: a no-grad
        buffer update like an initialiser (nn/init.py), so it runs torch's own ``mv`` and
        ``normalize`` calls on the storages and the estimates stay bitwise torch's."""
        with no_grad():
            w, u, v = mat.detach()._data, self._u._data, self._v._data
            for _ in range(n):
                u.copy_(TF.normalize(torch.mv(w, v), dim=0, eps=self.eps))
                v.copy_(TF.normalize(torch.mv(w.H, u), dim=0, eps=self.eps))

    def forward(self, weight: Tensor) -> Tensor:
        if weight.dim() == 1:
            return normalize(weight, dim=0, eps=self.eps)
        mat = self._reshape_weight_to_matrix(weight)
        if self.training:
            self._power_method(mat, self.n_power_iterations)
        u, v = self._u.clone(), self._v.clone()
        sigma = (u * (mat @ v)).sum()
        return weight / sigma

    def right_inverse(self, value: Tensor) -> Tensor:
        return value


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """``module.<name> / sigma``, ``sigma`` its largest singular value estimated by power
    iteration (one step per training forward; 15 at registration), as torch's."""
    weight = getattr(module, name, None)
    if not isinstance(weight, Tensor):
        raise ValueError(f"Module '{module}' has no parameter or buffer with name '{name}'")
    if dim is None:
        dim = 1 if type(module).__name__ in ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d") else 0
    return register_parametrization(module, name, _SpectralNorm(weight, n_power_iterations, dim, eps))

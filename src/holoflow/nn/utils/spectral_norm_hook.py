"""``holoflow.nn.utils.spectral_norm``: the older hook-based spectral normalization (parameter
``weight_orig``, buffers ``weight_u``/``weight_v``, ``weight`` recomputed before every forward
with one power-iteration step per training forward), as ``torch.nn.utils.spectral_norm``; the
parametrization form is in ``parametrizations``."""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as TF

from ...core.grad_mode import no_grad
from ...core.tensor import Tensor
from ...ops.creation import empty
from .. import init
from ..module import Module
from ..parameter import Parameter

__all__ = ["spectral_norm", "remove_spectral_norm"]


class SpectralNorm:
    def __init__(self, name: str = "weight", n_power_iterations: int = 1, dim: int = 0, eps: float = 1e-12) -> None:
        if n_power_iterations <= 0:
            raise ValueError("Expected n_power_iterations to be positive, but got "
                             f"n_power_iterations={n_power_iterations}")
        self.name, self.dim, self.n_power_iterations, self.eps = name, dim, n_power_iterations, eps

    def reshape_weight_to_matrix(self, weight: Tensor) -> Tensor:
        if self.dim != 0:
            weight = weight.permute(self.dim, *(d for d in range(weight.dim()) if d != self.dim))
        return weight.reshape(weight.shape[0], -1)

    def compute_weight(self, module: Module, do_power_iteration: bool) -> Tensor:
        weight = getattr(module, self.name + "_orig")
        u, v = getattr(module, self.name + "_u"), getattr(module, self.name + "_v")
        mat = self.reshape_weight_to_matrix(weight)
        if do_power_iteration:
            # a no-grad buffer update, like an initialiser: torch's own calls on the storages
            with no_grad():
                w, ud, vd = mat.detach()._data, u._data, v._data
                for _ in range(self.n_power_iterations):
                    vd.copy_(TF.normalize(torch.mv(w.t(), ud), dim=0, eps=self.eps))
                    ud.copy_(TF.normalize(torch.mv(w, vd), dim=0, eps=self.eps))
            u, v = u.clone(), v.clone()
        sigma = (u * (mat @ v)).sum()
        return weight / sigma

    def __call__(self, module: Module, inputs: Any) -> None:
        setattr(module, self.name, self.compute_weight(module, do_power_iteration=module.training))


def spectral_norm(module: Module, name: str = "weight", n_power_iterations: int = 1, eps: float = 1e-12,
                  dim: int | None = None) -> Module:
    """Replaces ``module.<name>`` by ``<name>_orig`` divided by its estimated largest singular value."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, SpectralNorm) and hook.name == name:
            raise RuntimeError(f"Cannot register two spectral_norm hooks on the same parameter {name}")
    if dim is None:
        dim = 1 if type(module).__name__ in ("ConvTranspose1d", "ConvTranspose2d", "ConvTranspose3d") else 0
    fn = SpectralNorm(name, n_power_iterations, dim, eps)
    weight = module._parameters[name]
    with no_grad():
        h, w = fn.reshape_weight_to_matrix(weight).shape
        u = init.normal_(empty(h, dtype=weight.dtype, device=weight.device), 0.0, 1.0)
        v = init.normal_(empty(w, dtype=weight.dtype, device=weight.device), 0.0, 1.0)
        u._data.copy_(TF.normalize(u._data, dim=0, eps=eps))
        v._data.copy_(TF.normalize(v._data, dim=0, eps=eps))
    del module._parameters[name]
    module.register_parameter(name + "_orig", weight)
    setattr(module, name, weight.detach())
    module.register_buffer(name + "_u", u)
    module.register_buffer(name + "_v", v)
    module.register_forward_pre_hook(fn)
    return module


def remove_spectral_norm(module: Module, name: str = "weight") -> Module:
    """Folds ``<name>_orig`` / sigma back into one ``<name>`` parameter."""
    for k, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, SpectralNorm) and hook.name == name:
            with no_grad():
                weight = hook.compute_weight(module, do_power_iteration=False).detach()
            delattr(module, name)
            del module._parameters[name + "_orig"]
            del module._buffers[name + "_u"]
            del module._buffers[name + "_v"]
            module.register_parameter(name, Parameter(weight))
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"spectral_norm of '{name}' not found in {module}")

"""``holoflow.nn.utils.weight_norm``: the older hook-based weight normalization
(parameters ``weight_g`` and ``weight_v``, ``weight`` recomputed before every forward), as
``torch.nn.utils.weight_norm``; the parametrization form is in ``parametrizations``."""
from __future__ import annotations

from typing import Any

from ...core.grad_mode import no_grad
from ..module import Module
from ..parameter import Parameter
from .parametrizations import norm_except_dim

__all__ = ["weight_norm", "remove_weight_norm"]


class WeightNorm:
    def __init__(self, name: str, dim: int) -> None:
        self.name, self.dim = name, -1 if dim is None else dim

    def compute_weight(self, module: Module):
        g, v = getattr(module, self.name + "_g"), getattr(module, self.name + "_v")
        return v * (g / norm_except_dim(v, 2, self.dim))

    def __call__(self, module: Module, inputs: Any) -> None:
        setattr(module, self.name, self.compute_weight(module))


def weight_norm(module: Module, name: str = "weight", dim: int | None = 0) -> Module:
    """Replaces ``module.<name>`` by ``<name>_g`` (magnitude) and ``<name>_v`` (direction)."""
    for hook in module._forward_pre_hooks.values():
        if isinstance(hook, WeightNorm) and hook.name == name:
            raise RuntimeError(f"Cannot register two weight_norm hooks on the same parameter {name}")
    fn = WeightNorm(name, dim)
    weight = getattr(module, name)
    del module._parameters[name]
    with no_grad():
        g = norm_except_dim(weight, 2, fn.dim).detach()
    module.register_parameter(name + "_g", Parameter(g))
    module.register_parameter(name + "_v", Parameter(weight.detach()))
    setattr(module, name, fn.compute_weight(module))
    module.register_forward_pre_hook(fn)
    return module


def remove_weight_norm(module: Module, name: str = "weight") -> Module:
    """Folds ``<name>_g`` and ``<name>_v`` back into one ``<name>`` parameter."""
    for k, hook in list(module._forward_pre_hooks.items()):
        if isinstance(hook, WeightNorm) and hook.name == name:
            with no_grad():
                weight = hook.compute_weight(module).detach()
            delattr(module, name)
            del module._parameters[name + "_g"]
            del module._parameters[name + "_v"]
            module.register_parameter(name, Parameter(weight))
            del module._forward_pre_hooks[k]
            return module
    raise ValueError(f"weight_norm of '{name}' not found in {module}")

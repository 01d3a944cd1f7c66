"""Hyper-parameter checks shared by the optimizers added for torch parity (torch's ValueErrors)."""
from __future__ import annotations

from typing import Any

from ..core.errors import UnsupportedError


def check_hyper(name: str, **values: float) -> None:
    """Raises ValueError naming the optimizer and the hyper-parameter when one is negative."""
    for key, val in values.items():
        if not val >= 0.0:
            raise ValueError(f"holoflow.optim.{name}: invalid {key} {val}; it must be >= 0")


def check_betas(name: str, betas: tuple[float, float]) -> None:
    """Raises ValueError unless both betas lie in [0, 1)."""
    for i, b in enumerate(betas):
        if not 0.0 <= b < 1.0:
            raise ValueError(f"holoflow.optim.{name}: invalid beta parameter at index {i}: {b}; "
                             f"it must lie in [0, 1)")


def scalar(value: Any) -> float:
    """A hyper-parameter as a Python float (a 1-element tensor ``lr`` too, as torch reads it)."""
    return float(value.item()) if hasattr(value, "item") else value


def refuse_shards(opt: Any, group: dict, params: list, grads: list, eager_foreach: bool) -> None:
    """Raises UnsupportedError where a rule that reads whole tensors (norms, matrix products)
    would be handed pieces of them: nn.Graph's update effects step a global parameter on this
    rank's shard (``_step_foreach`` with a global parameter, or ``_step_ops`` with a global
    parameter and a local gradient), and ZeRO steps rows of a parameter (a tensor that is none
    of the group's parameters). A replicated (broadcast) parameter's shard is the whole tensor:
    that is stepped. Eager steps of global parameters see them whole."""
    ids = {id(q) for q in group["params"]}
    for p, g in zip(params, grads):
        in_graph = p._global is not None and (eager_foreach or g._global is None)
        if id(p) in ids and not (in_graph and tuple(p._data.shape) != tuple(p.shape)):
            continue
        name = type(opt).__name__
        raise UnsupportedError(
            f"holoflow.optim.{name}: nn.Graph cannot run {name}'s update on pieces of a parameter of "
            f"shape {tuple(p.shape)} (a split global parameter's shard, or ZeRO's rows): the rule reads "
            f"whole tensors (norms, matrix products); step it eagerly (opt.step() outside the graph sees "
            f"global parameters whole), keep the parameter broadcast, or train without ZeRO")


def whole_pieces(params: list, grads: list) -> bool:
    """Whether an update effect of nn.Graph hands replicated global parameters (whole shards)
    with local gradients: the rule then runs on the storages, each rank on its replica."""
    return any(p._global is not None and g._global is None for p, g in zip(params, grads))

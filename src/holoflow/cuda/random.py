"""torch.cuda's seeding and random-state functions, each acting on a simulated rank's own CUDA
generators on that rank's thread (core/generators.py), as on a process's: ``manual_seed`` /
``manual_seed_all``, ``seed`` / ``seed_all``, ``initial_seed``, ``get_rng_state`` /
``set_rng_state`` and their ``_all`` forms. Elsewhere they are torch.cuda's own (on a machine
without CUDA: torch's answers; seeding is queued until CUDA initialises, as torch does).

Example::

    world.simulate(2, lambda r: flow.cuda.manual_seed(r))   # seeds each rank's CUDA generator;
                                                            # the process's is left alone
"""
from __future__ import annotations

from typing import Any

import torch

from ..core import generators

__all__ = ["manual_seed", "manual_seed_all", "seed", "seed_all", "initial_seed", "get_rng_state", "set_rng_state",
           "get_rng_state_all", "set_rng_state_all"]

_TORCH = {name: getattr(torch.cuda, name) for name in __all__}   # (torch's own, bound before any patch)


def _index() -> int:
    """The current CUDA device's index (0 before CUDA is initialised, as torch's lazy seeding
    seeds the device current once it is)."""
    return torch.cuda.current_device() if torch.cuda.is_initialized() else 0


def _device(device: Any) -> torch.device:
    """torch.cuda's ``device`` argument (an index, a string, a device) as a CUDA device."""
    dev = torch.device("cuda", device) if isinstance(device, int) else torch.device(device)
    if dev.type != "cuda":
        raise ValueError(f"holoflow.cuda: expected a CUDA device, got {device!r}")
    return dev if dev.index is not None else torch.device("cuda", _index())


def manual_seed(seed: int) -> None:
    """Seeds the current CUDA device's default generator (on a simulated rank: the rank's)."""
    gens = generators.current()
    if gens is None:
        return _TORCH["manual_seed"](seed)
    gens.seed_devices(int(seed), "cuda", _index())
    return None


def manual_seed_all(seed: int) -> None:
    """Seeds every CUDA device's default generator (on a simulated rank: the rank's)."""
    gens = generators.current()
    if gens is None:
        return _TORCH["manual_seed_all"](seed)
    gens.seed_devices(int(seed), "cuda", None)
    return None


def seed() -> None:
    """Seeds the current CUDA device's default generator with a non-deterministic number."""
    if generators.current() is None:
        return _TORCH["seed"]()
    return manual_seed(torch.Generator().seed())


def seed_all() -> None:
    """Seeds every CUDA device's default generator with one non-deterministic number."""
    if generators.current() is None:
        return _TORCH["seed_all"]()
    return manual_seed_all(torch.Generator().seed())


def initial_seed() -> int:
    """The seed of the current CUDA device's default generator."""
    gens = generators.current()
    if gens is None:
        return _TORCH["initial_seed"]()
    return gens.get(torch.device("cuda", torch.cuda.current_device())).initial_seed()


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    """The state of ``device``'s default generator (a ByteTensor)."""
    if generators.current() is None:
        return _TORCH["get_rng_state"](device)
    return generators.get_state(_device(device))


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    """Sets the state of ``device``'s default generator."""
    if generators.current() is None:
        return _TORCH["set_rng_state"](new_state, device)
    generators.set_state(getattr(new_state, "_data", new_state), _device(device))
    return None


def get_rng_state_all() -> list[torch.Tensor]:
    """The states of every CUDA device's default generator."""
    if generators.current() is None:
        return _TORCH["get_rng_state_all"]()
    return [get_rng_state(i) for i in range(torch.cuda.device_count())]


def set_rng_state_all(new_states: list) -> None:
    """Sets the states of every CUDA device's default generator, one per device."""
    if generators.current() is None:
        return _TORCH["set_rng_state_all"](new_states)
    for i, state in enumerate(new_states):
        set_rng_state(state, i)
    return None

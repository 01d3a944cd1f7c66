"""``holoflow.random``: torch.random's seeding functions (``manual_seed``, ``seed``,
``initial_seed``, ``get_rng_state``, ``set_rng_state``, ``fork_rng``).

holoflow's random ops draw from torch's generators (ops/random_ops.py), so these read and write
torch's global CPU generator (``manual_seed`` seeds the CUDA ones too, as torch's does), and
``fork_rng`` saves and restores those same states. On a simulated rank's thread they are that
rank's own generators instead, as its process's would be (core/generators.py).
"""
from __future__ import annotations

import contextlib
from typing import Any, Iterable, Iterator

import torch

from .core import generators
from .ops.creation import Generator, get_rng_state, initial_seed, manual_seed, seed, set_rng_state

__all__ = ["manual_seed", "seed", "initial_seed", "get_rng_state", "set_rng_state", "fork_rng",
           "default_generator"]


class _DefaultGenerator(Generator):
    """torch's default CPU generator, or on a simulated rank's thread that rank's."""

    def __init__(self) -> None:   # (no generator of its own)
        pass

    @property
    def torch(self) -> torch.Generator:
        return generators.cpu()


#: torch's default CPU generator, as a holoflow Generator (``holoflow.default_generator``)
default_generator = _DefaultGenerator()


def _device_module(device_type: str) -> Any:
    mod = getattr(torch, device_type, None)
    if mod is None or not hasattr(mod, "get_rng_state"):
        raise RuntimeError(f"holoflow.random.fork_rng: device type {device_type!r} has no random state "
                           f"holoflow can save (expected a device such as 'cuda')")
    return mod


@contextlib.contextmanager
def fork_rng(devices: Iterable[Any] | None = None, enabled: bool = True, _caller: str = "fork_rng",
             _devices_kw: str = "devices", device_type: str = "cuda") -> Iterator[None]:
    """Saves the CPU random state (and that of ``devices`` of ``device_type``: by default every
    visible one) on entry and restores it on exit, so draws inside leave no trace outside, as
    ``torch.random.fork_rng``. ``enabled=False`` makes it a no-op."""
    if not enabled:
        yield
        return
    if device_type == "meta":   # no random state to fork, as torch
        yield
        return
    mod = _device_module(device_type) if device_type != "cpu" else None
    if mod is None:   # the CPU state alone (saved below in every case)
        devices = []
    elif devices is None:
        devices = list(range(mod.device_count())) if mod.is_available() else []
    else:
        devices = list(devices)
    cpu_state = generators.get_state()
    try:
        devices = [d if isinstance(d, torch.device) else torch.device(d) if isinstance(d, str) else
                   torch.device(device_type, int(d)) for d in devices]
        dev_states = [generators.get_state(d) for d in devices]
    except (RuntimeError, AssertionError) as e:   # torch's class: no such device, or none compiled in
        raise type(e)(f"holoflow.random.fork_rng: cannot read the random state of {device_type} devices "
                      f"{devices}: {str(e).splitlines()[0]}") from None
    try:
        yield
    finally:
        generators.set_state(cpu_state)
        for d, s in zip(devices, dev_states):
            generators.set_state(s, d)

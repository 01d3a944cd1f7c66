"""The default generators random kernels draw from: torch's, or a simulated rank's own.

In a real world every process holds torch's default generators, so after the same ``manual_seed``
on every rank each process draws the same numbers for its local random ops. Simulated ranks
(``distributed.world.simulate``) are threads of one process: were they to share torch's
generators, rank 1 would draw the numbers after rank 0's, in whatever order the threads
interleave. So each simulated rank gets :class:`RankGenerators` of its own, forked from the
process's when the simulated world starts, and on a thread acting as that rank holoflow's random
ops hand its generator to their kernels where the caller names none; ``manual_seed`` there seeds
that rank's alone, as it would seed one process. Elsewhere nothing changes: the kernels get None
and draw from torch's.

Example::

    world.simulate(2, lambda r: (flow.manual_seed(0), flow.randn(3))[1])  # equal on both ranks,
                                                                          # and to one process's
"""
from __future__ import annotations

import threading

import torch

from .interpret import is_lazy

CPU = torch.device("cpu")


class Fork:
    """The process's generator states when a simulated world starts, which every rank's begin
    from: the CPU state at once, an accelerator's on first use (reading it initialises the
    device; eager random ops on simulated ranks do not advance the process's own meanwhile)."""

    def __init__(self) -> None:
        self._cpu = torch.default_generator.get_state()
        self._states: dict[torch.device, torch.Tensor] = {}
        self._lock = threading.Lock()

    def generator(self, device: torch.device) -> torch.Generator:
        """A new generator on ``device`` in the process's state at the fork."""
        if device == CPU:
            state = self._cpu
        else:
            with self._lock:
                state = self._states.get(device)
                if state is None:
                    state = self._states[device] = _device_module(device).get_rng_state(device.index)
        g = torch.Generator(device=device)
        g.set_state(state)
        return g


class RankGenerators:
    """One simulated rank's default generators, a process's worth: the CPU one, and one per
    accelerator device made on first use (forked, or seeded with the last seed the rank gave that
    device: ``manual_seed`` seeds every device's, as torch's does, and ``holoflow.cuda.manual_seed``
    / ``manual_seed_all`` one or every CUDA device's, made or not, as torch.cuda's do)."""

    def __init__(self, fork: Fork) -> None:
        self._fork = fork
        self._seed: int | None = None
        # (device type, index or None: every device of the type) -> the seed it was given last
        self._device_seeds: dict[tuple[str, int | None], int] = {}
        self._gens: dict[torch.device, torch.Generator] = {CPU: fork.generator(CPU)}
        self._lock = threading.Lock()   # (runtime threads acting as the rank share it)

    def seed_of(self, device) -> int | None:
        """The seed the rank's generator on ``device`` was given last (made or not yet), or None
        while it is (or would be made) in the process's state at the fork."""
        dev = _canonical(device)
        if dev == CPU:
            return self._seed
        seeds = self._device_seeds
        return seeds.get((dev.type, dev.index), seeds.get((dev.type, None), self._seed))

    def seed_devices(self, seed: int, device_type: str, index: int | None) -> None:
        """Seeds the rank's ``device_type`` generator ``index`` (None: every one of that type), as
        ``torch.cuda.manual_seed`` (``manual_seed_all``) seeds a process's; the CPU's is untouched."""
        with self._lock:
            if index is None:
                self._device_seeds = {k: v for k, v in self._device_seeds.items() if k[0] != device_type}
            self._device_seeds[(device_type, index)] = seed
            for dev, g in self._gens.items():
                if dev.type == device_type and index in (None, dev.index):
                    g.manual_seed(seed)

    def get(self, device) -> torch.Generator | None:
        """The rank's generator on ``device``; None on a device without random state (meta)."""
        dev = _canonical(device)
        if dev is None:
            return None
        g = self._gens.get(dev)
        if g is None:
            with self._lock:
                g = self._gens.get(dev)
                if g is None:
                    seed = self.seed_of(dev)
                    g = self._gens[dev] = self._fork.generator(dev) if seed is None else \
                        torch.Generator(device=dev).manual_seed(seed)
        return g

    def manual_seed(self, seed: int) -> torch.Generator:
        """Seeds every generator of the rank (and those it makes later) with ``seed``."""
        with self._lock:
            self._seed = seed
            self._device_seeds.clear()
            for g in self._gens.values():
                g.manual_seed(seed)
        return self._gens[CPU]


def _device_module(device: torch.device):
    mod = getattr(torch, device.type, None)
    if mod is None or not hasattr(mod, "get_rng_state"):
        raise RuntimeError(f"holoflow (simulated ranks): device type {device.type!r} has no random state "
                           f"holoflow can fork for a simulated rank (expected 'cpu' or 'cuda')")
    return mod


def _canonical(device) -> torch.device | None:
    """``device`` with its index filled in (the current one), as the key of a rank's generator."""
    dev = device if isinstance(device, torch.device) else torch.device(device)
    if dev.type == "cpu":
        return CPU
    if dev.type == "meta":
        return None
    if dev.index is None:
        dev = torch.device(dev.type, _device_module(dev).current_device())
    return dev


class _Local(threading.local):
    gens: RankGenerators | None = None


_LOCAL = _Local()


def install(gens: RankGenerators | None) -> RankGenerators | None:
    """Makes ``gens`` this thread's default generators (None: torch's); returns the previous."""
    prev, _LOCAL.gens = _LOCAL.gens, gens
    return prev


def current() -> RankGenerators | None:
    """This thread's simulated rank's default generators, else None (torch's)."""
    return _LOCAL.gens


def default(device) -> torch.Generator | None:
    """The generator a random kernel on ``device`` draws from when given none: this thread's
    simulated rank's, else None (torch's default generator)."""
    gens = _LOCAL.gens
    return None if gens is None else gens.get(device)


def for_kernel(generator, device) -> torch.Generator | None:
    """What an eager random op on ``device`` hands its kernel: ``generator`` (holoflow's or
    torch's) when given, else :func:`default`. Under a graph trace the default stays None, so
    every rank traces and plans the same program; lowering then binds a simulated rank's
    generator to the plan's random nodes (graph/lower.py ``bind_default_generators``)."""
    if generator is not None:
        return getattr(generator, "torch", generator)
    gens = _LOCAL.gens
    return None if gens is None or is_lazy() else gens.get(device)


def for_op(generator, x) -> torch.Generator | None:
    """:func:`for_kernel` for an op on the holoflow tensor ``x``. A global ``x`` gets the caller's
    generator alone: the global interpreter gives each shard a generator of its own, seeded from
    a draw of the default one (distributed/rng.py), and infers shapes by running the kernel on
    meta tensors, which take no generator."""
    if x._global is not None:
        return getattr(generator, "torch", generator)
    return for_kernel(generator, x._data.device)


def cpu() -> torch.Generator:
    """This thread's default CPU generator: its simulated rank's, else torch's."""
    gens = _LOCAL.gens
    return torch.default_generator if gens is None else gens.get(CPU)


def get_state(device=CPU) -> torch.Tensor:
    """The state of this thread's default generator on ``device`` (its simulated rank's, else
    torch's), as ``torch.get_rng_state`` / ``torch.cuda.get_rng_state(i)``."""
    dev = _canonical(device)
    g = default(dev)
    if g is not None:
        return g.get_state()
    return torch.default_generator.get_state() if dev == CPU else _device_module(dev).get_rng_state(dev.index)


def set_state(state: torch.Tensor, device=CPU) -> None:
    """Sets the state :func:`get_state` reads."""
    dev = _canonical(device)
    g = default(dev)
    if g is not None:
        g.set_state(state)
    elif dev == CPU:
        torch.default_generator.set_state(state)
    else:
        _device_module(dev).set_rng_state(state, dev.index)


def manual_seed(seed: int) -> torch.Generator:
    """``torch.manual_seed``, or on a simulated rank's thread the seeding of that rank's alone."""
    gens = _LOCAL.gens
    return torch.manual_seed(seed) if gens is None else gens.manual_seed(int(seed))


def seed() -> int:
    """``torch.seed``: a non-deterministic seed for every device (of this simulated rank's)."""
    gens = _LOCAL.gens
    if gens is None:
        return torch.seed()
    s = gens.get(CPU).seed()
    gens.manual_seed(s)
    return s

"""The default generators' states, to tell whether a function drew random numbers and to replay
its draws (vmap's and jacfwd's ``randomness``)."""
from __future__ import annotations

import torch

from ..core import generators

RANDOMNESS = ("error", "different", "same")


def check_randomness(randomness: str, who: str) -> None:
    """torch raises a RuntimeError for any other value."""
    if randomness not in RANDOMNESS:
        raise RuntimeError(f"holoflow.func.{who}: randomness must be 'error', 'different' or 'same' "
                           f"(torch.func's only values), got {randomness!r}")


def drew_error(who: str) -> RuntimeError:
    return RuntimeError(f"holoflow.func.{who}: the function draws random numbers; pass randomness='different' "
                        f"(each sample its own draws) or 'same' (one draw shared by every sample), as "
                        f"torch.func asks")


def _devices() -> list[torch.device]:
    cuda = torch.cuda.device_count() if torch.cuda.is_available() and torch.cuda.is_initialized() else 0
    return [torch.device("cpu")] + [torch.device("cuda", i) for i in range(cuda)]


def get_state() -> list:
    """The default generators' states (a simulated rank's own on its thread): CPU, then CUDA's."""
    cpu, *cuda = [generators.get_state(d) for d in _devices()]
    return [cpu, cuda] if cuda else [cpu]


def set_state(state: list) -> None:
    devices = _devices()
    generators.set_state(state[0])
    for d, st in zip(devices[1:], state[1] if len(state) > 1 else ()):
        generators.set_state(st, d)


def same(a: list, b: list) -> bool:
    return torch.equal(a[0], b[0]) and (len(a) == 1 or all(torch.equal(x, y) for x, y in zip(a[1], b[1])))

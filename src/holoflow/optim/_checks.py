"""Hyper-parameter checks shared by the optimizers added for torch parity (torch's ValueErrors)."""
from __future__ import annotations


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

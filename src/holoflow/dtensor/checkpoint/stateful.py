"""``torch.distributed.checkpoint.stateful``: the protocol of objects that DCP saves through their
``state_dict()`` and loads back through ``load_state_dict()`` (an app state wrapping a model and
its optimizer, as torch's DCP tutorial writes it)."""
from __future__ import annotations

from typing import Any, Protocol, TypeVar, runtime_checkable

__all__ = ["Stateful", "StatefulT"]


@runtime_checkable
class Stateful(Protocol):
    """What ``save`` calls ``state_dict()`` on and ``load`` hands the loaded values to, through
    ``load_state_dict()`` (any object with both methods is one: a structural check)."""

    def state_dict(self) -> dict[str, Any]:
        ...

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        ...


StatefulT = TypeVar("StatefulT", bound=Stateful)

"""``RemovableHandle``: what the ``register_*_hook`` methods return."""
from __future__ import annotations

import itertools
from typing import Any


class RemovableHandle:
    """Removes a hook from the dicts it was added to; also a context manager."""

    _ids = itertools.count()

    def __init__(self, *hooks_dicts: dict, extra: dict | None = None) -> None:
        self.id = next(RemovableHandle._ids)
        self._dicts = hooks_dicts
        self._extra = extra

    def remove(self) -> None:
        for d in self._dicts:
            d.pop(self.id, None)
        if self._extra is not None:
            self._extra.pop(self.id, None)

    def __enter__(self) -> "RemovableHandle":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

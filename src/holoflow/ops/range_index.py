"""Python ``range`` objects in an index, as torch reads them: the list of their integers.

``x[range(2, 5)]`` is advanced indexing with ``[2, 3, 4]`` in torch (a range is a sequence), and so
is a range inside a tuple index (``x[:, range(0, 4, 2)]``). :func:`expand_ranges` rewrites such an
index before it is parsed; ``Tensor.__getitem__``/``__setitem__`` call it first.
"""
from __future__ import annotations

from typing import Any

__all__ = ["expand_ranges"]


def expand_ranges(index: Any) -> Any:
    """``index`` with every top-level ``range`` (or ``range`` inside a tuple) turned into a list.

    >>> expand_ranges((slice(None), range(0, 4, 2)))
    (slice(None, None, None), [0, 2])
    """
    if isinstance(index, range):
        return list(index)
    if isinstance(index, tuple) and any(isinstance(i, range) for i in index):
        return tuple(list(i) if isinstance(i, range) else i for i in index)
    return index

"""Anomaly mode: the engine's side of ``autograd.detect_anomaly`` / ``set_detect_anomaly``, and
the metadata dict of grad nodes (``Node.metadata``), where anomaly mode keeps what it records.

On (one switch for the process, as torch's), every grad node recorded keeps the traceback of the
forward call that made it and, if a backward rule made it (``create_graph``), that rule's node; a
grad rule that raises, or returns NaN while ``check_nan`` is on, warns with those tracebacks.
Off, it costs one attribute read per recorded op and one per backward pass.
"""
from __future__ import annotations

import os
import threading
import traceback
import warnings
import weakref

import torch

from .tensor import Tensor


class _Anomaly:
    enabled = False
    check_nan = True


ANOMALY = _Anomaly()
METADATA: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_RUNNING = threading.local()   # the node whose rule runs on this thread (anomaly mode only)
_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def set_anomaly_enabled(enabled: bool, check_nan: bool = True) -> None:
    """Turns anomaly mode on or off for the process (``torch.set_anomaly_enabled``)."""
    ANOMALY.enabled, ANOMALY.check_nan = bool(enabled), bool(check_nan)


def is_anomaly_enabled() -> bool:
    return ANOMALY.enabled


def is_anomaly_check_nan_enabled() -> bool:
    return ANOMALY.check_nan


def metadata(node) -> dict:
    """The node's own dict (torch's ``grad_fn.metadata``), made on first use."""
    d = METADATA.get(node)
    if d is None:
        d = METADATA[node] = {}
    return d


def note_forward(node) -> None:
    """Keeps the traceback of the call recording ``node`` (and the node whose rule records it)."""
    d = metadata(node)
    d["traceback_"] = _user_stack()
    parent = getattr(_RUNNING, "node", None)
    if parent is not None:
        d["parent_"] = parent


def _user_stack() -> list[str]:
    """The current stack without holoflow's own innermost frames (dispatch, this module): it ends
    at the user's call, as torch's ends at its Python-visible frames."""
    frames = traceback.extract_stack()
    while frames and frames[-1].filename.startswith(_PACKAGE):
        frames.pop()
    return traceback.format_list(frames)


def running(node) -> object:
    """Marks ``node`` as the one whose rule runs; returns what to restore afterwards."""
    prev = getattr(_RUNNING, "node", None)
    _RUNNING.node = node
    return prev


def restore(prev) -> None:
    _RUNNING.node = prev


def check_nan(node, grads: tuple) -> None:
    """torch's check on a backward function's results under ``check_nan``."""
    if not ANOMALY.check_nan:
        return
    for i, g in enumerate(grads):
        if isinstance(g, Tensor) and not g._data.is_meta and bool(torch.isnan(g._data).any()):
            raise RuntimeError(f"holoflow.autograd: Function '{node.name()}' returned nan values in its "
                               f"{i}th output.")


def warn_error(node) -> None:
    """torch's warnings for an error in ``node``'s rule: the forward traceback that made it, then
    one for each node whose rule made the previous one (double backward)."""
    d = METADATA.get(node) or {}
    stack = d.get("traceback_")
    if stack is None:
        warnings.warn(f"Error detected in {node.name()}. No forward pass information available. Enable "
                      f"detect anomaly during forward pass for more information.", stacklevel=2)
        return
    warnings.warn(f"Error detected in {node.name()}. Traceback of forward call that caused the error:\n"
                  f"{''.join(stack)}", stacklevel=2)
    parent = d.get("parent_")
    while parent is not None:   # (one warning each, as torch's)
        pd = METADATA.get(parent) or {}
        if "traceback_" not in pd:
            warnings.warn(f"\n\nPrevious calculation was induced by {parent.name()}. No forward pass information "
                          f"available. Enable detect anomaly during forward pass for more information.", stacklevel=2)
            return
        warnings.warn(f"\n\nPrevious calculation was induced by {parent.name()}. Traceback of forward call that "
                      f"induced the previous calculation:\n{''.join(pd['traceback_'])}", stacklevel=2)
        parent = pd.get("parent_")

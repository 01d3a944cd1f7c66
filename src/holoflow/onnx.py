"""``holoflow.onnx``: ONNX export is not implemented; ``export`` raises naming what to do."""
from __future__ import annotations

from typing import Any

from .core.errors import UnsupportedError

__all__ = ["export", "is_in_onnx_export"]


def export(model: Any, args: Any = None, f: Any = None, *rest: Any, **kwargs: Any) -> None:
    """Raises: holoflow cannot export ONNX. Export from PyTorch instead (the weights move with
    ``holoflow.utils.convert.to_torch_file``)."""
    raise UnsupportedError("holoflow.onnx.export: ONNX export is not implemented in holoflow. Save the "
                           "weights (holoflow.utils.convert.to_torch_file), load them into the same model "
                           "written for PyTorch and export it with torch.onnx.export")


def is_in_onnx_export() -> bool:
    """Always False: holoflow never runs an ONNX export."""
    return False

"""``holoflow.utils``: data loading (``utils.data``) and interop (``utils.dlpack``)."""
from . import data, dlpack

__all__ = ["data", "dlpack"]

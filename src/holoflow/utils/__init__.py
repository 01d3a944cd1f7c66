"""``holoflow.utils``: data loading (``utils.data``), interop (``utils.dlpack``) and the global view
over containers (``utils.global_view``)."""
from . import checkpoint, convert, data, dlpack, global_view

__all__ = ["checkpoint", "convert", "data", "dlpack", "global_view"]

"""``holoflow.functional``: the functions ``torch.functional`` exports, as holoflow's own
(``einsum``, ``split``, ``stft``, ``norm``, ``meshgrid``, ``unique``, ``lu``, ``svd_lowrank`` ...).
Scripts that write ``torch.functional.einsum`` or ``from torch.functional import F`` get them."""
from __future__ import annotations

from .compat import broadcast_shapes, broadcast_tensors, meshgrid
from .ops.spectral import istft, stft
from .ops.decomp import cdist
from .ops.flat_index import unravel_index
from .ops.products import tensordot
from .ops.stacking import block_diag, cartesian_prod
from .ops.linalg import einsum
from .ops.lowrank import lu, pca_lowrank, svd_lowrank
from .ops.products import chain_matmul
from .ops.stacking import atleast_1d, atleast_2d, atleast_3d
from .ops.reduction import norm
from .ops.shape import split, unique_consecutive
from .ops.sorting import unique

__all__ = ["atleast_1d", "atleast_2d", "atleast_3d", "broadcast_shapes", "broadcast_tensors", "cartesian_prod",
           "block_diag", "cdist", "chain_matmul", "einsum", "istft", "lu", "norm", "meshgrid", "pca_lowrank",
           "split", "stft", "svd_lowrank", "tensordot", "unique", "unique_consecutive", "unravel_index"]

"""``holoflow.return_types``: the named-tuple classes of holoflow's multi-output functions under
torch's names (``return_types.max`` is the class of ``holoflow.max(x, dim)``'s result, with
torch's field names ``values``/``indices``), so ``isinstance(out, torch.return_types.max)``
holds under ``mock_torch``."""
from __future__ import annotations

from .core.registry import REGISTRY
from .ops.numeric import _HistogramddResult
from .ops.decomp import _SvdResult
from .ops.pointwise import _Frexp
from .ops.linalg_solve import (CholeskyEx, Eig, InvEx, LdlFactor, LdlFactorEx, Lstsq, LuFactor, LuFactorEx, LuUnpack,
                               PLU, SolveEx, TriangularSolve)
from .ops.order_stats import _KthResult, _MedianResult
from .ops.reduction import _aminmax


def _op_result(name: str) -> type:
    """The named tuple a registered multi-output op returns."""
    return REGISTRY[name].out_type


max = _op_result("max")  # noqa: A001 - torch's names
min = _op_result("min")  # noqa: A001
sort, topk, mode = _op_result("sort"), _op_result("topk"), _op_result("mode")
cummax, cummin, nanmedian = _op_result("cummax"), _op_result("cummin"), _op_result("nanmedian")
histogram, geqrf = _op_result("histogram"), _op_result("geqrf")
linalg_eigh, linalg_svd = _op_result("linalg_eigh"), _op_result("linalg_svd")
linalg_qr = qr = _op_result("linalg_qr")   # holoflow.qr and holoflow.linalg.qr share one class
slogdet = linalg_slogdet = _op_result("slogdet")
aminmax, frexp, kthvalue, median = _aminmax, _Frexp, _KthResult, _MedianResult
svd, histogramdd = _SvdResult, _HistogramddResult
linalg_cholesky_ex, linalg_eig, linalg_inv_ex, linalg_lstsq, linalg_lu = CholeskyEx, Eig, InvEx, Lstsq, PLU
linalg_lu_factor, linalg_lu_factor_ex, linalg_solve_ex = LuFactor, LuFactorEx, SolveEx
linalg_ldl_factor, linalg_ldl_factor_ex, lu_unpack, triangular_solve = LdlFactor, LdlFactorEx, LuUnpack, TriangularSolve

__all__ = ["aminmax", "cummax", "cummin", "frexp", "geqrf", "histogram", "histogramdd", "kthvalue",
           "linalg_cholesky_ex", "linalg_eig", "linalg_eigh", "linalg_inv_ex", "linalg_ldl_factor",
           "linalg_ldl_factor_ex", "linalg_lstsq", "linalg_lu", "linalg_lu_factor", "linalg_lu_factor_ex", "linalg_qr",
           "linalg_slogdet", "linalg_solve_ex", "linalg_svd", "lu_unpack", "max", "median", "min", "mode", "nanmedian",
           "qr", "slogdet", "sort", "svd", "topk", "triangular_solve"]

#: every class above, as torch's ``return_types.all_return_types``
all_return_types = [globals()[_name] for _name in __all__]

"""View ops that are not reshapes: as_strided, view(dtype), and writes through views
(the view_scatter op an in-place write on a view records), against torch."""
import torch
from harness import F32, F64, Case, parametrize, randn

import holoflow as flow


def _write_through_view(lib, x, y):
    b = x * 1
    b[1:3].mul_(y)
    b.t()[0].add_(y[0, :1] * 2)
    return b


CASES = [
    Case("as_strided-windows", lambda x: flow.as_strided(x, (3, 3), (1, 1), 1),
         lambda x: torch.as_strided(x, (3, 3), (1, 1), 1), lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {})),
    Case("as_strided-transpose", lambda x: flow.as_strided(x, (4, 3), (1, 4)),
         lambda x: torch.as_strided(x, (4, 3), (1, 4)), lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {})),
    Case("view-dtype", lambda x: x.view(flow.int32), lambda x: x.view(torch.int32),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {}), grad=False, dtypes=(F32,)),
    Case("view-dtype-narrower", lambda x: x.view(flow.bfloat16), lambda x: x.view(torch.bfloat16),
         lambda dt, g: ((randn(3, 4, gen=g, dtype=dt),), {}), grad=False, dtypes=(F32,)),
    Case("inplace-through-views", lambda x, y: _write_through_view(flow, x, y),
         lambda x, y: _write_through_view(torch, x, y),
         lambda dt, g: ((randn(4, 3, gen=g, dtype=dt), randn(2, 3, gen=g, dtype=dt)), {}), dtypes=(F32, F64)),
]
globals().update(parametrize(CASES))

"""Imports every op module so the registry is full; each module's ``__all__`` becomes
``holoflow.<name>``. Modules that sub-modules re-export (scan, layout, scatter, sorting, norm,
conv, attention, activation, dropout, pooling) come in through their parents."""
from __future__ import annotations

from . import indexing, linalg, loss, nn_ops, random_ops, reduction, shape
from . import decomp, pool3d, rnn, sampling, sequence  # noqa: F401 - new op modules (issue 12)
from . import order_stats, pointwise, histogram, stacking, calculus, products, distance
from . import complex_ops, special, flat_index, linalg_solve
from . import spectral, tensor_meta, control_flow, copies, numeric, factories
from . import lowrank, segment, storage  # torch's remaining top-level names (round 2)
from . import linear_loss, quantize  # noqa: F401 - (linear_loss: nn.functional's; quantize: QAT's fake quantization)
from . import grouped_mm  # noqa: F401 - nn.functional's grouped GEMM (Mixture-of-Experts)
from . import random_dists  # noqa: F401 - distributions' Gamma/Dirichlet samplers (torch's private kernels)

__all__: list[str] = []
for _mod in (reduction, linalg, shape, indexing, nn_ops, loss, random_ops, decomp, order_stats, pointwise, histogram,
             stacking, calculus, products, distance, linalg_solve, complex_ops, special, flat_index, spectral,
             tensor_meta, control_flow, copies, numeric, factories, lowrank, segment, storage, quantize):
    for _name in _mod.__all__:
        globals()[_name] = getattr(_mod, _name)
        __all__.append(_name)

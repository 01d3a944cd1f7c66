"""``holoflow.quasirandom``: ``SobolEngine``, torch.quasirandom's (scrambled) Sobol sequences.

The engine's state (direction numbers, the scrambling shift, the last point) is bookkeeping, not
a tensor computation anything differentiates or shards, so it runs torch's own Sobol kernels
(``torch._sobol_engine_*``) on the storages of holoflow tensors, in torch's order: the same
arguments draw the same points as torch, and scrambling draws from torch's default generator
(holoflow's), or from a generator seeded with ``seed``, as torch's does. Draws are local CPU
tensors.
"""
from __future__ import annotations

import torch

from .core.dtype import dtype as _dtype
from .core.dtype import get_default_dtype, to_torch
from .core.tensor import Tensor

__all__ = ["SobolEngine"]


class SobolEngine:
    """An engine for (scrambled) Sobol sequences of up to 21201 dimensions, as
    ``torch.quasirandom.SobolEngine`` (direction numbers of Joe and Kuo, criterion D(6)).

    >>> engine = holoflow.quasirandom.SobolEngine(dimension=5)
    >>> engine.draw(3)          # the points 0, 1/2, then (3/4, 1/4, ...)

    Args:
        dimension: the dimensionality of the points, in ``[1, 21201]``.
        scramble: Owen-scramble the sequence (default False).
        seed: the seed of the scrambling's generator; None draws from the default generator.
    """

    MAXBIT = 30
    MAXDIM = 21201

    def __init__(self, dimension: int, scramble: bool = False, seed: int | None = None) -> None:
        if dimension > self.MAXDIM or dimension < 1:
            raise ValueError(f"holoflow.quasirandom.SobolEngine: Supported range of dimensionality for SobolEngine "
                             f"is [1, {self.MAXDIM}], got dimension={dimension}")
        self.seed, self.scramble, self.dimension = seed, scramble, dimension
        state = torch.zeros(dimension, self.MAXBIT, dtype=torch.long)
        torch._sobol_engine_initialize_state_(state, dimension)
        self.sobolstate = Tensor._make(state)
        if not scramble:
            self.shift = Tensor._make(torch.zeros(dimension, dtype=torch.long))
        else:
            self._scramble()
        self.quasi = Tensor._make(self.shift._data.clone(memory_format=torch.contiguous_format))
        self._first_point = Tensor._make((self.quasi._data / 2 ** self.MAXBIT).reshape(1, -1))
        self.num_generated = 0

    def draw(self, n: int = 1, out: Tensor | None = None, dtype: _dtype | torch.dtype | None = None) -> Tensor:
        """The next ``n`` points, shape ``(n, dimension)``, in ``dtype`` (default: the default
        dtype); written into ``out`` (resized) when given, as torch."""
        dt = to_torch(get_default_dtype() if dtype is None else dtype)
        if self.num_generated == 0:
            if n == 1:
                result = self._first_point._data.to(dt)
            else:
                result = torch.cat((self._first_point._data.to(dt), self._draw(n - 1, self.num_generated, dt)), dim=-2)
        else:
            result = self._draw(n, self.num_generated - 1, dt)
        self.num_generated += n
        if out is not None:
            return _into(out, result)
        return Tensor._make(result)

    def _draw(self, n: int, start: int, dt: torch.dtype) -> torch.Tensor:
        """torch's Sobol kernel: ``n`` points after point ``start``; the engine's ``quasi`` moves on."""
        try:
            result, quasi = torch._sobol_engine_draw(self.quasi._data, n, self.sobolstate._data, self.dimension,
                                                     start, dtype=dt)
        except NotImplementedError as e:   # (torch's kernel draws float32 and float64 only)
            raise NotImplementedError(f"holoflow.quasirandom.SobolEngine.draw: {e}; draw with dtype "
                                      f"holoflow.float32 or holoflow.float64 and convert") from e
        self.quasi = Tensor._make(quasi)
        return result

    def draw_base2(self, m: int, out: Tensor | None = None, dtype: _dtype | torch.dtype | None = None) -> Tensor:
        """The next ``2**m`` points; the total drawn must stay a power of 2 (the balance
        properties of Sobol' points), else ValueError."""
        n = 2 ** m
        total_n = self.num_generated + n
        if not (total_n & (total_n - 1) == 0):
            raise ValueError(f"holoflow.quasirandom.SobolEngine.draw_base2: The balance properties of Sobol' points "
                             f"require n to be a power of 2. {self.num_generated} points have been previously "
                             f"generated, then: n={self.num_generated}+2**{m}={total_n}. If you still want to do "
                             f"this, please use 'SobolEngine.draw()' instead.")
        return self.draw(n=n, out=out, dtype=dtype)

    def reset(self) -> "SobolEngine":
        """Back to the first point."""
        self.quasi._data.copy_(self.shift._data)
        self.num_generated = 0
        return self

    def fast_forward(self, n: int) -> "SobolEngine":
        """Skips ``n`` points (as drawing them without using them)."""
        start = self.num_generated
        torch._sobol_engine_ff_(self.quasi._data, n - 1 if start == 0 else n, self.sobolstate._data,
                                self.dimension, start if start == 0 else start - 1)
        self.num_generated += n
        return self

    def _scramble(self) -> None:
        g = None
        if self.seed is not None:
            g = torch.Generator()
            g.manual_seed(self.seed)
        shift_ints = torch.randint(2, (self.dimension, self.MAXBIT), generator=g)
        self.shift = Tensor._make(torch.mv(shift_ints, torch.pow(2, torch.arange(0, self.MAXBIT))))
        ltm = torch.randint(2, (self.dimension, self.MAXBIT, self.MAXBIT), generator=g).tril()
        torch._sobol_engine_scramble_(self.sobolstate._data, ltm, self.dimension)

    def __repr__(self) -> str:
        parts = [f"dimension={self.dimension}"]
        if self.scramble:
            parts.append("scramble=True")
        if self.seed is not None:
            parts.append(f"seed={self.seed}")
        return f"{type(self).__name__}({', '.join(parts)})"


def _into(out: Tensor, result: torch.Tensor) -> Tensor:
    """``out`` resized to ``result``'s shape and holding its values (torch's ``out=``)."""
    if not isinstance(out, Tensor) or out._global is not None:
        raise TypeError(f"holoflow.quasirandom.SobolEngine.draw: out must be a local holoflow Tensor, got "
                        f"{type(out).__name__}{' (global)' if isinstance(out, Tensor) else ''}")
    out._data.resize_as_(result).copy_(result)
    return out

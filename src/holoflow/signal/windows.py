"""``holoflow.signal.windows``: the window functions of ``torch.signal.windows`` (``hann``,
``gaussian``, ``kaiser``, ``general_cosine`` ...) as holoflow tensors, with torch's arguments,
dtypes and values (computed by torch's own functions, as holoflow's creation ops are)."""
from __future__ import annotations

from typing import Any, Callable

import torch.signal.windows as _tw

from ..core.tensor import Tensor
from ..ops.creation import _factory

__all__ = ["bartlett", "blackman", "cosine", "exponential", "gaussian", "general_cosine", "general_hamming",
           "hamming", "hann", "kaiser", "nuttall"]


def _window(name: str) -> Callable[..., Tensor]:
    fn = getattr(_tw, name)

    def make(M: int, *args: Any, dtype: Any = None, layout: Any = None, device: Any = None,
             requires_grad: bool = False, **params: Any) -> Tensor:
        return _factory(f"signal.windows.{name}", fn, M, *args, dtype=dtype, device=device,
                        requires_grad=requires_grad, **params)
    make.__name__ = make.__qualname__ = name
    make.__doc__ = f"The window of ``torch.signal.windows.{name}`` (same arguments, dtype and values)."
    return make


bartlett, blackman, cosine, exponential, gaussian = (_window(n) for n in ("bartlett", "blackman", "cosine",
                                                                          "exponential", "gaussian"))
general_cosine, general_hamming, hamming, hann, kaiser, nuttall = (
    _window(n) for n in ("general_cosine", "general_hamming", "hamming", "hann", "kaiser", "nuttall"))

"""Activations as modules; each calls its ``F`` function and prints like torch's."""
from __future__ import annotations

from typing import Any

from ...core.tensor import Tensor
from ...ops.creation import empty

from .. import init
from ..module import Module
from ..parameter import Parameter
from .. import functional as F


class _Inplace(Module):
    """An activation with only an ``inplace`` flag: ``F.<_fn>(x, inplace=...)``."""

    _fn = "relu"

    def __init__(self, inplace: bool = False) -> None:
        super().__init__()
        self.inplace = inplace

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._fn)(input, inplace=self.inplace)

    def extra_repr(self) -> str:
        return "inplace=True" if self.inplace else ""


class ReLU(_Inplace):
    """``max(0, x)``."""

    _fn = "relu"


class ReLU6(_Inplace):
    """``min(max(0, x), 6)``."""

    _fn = "relu6"


class SiLU(_Inplace):
    """``x * sigmoid(x)``."""

    _fn = "silu"


class Mish(_Inplace):
    """``x * tanh(softplus(x))``."""

    _fn = "mish"


class Hardswish(_Inplace):
    """``x * relu6(x + 3) / 6``."""

    _fn = "hardswish"

    def extra_repr(self) -> str:
        return ""


class Hardsigmoid(_Inplace):
    """``relu6(x + 3) / 6``."""

    _fn = "hardsigmoid"

    def extra_repr(self) -> str:
        return ""


class SELU(_Inplace):
    """Scaled ELU."""

    _fn = "selu"


class _Plain(Module):
    """An activation without settings: ``F.<_fn>(x)``."""

    _fn = "tanh"

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._fn)(input)


class Tanh(_Plain):
    _fn = "tanh"


class Sigmoid(_Plain):
    _fn = "sigmoid"


class Softsign(_Plain):
    _fn = "softsign"


class LogSigmoid(_Plain):
    _fn = "logsigmoid"


class Tanhshrink(_Plain):
    _fn = "tanhshrink"


class LeakyReLU(Module):
    """``x if x >= 0 else negative_slope * x``."""

    def __init__(self, negative_slope: float = 1e-2, inplace: bool = False) -> None:
        super().__init__()
        self.negative_slope, self.inplace = negative_slope, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.leaky_relu(input, self.negative_slope, self.inplace)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}" + (", inplace=True" if self.inplace else "")


class ELU(Module):
    """``x if x > 0 else alpha * (exp(x) - 1)``."""

    _fn = "elu"

    def __init__(self, alpha: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        self.alpha, self.inplace = alpha, inplace

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._fn)(input, self.alpha, self.inplace)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}" + (", inplace=True" if self.inplace else "")


class CELU(ELU):
    _fn = "celu"


class GELU(Module):
    """Gaussian error linear unit; ``approximate='tanh'`` for the tanh approximation."""

    def __init__(self, approximate: str = "none") -> None:
        super().__init__()
        self.approximate = approximate

    def forward(self, input: Tensor) -> Tensor:
        return F.gelu(input, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class Softplus(Module):
    """``log(1 + exp(beta * x)) / beta``, linear above ``threshold``."""

    def __init__(self, beta: float = 1.0, threshold: float = 20.0) -> None:
        super().__init__()
        self.beta, self.threshold = beta, threshold

    def forward(self, input: Tensor) -> Tensor:
        return F.softplus(input, self.beta, self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class Hardtanh(Module):
    """Clamps to ``[min_val, max_val]``."""

    def __init__(self, min_val: float = -1.0, max_val: float = 1.0, inplace: bool = False) -> None:
        super().__init__()
        if max_val <= min_val:
            raise AssertionError("max_val must be greater than min_val")   # (torch's class: an assert)
        self.min_val, self.max_val, self.inplace = min_val, max_val, inplace

    def forward(self, input: Tensor) -> Tensor:
        return F.hardtanh(input, self.min_val, self.max_val, self.inplace)

    def extra_repr(self) -> str:
        return f"min_val={self.min_val}, max_val={self.max_val}" + (", inplace=True" if self.inplace else "")


class PReLU(Module):
    """Leaky ReLU with a learned slope per channel (``num_parameters``)."""

    def __init__(self, num_parameters: int = 1, init: float = 0.25, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        self.num_parameters, self.init = num_parameters, init
        self.weight = Parameter(empty(num_parameters, device=device, dtype=dtype))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        init.constant_(self.weight, self.init)

    def forward(self, input: Tensor) -> Tensor:
        return F.prelu(input, self.weight)

    def extra_repr(self) -> str:
        return f"num_parameters={self.num_parameters}"


class GLU(Module):
    """``a * sigmoid(b)`` for the two halves of ``dim``."""

    def __init__(self, dim: int = -1) -> None:
        super().__init__()
        self.dim = dim

    def forward(self, input: Tensor) -> Tensor:
        return F.glu(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class _SoftmaxBase(Module):
    _fn = "softmax"

    def __init__(self, dim: int | None = None) -> None:
        super().__init__()
        self.dim = dim

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if not hasattr(self, "dim"):
            self.dim = None

    def forward(self, input: Tensor) -> Tensor:
        return getattr(F, self._fn)(input, self.dim)

    def extra_repr(self) -> str:
        return f"dim={self.dim}"


class Softmax(_SoftmaxBase):
    """Softmax along ``dim``."""

    _fn = "softmax"


class LogSoftmax(_SoftmaxBase):
    """Log-softmax along ``dim``."""

    _fn = "log_softmax"


class Softmin(_SoftmaxBase):
    """Softmax of ``-x`` along ``dim``."""

    _fn = "softmin"

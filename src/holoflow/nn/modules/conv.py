"""Convolutions: ``Conv1d/2d/3d`` and ``ConvTranspose1d/2d/3d``, torch's parameters, init and repr."""
from __future__ import annotations

import math
from typing import Any

from ...core.tensor import Tensor
from ...ops.creation import empty

from .. import init
from ..module import Module
from ..parameter import Parameter
from .. import functional as F


def _ntuple(n: int):
    def parse(x: Any) -> tuple:
        if isinstance(x, (list, tuple)):
            return tuple(x)
        return (x,) * n
    return parse


_single, _pair, _triple = _ntuple(1), _ntuple(2), _ntuple(3)
_PADDING_MODES = ("zeros", "reflect", "replicate", "circular")


class _ConvNd(Module):
    _n = 2

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any, padding: Any,
                 dilation: Any, transposed: bool, output_padding: Any, groups: int, bias: bool,
                 padding_mode: str, device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        tup = _ntuple(self._n)
        if groups <= 0:
            raise ValueError("groups must be a positive integer")
        if in_channels % groups != 0:
            raise ValueError("in_channels must be divisible by groups")
        if out_channels % groups != 0:
            raise ValueError("out_channels must be divisible by groups")
        if isinstance(padding, str):
            if padding not in ("same", "valid"):
                raise ValueError(f"Invalid padding string {padding!r}, should be one of {{'valid', 'same'}}")
            if padding == "same" and any(s != 1 for s in tup(stride)):
                raise ValueError("padding='same' is not supported for strided convolutions")
        if padding_mode not in _PADDING_MODES:
            raise ValueError(f"padding_mode must be one of {_PADDING_MODES}, but got padding_mode='{padding_mode}'")
        self.in_channels, self.out_channels = in_channels, out_channels
        self.kernel_size, self.stride = tup(kernel_size), tup(stride)
        self.padding = padding if isinstance(padding, str) else tup(padding)
        self.dilation, self.transposed = tup(dilation), transposed
        self.output_padding, self.groups, self.padding_mode = tup(output_padding), groups, padding_mode
        self._reversed_padding_repeated_twice = self._reversed_padding()
        shape = ((in_channels, out_channels // groups) if transposed else
                 (out_channels, in_channels // groups)) + self.kernel_size
        self.weight = Parameter(empty(*shape, device=device, dtype=dtype))
        if bias:
            self.bias = Parameter(empty(out_channels, device=device, dtype=dtype))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def _reversed_padding(self) -> list[int]:
        if isinstance(self.padding, str):
            out = [0, 0] * len(self.kernel_size)
            if self.padding == "same":
                for d, k, i in zip(self.dilation, self.kernel_size, range(len(self.kernel_size) - 1, -1, -1)):
                    total = d * (k - 1)
                    left = total // 2
                    out[2 * i], out[2 * i + 1] = left, total - left
            return out
        return [p for p in reversed(self.padding) for _ in range(2)]

    def reset_parameters(self) -> None:
        init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in, _ = init._calculate_fan_in_and_fan_out(self.weight)
            if fan_in != 0:
                bound = 1 / math.sqrt(fan_in)
                init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        s = "{in_channels}, {out_channels}, kernel_size={kernel_size}, stride={stride}"
        if self.padding != (0,) * len(self.padding):
            s += ", padding={padding}"
        if self.dilation != (1,) * len(self.dilation):
            s += ", dilation={dilation}"
        if self.output_padding != (0,) * len(self.output_padding):
            s += ", output_padding={output_padding}"
        if self.groups != 1:
            s += ", groups={groups}"
        if self.bias is None:
            s += ", bias=False"
        if self.padding_mode != "zeros":
            s += ", padding_mode={padding_mode}"
        return s.format(**self.__dict__)

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        if not hasattr(self, "padding_mode"):
            self.padding_mode = "zeros"


class _Conv(_ConvNd):
    _fn = "conv2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, dilation: Any = 1, groups: int = 1, bias: bool = True,
                 padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, False, 0,
                         groups, bias, padding_mode, device, dtype)

    def _conv_forward(self, input: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        conv = getattr(F, self._fn)
        if self.padding_mode != "zeros":
            input = F.pad(input, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            return conv(input, weight, bias, self.stride, 0, self.dilation, self.groups)
        return conv(input, weight, bias, self.stride, self.padding, self.dilation, self.groups)

    def forward(self, input: Tensor) -> Tensor:
        return self._conv_forward(input, self.weight, self.bias)


class Conv1d(_Conv):
    """1-D convolution over ``(N, C, L)`` input."""

    _n, _fn = 1, "conv1d"


class Conv2d(_Conv):
    """2-D convolution over ``(N, C, H, W)`` input."""

    _n, _fn = 2, "conv2d"


class Conv3d(_Conv):
    """3-D convolution over ``(N, C, D, H, W)`` input."""

    _n, _fn = 3, "conv3d"


class _ConvTranspose(_ConvNd):
    _fn = "conv_transpose2d"

    def __init__(self, in_channels: int, out_channels: int, kernel_size: Any, stride: Any = 1,
                 padding: Any = 0, output_padding: Any = 0, groups: int = 1, bias: bool = True,
                 dilation: Any = 1, padding_mode: str = "zeros", device: Any = None, dtype: Any = None) -> None:
        if padding_mode != "zeros":
            raise ValueError(f'Only "zeros" padding mode is supported for {type(self).__name__}')
        super().__init__(in_channels, out_channels, kernel_size, stride, padding, dilation, True,
                         output_padding, groups, bias, padding_mode, device, dtype)

    def _output_padding(self, input: Tensor, output_size: Any) -> tuple:
        if output_size is None:
            return self.output_padding
        n = self._n
        lead = 2 if input.dim() == n + 2 else 1   # (as torch's: N and C, or C of an unbatched input)
        output_size = list(output_size)
        if len(output_size) == n + lead:
            output_size = output_size[lead:]
        if len(output_size) != n:
            raise ValueError(f"ConvTranspose{n}D: for {input.dim()}D input, output_size must have {n} or "
                             f"{n + lead} elements (got {len(output_size)})")
        # (torch's index: the spatial dims follow the leading ones, an input of too few dims raises IndexError)
        spatial = tuple(input.size(d + lead) for d in range(n))
        res = []
        for d in range(n):
            smallest = ((spatial[d] - 1) * self.stride[d] - 2 * self.padding[d]
                        + self.dilation[d] * (self.kernel_size[d] - 1) + 1)
            largest = smallest + self.stride[d] - 1
            if not smallest <= output_size[d] <= largest:
                raise ValueError(f"requested an output size of {output_size}, but valid sizes range from "
                                 f"{smallest} to {largest} (for an input of {spatial})")
            res.append(output_size[d] - smallest)
        return tuple(res)

    def forward(self, input: Tensor, output_size: Any = None) -> Tensor:
        output_padding = self._output_padding(input, output_size)
        return getattr(F, self._fn)(input, self.weight, self.bias, self.stride, self.padding,
                                    output_padding, self.groups, self.dilation)


class ConvTranspose1d(_ConvTranspose):
    """1-D transposed convolution."""

    _n, _fn = 1, "conv_transpose1d"


class ConvTranspose2d(_ConvTranspose):
    """2-D transposed convolution."""

    _n, _fn = 2, "conv_transpose2d"


class ConvTranspose3d(_ConvTranspose):
    """3-D transposed convolution."""

    _n, _fn = 3, "conv_transpose3d"

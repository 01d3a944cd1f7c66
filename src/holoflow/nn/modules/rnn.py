"""``RNN``, ``LSTM``, ``GRU`` and their cells, with torch's parameters, init and equations.

Each layer is one op (ops/rnn.py: the time loop in one kernel, with ATen's cell math and
derivatives): ``rnn_layer`` one way, ``rnn_bidi_layer`` both directions in ATen's one call (its
reverse direction is its own: torch's values bit for bit); dropout between layers is a holoflow op.
Packed input (:class:`~holoflow.nn.utils.rnn.PackedSequence`) runs the shrinking batch of each time
step, as torch does, so final hidden states are each sequence's last real step. The cells are
composites of holoflow ops (one step: nothing to fuse).
"""
from __future__ import annotations

import math
import numbers
import warnings
from typing import Any

from ...core.sbp import B
from ...core.tensor import Tensor
from ...ops.creation import empty, zeros
from ...ops.linalg import linear
from ...ops.random_ops import dropout
from ...ops.rnn import rnn_bidi_layer, rnn_layer
from ...ops.shape import stack
from .. import init
from ..module import Module
from ..parameter import Parameter
from ..utils.rnn import PackedSequence, batch_sizes_of

__all__ = ["RNNBase", "RNN", "LSTM", "GRU", "RNNCellBase", "RNNCell", "LSTMCell", "GRUCell"]

_GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}


# -- one time step -----------------------------------------------------------------------------------

def _rnn_step(xw: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Tensor | None, w_hr: Any, relu: bool):
    pre = xw + linear(h, w_hh, b_hh)
    return (pre.relu() if relu else pre.tanh()), None


def _lstm_step(xw: Tensor, h: Tensor, c: Tensor, w_hh: Tensor, b_hh: Tensor | None, w_hr: Any, relu: bool):
    h, c = _lstm_gates(xw + linear(h, w_hh, b_hh), c)
    return (linear(h, w_hr) if w_hr is not None else h), c


def hidden_first(x: Tensor, h: Tensor, w_ih: Tensor, w_hh: Tensor, b_ih: Tensor | None,
                 b_hh: Tensor | None) -> Tensor:
    """An RNN or LSTM cell's pre-activations, the hidden state's product recorded first as in
    torch's cells (``linear_hh(h).add_(linear_ih(x))``): their backward then reaches the input's
    weight first (an in-place change of it refuses before any gradient is kept)."""
    hw = linear(h, w_hh, b_hh)
    return hw + linear(x, w_ih, b_ih)


def _lstm_gates(pre: Tensor, c: Tensor) -> tuple[Tensor, Tensor]:
    i, f, g, o = pre.chunk(4, 1)
    c = f.sigmoid() * c + i.sigmoid() * g.tanh()
    return o.sigmoid() * c.tanh(), c


def _gru_step(xw: Tensor, h: Tensor, c: Any, w_hh: Tensor, b_hh: Tensor | None, w_hr: Any, relu: bool):
    rx, zx, nx = xw.chunk(3, 1)
    rh, zh, nh = linear(h, w_hh, b_hh).chunk(3, 1)
    r, z = (rx + rh).sigmoid(), (zx + zh).sigmoid()
    n = (nx + r * nh).tanh()
    return (h - n) * z + n, None


def _zeros_like_layout(shape: tuple, x: Tensor) -> Tensor:
    """Zero initial states on ``x``'s device, broadcast over ``x``'s placement when it is global."""
    if x._global is not None:   # made global (a recorded creation inside a graph's trace)
        return zeros(*shape, dtype=x.dtype, placement=x.placement, sbp=(B,) * len(x.sbp))
    return zeros(*shape, dtype=x.dtype, device=x.device)


# -- the layers -----------------------------------------------------------------------------------------

class RNNBase(Module):
    """The shared machinery of RNN/LSTM/GRU: parameters ``weight_ih_l{k}[_reverse]``,
    ``weight_hh_l{k}``, ``bias_ih_l{k}``, ``bias_hh_l{k}`` (and ``weight_hr_l{k}`` for an LSTM
    with ``proj_size``), each drawn from U(-1/sqrt(hidden_size), 1/sqrt(hidden_size)) in
    registration order, as torch does."""

    def __init__(self, mode: str, input_size: int, hidden_size: int, num_layers: int = 1, bias: bool = True,
                 batch_first: bool = False, dropout: float = 0.0, bidirectional: bool = False, proj_size: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        if mode not in _GATES:
            raise ValueError(f"holoflow.nn.RNNBase: unrecognized RNN mode {mode!r}")
        if not isinstance(dropout, numbers.Number) or not 0 <= dropout <= 1 or isinstance(dropout, bool):
            raise ValueError("dropout should be a number in range [0, 1] representing the probability of an "
                             "element being zeroed")
        if dropout > 0 and num_layers == 1:
            warnings.warn("dropout option adds dropout after all but last recurrent layer, so non-zero dropout "
                          f"expects num_layers greater than 1, but got dropout={dropout} and num_layers={num_layers}",
                          stacklevel=2)
        if not isinstance(hidden_size, int) or hidden_size <= 0:
            raise ValueError(f"hidden_size must be a positive integer, got {hidden_size!r}")
        if not isinstance(num_layers, int) or num_layers <= 0:
            raise ValueError(f"num_layers must be a positive integer, got {num_layers!r}")
        if proj_size < 0:
            raise ValueError("proj_size should be a positive integer or zero to disable projections")
        if proj_size >= hidden_size:
            raise ValueError("proj_size has to be smaller than hidden_size")
        if proj_size and mode != "LSTM":
            raise ValueError("proj_size argument is only supported for LSTM, not RNN or GRU")
        self.mode, self.input_size, self.hidden_size = mode, input_size, hidden_size
        self.num_layers, self.bias, self.batch_first = num_layers, bias, batch_first
        self.dropout, self.bidirectional, self.proj_size = float(dropout), bidirectional, proj_size
        gate = _GATES[mode] * hidden_size
        dirs = 2 if bidirectional else 1
        real_hidden = proj_size if proj_size > 0 else hidden_size
        kw = {"device": device, "dtype": dtype}
        self._flat_weights_names: list[str] = []
        for layer in range(num_layers):
            for d in range(dirs):
                layer_in = input_size if layer == 0 else real_hidden * dirs
                sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
                params = [("weight_ih", (gate, layer_in)), ("weight_hh", (gate, real_hidden))]
                if bias:
                    params += [("bias_ih", (gate,)), ("bias_hh", (gate,))]
                if proj_size > 0:
                    params.append(("weight_hr", (proj_size, hidden_size)))
                for name, shape in params:
                    setattr(self, name + sfx, Parameter(empty(*shape, **kw)))
                    self._flat_weights_names.append(name + sfx)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def flatten_parameters(self) -> None:
        """A no-op (there is no cuDNN weight buffer to compact)."""

    @property
    def _flat_weights(self) -> list:
        return [getattr(self, n) for n in self._flat_weights_names]

    @property
    def all_weights(self) -> list[list[Parameter]]:
        per = len(self._flat_weights_names) // (self.num_layers * (2 if self.bidirectional else 1))
        w = self._flat_weights
        return [w[i:i + per] for i in range(0, len(w), per)]

    def _weights(self, layer: int, d: int) -> dict:
        sfx = f"_l{layer}" + ("_reverse" if d == 1 else "")
        # by attribute, as torch's _flat_weights: a parametrized weight (orthogonal, weight_norm)
        # is a property computing it, no longer in _parameters
        get = lambda n: getattr(self, n + sfx, None)  # noqa: E731
        return {"w_ih": get("weight_ih"), "w_hh": get("weight_hh"), "b_ih": get("bias_ih"),
                "b_hh": get("bias_hh"), "w_hr": get("weight_hr")}

    def _state_shapes(self, batch: int | None) -> tuple:
        n = self.num_layers * (2 if self.bidirectional else 1)
        real = self.proj_size if self.proj_size > 0 else self.hidden_size
        lead = (n,) if batch is None else (n, batch)
        return lead + (real,), lead + (self.hidden_size,)

    def _check_hidden(self, h: Tensor, want: tuple, what: str) -> None:
        if tuple(h.shape) != want:
            raise RuntimeError(f"holoflow.nn.{type(self).__name__}: Expected {what} size {want}, got "
                               f"{tuple(h.shape)}")

    def forward(self, input: Any, hx: Any = None):
        is_lstm = self.mode == "LSTM"
        packed = isinstance(input, PackedSequence)
        if packed:
            x, batch_sizes, sorted_idx, unsorted_idx = input
            bs = batch_sizes_of(input)
            batch, batched = bs[0], True
        else:
            if input.dim() not in (2, 3):
                raise ValueError(f"holoflow.nn.{type(self).__name__}: Expected input to be 2D or 3D, got "
                                 f"{input.dim()}D tensor of shape {tuple(input.shape)}")
            batched, bs, sorted_idx, unsorted_idx = input.dim() == 3, None, None, None
            x = input if batched else input.unsqueeze(1)
            if batched and self.batch_first:
                x = x.transpose(0, 1)
            batch = x.shape[1]
        if x.shape[-1] != self.input_size:
            raise RuntimeError(f"holoflow.nn.{type(self).__name__}: input.size(-1) must be equal to input_size. "
                               f"Expected {self.input_size}, got {x.shape[-1]}")
        h_shape, c_shape = self._state_shapes(batch if batched else None)
        if hx is None:
            h0 = _zeros_like_layout(self._state_shapes(batch)[0], x)
            c0 = _zeros_like_layout(self._state_shapes(batch)[1], x) if is_lstm else None
        else:
            if is_lstm:
                want = 3 if batched else 2
                if isinstance(hx, Tensor) and len(hx) >= 2 and (hx[0].dim(), hx[1].dim()) != (want, want):
                    raise RuntimeError(f"holoflow.nn.LSTM: For {'batched 3-D' if batched else 'unbatched 2-D'} input, "
                                       f"hx and cx should also be {want}-D but got ({hx[0].dim()}-D, {hx[1].dim()}-D) "
                                       f"tensors")   # (torch's check, which indexes a Tensor hx)
                if not isinstance(hx, (tuple, list)) or len(hx) != 2:
                    raise TypeError("holoflow.nn.LSTM: hx must be a tuple (h_0, c_0)")
                h0, c0 = hx
                self._check_hidden(h0, h_shape, "hidden[0]")
                self._check_hidden(c0, c_shape, "hidden[1]")
            else:
                if isinstance(hx, (tuple, list)):
                    raise TypeError(f"holoflow.nn.{type(self).__name__}: hx must be a Tensor, got a tuple")
                h0, c0 = hx, None
                self._check_hidden(h0, h_shape, "hidden")
            if not batched:
                h0, c0 = h0.unsqueeze(1), (c0.unsqueeze(1) if c0 is not None else None)
            if sorted_idx is not None:
                h0 = h0.index_select(1, sorted_idx)
                c0 = c0.index_select(1, sorted_idx) if c0 is not None else None
        dirs = 2 if self.bidirectional else 1
        hs, cs, layer_in = [], [], x
        names = ("w_ih", "w_hh", "b_ih", "b_hh", "w_hr")
        for layer in range(self.num_layers):
            if dirs == 2:   # both directions in ATen's one call (the reverse one is its own)
                ws = [self._weights(layer, d) for d in (0, 1)]
                pair = slice(2 * layer, 2 * layer + 2)
                layer_in, h, c = rnn_bidi_layer(self.mode, layer_in, h0[pair], c0[pair] if c0 is not None else None,
                                                tuple(ws[0][n] for n in names), tuple(ws[1][n] for n in names), bs)
                hs += [h[0], h[1]]
                cs += [c[0], c[1]] if c is not None else [None, None]
            else:
                w = self._weights(layer, 0)
                layer_in, h, c = rnn_layer(self.mode, layer_in, h0[layer], c0[layer] if c0 is not None else None,
                                           *(w[n] for n in names), False, bs)
                hs.append(h)
                cs.append(c)
            if self.dropout and self.training and layer < self.num_layers - 1:
                layer_in = dropout(layer_in, self.dropout, True)
        h_n = stack(hs, 0)
        c_n = stack(cs, 0) if is_lstm else None
        if unsorted_idx is not None:
            h_n = h_n.index_select(1, unsorted_idx)
            c_n = c_n.index_select(1, unsorted_idx) if c_n is not None else None
        if packed:
            output: Any = input.with_data(layer_in)
        else:
            output = layer_in
            if not batched:
                output, h_n = output.squeeze(1), h_n.squeeze(1)
                c_n = c_n.squeeze(1) if c_n is not None else None
            elif self.batch_first:
                output = output.transpose(0, 1)
        return output, ((h_n, c_n) if is_lstm else h_n)

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.proj_size != 0:
            s += f", proj_size={self.proj_size}"
        if self.num_layers != 1:
            s += f", num_layers={self.num_layers}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if self.batch_first is not False:
            s += f", batch_first={self.batch_first}"
        if self.dropout != 0:
            s += f", dropout={self.dropout}"
        if self.bidirectional is not False:
            s += f", bidirectional={self.bidirectional}"
        return s


class RNN(RNNBase):
    """Elman RNN: ``h_t = tanh(x_t W_ih^T + b_ih + h_{t-1} W_hh^T + b_hh)`` (or relu)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        names = ["input_size", "hidden_size", "num_layers", "nonlinearity", "bias", "batch_first", "dropout",
                 "bidirectional"]
        kwargs.update(zip(names, args))
        nonlinearity = kwargs.pop("nonlinearity", "tanh")
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity '{nonlinearity}'. Select from 'tanh' or 'relu'.")
        self.nonlinearity = nonlinearity
        super().__init__("RNN_TANH" if nonlinearity == "tanh" else "RNN_RELU", **kwargs)


class LSTM(RNNBase):
    """Long short-term memory, gates ``i, f, g, o`` in that order; returns
    ``(output, (h_n, c_n))``; ``proj_size > 0`` projects ``h`` with ``weight_hr``."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("LSTM", *args, **kwargs)


class GRU(RNNBase):
    """Gated recurrent unit, gates ``r, z, n`` in that order."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__("GRU", *args, **kwargs)


# -- cells -------------------------------------------------------------------------------------------------

class RNNCellBase(Module):
    def __init__(self, input_size: int, hidden_size: int, bias: bool, num_chunks: int, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__()
        self.input_size, self.hidden_size, self.bias = input_size, hidden_size, bias
        kw = {"device": device, "dtype": dtype}
        self.weight_ih = Parameter(empty(num_chunks * hidden_size, input_size, **kw))
        self.weight_hh = Parameter(empty(num_chunks * hidden_size, hidden_size, **kw))
        if bias:
            self.bias_ih = Parameter(empty(num_chunks * hidden_size, **kw))
            self.bias_hh = Parameter(empty(num_chunks * hidden_size, **kw))
        else:
            self.register_parameter("bias_ih", None)
            self.register_parameter("bias_hh", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        stdv = 1.0 / math.sqrt(self.hidden_size) if self.hidden_size > 0 else 0
        for weight in self.parameters():
            init.uniform_(weight, -stdv, stdv)

    def _prep(self, input: Tensor, hx: Any, n_states: int) -> tuple:
        name = type(self).__name__
        if input.dim() not in (1, 2):
            raise ValueError(f"holoflow.nn.{name}: Expected input to be 1D or 2D, got {input.dim()}D instead")
        if input.shape[-1] != self.input_size:
            raise RuntimeError(f"holoflow.nn.{name}: input has inconsistent input_size: got {input.shape[-1]} "
                               f"expected {self.input_size}")
        batched = input.dim() == 2
        x = input if batched else input.unsqueeze(0)
        want = (x.shape[0], self.hidden_size)
        if hx is None:
            states = [_zeros_like_layout(want, x) for _ in range(n_states)]
        else:
            states = list(hx) if n_states == 2 else [hx]
            for s in states:   # (as torch's, before the type: a Tensor hx is iterated here too)
                if s.dim() not in (1, 2):
                    raise ValueError(f"holoflow.nn.{name}: Expected hidden to be 1D or 2D, got {s.dim()}D instead")
            if n_states == 2 and isinstance(hx, Tensor):   # (its rows would be taken as (h, c))
                raise TypeError(f"holoflow.nn.{name}: hx must be a tuple (h_0, c_0) of Tensors, not a Tensor")
            for s in states:
                s_shape = tuple(s.shape) if batched else (1,) + tuple(s.shape)
                if s_shape != want:
                    exp = want if batched else want[1:]
                    raise RuntimeError(f"holoflow.nn.{name}: hidden state of shape {tuple(s.shape)} does not match "
                                       f"input of shape {tuple(input.shape)} (expected {exp})")
            if not batched:
                states = [s.unsqueeze(0) for s in states]
        return x, states, batched

    def extra_repr(self) -> str:
        s = f"{self.input_size}, {self.hidden_size}"
        if self.bias is not True:
            s += f", bias={self.bias}"
        if getattr(self, "nonlinearity", "tanh") != "tanh":
            s += f", nonlinearity={self.nonlinearity}"
        return s


class RNNCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, nonlinearity: str = "tanh",
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 1, device, dtype)
        if nonlinearity not in ("tanh", "relu"):
            raise ValueError(f"Unknown nonlinearity: {nonlinearity}")
        self.nonlinearity = nonlinearity

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, (h,), batched = self._prep(input, hx, 1)
        pre = hidden_first(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh)
        h = pre.relu() if self.nonlinearity == "relu" else pre.tanh()
        return h if batched else h.squeeze(0)


class LSTMCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 4, device, dtype)

    def forward(self, input: Tensor, hx: tuple | None = None) -> tuple[Tensor, Tensor]:
        x, (h, c), batched = self._prep(input, hx, 2)
        h, c = _lstm_gates(hidden_first(x, h, self.weight_ih, self.weight_hh, self.bias_ih, self.bias_hh), c)
        return (h, c) if batched else (h.squeeze(0), c.squeeze(0))


class GRUCell(RNNCellBase):
    def __init__(self, input_size: int, hidden_size: int, bias: bool = True, device: Any = None,
                 dtype: Any = None) -> None:
        super().__init__(input_size, hidden_size, bias, 3, device, dtype)

    def forward(self, input: Tensor, hx: Tensor | None = None) -> Tensor:
        x, (h,), batched = self._prep(input, hx, 1)
        h, _ = _gru_step(linear(x, self.weight_ih, self.bias_ih), h, None, self.weight_hh, self.bias_hh, None, False)
        return h if batched else h.squeeze(0)

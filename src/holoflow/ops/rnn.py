"""Recurrent layers: one op runs one layer in one direction over a whole sequence.

Stepping through time with holoflow ops costs a dozen dispatches per step (and as many grad
nodes); one primitive per layer-direction runs ATen's RNN kernel (``torch.lstm``/``gru``/
``rnn_tanh``/``rnn_relu`` with one layer) instead, with ATen's derivatives for the backward
(ops/torch_vjp.py), so values and gradients are ``torch.nn.LSTM``/``GRU``/``RNN``'s. Packed
input gives ``batch_sizes`` (an attr: static shapes): the rows of step ``t`` are
``x[offset_t : offset_t + batch_sizes[t]]``, and a sequence's final state is its state after its
own last step.

SBP: without packing, the batch axis splits everything batched (x on axis 1, states on 0)
while the weights stay broadcast; in the backward the weight gradients are then partial sums.
"""
from __future__ import annotations

import torch

from ..core import grad_mode
from ..core.dispatch import apply
from ..core.errors import DTypeError
from ..core.registry import Meta
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from .torch_vjp import defop_vjp

__all__: list[str] = []   # used by holoflow.nn.RNN/LSTM/GRU

MODES = ("RNN_TANH", "RNN_RELU", "LSTM", "GRU")


_ATEN = {"LSTM": torch.lstm, "GRU": torch.gru, "RNN_TANH": torch.rnn_tanh, "RNN_RELU": torch.rnn_relu}


def _run(mode: str, x, hx, params: list, has_bias: bool, bidirectional: bool, batch_sizes, weights_rg: bool,
         autocast=None, x_leaf: bool = True):
    """ATen's one-layer kernel: ``(output, h_n, c_n)`` (``(output, h_n)`` but LSTM's); under
    ``torch.autocast(dtype=autocast)`` when an autocast region gives the op that attr
    (amp/policy.py's NATIVE: the dtypes are those of the path ATen takes inside)."""
    if autocast is not None:
        if x.device.type == "meta":
            return _autocast_metas(mode, x, hx, params, has_bias, bidirectional, batch_sizes, autocast)
        if bidirectional and not x_leaf and x.requires_grad:
            # torch.autocast casts a leaf once for all its uses (its cache), anything else per use:
            # both directions read x, and the gradients of one cast sum in the low dtype. A layer
            # over another's output (not a leaf in torch's graph) casts it per direction
            x = x.view_as(x)
        with torch.autocast(x.device.type, dtype=autocast):
            return _run(mode, x, hx, params, has_bias, bidirectional, batch_sizes, weights_rg)
    fn = _ATEN[mode]
    states = list(hx) if isinstance(hx, tuple) else [hx]
    # ``train``: whether a backward through torch's graph follows (ops/torch_vjp.py's backward re-runs
    # this kernel under enable_grad with leaves that require grad; the forward op's inputs do not).
    # With dropout 0 and one layer it changes no value, but cuDNN's inference forward keeps no
    # reserve space and its backward refuses to run ("cudnn RNN backward can only be called in
    # training mode"), as torch.nn.LSTM's in eval(); ATen's CPU kernels ignore it.
    train = torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in [x, *states, *params])
    if weights_rg and not any(p.requires_grad for p in params):
        # ATen's CPU RNN kernels choose their code path (and so their rounding) by whether the
        # weights require grad and whether grad mode is on; the module's weights do (``weights_rg``,
        # the holoflow parameters'), so the call runs on flagged aliases in holoflow's grad mode, as
        # torch's nn.GRU/LSTM/RNN would (its values bit for bit), and its outputs are detached
        params = [p.detach().requires_grad_() for p in params]
        with torch.set_grad_enabled(grad_mode.STATE.enabled):
            got = _run(mode, x, hx, params, has_bias, bidirectional, batch_sizes, False)
        return tuple(t.detach() for t in got)
    # batch_sizes: a CPU int64 tensor whatever x's device (ATen's packed kernels read it on the host)
    if batch_sizes is not None:
        return fn(x, torch.tensor(batch_sizes, device="cpu"), hx, params, has_bias, 1, 0.0, train, bidirectional)
    return fn(x, hx, params, has_bias, 1, 0.0, train, bidirectional, False)


def _autocast_metas(mode: str, x, hx, params: list, has_bias: bool, bidirectional: bool, batch_sizes, low):
    """The outputs on meta tensors (a trace's shape inference) in the dtypes autocast gives them:
    torch.autocast casts no meta tensor, so the dtypes come from a one-step, batch-one run on
    the CPU (the CPU is autocast's only device taking this path: amp/policy.py)."""
    shapes = _run(mode, x, hx, params, has_bias, bidirectional, batch_sizes, False)
    one = torch.zeros(x.shape[-1], dtype=x.dtype).expand(*(1,) * (x.dim() - 1), x.shape[-1])
    states = [torch.zeros(s.shape[0], 1, s.shape[-1], dtype=s.dtype) for s in (hx if isinstance(hx, tuple) else (hx,))]
    probe = _run(mode, one, tuple(states) if isinstance(hx, tuple) else states[0],
                 [torch.zeros(p.shape, dtype=p.dtype) for p in params], has_bias, bidirectional,
                 None if batch_sizes is None else (1,), False, low)
    return tuple(s.to(p.dtype) for s, p in zip(shapes, probe))


def _check_dtypes(mode: str, x, tensors) -> None:
    """torch's check (outside autocast, which casts them): states and weights (``(name, tensor)``
    pairs) in ``x``'s dtype."""
    for name, t in tensors:
        if t is not None and t.dtype != x.dtype:
            raise DTypeError(f"holoflow.nn.{mode.split('_')[0]}: input must have the type {x.dtype}, got {name} of "
                             f"type {t.dtype}")


def _params(w_ih, w_hh, b_ih, b_hh, w_hr) -> list:
    """One direction's weights in ATen's order (biases and projection where present)."""
    return [w_ih, w_hh] + ([b_ih, b_hh] if b_ih is not None else []) + ([w_hr] if w_hr is not None else [])


# Modes whose reverse direction ATen computes otherwise than its forward one over the flipped
# sequence (its simple cells add the input projection per step there: another rounding)
_OWN_REVERSE = ("RNN_TANH", "RNN_RELU")


def _layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode: str, reverse: bool, batch_sizes, weights_rg=False,
           autocast=None, x_leaf=True):
    """One layer, one direction, on ATen's kernel: (output rows like x, final h, final c).
    The reverse direction of a padded LSTM/GRU sequence is the forward one over the time-flipped
    input; of a packed sequence or a plain RNN, the second half of a bidirectional call whose
    halves share the weights (twice the work of that direction; a bidirectional module runs
    both directions in one call instead: ``rnn_bidi_layer``)."""
    if autocast is None:
        _check_dtypes(mode, x, (("h0", h0), ("c0", c0), ("weight_ih", w_ih), ("weight_hh", w_hh), ("bias_ih", b_ih),
                                ("bias_hh", b_hh), ("weight_hr", w_hr)))
    params = _params(w_ih, w_hh, b_ih, b_hh, w_hr)
    has_bias, lstm = b_ih is not None, mode == "LSTM"
    if reverse and (batch_sizes is not None or mode in _OWN_REVERSE):
        h2 = torch.stack([h0, h0])
        hx = (h2, torch.stack([c0, c0])) if lstm else h2
        res = _run(mode, x, hx, params + params, has_bias, True, batch_sizes, weights_rg, autocast, x_leaf)
        out = res[0].narrow(-1, res[0].shape[-1] // 2, res[0].shape[-1] // 2)
        return out, res[1][1], res[2][1] if lstm else None
    hx = (h0.unsqueeze(0), c0.unsqueeze(0)) if lstm else h0.unsqueeze(0)
    flip = reverse and batch_sizes is None
    res = _run(mode, x.flip(0) if flip else x, hx, params, has_bias, False, batch_sizes, weights_rg, autocast)
    out = res[0].flip(0) if flip else res[0]
    return out, res[1][0], res[2][0] if lstm else None


def _lstm_kernel(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse, batch_sizes, weights_rg=False,
                 autocast=None, x_leaf=True):
    return _layer(x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode, reverse, batch_sizes, weights_rg, autocast, x_leaf)


def _rnn_kernel(x, h0, w_ih, w_hh, b_ih, b_hh, mode, reverse, batch_sizes, weights_rg=False, autocast=None,
                x_leaf=True):
    out, h, _ = _layer(x, h0, None, w_ih, w_hh, b_ih, b_hh, None, mode, reverse, batch_sizes, weights_rg, autocast,
                       x_leaf)
    return out, h


def _lstm_bidi_kernel(x, h0, c0, *weights, mode, batch_sizes, weights_rg=False, autocast=None, x_leaf=True):
    """Both directions of one LSTM layer in ATen's bidirectional call: ``h0``/``c0`` ``(2, B, H)``,
    ``weights`` each direction's ``(w_ih, w_hh, b_ih, b_hh, w_hr)``; output ``(.., 2 * H)``."""
    if autocast is None:
        _check_dtypes(mode, x, [("a state or weight", t) for t in (h0, c0, *weights)])
    params = _params(*weights[:5]) + _params(*weights[5:])
    out, h, c = _run(mode, x, (h0, c0), params, weights[2] is not None, True, batch_sizes, weights_rg, autocast,
                     x_leaf)
    return out, h, c


def _rnn_bidi_kernel(x, h0, *weights, mode, batch_sizes, weights_rg=False, autocast=None, x_leaf=True):
    """Both directions of one GRU/RNN layer (``weights``: ``(w_ih, w_hh, b_ih, b_hh)`` each)."""
    if autocast is None:
        _check_dtypes(mode, x, [("a state or weight", t) for t in (h0, *weights)])
    params = _params(*weights[:4], None) + _params(*weights[4:], None)
    out, h = _run(mode, x, h0, params, weights[2] is not None, True, batch_sizes, weights_rg, autocast, x_leaf)
    return out, h


def _roles(metas, lstm: bool) -> list[str]:
    """The role of each present tensor input: 'x', 'state' or 'weight'."""
    names = ["x", "state", "state"] if lstm else ["x", "state"]
    names += ["weight"] * (len(metas) - len(names))
    return [n for n, m in zip(names, metas) if isinstance(m, Meta)]


def _layer_sbp(lstm: bool, state_axis: int = 0):
    """Broadcast everything, or (unpacked) split the batch: x on axis 1, the states on
    ``state_axis`` (0 for one direction's ``(B, H)``, 1 for both directions' ``(2, B, H)``)."""
    n_out = 3 if lstm else 2

    def rule(metas, attrs):
        roles = _roles(metas, lstm)
        sigs = [((B,) * len(roles), (B,) * n_out)]
        if attrs["batch_sizes"] is None:
            per = {"x": S(1), "state": S(state_axis), "weight": B}
            sigs.append((tuple(per[r] for r in roles), (S(1),) + (S(state_axis),) * (n_out - 1)))
        return sigs
    return rule


def _layer_bwd_sbp(lstm: bool, state_axis: int = 0):
    n_out = 3 if lstm else 2

    def rule(metas, attrs):
        n_in = attrs["n_in"]
        roles = _roles(list(metas[:n_in]), lstm)
        diff = attrs["diff"]
        all_roles = (["x", "state", "state"] if lstm else ["x", "state"])
        all_roles += ["weight"] * (n_in - len(all_roles))
        sigs = [((B,) * (len(roles) + n_out), (B,) * len(diff))]
        if attrs["batch_sizes"] is None:
            per_in = {"x": S(1), "state": S(state_axis), "weight": B}
            per_grad = {"x": S(1), "state": S(state_axis), "weight": P}
            ins = tuple(per_in[r] for r in roles) + (S(1),) + (S(state_axis),) * (n_out - 1)
            sigs.append((ins, tuple(per_grad[all_roles[i]] for i in diff)))
        return sigs
    return rule


LSTM_LAYER = defop_vjp("lstm_layer", _lstm_kernel, sbp=_layer_sbp(True), bwd_sbp=_layer_bwd_sbp(True),
                       family="rnn", outputs=("output", "h_n", "c_n"))
RNN_LAYER = defop_vjp("rnn_layer", _rnn_kernel, sbp=_layer_sbp(False), bwd_sbp=_layer_bwd_sbp(False),
                      family="rnn", outputs=("output", "h_n"))
LSTM_BIDI_LAYER = defop_vjp("lstm_bidi_layer", _lstm_bidi_kernel, sbp=_layer_sbp(True, 1),
                            bwd_sbp=_layer_bwd_sbp(True, 1), family="rnn", outputs=("output", "h_n", "c_n"))
RNN_BIDI_LAYER = defop_vjp("rnn_bidi_layer", _rnn_bidi_kernel, sbp=_layer_sbp(False, 1),
                           bwd_sbp=_layer_bwd_sbp(False, 1), family="rnn", outputs=("output", "h_n"))


def rnn_layer(mode: str, x: Tensor, h0: Tensor, c0: Tensor | None, w_ih: Tensor, w_hh: Tensor,
              b_ih: Tensor | None = None, b_hh: Tensor | None = None, w_hr: Tensor | None = None,
              reverse: bool = False, batch_sizes: tuple | None = None) -> tuple:
    """One recurrent layer in one direction: ``x`` ``(T, B, in)`` (or packed rows with
    ``batch_sizes``), states ``(B, H)``; returns ``(output, h_n)`` or, for LSTM, ``(output, h_n, c_n)``."""
    if mode not in MODES:
        raise ValueError(f"holoflow.rnn_layer: mode must be one of {MODES}, got {mode!r}")
    bs = tuple(int(b) for b in batch_sizes) if batch_sizes is not None else None
    rg = any(w is not None and w.requires_grad for w in (w_ih, w_hh, b_ih, b_hh, w_hr))
    if mode == "LSTM":
        return tuple(apply(LSTM_LAYER, x, h0, c0, w_ih, w_hh, b_ih, b_hh, w_hr, mode=mode, reverse=bool(reverse),
                           batch_sizes=bs, weights_rg=rg, x_leaf=x.is_leaf))
    return tuple(apply(RNN_LAYER, x, h0, w_ih, w_hh, b_ih, b_hh, mode=mode, reverse=bool(reverse),
                       batch_sizes=bs, weights_rg=rg, x_leaf=x.is_leaf)) + (None,)


def rnn_bidi_layer(mode: str, x: Tensor, h0: Tensor, c0: Tensor | None, forward: tuple, backward: tuple,
                   batch_sizes: tuple | None = None) -> tuple:
    """One bidirectional recurrent layer in ATen's one call (torch's values and gradients bit for
    bit): ``x`` ``(T, B, in)`` (or packed rows with ``batch_sizes``), states ``(2, B, H)``,
    ``forward``/``backward`` each direction's ``(w_ih, w_hh, b_ih, b_hh, w_hr)`` (None where
    absent); returns ``(output (.., 2 * H), h_n, c_n or None)``."""
    if mode not in MODES:
        raise ValueError(f"holoflow.rnn_bidi_layer: mode must be one of {MODES}, got {mode!r}")
    weights = tuple(forward) + tuple(backward)
    bs = tuple(int(b) for b in batch_sizes) if batch_sizes is not None else None
    rg = any(w is not None and w.requires_grad for w in weights)
    if mode == "LSTM":
        return tuple(apply(LSTM_BIDI_LAYER, x, h0, c0, *weights, mode=mode, batch_sizes=bs, weights_rg=rg,
                           x_leaf=x.is_leaf))
    w = weights[:4] + weights[5:9]   # (no projection but LSTM's)
    return tuple(apply(RNN_BIDI_LAYER, x, h0, *w, mode=mode, batch_sizes=bs, weights_rg=rg,
                       x_leaf=x.is_leaf)) + (None,)

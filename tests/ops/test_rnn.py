"""ops/rnn.py (one recurrent layer, one direction or both) vs torch's own RNN kernels:
``torch._VF`` layers of one layer (the reverse direction as torch's bidirectional half; both
directions as its bidirectional call), padded and packed input; forward + backward, gradcheck,
SBP rules on simulated ranks."""
import pytest
import torch

import holoflow as flow
from harness import F32, F64, Case, parametrize, randn
from holoflow.ops.rnn import rnn_bidi_layer, rnn_layer

H, IN, T, N = 3, 2, 4, 3
GATES = {"LSTM": 4, "GRU": 3, "RNN_TANH": 1, "RNN_RELU": 1}
PACKED = (3, 3, 2, 1)   # batch_sizes of lengths [4, 3, 2]


def _torch_layer(mode, x, h0, c0, ws, reverse, batch_sizes, proj):
    """torch's kernel for the same layer: a bidirectional one-layer call whose other direction
    gets copies of the same weights, keeping the half asked for; ``train=True`` as torch.nn.LSTM's
    in train() (dropout 0: the same values; cuDNN's backward needs its training forward)."""
    n = len(ws)
    flat = list(ws) + list(ws)
    hx = torch.stack([h0, h0])
    if mode == "LSTM":
        hx = (hx, torch.stack([c0, c0]))
    fn = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh,
          "RNN_RELU": torch._VF.rnn_relu}[mode]
    has_bias = n - (1 if proj else 0) == 4
    if batch_sizes is None:
        res = fn(x, hx, flat, has_bias, 1, 0.0, True, True, False)
    else:
        res = fn(x, torch.tensor(batch_sizes), hx, flat, has_bias, 1, 0.0, True, True)
    out, hn = res[0], res[1]
    width = out.shape[-1] // 2
    k = 1 if reverse else 0
    out = out.narrow(-1, k * width, width)
    return (out, hn[k], res[2][k]) if mode == "LSTM" else (out, hn[k])


def _make(mode, bias=True, proj=0, packed=False):
    hs = proj or H

    def make(dt, g):
        rows = sum(PACKED) if packed else None
        x = randn(rows, IN, gen=g, dtype=dt) if packed else randn(T, N, IN, gen=g, dtype=dt)
        h0 = randn(N, hs, gen=g, dtype=dt)
        c0 = randn(N, H, gen=g, dtype=dt) if mode == "LSTM" else None
        gs = GATES[mode] * H
        ws = [randn(gs, IN, gen=g, dtype=dt) * 0.5, randn(gs, hs, gen=g, dtype=dt) * 0.5]
        if bias:
            ws += [randn(gs, gen=g, dtype=dt) * 0.5, randn(gs, gen=g, dtype=dt) * 0.5]
        if proj:
            ws.append(randn(proj, H, gen=g, dtype=dt) * 0.5)
        return (x, h0, c0, *ws), {}
    return make


def _case(mode, reverse, bias=True, proj=0, packed=False):
    bs = PACKED if packed else None

    def fl(x, h0, c0, *ws):
        w = list(ws) if bias else [ws[0], ws[1], None, None] + list(ws[2:])
        if not proj:
            w = w[:4]
        out = rnn_layer(mode, x, h0, c0, *w, reverse=reverse, batch_sizes=bs)
        return out if mode == "LSTM" else out[:2]

    def tf(x, h0, c0, *ws):
        return _torch_layer(mode, x, h0, c0, ws, reverse, bs, proj)
    name = f"{mode}-{'rev' if reverse else 'fwd'}{'-nobias' if not bias else ''}{f'-proj{proj}' if proj else ''}" \
           f"{'-packed' if packed else ''}"
    return Case(name, fl, tf, _make(mode, bias, proj, packed), dtypes=(F32, F64))


def _make_bidi(mode, bias=True, proj=0, packed=False):
    """Inputs of a bidirectional layer: states ``(2, N, H)`` and each direction's weights."""
    one = _make(mode, bias, proj, packed)

    def make(dt, g):
        (x, h0, c0, *wf), _ = one(dt, g)
        (_, h1, c1, *wr), _ = one(dt, g)
        return (x, torch.stack([h0, h1]), torch.stack([c0, c1]) if c0 is not None else None, *wf, *wr), {}
    return make


def _bidi_case(mode, bias=True, proj=0, packed=False):
    bs = PACKED if packed else None
    n = 2 + (2 if bias else 0) + (1 if proj else 0)

    def full(ws):
        w = list(ws) if bias else [ws[0], ws[1], None, None] + list(ws[2:])
        return tuple(w) + (None,) * (5 - len(w))

    def fl(x, h0, c0, *ws):
        out = rnn_bidi_layer(mode, x, h0, c0, full(ws[:n]), full(ws[n:]), batch_sizes=bs)
        return out if mode == "LSTM" else out[:2]

    def tf(x, h0, c0, *ws):
        fn = {"LSTM": torch._VF.lstm, "GRU": torch._VF.gru, "RNN_TANH": torch._VF.rnn_tanh,
              "RNN_RELU": torch._VF.rnn_relu}[mode]
        hx = (h0, c0) if mode == "LSTM" else h0
        if bs is None:
            res = fn(x, hx, list(ws), bias, 1, 0.0, True, True, False)
        else:
            res = fn(x, torch.tensor(bs), hx, list(ws), bias, 1, 0.0, True, True)
        return tuple(res) if mode == "LSTM" else tuple(res[:2])
    name = f"{mode}-bidi{'-nobias' if not bias else ''}{f'-proj{proj}' if proj else ''}{'-packed' if packed else ''}"
    return Case(name, fl, tf, _make_bidi(mode, bias, proj, packed), dtypes=(F32, F64))


CASES = [_case(m, r, packed=p) for m in GATES for r in (False, True) for p in (False, True)]
CASES += [_bidi_case(m, packed=p) for m in GATES for p in (False, True)]
CASES += [_bidi_case("GRU", bias=False), _bidi_case("LSTM", proj=2), _bidi_case("LSTM", bias=False, proj=2, packed=True)]
CASES += [_case("GRU", False, bias=False), _case("LSTM", True, bias=False, packed=True),
          _case("LSTM", False, proj=2), _case("LSTM", True, proj=2, packed=True)]
globals().update(parametrize(CASES))


def test_mixed_dtypes_raise_like_torch():
    x = flow.randn(T, N, IN, dtype=flow.float64)
    with pytest.raises(TypeError, match="input must have the type"):
        rnn_layer("GRU", x, flow.zeros(N, H), None, flow.randn(3 * H, IN), flow.randn(3 * H, H))


_ = torch

"""Minimized findings of the nn.Module fuzzer (tests/nn/test_fuzz_modules.py) and of the nn gaps
it points at, each against torch: values, gradients and exception classes."""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import broadcast as B, split as S

from .test_fuzz_modules import _raised


def _same_refusal(call) -> None:
    """``call(lib)`` raises in torch, and in holoflow with the same class."""
    want, got = _raised(lambda: call(torch)), _raised(lambda: call(flow))
    assert want is not None
    assert isinstance(got, type(want)), f"torch {type(want).__name__}: {want}; holoflow {got!r}"


@pytest.mark.parametrize("nested", [True, False])
def test_transformer_encoder_of_a_layer_without_self_attention(nested):
    """An encoder whose layers are not transformer layers (a Linear): torch's forward reads the
    first layer's ``self_attn.batch_first`` first (AttributeError); holoflow called the layer with
    the encoder's keyword arguments (TypeError)."""
    def call(lib):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = lib.nn.TransformerEncoder(lib.nn.Linear(4, 4), 2, enable_nested_tensor=nested)
        return m(lib.ones(2, 3, 4))
    _same_refusal(call)


@pytest.mark.parametrize("call", [
    "nn.EmbeddingBag(5, 3, mode='max')(lib.tensor([0, 1, 2]), lib.ones(2, 3))",
    "nn.EmbeddingBag(5, 3, mode='max', scale_grad_by_freq=True)(lib.tensor([[0, 1, 2]]))",
    "nn.EmbeddingBag(5, 3, mode='sum')(lib.tensor([0, 1, 2]), lib.tensor([[0]]))",
], ids=["max-2d-offsets", "max-freq", "sum-2d-offsets"])
def test_embedding_bag_refusals_of_nn_functional(call):
    """seed 47398: max mode's op runs ATen's embedding_bag, which lacks nn.functional's checks: a
    2-D ``offsets`` reached the kernel (RuntimeError; torch: ValueError) and ``scale_grad_by_freq``
    in max mode would have been taken (torch: ValueError). Both are checked before the op."""
    _same_refusal(lambda lib: eval(call, {"nn": lib.nn, "lib": lib}))


@pytest.mark.parametrize("call", [
    "m(lib.ones(3, 2, 4), lib.ones(5, 2, 4), lib.ones(5, 2, 4), attn_mask=lib.zeros(1, 3, 5))",
    "m(lib.ones(3, 2, 4), lib.ones(5, 2, 4), lib.ones(5, 2, 4), attn_mask=lib.zeros(3, 1), need_weights=False)",
    "m(lib.ones(3, 4), lib.ones(5, 4), lib.ones(5, 4), attn_mask=lib.zeros(1, 5))",
    "m(lib.ones(3, 2, 4), lib.ones(5, 2, 4), lib.ones(5, 2, 4), key_padding_mask=lib.zeros(3, 5))",
    "m(lib.ones(3, 2, 4), lib.ones(5, 2, 4), lib.ones(5, 2, 4), key_padding_mask=lib.zeros(2, 1))",
    "m(lib.ones(3, 2, 4), lib.ones(5, 2, 4), lib.ones(6, 2, 4))",
    "nn.MultiheadAttention(4, 2, kdim=3, vdim=5)(lib.ones(3, 2, 4), lib.ones(5, 2, 3), lib.ones(6, 2, 5))",
], ids=["3d-mask-broadcast", "2d-mask-broadcast", "unbatched-mask-broadcast", "padding-batch", "padding-length",
        "key-value", "separate-key-value"])
def test_attention_mask_and_key_shapes_are_checked_as_torch(call):
    """seed 48916 (a key padding mask of another batch: a reshape's ShapeError; torch's
    AssertionError). Looking at torch's checks: attention masks that broadcast to (N * heads, L, S)
    were taken (silently; torch: RuntimeError, the exact shape), keys and values of different
    lengths failed in a matmul (torch: AssertionError)."""
    def call_with(lib):
        m = lib.nn.MultiheadAttention(4, 2)
        return eval(call, {"nn": lib.nn, "lib": lib, "m": m})
    _same_refusal(call_with)


@pytest.mark.parametrize("kw", ["mask", "src_key_padding_mask"])
def test_transformer_encoder_refuses_integer_masks_first(kw):
    """seed 50112: an encoder called with an integer mask and an input of another width: torch
    checks the masks' dtypes before anything (AssertionError); holoflow ran the layers and failed in
    a layer norm (ShapeError)."""
    def call(lib):
        layer = lib.nn.TransformerEncoderLayer(4, 2, 6, dropout=0.0, norm_first=True)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            m = lib.nn.TransformerEncoder(layer, 1)
        return m(lib.ones(2, 1, 3), **{kw: lib.tensor([[0, 1]])})
    _same_refusal(call)


def test_embedding_bag_scaled_by_frequency_on_split_bags():
    """``scale_grad_by_freq`` on a 2-D input split by bags (S(0)) over 2 ranks: the forward took
    the split-bags signature, so each rank's backward divided by the counts of its own bags' indices
    only: the weight's gradient was silently wrong (the bags' split is now refused with frequency
    scaling, and the input boxed). Against one process, which is torch's (tests/ops/test_sampling)."""
    idx = torch.tensor([[0, 1, 1, 2, 3], [1, 1, 0, 0, 2], [3, 3, 3, 1, 0], [2, 2, 1, 0, 1]])
    w, up = torch.randn(4, 3, dtype=torch.float64), torch.randn(4, 3, dtype=torch.float64)

    def grad(rank):
        place = flow.placement("cpu", [0, 1])
        gw = flow.from_torch(w).to_global(place, (B,)).requires_grad_()
        gi = flow.from_torch(idx).to_global(place, (B,)).to_global(sbp=(S(0),))
        out = flow.nn.functional.embedding_bag(gi, gw, mode="mean", scale_grad_by_freq=True)
        g, = flow.autograd.grad([out], [gw], [flow.from_torch(up).to_global(place, (B,))])
        return g.to_global(sbp=(B,)).to_local().to_torch()
    tw = w.clone().requires_grad_()
    want, = torch.autograd.grad(torch.nn.functional.embedding_bag(idx, tw, mode="mean", scale_grad_by_freq=True),
                                [tw], [up])
    for got in world.simulate(2, grad, timeout=120):
        torch.testing.assert_close(got, want)


@pytest.mark.parametrize("kind", ["RNNCell", "LSTMCell"])
def test_cell_backward_reaches_the_input_weight_first(kind):
    """seed 53676 (an LSTMCell's weight_ih tied to an Embedding with max_norm, which renormalizes
    it in place): torch's RNN and LSTM cells record ``linear_hh(h)`` before ``linear_ih(x)``, so
    their backward reaches the input's weight first and refuses its in-place change before keeping
    any gradient; holoflow's recorded them the other way and had accumulated weight_hh's (and
    bias_hh's) gradients before refusing (a later clip_grad_norm_ then differed)."""
    def run(lib):
        lib.manual_seed(0)
        cell = getattr(lib.nn, kind)(3, 2).double()
        x = lib.ones(2, 3, dtype=lib.float64, requires_grad=True)
        h = lib.ones(2, 2, dtype=lib.float64, requires_grad=True)
        out = cell(x, (h, h) if kind == "LSTMCell" else h)
        with lib.no_grad():
            cell.weight_ih.mul_(2)
        with pytest.raises(RuntimeError, match="in-place|inplace"):
            (out[0] if isinstance(out, tuple) else out).sum().backward()
        return [q.grad is None for q in cell.parameters()] + [x.grad is None, h.grad is None]
    assert run(flow) == run(torch)


def test_conv_transpose_output_size_of_a_one_dim_input():
    """seed 56895: ``ConvTranspose1d`` of a 1-D input with a 2-element ``output_size``: torch reads
    the input's size at dim 1 (IndexError); holoflow took the input's last dim and compared a tensor
    (RuntimeError: the truth value of a tensor is ambiguous)."""
    _same_refusal(lambda lib: lib.nn.ConvTranspose1d(2, 1, 1, stride=2)(lib.ones(3), lib.ones(2, 2, 5)))
    _same_refusal(lambda lib: lib.nn.ConvTranspose1d(2, 1, 1, stride=2)(lib.ones(3), [4, 5]))


def test_transformer_decoder_with_a_target_mask_traces_in_a_graph():
    """A ``TransformerDecoder`` (as in ``Transformer``) given ``tgt_mask`` with ``tgt_is_causal``
    left None inside ``nn.Graph``: torch's rule compares the mask with a causal one (a hint only:
    the mask applies either way), which read the symbolic mask's value and failed the trace
    (GraphBuildError). In a trace the hint is left off; the graph equals eager."""
    flow.manual_seed(0)
    m = flow.nn.TransformerDecoder(flow.nn.TransformerDecoderLayer(4, 2, 8, dropout=0.0), 1)
    mask = flow.nn.Transformer.generate_square_subsequent_mask(3)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x, y, tgt_mask):
            return self.m(x, y, tgt_mask=tgt_mask)
    x, y = flow.randn(3, 2, 4), flow.randn(3, 2, 4)
    torch.testing.assert_close(G()(x, y, mask).to_torch(), m(x, y, tgt_mask=mask).to_torch())


@pytest.mark.parametrize("name", ["lstm_cell", "rnn_tanh_cell", "rnn_relu_cell", "gru_cell"])
def test_cell_functions_backward_reaches_the_input_weight_as_torch(name):
    """torch's cell functions (``torch.lstm_cell`` & co.) as its cell modules above: with the
    input's weight changed in place, the backward refuses having kept the gradients torch keeps
    (none for the RNN and LSTM cells, whose hidden product is recorded first; GRU's the other way)."""
    def run(lib):
        gates = {"lstm_cell": 4, "gru_cell": 3}.get(name, 1) * 2
        g = lib.Generator().manual_seed(0)
        w_ih, w_hh = (lib.randn(gates, k, generator=g, dtype=lib.float64).requires_grad_() for k in (3, 2))
        b_ih, b_hh = (lib.randn(gates, generator=g, dtype=lib.float64).requires_grad_() for _ in range(2))
        x = lib.ones(2, 3, dtype=lib.float64, requires_grad=True)
        h = lib.ones(2, 2, dtype=lib.float64, requires_grad=True)
        out = getattr(lib, name)(x, (h, h) if name == "lstm_cell" else h, w_ih, w_hh, b_ih, b_hh)
        with lib.no_grad():
            w_ih.mul_(2)
        with pytest.raises(RuntimeError, match="in-place|inplace"):
            (out[0] if isinstance(out, tuple) else out).sum().backward()
        return [q.grad is None for q in (w_ih, w_hh, b_ih, b_hh, x, h)]
    assert run(flow) == run(torch)

"""torch.nn modules with their options against torch: the same weights (torch's state_dict loaded),
outputs, parameter and input gradients (float64) - recurrent layers (layers, directions,
projections, initial states), attention with every mask and key/value option, transformer layers,
convolution padding modes, normalization, resampling, padding and activation modules, losses."""
from __future__ import annotations

import itertools
import warnings

import torch

import holoflow as flow
from harness import sweep

D = torch.float64


def _to_flow(x):
    if isinstance(x, torch.Tensor):
        return flow.from_torch(x.detach().clone()).requires_grad_(x.requires_grad)
    if isinstance(x, (tuple, list)):
        return type(x)(_to_flow(v) for v in x)
    return x


def _flat(out) -> list:
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in _flat(v)]
    return [] if out is None else [out]


def _check(failures: list, name: str, cls: str, args: tuple, kwargs: dict, inputs: list, call=None,
           call_kwargs: dict | None = None) -> bool:
    """``cls(*args, **kwargs)`` of both libraries on ``inputs``; returns whether torch ran it."""
    call = call or (lambda m, *a, **kw: m(*a, **kw))
    call_kwargs = call_kwargs or {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            tm = getattr(torch.nn, cls)(*args, **kwargs).to(D)
            tins = [x.clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
                    for x in inputs]
            touts = _flat(call(tm, *tins, **call_kwargs))
        except Exception:
            return False
        try:
            fm = getattr(flow.nn, cls)(*args, **{k: _to_flow(v) for k, v in kwargs.items()}).to(flow.float64)
            fm.load_state_dict({k: flow.from_torch(v.clone()) for k, v in tm.state_dict().items()})
            fins = [_to_flow(x) for x in tins]
            fouts = _flat(call(fm, *fins, **{k: _to_flow(v) for k, v in call_kwargs.items()}))
        except Exception as e:
            failures.append(f"{name}: {e}")
            return True
    if len(fouts) != len(touts):
        failures.append(f"{name}: {len(fouts)} outputs, torch {len(touts)}")
        return True
    loss_t = loss_f = 0
    for i, (f, t) in enumerate(zip(fouts, touts)):
        g = f.to_torch().detach()
        if (g.shape, g.dtype) != (t.shape, t.dtype) or not torch.allclose(g, t.detach(), rtol=1e-5, atol=1e-6,
                                                                         equal_nan=True):
            failures.append(f"{name}: output {i} differs")
            return True
        if t.requires_grad:
            w = torch.randn(t.shape, dtype=t.dtype)
            loss_t, loss_f = loss_t + (t * w).sum(), loss_f + (f * flow.from_torch(w)).sum()
    if isinstance(loss_t, torch.Tensor):
        loss_t.backward()
        loss_f.backward()
        pairs = [(f"parameter {k}", p.grad, q.grad) for (k, p), (_, q) in zip(tm.named_parameters(), fm.named_parameters())]
        pairs += [("an input", x.grad, y.grad) for x, y in zip(tins, fins) if isinstance(x, torch.Tensor)]
        for what, want, got in pairs:
            if (want is None) != (got is None) or (want is not None and not torch.allclose(
                    got.to_torch(), want, rtol=1e-5, atol=1e-6)):
                failures.append(f"{name}: gradient of {what} differs")
                return True
    return True



def test_recurrent_layers_match_torch():
    torch.manual_seed(0)
    seq = torch.randn(5, 3, 4, dtype=D)
    options = [{}, {"num_layers": 2}, {"bidirectional": True}, {"batch_first": True, "num_layers": 2, "bidirectional": True},
               {"bias": False}, {"nonlinearity": "relu"}, {"proj_size": 3}, {"proj_size": 2, "bidirectional": True,
                                                                              "num_layers": 2}]
    cases = []
    for cls, kw in itertools.product(["RNN", "LSTM", "GRU"], options):
        if ("nonlinearity" in kw and cls != "RNN") or ("proj_size" in kw and cls != "LSTM"):
            continue
        layers = (2 if kw.get("bidirectional") else 1) * kw.get("num_layers", 1)
        batch = 5 if kw.get("batch_first") else 3
        h0 = torch.randn(layers, batch, kw.get("proj_size", 5), dtype=D)
        state = (h0, torch.randn(layers, batch, 5, dtype=D)) if cls == "LSTM" else h0
        cases += [(f"{cls} {kw}", cls, (4, 5), kw, [seq]), (f"{cls} {kw} with a state", cls, (4, 5), kw, [seq, state])]
    cases += [(cls, cls, (4, 5), {}, [seq[0]]) for cls in ("RNNCell", "LSTMCell", "GRUCell")]
    sweep(_check, cases)


def test_attention_and_transformer_layers_match_torch():
    torch.manual_seed(1)
    q = torch.randn(3, 5, 8, dtype=D)
    padding = torch.zeros(3, 6, dtype=torch.bool)
    padding[0, -2:] = True
    causal = torch.triu(torch.ones(5, 6, dtype=torch.bool), 1)
    cases = []
    for kw, call_kw in itertools.product(
            [{"batch_first": True}, {"batch_first": True, "bias": False}, {"batch_first": True, "add_bias_kv": True},
             {"batch_first": True, "add_zero_attn": True}, {"batch_first": True, "kdim": 7, "vdim": 6}],
            [{}, {"key_padding_mask": padding}, {"attn_mask": causal}, {"need_weights": False},
             {"average_attn_weights": False}, {"key_padding_mask": padding, "attn_mask": causal.double() * -1e4}]):
        k, v = torch.randn(3, 6, kw.get("kdim", 8), dtype=D), torch.randn(3, 6, kw.get("vdim", 8), dtype=D)
        cases.append((f"MultiheadAttention {kw} {sorted(call_kw)}", "MultiheadAttention", (8, 2), kw, [q, k, v], None,
                      call_kw))
    src, tgt = torch.randn(3, 5, 8, dtype=D), torch.randn(3, 4, 8, dtype=D)
    src_padding = torch.tensor([[False] * 5, [False] * 3 + [True] * 2, [False] * 5])
    for kw in ({"batch_first": True, "dropout": 0.0},
               {"batch_first": True, "dropout": 0.0, "norm_first": True, "activation": "gelu"},
               {"batch_first": True, "dropout": 0.0, "bias": False}):
        cases += [(f"TransformerEncoderLayer {kw} padding", "TransformerEncoderLayer", (8, 2, 16), kw, [src], None,
                   {"src_key_padding_mask": src_padding}),
                  (f"TransformerEncoderLayer {kw} causal", "TransformerEncoderLayer", (8, 2, 16), kw, [src], None,
                   {"src_mask": torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=D), "is_causal": True}),
                  (f"TransformerDecoderLayer {kw}", "TransformerDecoderLayer", (8, 2, 16), kw, [tgt, src], None,
                   {"tgt_mask": torch.nn.Transformer.generate_square_subsequent_mask(4, dtype=D)})]
    sweep(_check, cases)


def test_convolution_normalization_resampling_and_activation_modules_match_torch():
    torch.manual_seed(2)
    img = torch.randn(2, 3, 7, 6, dtype=D)
    cases = []
    for mode in ("zeros", "reflect", "replicate", "circular"):
        cases += [(f"Conv2d {mode}", "Conv2d", (3, 4, 3), {"padding": 1, "padding_mode": mode}, [img]),
                  (f"Conv1d {mode}", "Conv1d", (3, 4, 3), {"padding": 2, "padding_mode": mode, "dilation": 2},
                   [img[:, :, 0]])]
    cases.append(("ConvTranspose2d output_size", "ConvTranspose2d", (3, 2, 3), {"stride": 2}, [img],
                  lambda m, x: m(x, output_size=(14, 12))))
    samples = torch.rand(2, 3, 2, dtype=D)
    modules = [("BatchNorm2d", (3,), {"affine": False}, img), ("BatchNorm2d", (3,), {"track_running_stats": False}, img),
               ("InstanceNorm2d", (3,), {"affine": True}, img), ("GroupNorm", (1, 3), {}, img),
               ("LayerNorm", ((7, 6),), {"bias": False}, img), ("LayerNorm", (6,), {"elementwise_affine": False}, img),
               ("Upsample", (), {"scale_factor": 2, "mode": "bilinear", "align_corners": True}, img),
               ("UpsamplingNearest2d", (), {"scale_factor": 2}, img), ("PixelUnshuffle", (2,), {}, img[..., :6, :6]),
               ("Fold", ((4, 5), 2), {}, torch.randn(2, 12, 12, dtype=D)),
               ("Unfold", (2,), {"dilation": 2, "padding": 1, "stride": 2}, img), ("AdaptiveAvgPool2d", ((None, 3),), {}, img),
               ("FractionalMaxPool2d", (2,), {"output_size": 3, "_random_samples": samples}, img),
               ("LPPool1d", (2, 3), {}, img[:, :, 0].abs()), ("ZeroPad2d", ((1, 2, 0, 1),), {}, img),
               ("ReflectionPad2d", (2,), {}, img), ("CircularPad2d", (1,), {}, img),
               ("ConstantPad3d", (1, 2.5), {}, img.unsqueeze(2)), ("Softmax2d", (), {}, img), ("LogSoftmax", (1,), {}, img),
               ("PReLU", (3,), {}, img), ("Hardtanh", (-0.5, 0.5), {}, img), ("Threshold", (0.1, 20.0), {}, img),
               ("ChannelShuffle", (3,), {}, img), ("Flatten", (1, 2), {}, img), ("Unflatten", (1, (3, 1)), {}, img),
               ("Identity", (), {}, img)]
    cases += [(f"{cls} {args} {kw}", cls, args, kw, [x]) for cls, args, kw, x in modules]
    cases.append(("RReLU eval", "RReLU", (0.1, 0.3), {}, [img], lambda m, x: m.eval()(x)))
    idx = torch.tensor([[1, 2, 4], [4, 3, 2]])
    a, b = torch.randn(4, 6, dtype=D), torch.randn(4, 6, dtype=D)
    cases += [("EmbeddingBag max", "EmbeddingBag", (10, 3), {"mode": "max"}, [idx]),
              ("Embedding padding, max_norm", "Embedding", (10, 3), {"padding_idx": 2, "max_norm": 1.0}, [idx]),
              ("Bilinear", "Bilinear", (7, 6, 2), {}, [torch.randn(4, 7, dtype=D), b]),
              ("CosineSimilarity", "CosineSimilarity", (), {}, [a, b]),
              ("PairwiseDistance", "PairwiseDistance", (), {"p": 1}, [a, b])]
    sweep(_check, cases)


def test_loss_modules_match_torch():
    torch.manual_seed(3)
    logits = torch.randn(4, 10, dtype=D)
    sweep(_check, [
        ("AdaptiveLogSoftmaxWithLoss", "AdaptiveLogSoftmaxWithLoss", (10, 12, [4, 8]), {"div_value": 2.0},
         [logits, torch.tensor([1, 11, 5, 7])]),
        ("CTCLoss", "CTCLoss", (), {"blank": 0, "zero_infinity": True},
         [torch.randn(6, 2, 5, dtype=D).log_softmax(2), torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]),
          torch.tensor([2, 2])]),
        ("MultiLabelSoftMarginLoss", "MultiLabelSoftMarginLoss", (), {"weight": torch.rand(10, dtype=D)},
         [logits, (torch.rand(4, 10) > 0.5).double()]),
        ("TripletMarginWithDistanceLoss", "TripletMarginWithDistanceLoss", (), {"margin": 0.5, "swap": True},
         [logits, logits.flip(0), torch.randn(4, 10, dtype=D)]),
        ("CosineEmbeddingLoss", "CosineEmbeddingLoss", (), {"margin": 0.2},
         [logits, logits.flip(0), torch.tensor([1, -1, 1, -1])]),
        ("GaussianNLLLoss", "GaussianNLLLoss", (), {"full": True, "eps": 1e-3},
         [logits, logits.flip(0), torch.rand(4, 1, dtype=D)]),
        ("NLLLoss on images", "NLLLoss", (), {"ignore_index": 1, "reduction": "sum"},
         [torch.randn(2, 3, 4, 5, dtype=D).log_softmax(1), torch.randint(0, 3, (2, 4, 5))]),
        ("NLLLoss2d (torch's deprecated name)", "NLLLoss2d", (), {"ignore_index": 1},
         [torch.randn(2, 3, 4, 5, dtype=D).log_softmax(1), torch.randint(0, 3, (2, 4, 5))]),
    ])

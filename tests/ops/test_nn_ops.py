"""NN ops vs torch.nn.functional: activations, softmax, norms, embedding, conv, pooling,
interpolation, attention; forward + backward, gradcheck, SBP rules on simulated ranks."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
import holoflow.nn.functional as HF
from harness import BF16, F32, F64, Case, check_sbp, parametrize, positive, randn

ALL = (F32, F64, BF16)


def _c(name, ffn, tfn, make, **kw):
    return Case(name, ffn, tfn, make, **kw)


def _x(*shape, scale=1.0):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt) * scale,), {})


CASES = []
# -- activations -------------------------------------------------------------------------------
ACTS = [("relu", {}), ("leaky_relu", {"negative_slope": 0.2}), ("gelu", {}), ("gelu", {"approximate": "tanh"}),
        ("silu", {}), ("mish", {}), ("hardswish", {}), ("hardsigmoid", {}), ("softplus", {"beta": 2.0, "threshold": 3.0}),
        ("elu", {"alpha": 0.7}), ("selu", {}), ("relu6", {}), ("logsigmoid", {}), ("hardtanh", {"min_val": -0.5})]
for name, kw in ACTS:
    for shape in [(4, 5), (0, 3), (2, 3, 4)]:
        CASES.append(_c(f"{name}{kw or ''}{list(shape)}", lambda x, n=name, k=kw: getattr(HF, n)(x, **k),
                        lambda x, n=name, k=kw: getattr(F, n)(x, **k), _x(*shape, scale=3.0), dtypes=ALL,
                        gradcheck=name not in ("relu", "leaky_relu", "hardswish", "hardsigmoid", "relu6", "hardtanh")))
# -- softmax ------------------------------------------------------------------------------------
for dim in (0, 1, -1):
    CASES.append(_c(f"softmax-dim{dim}", lambda x, d=dim: HF.softmax(x, d), lambda x, d=dim: F.softmax(x, d),
                    _x(3, 4, 5), dtypes=ALL))
    CASES.append(_c(f"log_softmax-dim{dim}", lambda x, d=dim: HF.log_softmax(x, d),
                    lambda x, d=dim: F.log_softmax(x, d), _x(3, 4, 5, scale=4.0), dtypes=ALL))
CASES += [
    _c("softmax-empty", lambda x: HF.softmax(x, 1), lambda x: F.softmax(x, 1), _x(0, 4)),
    _c("softmax-dtype", lambda x: HF.softmax(x, -1, dtype=flow.float64), lambda x: F.softmax(x, -1, dtype=torch.float64),
       _x(2, 3), dtypes=(F32,), gradcheck=False),
    _c("log_softmax-method", lambda x: x.log_softmax(0), lambda x: x.log_softmax(0), _x(4)),
    _c("softmax-double-backward", lambda x: _double(flow, x, lambda t: flow.softmax(t, -1)),
       lambda x: _double(torch, x, lambda t: torch.softmax(t, -1)), _x(3, 4), sbp=False, gradcheck=False),
    _c("log_softmax-double-backward", lambda x: _double(flow, x, lambda t: flow.log_softmax(t, -1)),
       lambda x: _double(torch, x, lambda t: torch.log_softmax(t, -1)), _x(3, 4), sbp=False, gradcheck=False),
    _c("gelu-double-backward", lambda x: _double(flow, x, flow.gelu), lambda x: _double(torch, x, F.gelu), _x(3, 4),
       sbp=False, gradcheck=False),
    _c("gelu-tanh-double-backward", lambda x: _double(flow, x, lambda t: HF.gelu(t, approximate="tanh")),
       lambda x: _double(torch, x, lambda t: F.gelu(t, approximate="tanh")), _x(3, 4), sbp=False, gradcheck=False),
]


def _double(lib, x, fn):
    """A first derivative taken with create_graph, so the test differentiates it again.
    (sbp=False on these cases: autograd.grad is not an op; the forward ops are covered above.)"""
    y = fn(x)
    w = lib.linspace(-1, 1, y.numel(), dtype=y.dtype, device=y.device).reshape(y.shape) if hasattr(lib.Tensor, "reshape") else None
    w = w if w is not None else lib.ones_like(y) * 0.7
    (g,) = lib.autograd.grad(y, x, w * y, create_graph=True) if lib is torch else flow.autograd.grad([y], [x], [w * y],
                                                                                                    create_graph=True)
    return g


# -- normalization ------------------------------------------------------------------------------
def _ln(shape, ns, affine=True):
    def make(dt, g):
        w = (randn(*ns, gen=g, dtype=dt), randn(*ns, gen=g, dtype=dt)) if affine else (None, None)
        return (randn(*shape, gen=g, dtype=dt) * 2 + 1, ns, *w), {}
    return make


for shape, ns, aff in [((4, 6), (6,), True), ((2, 3, 4), (3, 4), True), ((0, 5), (5,), True), ((3, 5), (5,), False)]:
    CASES.append(_c(f"layer_norm{list(shape)}{list(ns)}{'' if aff else '-noaffine'}",
                    lambda x, n, w, b: HF.layer_norm(x, n, w, b), lambda x, n, w, b: F.layer_norm(x, n, w, b),
                    _ln(shape, ns, aff), dtypes=ALL))
    CASES.append(_c(f"rms_norm{list(shape)}{list(ns)}{'' if aff else '-noaffine'}",
                    lambda x, n, w, b: HF.rms_norm(x, n, w), lambda x, n, w, b: F.rms_norm(x, n, w),
                    _ln(shape, ns, aff), dtypes=ALL))
CASES.append(_c("rms_norm-eps", lambda x, n, w, b: HF.rms_norm(x, n, w, eps=1e-3),
                lambda x, n, w, b: F.rms_norm(x, n, w, eps=1e-3), _ln((3, 4), (4,))))


def _gn(shape, groups, affine=True):
    def make(dt, g):
        c = shape[1]
        w = (randn(c, gen=g, dtype=dt), randn(c, gen=g, dtype=dt)) if affine else (None, None)
        return (randn(*shape, gen=g, dtype=dt) * 2, groups, *w), {}
    return make


for shape, groups, aff in [((2, 6, 4, 3), 3, True), ((3, 4, 5), 2, True), ((2, 4), 4, False)]:
    CASES.append(_c(f"group_norm{list(shape)}g{groups}", HF.group_norm, F.group_norm, _gn(shape, groups, aff),
                    dtypes=ALL))
# strided inputs (torch's F.group_norm densifies them first): a transposed (N, T, C) activation,
# whose upstream gradient is strided too, and an NHWC tensor viewed as channels-last NCHW
_GN_VIEWS = {"transposed": (lambda x: x.transpose(1, 2), (3, 5, 4), 4),
             "channels_last": (lambda x: x.permute(0, 3, 1, 2), (2, 3, 4, 6), 6)}
for view_name, (view, shape, c) in _GN_VIEWS.items():
    def _gn_strided(fn, view=view):
        return lambda x, g, w, b: fn(view(x), g, w, b).transpose(1, 2)
    CASES.append(_c(f"group_norm-{view_name}", _gn_strided(HF.group_norm), _gn_strided(F.group_norm),
                    lambda dt, g, shape=shape, c=c: ((randn(*shape, gen=g, dtype=dt) * 2, 2, randn(c, gen=g, dtype=dt),
                                                      randn(c, gen=g, dtype=dt)), {}),
                    dtypes=(F32, F64)))


def _bn_fns(lib, training, momentum=0.1, steps=1, stats=True):
    fn = HF.batch_norm if lib is flow else F.batch_norm

    def run(x, w, b):
        c = x.shape[1]
        rm = lib.linspace(-1, 1, c, dtype=x.dtype, device=x.device) if stats else None
        rv = lib.linspace(0.5, 2, c, dtype=x.dtype, device=x.device) if stats else None
        for _ in range(steps - 1):
            fn(x.detach() * 1.5, rm, rv, w, b, training, momentum)
        out = fn(x, rm, rv, w, b, training, momentum)
        return (out, rm, rv) if stats else out
    return run


def _bn(shape, affine=True):
    def make(dt, g):
        c = shape[1]
        w = (positive(c, gen=g, dtype=dt), randn(c, gen=g, dtype=dt)) if affine else (None, None)
        return (randn(*shape, gen=g, dtype=dt) * 2 + 1, *w), {}
    return make


for shape in [(4, 3), (2, 3, 5), (2, 4, 3, 3)]:
    CASES.append(_c(f"batch_norm-train{list(shape)}", _bn_fns(flow, True), _bn_fns(torch, True), _bn(shape), dtypes=ALL))
    CASES.append(_c(f"batch_norm-eval{list(shape)}", _bn_fns(flow, False), _bn_fns(torch, False), _bn(shape), dtypes=ALL))


def _bn_stats_fn(lib):
    """The running statistics one training step leaves (``batch_norm_stats``, the op a traced
    batch norm computes them with), against aten's functional batch norm."""
    def f(x, rm, rv):
        if lib is torch:
            out = torch.ops.aten._native_batch_norm_legit_functional(x, None, None, rm, rv, True, 0.3, 1e-5)
            return out[3], out[4]
        from holoflow.core.dispatch import apply
        from holoflow.ops.norm import BATCH_NORM_STATS
        return tuple(apply(BATCH_NORM_STATS, x, rm, rv, momentum=0.3, eps=1e-5))
    return f


def _bn_stats_make(shape):
    def make(dt, g):
        c = shape[1]
        return (randn(*shape, gen=g, dtype=dt) * 2 + 1, randn(c, gen=g, dtype=dt), positive(c, gen=g, dtype=dt)), {}
    return make


CASES += [
    _c("batch_norm_stats", _bn_stats_fn(flow), _bn_stats_fn(torch), _bn_stats_make((4, 3, 2)), grad=False),
    _c("batch_norm-running-stats-3-steps", _bn_fns(flow, True, 0.3, 3), _bn_fns(torch, True, 0.3, 3), _bn((5, 3, 3))),
    _c("batch_norm-no-stats-noaffine", _bn_fns(flow, True, stats=False), _bn_fns(torch, True, stats=False),
       _bn((4, 3, 2), affine=False)),
]


# -- embedding, one_hot, normalize, cosine_similarity -----------------------------------------------
def _emb(idx_shape, n=7, d=4):
    return lambda dt, g: ((torch.randint(0, n, idx_shape, generator=g), randn(n, d, gen=g, dtype=dt)), {})


for shape in [(5,), (2, 3), (0, 2)]:
    CASES.append(_c(f"embedding{list(shape)}", HF.embedding, F.embedding, _emb(shape), dtypes=ALL))
CASES += [
    _c("embedding-padding_idx", lambda i, w: HF.embedding(i, w, padding_idx=2), lambda i, w: F.embedding(i, w, padding_idx=2),
       lambda dt, g: ((torch.tensor([[2, 1, 2], [0, 2, 6]]), randn(7, 3, gen=g, dtype=dt)), {}),
       gradcheck=False),  # the padding row is read but gets no gradient by design, as in torch
    _c("embedding-padding_idx-neg", lambda i, w: HF.embedding(i, w, padding_idx=-1),
       lambda i, w: F.embedding(i, w, padding_idx=-1),
       lambda dt, g: ((torch.tensor([6, 1, 6, 0]), randn(7, 3, gen=g, dtype=dt)), {}), gradcheck=False),
    _c("one_hot", lambda i: HF.one_hot(i, 5), lambda i: F.one_hot(i, 5),
       lambda dt, g: ((torch.randint(0, 5, (3, 4), generator=g),), {}), grad=False, dtypes=(F32,)),
    _c("one_hot-infer", HF.one_hot, F.one_hot, lambda dt, g: ((torch.tensor([0, 3, 1]),), {}), grad=False, dtypes=(F32,)),
    _c("normalize", HF.normalize, F.normalize, _x(3, 4), dtypes=ALL),
    _c("normalize-p1-dim0", lambda x: HF.normalize(x, 1.0, 0), lambda x: F.normalize(x, 1.0, 0), _x(3, 4)),
]
CASES.append(_c("cosine_similarity", HF.cosine_similarity, F.cosine_similarity,
                lambda dt, g: ((randn(3, 4, gen=g, dtype=dt), randn(1, 4, gen=g, dtype=dt)), {})))


# -- convolution ---------------------------------------------------------------------------------
def _conv(x_shape, w_shape, bias=True):
    def make(dt, g):
        b = randn(w_shape[0], gen=g, dtype=dt) if bias else None
        return (randn(*x_shape, gen=g, dtype=dt), randn(*w_shape, gen=g, dtype=dt) * 0.3, b), {}
    return make


def _convt(x_shape, w_shape, bias=True, groups=1):
    def make(dt, g):
        b = randn(w_shape[1] * groups, gen=g, dtype=dt) if bias else None
        return (randn(*x_shape, gen=g, dtype=dt), randn(*w_shape, gen=g, dtype=dt) * 0.3, b), {}
    return make


CONV2D = [
    ("basic", (2, 3, 6, 5), (4, 3, 3, 3), {}, True),
    ("stride-pad", (2, 3, 7, 7), (4, 3, 3, 2), {"stride": 2, "padding": (1, 2)}, True),
    ("dilation", (1, 3, 8, 8), (3, 3, 3, 3), {"dilation": 2, "padding": 1}, False),
    ("groups", (2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2}, True),
    ("depthwise", (2, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "padding": 1}, True),
    ("same-odd", (2, 3, 5, 6), (3, 3, 3, 3), {"padding": "same"}, True),
    ("same-even", (2, 3, 5, 6), (3, 3, 4, 2), {"padding": "same"}, True),
    ("same-dilated", (1, 3, 7, 7), (3, 3, 2, 3), {"padding": "same", "dilation": 3}, False),
    ("valid", (2, 3, 5, 6), (3, 3, 3, 3), {"padding": "valid"}, True),
    ("unbatched", (3, 6, 5), (4, 3, 3, 3), {"padding": 1}, True),
    ("empty-batch", (0, 3, 6, 5), (4, 3, 3, 3), {}, True),
    # one value for both spatial dims, as ATen expands it (it was a ValueError)
    ("one-element-tuples", (1, 3, 7, 6), (3, 3, 3, 2), {"stride": (2,), "padding": [1], "dilation": (1,)}, True),
]
for name, xs, ws, kw, bias in CONV2D:
    CASES.append(_c(f"conv2d-{name}", lambda x, w, b, k=kw: HF.conv2d(x, w, b, **k),
                    lambda x, w, b, k=kw: F.conv2d(x, w, b, **k), _conv(xs, ws, bias), dtypes=ALL, atol=1e-4))
CASES += [
    _c("conv1d", lambda x, w, b: HF.conv1d(x, w, b, stride=2, padding=1), lambda x, w, b: F.conv1d(x, w, b, stride=2, padding=1),
       _conv((2, 3, 9), (4, 3, 3)), dtypes=ALL),
    _c("conv1d-same-even", lambda x, w, b: HF.conv1d(x, w, b, padding="same"), lambda x, w, b: F.conv1d(x, w, b, padding="same"),
       _conv((2, 3, 9), (4, 3, 4))),
    _c("conv3d", lambda x, w, b: HF.conv3d(x, w, b, padding=1), lambda x, w, b: F.conv3d(x, w, b, padding=1),
       _conv((1, 3, 3, 4, 4), (3, 3, 2, 3, 3))),
    _c("conv_transpose2d", lambda x, w, b: HF.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
       lambda x, w, b: F.conv_transpose2d(x, w, b, stride=2, padding=1, output_padding=1),
       _convt((2, 3, 4, 5), (3, 4, 3, 3)), dtypes=ALL, atol=1e-4),
    _c("conv_transpose2d-groups", lambda x, w, b: HF.conv_transpose2d(x, w, b, groups=2, dilation=2),
       lambda x, w, b: F.conv_transpose2d(x, w, b, groups=2, dilation=2), _convt((1, 4, 3, 3), (4, 3, 2, 2), groups=2)),
    _c("conv_transpose2d-one-element-tuples",
       lambda x, w, b: HF.conv_transpose2d(x, w, b, stride=(2,), padding=(1,), output_padding=(1,)),
       lambda x, w, b: F.conv_transpose2d(x, w, b, stride=(2,), padding=(1,), output_padding=(1,)),
       _convt((1, 3, 4, 5), (3, 3, 3, 3))),
    _c("conv_transpose1d", lambda x, w, b: HF.conv_transpose1d(x, w, b, stride=3),
       lambda x, w, b: F.conv_transpose1d(x, w, b, stride=3), _convt((2, 3, 5), (3, 3, 2))),
]

# -- pooling & interpolate -------------------------------------------------------------------------
POOLS = [
    ("max_pool2d", {"kernel_size": 2}), ("max_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1}),
    ("max_pool2d", {"kernel_size": (2, 3), "dilation": 2, "ceil_mode": True}),
    ("avg_pool2d", {"kernel_size": 2}), ("avg_pool2d", {"kernel_size": 3, "stride": 2, "padding": 1, "count_include_pad": False}),
    ("avg_pool2d", {"kernel_size": 3, "ceil_mode": True, "divisor_override": 2}),
    ("adaptive_avg_pool2d", {"output_size": (3, 2)}), ("adaptive_avg_pool2d", {"output_size": 1}),
    ("adaptive_avg_pool2d", {"output_size": (None, 4)}),
    ("max_pool2d", {"kernel_size": (2,), "stride": (1,), "padding": (1,), "dilation": (2,)}),
    ("avg_pool2d", {"kernel_size": (3,), "stride": [2], "padding": (1,)}),
]
for name, kw in POOLS:
    for shape in [(2, 3, 7, 8), (3, 6, 5)]:
        CASES.append(_c(f"{name}{kw}{list(shape)}", lambda x, n=name, k=kw: getattr(HF, n)(x, **k),
                        lambda x, n=name, k=kw: getattr(F, n)(x, **k), _x(*shape), dtypes=ALL,
                        gradcheck=name != "max_pool2d"))
CASES += [
    _c("max_pool2d-indices", lambda x: HF.max_pool2d(x, 2, return_indices=True),
       lambda x: F.max_pool2d(x, 2, return_indices=True), _x(2, 3, 4, 6)),
    _c("max_pool2d-empty", lambda x: HF.max_pool2d(x, 2), lambda x: F.max_pool2d(x, 2), _x(0, 3, 4, 4), gradcheck=False),
    _c("avg_pool2d-double-backward", lambda x: _double(flow, x, lambda t: HF.avg_pool2d(t * t, 2)),
       lambda x: _double(torch, x, lambda t: F.avg_pool2d(t * t, 2)), _x(1, 2, 4, 4), sbp=False, gradcheck=False),
]
INTERP = [({"scale_factor": 2, "mode": "nearest"}, (2, 3, 4, 5)), ({"size": (7, 3), "mode": "nearest"}, (1, 3, 4, 5)),
          ({"scale_factor": 1.5, "mode": "bilinear", "align_corners": False}, (2, 3, 4, 5)),
          ({"size": (6, 9), "mode": "bilinear", "align_corners": True}, (1, 3, 4, 5)),
          ({"scale_factor": (2, 0.5), "mode": "bilinear"}, (1, 3, 4, 6)),
          ({"scale_factor": 3, "mode": "nearest"}, (2, 3, 4)), ({"size": 7, "mode": "linear"}, (2, 3, 4)),
          ({"scale_factor": 2, "mode": "nearest"}, (1, 2, 2, 3, 2)), ({"size": (3, 5, 2), "mode": "nearest"}, (1, 2, 2, 3, 4)),
          ({"scale_factor": 1.5, "mode": "trilinear"}, (1, 2, 2, 3, 2)),
          ({"size": (3, 4, 5), "mode": "trilinear", "align_corners": True}, (2, 1, 2, 3, 2)),
          ({"size": (3, 2), "mode": "area"}, (2, 3, 7, 5)), ({"size": 3, "mode": "area"}, (2, 3, 7)),
          ({"scale_factor": 0.5, "mode": "area"}, (1, 2, 4, 5, 6)),
          ({"scale_factor": 1.7, "mode": "nearest-exact"}, (2, 3, 4, 5)), ({"size": 5, "mode": "nearest-exact"}, (2, 3, 3)),
          ({"size": (3, 2), "mode": "bilinear", "antialias": True}, (2, 3, 8, 7)),
          ({"scale_factor": 0.6, "mode": "bicubic", "antialias": True, "align_corners": True}, (1, 2, 6, 6)),
          ({"scale_factor": 1.5, "mode": "bilinear", "recompute_scale_factor": True}, (1, 2, 5, 3))]
for kw, shape in INTERP:
    CASES.append(_c(f"interpolate{kw}{list(shape)}", lambda x, k=kw: HF.interpolate(x, **k),
                    lambda x, k=kw: F.interpolate(x, **k), _x(*shape),
                    dtypes=(F32, F64) if kw.get("antialias") else ALL))   # torch's CPU antialias: no bf16


# -- attention -------------------------------------------------------------------------------------
def _qkv(b, h, lq, s, e, ev=None, mask=None):
    def make(dt, g):
        q, k, v = (randn(b, h, lq, e, gen=g, dtype=dt), randn(b, h, s, e, gen=g, dtype=dt),
                   randn(b, h, s, ev or e, gen=g, dtype=dt))
        m = None
        if mask == "bool":
            m = torch.rand(lq, s, generator=g) > 0.3
            m[:, 0] = True
        elif mask == "float":
            m = randn(b, 1, lq, s, gen=g, dtype=dt)
        return (q, k, v, m), {}
    return make


SDPA = [("basic", _qkv(2, 3, 4, 5, 8), {}), ("causal", _qkv(2, 2, 5, 5, 4), {"is_causal": True}),
        ("bool-mask", _qkv(2, 2, 4, 6, 4, 3, "bool"), {}), ("float-mask", _qkv(2, 2, 3, 4, 4, mask="float"), {}),
        ("scale", _qkv(1, 2, 3, 3, 4), {"scale": 0.3}), ("empty-batch", _qkv(0, 2, 3, 3, 4), {})]
for name, make, kw in SDPA:
    CASES.append(_c(f"sdpa-{name}", lambda q, k, v, m, kw=kw: HF.scaled_dot_product_attention(q, k, v, m, **kw),
                    lambda q, k, v, m, kw=kw: F.scaled_dot_product_attention(q, k, v, m, **kw), make,
                    dtypes=(F32, F64), atol=1e-4))
    CASES.append(_c(f"sdpa-{name}-bf16", lambda q, k, v, m, kw=kw: HF.scaled_dot_product_attention(q, k, v, m, **kw),
                    lambda q, k, v, m, kw=kw: F.scaled_dot_product_attention(q, k, v, m, **kw), make,
                    dtypes=(BF16,), gradcheck=False, sbp=False))  # sbp, gradcheck: covered by the f32/f64 case
CASES.append(_c("sdpa-gqa", lambda q, k, v: HF.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True),
                lambda dt, g: ((randn(2, 6, 4, 8, gen=g, dtype=dt), randn(2, 2, 4, 8, gen=g, dtype=dt),
                                randn(2, 3, 4, 5, gen=g, dtype=dt)), {}), dtypes=(F32, F64), atol=1e-4))
CASES.append(_c("sdpa-3d", lambda q, k, v: HF.scaled_dot_product_attention(q, k, v),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v),
                lambda dt, g: ((randn(3, 4, 5, gen=g, dtype=dt), randn(3, 6, 5, gen=g, dtype=dt),
                                randn(3, 6, 2, gen=g, dtype=dt)), {})))

globals().update(parametrize(CASES))


# -- clear errors and module-level behaviour ------------------------------------------------------
def test_conv2d_channel_mismatch_names_shapes_and_expected_count():
    x, w = flow.randn(2, 3, 5, 5), flow.randn(4, 2, 3, 3)
    with pytest.raises(ValueError, match=r"\(2, 3, 5, 5\).*3 channels.*\(4, 2, 3, 3\).*expects 2 input channels"):
        HF.conv2d(x, w)
    with pytest.raises(ValueError, match="groups=2 expects 4"):
        HF.conv2d(x, w, groups=2)
    with pytest.raises(ValueError, match=r"bias of shape \(3,\) should be \(4,\)"):
        HF.conv2d(flow.randn(1, 2, 5, 5), w, flow.randn(3))


def test_interpolate_bad_arguments_raise_torchs_errors():
    cases = [((1, 1, 4, 4), dict(size=(2, 2), mode="trilinear"), NotImplementedError, "trilinear mode needs 5D"),
             ((1, 1, 4, 4), dict(size=(2, 2), mode="foo"), NotImplementedError, "Only 3D, 4D and 5D"),
             ((1, 1, 4, 4), dict(size=(2, 2), mode="nearest", align_corners=True), ValueError, "align_corners"),
             ((1, 1, 2, 2, 2), dict(size=(2, 2, 2), mode="nearest", antialias=True), ValueError, "Anti-alias"),
             ((1, 1, 4, 4), dict(size=(2, 2), scale_factor=2), ValueError, "only one of size or scale_factor"),
             ((1, 1, 4, 4), dict(), ValueError, "either size or scale_factor"),
             ((1, 1, 4, 4), dict(size=(2, 2), recompute_scale_factor=True), ValueError, "not meaningful"),
             ((1, 1, 4, 4), dict(scale_factor=(2, 2, 2)), ValueError, "nd scale_factor must have the same number of spatial dimensions")]
    for shape, kw, exc, msg in cases:
        for lib, fn in ((torch, F.interpolate), (flow, HF.interpolate)):
            with pytest.raises(exc, match=msg):
                fn(lib.zeros(shape), **kw)


def test_interpolate_double_backward_area_and_trilinear():
    for kw, shape in (({"size": (2, 3), "mode": "area"}, (1, 2, 5, 6)), ({"scale_factor": 2, "mode": "trilinear"},
                                                                           (1, 1, 2, 2, 3))):
        x = torch.randn(shape, dtype=torch.float64)
        want = _double(torch, x.clone().requires_grad_(), lambda t: F.interpolate(t * t, **kw))
        got = _double(flow, flow.from_torch(x).requires_grad_(), lambda t: HF.interpolate(t * t, **kw))
        torch.testing.assert_close(got.to_torch(), want.detach())


def test_conv2d_same_rejects_stride():
    with pytest.raises(ValueError, match="'same'.*strided"):
        HF.conv2d(flow.randn(1, 2, 5, 5), flow.randn(3, 2, 3, 3), padding="same", stride=2)


def test_layer_norm_and_batch_norm_shape_errors():
    with pytest.raises(ValueError, match=r"layer_norm.*\(2, 3\).*\(4,\)"):
        HF.layer_norm(flow.randn(2, 3), (4,))
    with pytest.raises(ValueError, match=r"batch_norm: running_mean has shape \(4,\).*3 channels"):
        HF.batch_norm(flow.randn(2, 3), flow.zeros(4), flow.ones(3), training=True)
    with pytest.raises(ValueError, match="more than 1 value per channel"):
        HF.batch_norm(flow.randn(1, 3), flow.zeros(3), flow.ones(3), training=True)


CONV_DOUBLE = {   # name: (functional name, x shape, w shape, has bias, kwargs)
    "conv2d": ("conv2d", (2, 3, 6, 5), (4, 3, 3, 3), True, dict(stride=2, padding=1)),
    "conv2d-groups-dilation": ("conv2d", (1, 4, 7, 7), (6, 2, 3, 2), True, dict(groups=2, dilation=(2, 1))),
    "conv1d-same-even": ("conv1d", (2, 3, 9), (4, 3, 4), False, dict(padding="same")),
    "conv1d-unbatched": ("conv1d", (3, 8), (2, 3, 3), True, dict(padding=2)),
    "conv3d": ("conv3d", (1, 2, 3, 4, 4), (3, 2, 2, 3, 3), True, dict(padding=1)),
    "conv_transpose2d": ("conv_transpose2d", (2, 3, 4, 5), (3, 4, 3, 3), True,
                         dict(stride=2, padding=1, output_padding=1)),
    "conv_transpose1d-groups": ("conv_transpose1d", (2, 4, 5), (4, 3, 2), False, dict(stride=3, groups=2)),
}


@pytest.mark.parametrize("name", sorted(CONV_DOUBLE))
def test_conv_double_backward_matches_torch(name):
    """A gradient penalty through a convolution: grad(create_graph=True) w.r.t. input, weight and
    bias, then backward through those gradients (convolution_backward's own grad)."""
    fname, xs, ws, has_b, kw = CONV_DOUBLE[name]
    gen = torch.Generator().manual_seed(0)
    tx, tw = torch.randn(xs, generator=gen, dtype=torch.float64), torch.randn(ws, generator=gen, dtype=torch.float64)
    tb = torch.randn(ws[1] * kw.get("groups", 1) if "transpose" in fname else ws[0], generator=gen,
                     dtype=torch.float64) if has_b else None

    def run(lib, fn, x, w, b):
        ins = [t.clone().requires_grad_() for t in ([x, w] + ([b] if b is not None else []))]
        y = fn(*ins[:2], ins[2] if b is not None else None, **kw)
        v = lib.cos(lib.arange(y.numel(), dtype=y.dtype)).reshape(y.shape)
        gs = lib.autograd.grad((v * y * y).sum(), ins, create_graph=True)
        penalty = sum(((g - 0.3) ** 2).sum() * (i + 1) for i, g in enumerate(gs))
        penalty.backward()
        return [g.detach() for g in gs] + [t.grad for t in ins]

    want = run(torch, getattr(F, fname), tx, tw, tb)
    conv = lambda t: None if t is None else flow.from_torch(t)
    got = run(flow, getattr(HF, fname), conv(tx), conv(tw), conv(tb))
    assert len(got) == len(want)
    for g, t in zip(got, want):
        torch.testing.assert_close(g.to_torch(), t)


def test_conv_double_backward_through_one_gradient_only():
    """Only the input gradient is differentiated (a WGAN-GP critic): the weight's second-order
    gradient comes from ddx alone, and a bias-only cotangent reaches dy as a broadcast."""
    def run(lib, fn, x, w, b):
        x, w, b = (t.clone().requires_grad_() for t in (x, w, b))
        y = fn(x, w, b, padding=1).tanh()
        (gx,) = lib.autograd.grad(y.sum(), x, create_graph=True)
        ((gx.flatten(1).norm(2, dim=1) - 1) ** 2).mean().backward()
        out = [w.grad.clone(), b.grad.clone()]
        (gb,) = lib.autograd.grad(fn(x, w, b).pow(2).sum(), b, create_graph=True)
        x.grad = None
        (gb ** 2).sum().backward()
        return out + [x.grad]
    x, w, b = torch.randn(2, 3, 5, 5), torch.randn(4, 3, 3, 3), torch.randn(4)
    want = run(torch, F.conv2d, x, w, b)
    got = run(flow, HF.conv2d, *(flow.from_torch(t) for t in (x, w, b)))
    for g, t in zip(got, want):
        torch.testing.assert_close(g.to_torch(), t, atol=1e-4, rtol=1e-4)


def test_batch_norm_running_stats_updated_in_place_like_torch():
    x = torch.randn(6, 3, 4)
    rm, rv = torch.zeros(3), torch.ones(3)
    frm, frv = flow.zeros(3), flow.ones(3)
    for i in range(4):
        F.batch_norm(x * (i + 1), rm, rv, training=True, momentum=0.2)
        HF.batch_norm(flow.from_torch(x * (i + 1)), frm, frv, training=True, momentum=0.2)
    torch.testing.assert_close(frm.to_torch(), rm)
    torch.testing.assert_close(frv.to_torch(), rv)
    out = HF.batch_norm(flow.from_torch(x), frm, frv, training=False)
    torch.testing.assert_close(out.to_torch(), F.batch_norm(x, rm, rv, training=False))


def test_inplace_activations():
    x = torch.randn(3, 4)
    fx = flow.from_torch(x.clone())
    assert HF.relu(fx, inplace=True) is fx
    torch.testing.assert_close(fx.to_torch(), x.relu())
    fx = flow.from_torch(x.clone())
    HF.leaky_relu(fx, 0.3, inplace=True)
    torch.testing.assert_close(fx.to_torch(), F.leaky_relu(x, 0.3))


def test_sdpa_dropout_matches_torch_under_seed():
    q, k, v = (torch.randn(2, 2, 4, 8) for _ in range(3))
    fq, fk, fv = (flow.from_torch(t.clone()).requires_grad_() for t in (q, k, v))
    tq, tk, tv = (t.clone().requires_grad_() for t in (q, k, v))
    flow.manual_seed(5)
    got = HF.scaled_dot_product_attention(fq, fk, fv, dropout_p=0.4)
    torch.manual_seed(5)
    want = F.scaled_dot_product_attention(tq, tk, tv, dropout_p=0.4)
    torch.testing.assert_close(got.to_torch(), want.detach(), atol=1e-5, rtol=1e-4)
    up = torch.randn(want.shape)
    want.backward(up)
    got.backward(flow.from_torch(up))
    for f, t in ((fq, tq), (fk, tk), (fv, tv)):
        torch.testing.assert_close(f.grad.to_torch(), t.grad, atol=1e-5, rtol=1e-4)


def test_sdpa_dropout_sbp_rules():
    case = Case("sdpa-dropout", lambda q, k, v: HF.scaled_dot_product_attention(q, k, v, dropout_p=0.2),
                lambda q, k, v: F.scaled_dot_product_attention(q, k, v, dropout_p=0.2),
                lambda dt, g: ((randn(2, 3, 4, 4, gen=g, dtype=dt),) * 3, {}), random=True)
    check_sbp(case)  # random op: signatures declared and counted, values seed-dependent


def _backward_case(name, fwd, make):
    """A case that dispatches the backward ops directly (autograd.grad without create_graph), so
    the backward ops' own SBP signatures are validated too."""
    def run(*args):
        xs = [a.detach().requires_grad_() if isinstance(a, flow.Tensor) and a.is_floating_point() else a for a in args]
        with flow.enable_grad():
            out = fwd(*xs)
            ins = [a for a in xs if isinstance(a, flow.Tensor) and a.requires_grad]
            return flow.autograd.grad([out], ins, [flow.ones_like(out) * 0.5])
    return Case(name, run, None, make)


BACKWARD_CASES = [
    _backward_case("bwd-softmax", lambda x: HF.softmax(x, 1) * x, _x(3, 4, 2)),
    _backward_case("bwd-log_softmax", lambda x: HF.log_softmax(x, 0) * x, _x(3, 4)),
    _backward_case("bwd-gelu", HF.gelu, _x(3, 4)),
    _backward_case("bwd-layer_norm", lambda x, n, w, b: HF.layer_norm(x, n, w, b), _ln((3, 2, 4), (4,))),
    _backward_case("bwd-group_norm", HF.group_norm, _gn((3, 4, 5), 2)),
    _backward_case("bwd-batch_norm-train", lambda x, w, b: HF.batch_norm(x, flow.zeros(x.shape[1], dtype=x.dtype),
                                                                         flow.ones(x.shape[1], dtype=x.dtype), w, b, True),
                   _bn((4, 3, 2))),
    _backward_case("bwd-batch_norm-eval", lambda x, w, b: HF.batch_norm(x, flow.zeros(x.shape[1], dtype=x.dtype),
                                                                        flow.ones(x.shape[1], dtype=x.dtype), w, b, False),
                   _bn((4, 3, 2))),
    _backward_case("bwd-embedding", lambda i, w: HF.embedding(i, w, padding_idx=1), _emb((3, 2))),
    _backward_case("bwd-conv2d", lambda x, w, b: HF.conv2d(x, w, b, padding=1), _conv((3, 3, 4, 4), (3, 3, 3, 3))),
    _backward_case("bwd-conv2d-same-even", lambda x, w, b: HF.conv2d(x, w, b, padding="same"),
                   _conv((3, 3, 4, 4), (3, 3, 2, 2))),
    _backward_case("bwd-conv_transpose2d", lambda x, w, b: HF.conv_transpose2d(x, w, b, stride=2),
                   _convt((3, 3, 3, 3), (3, 3, 3, 3))),
    _backward_case("bwd-max_pool2d", lambda x: HF.max_pool2d(x, 2), _x(3, 3, 4, 4)),
    _backward_case("bwd-avg_pool2d", lambda x: HF.avg_pool2d(x, 2), _x(3, 3, 4, 4)),
    _backward_case("bwd-adaptive_avg_pool2d", lambda x: HF.adaptive_avg_pool2d(x, 3), _x(3, 3, 5, 4)),
    _backward_case("bwd-interpolate", lambda x: HF.interpolate(x, scale_factor=2, mode="bilinear"), _x(3, 3, 3, 3)),
    _backward_case("bwd-sdpa", lambda q, k, v, m: HF.scaled_dot_product_attention(q, k, v, m),
                   _qkv(3, 2, 3, 4, 4, mask="float")),
]


@pytest.mark.parametrize("case", BACKWARD_CASES, ids=repr)
def test_backward_op_sbp_rules(case):
    check_sbp(case)


def test_sdpa_gqa_head_count_errors_like_torch():
    q, k = torch.randn(2, 3, 5, 8), torch.randn(2, 2, 6, 8)
    for fn, args in ((F.scaled_dot_product_attention, (q, k, k)),
                     (HF.scaled_dot_product_attention, (flow.from_torch(q), flow.from_torch(k), flow.from_torch(k)))):
        with pytest.raises(RuntimeError, match="Number of heads in key and value must divide"):
            fn(*args, enable_gqa=True)


PIECEWISE_LINEAR = {
    "leaky_relu": lambda F, y: F.leaky_relu(y, 0.2), "hardtanh": lambda F, y: F.hardtanh(y, -0.5, 0.7),
    "relu6": lambda F, y: F.relu6(y * 4), "threshold": lambda F, y: F.threshold(y, 0.1, -2.0),
    "softshrink": lambda F, y: F.softshrink(y, 0.3), "hardshrink": lambda F, y: F.hardshrink(y, 0.3),
}


@pytest.mark.parametrize("name", PIECEWISE_LINEAR)
def test_piecewise_linear_double_backward_through_the_slope_is_zero_as_in_torch(name):
    """These activations' gradients depend on x only through where x lies: the derivative there
    is a zero tensor (torch's), so the input-Hessian of such a network is zeros, not an error."""
    act = PIECEWISE_LINEAR[name]
    got = []
    for lib, fn in ((torch, F), (flow, HF)):
        x = lib.tensor([[-1.0, 2.0, 3.0], [0.5, -0.2, -4.0]], requires_grad=True)
        w = lib.tensor([[1.0, -2.0], [0.5, 1.5], [-1.0, 0.3]])
        (g,) = lib.autograd.grad(act(fn, x @ w).sum(), x, create_graph=True)
        (gg,) = lib.autograd.grad((g * g * 3).sum(), x)
        got.append((g.detach().numpy().tolist(), gg.numpy().tolist()))
    assert got[1] == got[0]
    assert got[0][1] == [[0.0] * 3] * 2


@pytest.mark.parametrize("causal", [False, True])
def test_sdpa_strided_head_dim_matches_torch(causal):
    """q/k/v that are transposes of (B, H, E, L) tensors — the head dim E strided, as in a conv
    U-Net's attention block (``reshape(b, h, c, hw).transpose(-1, -2)``) — once went to torch's
    private CPU flash kernel as they were and came back NaN / huge; forward and gradients match."""
    base = torch.randn(2, 12, 3, 5, generator=torch.Generator().manual_seed(3))
    outs = []
    for lib, fn in ((torch, F), (flow, HF)):
        x = (flow.from_torch(base.clone()) if lib is flow else base.clone()).requires_grad_()
        q, k, v = (t.reshape(2, 2, 2, 15).transpose(-1, -2) for t in x.chunk(3, dim=1))
        assert q.stride()[-1] != 1
        y = fn.scaled_dot_product_attention(q, k, v, is_causal=causal)
        (y * y.detach().sin()).sum().backward()
        to = (lambda t: t.to_torch()) if lib is flow else (lambda t: t)
        outs.append((to(y.detach()), to(x.grad)))
    torch.testing.assert_close(outs[1][0], outs[0][0])
    torch.testing.assert_close(outs[1][1], outs[0][1])


def test_embedding_scale_grad_by_freq_matches_torch():
    """scale_grad_by_freq (once refused) divides each row's gradient by its lookup count, with a
    padding row. Double backward (d weight-gradient / d dy) keeps that division: torch's
    ``embedding_dense_double_backward`` drops it, so it is checked against the formula."""
    idx = torch.tensor([[0, 2, 2], [5, 1, 0], [2, 3, 2]])
    w0 = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))
    ct = torch.randn(6, 4, generator=torch.Generator().manual_seed(3))
    grads = []
    for lib, fn in ((torch, F), (flow, HF)):
        w = (flow.from_torch(w0.clone()) if lib is flow else w0.clone()).requires_grad_()
        i = flow.from_torch(idx) if lib is flow else idx
        y = fn.embedding(i, w, padding_idx=1, scale_grad_by_freq=True)
        (y * lib.arange(36.0).reshape(3, 3, 4)).sum().backward()
        grads.append(w.grad.to_torch() if lib is flow else w.grad)
    torch.testing.assert_close(grads[1], grads[0])
    w = flow.from_torch(w0.clone()).requires_grad_()
    y = HF.embedding(flow.from_torch(idx), w, padding_idx=1, scale_grad_by_freq=True)
    dy = flow.ones(3, 3, 4, requires_grad=True)
    (gw,) = flow.autograd.grad(y, w, dy, create_graph=True)
    (gdy,) = flow.autograd.grad((gw * flow.from_torch(ct)).sum(), dy)
    counts = torch.bincount(idx.reshape(-1), minlength=6).clamp(min=1).unsqueeze(1)
    want = (ct / counts)[idx] * (idx != 1).unsqueeze(-1)
    torch.testing.assert_close(gdy.to_torch(), want)
    module = flow.nn.Embedding(6, 4, scale_grad_by_freq=True)
    module(flow.from_torch(idx)).sum().backward()
    torch.testing.assert_close(module.weight.grad.to_torch()[2], torch.ones(4))

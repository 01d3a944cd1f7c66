"""Option sweeps against torch, values and gradients (float64): nn.functional's interpolate (every
mode x align_corners x size / scale factor x recompute_scale_factor x antialias), grid_sample and
affine_grid, every pooling's options, conv2d / conv_transpose2d with groups, dilation, strides and
string paddings, pad in every mode with negative pads, the losses' reductions, weights, ignored
classes and smoothing, parameterised activations, normalizations, embeddings, distances, and
torch.linalg's orders, modes and tolerances. Found: circular pad's gradient with a negative pad
went to the uncropped tensor's ends; normalize with p=inf divided by 1; cosine_similarity clamped
the product of the norms, not each norm, as torch 2 does; linalg.pinv refused atol= and
hermitian=True."""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as TF

import holoflow as flow
import holoflow.nn.functional as FF
from harness import sweep


def _check(failures: list, name: str, tf_call, ff_call, inputs: list) -> bool:
    """Compares one call (values, dtypes, input gradients); returns whether torch computed it."""
    ts = [x.clone().requires_grad_(x.is_floating_point()) for x in inputs]
    try:
        want = tf_call(*ts)
    except Exception:   # not a valid combination for torch
        return False
    fs = [flow.from_torch(x.detach().clone()).requires_grad_(x.is_floating_point()) for x in inputs]
    try:
        got = ff_call(*fs)
    except Exception as e:
        failures.append(f"{name}: {e}")
        return True
    g = got.to_torch().detach()
    if g.shape != want.shape or g.dtype != want.dtype:
        failures.append(f"{name}: {tuple(g.shape)} {g.dtype}, torch {tuple(want.shape)} {want.dtype}")
    elif not torch.allclose(g, want.detach(), rtol=1e-4, atol=1e-5, equal_nan=True):
        failures.append(f"{name}: values differ by {(g - want.detach()).abs().max().item()}")
    elif want.requires_grad:
        w = torch.randn(want.shape, dtype=want.dtype)
        try:
            (want * w).sum().backward()
        except RuntimeError:   # not differentiable there (torch says why): holoflow refuses too
            try:
                (got * flow.from_torch(w)).sum().backward()
                failures.append(f"{name}: backward ran where torch refuses it")
            except RuntimeError:
                pass
            return True
        (got * flow.from_torch(w)).sum().backward()
        for t, f in zip(ts, fs):
            if t.grad is not None and (f.grad is None or not torch.allclose(f.grad.to_torch(), t.grad, rtol=1e-4,
                                                                            atol=1e-5)):
                failures.append(f"{name}: gradient differs")
                break
    return True


def _inputs() -> tuple:
    torch.manual_seed(0)
    return (torch.randn(2, 3, 9, dtype=torch.float64), torch.randn(2, 3, 5, 7, dtype=torch.float64),
            torch.randn(1, 2, 4, 5, 6, dtype=torch.float64))



def _interpolate_kwargs(x):
    modes = {3: ["nearest", "linear", "nearest-exact", "area"],
             4: ["nearest", "bilinear", "bicubic", "nearest-exact", "area"],
             5: ["nearest", "trilinear", "area", "nearest-exact"]}[x.dim()]
    sizes = [("size", None), ("scale", 1.7), ("scale", 0.6), ("scale", 2)]
    for mode, corners, (kind, factor), recompute, aa in itertools.product(modes, [None, True, False], sizes,
                                                                         [None, True, False], [False, True]):
        kw = {"mode": mode}
        if corners is not None:
            kw["align_corners"] = corners
        if kind == "size":
            kw["size"] = tuple(s + 2 for s in x.shape[2:])
        else:
            kw["scale_factor"], kw["recompute_scale_factor"] = factor, recompute
        if aa:
            kw["antialias"] = True
        yield kw


def test_interpolate_matches_torch():
    sweep(_check, [(f"interpolate {x.dim()}d {kw}", lambda a, kw=kw: TF.interpolate(a, **kw),
                    lambda a, kw=kw: FF.interpolate(a, **kw), [x])
                   for x in _inputs() for kw in _interpolate_kwargs(x)])


def test_grid_sample_and_affine_grid_match_torch():
    _, x4, x5 = _inputs()
    g2 = torch.rand(2, 4, 6, 2, dtype=torch.float64) * 2.4 - 1.2
    g3 = torch.rand(1, 3, 4, 2, 3, dtype=torch.float64) * 2.4 - 1.2
    cases = [(f"grid_sample {x.dim()}d {kw}", lambda a, b, kw=kw: TF.grid_sample(a, b, **kw),
              lambda a, b, kw=kw: FF.grid_sample(a, b, **kw), [x, g])
             for (x, g), mode, padding, corners in itertools.product(
                 [(x4, g2), (x5, g3)], ["bilinear", "nearest", "bicubic"], ["zeros", "border", "reflection"],
                 [True, False])
             for kw in [{"mode": mode, "padding_mode": padding, "align_corners": corners}]]
    theta = torch.randn(2, 2, 3, dtype=torch.float64)
    cases += [(f"affine_grid {c}", lambda t, c=c: TF.affine_grid(t, (2, 3, 5, 7), align_corners=c),
               lambda t, c=c: FF.affine_grid(t, (2, 3, 5, 7), align_corners=c), [theta]) for c in (True, False)]
    sweep(_check, cases)


def test_pooling_options_match_torch():
    x3, x4, x5 = _inputs()
    cases = []
    for k, stride, pad, ceil in itertools.product([2, 3], [None, 1, 2], [0, 1], [False, True]):
        if pad * 2 > k:
            continue
        for include_pad, divisor in itertools.product([True, False], [None, 3]):
            kw = {"kernel_size": k, "stride": stride, "padding": pad, "ceil_mode": ceil,
                  "count_include_pad": include_pad}
            cases.append((f"avg_pool1d {kw}", lambda a, kw=kw: TF.avg_pool1d(a, **kw),
                          lambda a, kw=kw: FF.avg_pool1d(a, **kw), [x3]))
            kw = {**kw, "divisor_override": divisor}
            for fn, x in (("avg_pool2d", x4), ("avg_pool3d", x5)):
                cases.append((f"{fn} {kw}", lambda a, kw=kw, fn=fn: getattr(TF, fn)(a, **kw),
                              lambda a, kw=kw, fn=fn: getattr(FF, fn)(a, **kw), [x]))
        for dilation in (1, 2):
            kw = {"kernel_size": k, "stride": stride, "padding": pad, "ceil_mode": ceil, "dilation": dilation}
            for fn, x in (("max_pool1d", x3), ("max_pool2d", x4), ("max_pool3d", x5)):
                cases.append((f"{fn} {kw}", lambda a, kw=kw, fn=fn: getattr(TF, fn)(a, **kw),
                              lambda a, kw=kw, fn=fn: getattr(FF, fn)(a, **kw), [x]))
    for size, fn in itertools.product([1, 2, 3, (2, 5), (None, 3)], ["adaptive_avg_pool2d", "adaptive_max_pool2d"]):
        cases.append((f"{fn} {size}", lambda a, s=size, fn=fn: getattr(TF, fn)(a, s),
                      lambda a, s=size, fn=fn: getattr(FF, fn)(a, s), [x4]))
    for p in (1, 2, 3.5):
        cases.append((f"lp_pool2d {p}", lambda a, p=p: TF.lp_pool2d(a.abs() + 0.1, p, 2),
                      lambda a, p=p: FF.lp_pool2d(a.abs() + 0.1, p, 2), [x4]))
    sweep(_check, cases)


def test_convolution_options_match_torch():
    _, x4, _ = _inputs()
    cases = []
    for groups, dilation, pad, stride in itertools.product([1, 3], [1, 2], [0, 1, "same", "valid"], [1, 2]):
        w, b = torch.randn(6, 3 // groups, 3, 2, dtype=torch.float64), torch.randn(6, dtype=torch.float64)
        kw = {"stride": stride, "padding": pad, "dilation": dilation, "groups": groups}
        cases.append((f"conv2d {kw}", lambda a, w, b, kw=kw: TF.conv2d(a, w, b, **kw),
                      lambda a, w, b, kw=kw: FF.conv2d(a, w, b, **kw), [x4, w, b]))
        if isinstance(pad, str):
            continue
        for out_pad in range(max(stride, dilation)):
            wt = torch.randn(3, 6 // groups, 3, 2, dtype=torch.float64)
            kw = {"stride": stride, "padding": pad, "dilation": dilation, "groups": groups, "output_padding": out_pad}
            cases.append((f"conv_transpose2d {kw}", lambda a, w, kw=kw: TF.conv_transpose2d(a, w, **kw),
                          lambda a, w, kw=kw: FF.conv_transpose2d(a, w, **kw), [x4, wt]))
    sweep(_check, cases)


def test_pad_modes_with_negative_pads_match_torch():
    xs = _inputs()
    sweep(_check, [(f"pad {mode} {pad} {x.dim()}d", lambda a, p=pad, m=mode: TF.pad(a, p, mode=m),
                    lambda a, p=pad, m=mode: FF.pad(a, p, mode=m), [x])
                   for mode in ("constant", "reflect", "replicate", "circular")
                   for pad in ((1, 2), (2, 1, 0, 3), (1, 1, 1, 1, 1, 1), (-1, 2), (2, -1, -1, 1))
                   for x in xs])


def _flow(t):
    return None if t is None else flow.from_torch(t)


def test_classification_losses_options_match_torch():
    torch.manual_seed(1)
    d = torch.float64
    logits2, logits4 = torch.randn(6, 5, dtype=d), torch.randn(3, 5, 2, 4, dtype=d)
    t2, t4 = torch.tensor([0, 4, 2, 1, 4, 3]), torch.randint(0, 5, (3, 2, 4))
    t4[0, 0, 0] = -100
    w5 = torch.rand(5, dtype=d) + 0.5
    probs = torch.softmax(torch.randn(6, 5, dtype=d), -1)
    cases = []
    for (x, t), red, w, ignore, smooth in itertools.product([(logits2, t2), (logits4, t4)], ["mean", "sum", "none"],
                                                           [None, w5], [-100, 2], [0.0, 0.2]):
        kw = {"reduction": red, "ignore_index": ignore, "weight": w}
        cases.append((f"cross_entropy {x.dim()}d {kw} smoothing={smooth}",
                      lambda a, t=t, kw=kw, s=smooth: TF.cross_entropy(a, t, label_smoothing=s, **kw),
                      lambda a, t=t, kw=kw, s=smooth: FF.cross_entropy(a, _flow(t), label_smoothing=s,
                                                                       **{**kw, "weight": _flow(kw["weight"])}), [x]))
        cases.append((f"nll_loss {x.dim()}d {kw}", lambda a, t=t, kw=kw: TF.nll_loss(a.log_softmax(1), t, **kw),
                      lambda a, t=t, kw=kw: FF.nll_loss(a.log_softmax(1), _flow(t),
                                                        **{**kw, "weight": _flow(kw["weight"])}), [x]))
    for red, smooth, w in itertools.product(["mean", "sum", "none"], [0.0, 0.1], [None, w5]):
        cases.append((f"cross_entropy soft {red} {smooth} weight={w is not None}",
                      lambda a, r=red, s=smooth, w=w: TF.cross_entropy(a, probs, weight=w, reduction=r, label_smoothing=s),
                      lambda a, r=red, s=smooth, w=w: FF.cross_entropy(a, _flow(probs), weight=_flow(w), reduction=r,
                                                                       label_smoothing=s), [logits2]))
    y, pos = torch.rand(6, 5, dtype=d), torch.rand(5, dtype=d) + 0.5
    for red, w, pw in itertools.product(["mean", "sum", "none"], [None, w5], [None, pos]):
        cases.append((f"bce_with_logits {red}", lambda a, r=red, w=w, pw=pw: TF.binary_cross_entropy_with_logits(
            a, y, weight=w, pos_weight=pw, reduction=r), lambda a, r=red, w=w, pw=pw: FF.binary_cross_entropy_with_logits(
            a, _flow(y), weight=_flow(w), pos_weight=_flow(pw), reduction=r), [logits2]))
        cases.append((f"bce {red}", lambda a, r=red, w=w: TF.binary_cross_entropy(a.sigmoid(), y, weight=w, reduction=r),
                      lambda a, r=red, w=w: FF.binary_cross_entropy(a.sigmoid(), _flow(y), weight=_flow(w), reduction=r),
                      [logits2]))
    for red, log_target in itertools.product(["sum", "none", "batchmean"], [False, True]):
        tg = probs.log() if log_target else probs
        cases.append((f"kl_div {red} {log_target}",
                      lambda a, r=red, lt=log_target, tg=tg: TF.kl_div(a.log_softmax(-1), tg, reduction=r, log_target=lt),
                      lambda a, r=red, lt=log_target, tg=tg: FF.kl_div(a.log_softmax(-1), _flow(tg), reduction=r,
                                                                       log_target=lt), [logits2]))
    sweep(_check, cases)


def test_regression_losses_options_match_torch():
    torch.manual_seed(2)
    d = torch.float64
    x, y = torch.randn(6, 5, dtype=d), torch.randn(6, 5, dtype=d)
    cases = []
    for fn, red in itertools.product(["mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "soft_margin_loss"],
                                     ["mean", "sum", "none"]):
        t = torch.sign(y) if fn == "soft_margin_loss" else y
        cases.append((f"{fn} {red}", lambda a, fn=fn, r=red, t=t: getattr(TF, fn)(a, t, reduction=r),
                      lambda a, fn=fn, r=red, t=t: getattr(FF, fn)(a, _flow(t), reduction=r), [x]))
    for beta in (0.5, 1.0, 0.0):
        cases.append((f"smooth_l1 beta={beta}", lambda a, b=beta: TF.smooth_l1_loss(a, y, beta=b),
                      lambda a, b=beta: FF.smooth_l1_loss(a, _flow(y), beta=b), [x]))
    counts = torch.poisson(torch.rand(6, 5, dtype=d) * 3)
    for log_input, full, red in itertools.product([True, False], [True, False], ["mean", "sum"]):
        cases.append((f"poisson_nll {log_input} {full} {red}",
                      lambda a, li=log_input, f=full, r=red: TF.poisson_nll_loss(a if li else a.exp(), counts, log_input=li,
                                                                                 full=f, reduction=r),
                      lambda a, li=log_input, f=full, r=red: FF.poisson_nll_loss(a if li else a.exp(), _flow(counts),
                                                                                 log_input=li, full=f, reduction=r), [x]))
    var = torch.rand(6, 5, dtype=d) + 0.1
    for full, red in itertools.product([True, False], ["mean", "sum", "none"]):
        cases.append((f"gaussian_nll {full} {red}", lambda a, v, f=full, r=red: TF.gaussian_nll_loss(a, y, v, full=f, reduction=r),
                      lambda a, v, f=full, r=red: FF.gaussian_nll_loss(a, _flow(y), v, full=f, reduction=r), [x, var]))
    sweep(_check, cases)


def test_activations_and_normalize_options_match_torch():
    torch.manual_seed(3)
    x = torch.randn(4, 6, dtype=torch.float64) * 3
    options = [("elu", {"alpha": 0.7}), ("celu", {"alpha": 1.3}), ("selu", {}), ("softplus", {"beta": 2, "threshold": 3}),
               ("hardtanh", {"min_val": -0.5, "max_val": 2.0}), ("threshold", {"threshold": 0.3, "value": -1.0}),
               ("glu", {"dim": 1}), ("gelu", {"approximate": "tanh"}), ("gelu", {}), ("leaky_relu", {"negative_slope": 0.2}),
               ("relu6", {}), ("hardsigmoid", {}), ("hardswish", {}), ("silu", {}), ("mish", {}), ("softsign", {}),
               ("tanhshrink", {}), ("softshrink", {"lambd": 0.7}), ("hardshrink", {"lambd": 0.7}), ("logsigmoid", {}),
               ("softmin", {"dim": 0}), ("softmax", {"dim": 1, "dtype": torch.float32}), ("log_softmax", {"dim": 0}),
               ("normalize", {"p": 1.5, "dim": 0}), ("normalize", {"p": float("inf"), "dim": 1}),
               ("normalize", {"p": 0.5, "dim": 1, "eps": 0.1}), ("rrelu", {"training": False})]
    sweep(_check, [(f"{fn} {kw}", lambda a, fn=fn, kw=kw: getattr(TF, fn)(a, **kw),
                    lambda a, fn=fn, kw=kw: getattr(FF, fn)(a, **kw), [x]) for fn, kw in options])


def test_normalization_options_match_torch():
    torch.manual_seed(4)
    d = torch.float64
    x = torch.randn(4, 6, 3, 2, dtype=d)
    rm, rv = torch.randn(6, dtype=d), torch.rand(6, dtype=d) + 0.5
    w, b = torch.randn(6, dtype=d), torch.randn(6, dtype=d)
    cases = []
    for training, affine in itertools.product([True, False], [True, False]):
        cases.append((f"batch_norm training={training} affine={affine}",
                      lambda a, w, b, t=training, af=affine: TF.batch_norm(a, rm.clone(), rv.clone(), w if af else None,
                                                                           b if af else None, training=t),
                      lambda a, w, b, t=training, af=affine: FF.batch_norm(a, _flow(rm.clone()), _flow(rv.clone()),
                                                                           w if af else None, b if af else None,
                                                                           training=t), [x, w, b]))
    for stats in (True, False):
        cases.append((f"instance_norm use_input_stats={stats}",
                      lambda a, w, b, s=stats: TF.instance_norm(a, rm.clone(), rv.clone(), w, b, use_input_stats=s),
                      lambda a, w, b, s=stats: FF.instance_norm(a, _flow(rm.clone()), _flow(rv.clone()), w, b,
                                                                use_input_stats=s), [x, w, b]))
    cases += [(f"group_norm {g}", lambda a, w, b, g=g: TF.group_norm(a, g, w, b),
               lambda a, w, b, g=g: FF.group_norm(a, g, w, b), [x, w, b]) for g in (1, 2, 3, 6)]
    for shape in ((2,), (3, 2), (6, 3, 2)):
        wn = torch.randn(shape, dtype=d)
        cases += [(f"layer_norm {shape}", lambda a, w, s=shape: TF.layer_norm(a, s, w, None),
                   lambda a, w, s=shape: FF.layer_norm(a, s, w, None), [x, wn]),
                  (f"rms_norm {shape}", lambda a, w, s=shape: TF.rms_norm(a, s, w),
                   lambda a, w, s=shape: FF.rms_norm(a, s, w), [x, wn]),
                  (f"rms_norm eps {shape}", lambda a, s=shape: TF.rms_norm(a, s, eps=1e-3),
                   lambda a, s=shape: FF.rms_norm(a, s, eps=1e-3), [x])]
    cases += [(f"local_response_norm {kw}", lambda a, kw=kw: TF.local_response_norm(a, **kw),
               lambda a, kw=kw: FF.local_response_norm(a, **kw), [x])
              for kw in ({"size": 3}, {"size": 4, "alpha": 0.1, "beta": 0.5, "k": 2.0})]
    sweep(_check, cases)


def test_embeddings_and_distances_options_match_torch():
    torch.manual_seed(5)
    d = torch.float64
    table, idx = torch.randn(10, 4, dtype=d), torch.tensor([[1, 0, 9], [3, 3, 0]])
    cases = []
    for pad, max_norm, by_freq in itertools.product([None, 0, 3], [None, 1.0], [False, True]):
        kw = {"padding_idx": pad, "max_norm": max_norm, "scale_grad_by_freq": by_freq}
        cases.append((f"embedding {kw}", lambda e, kw=kw: TF.embedding(idx, e.clone(), **kw),
                      lambda e, kw=kw: FF.embedding(_flow(idx), e.clone(), **kw), [table]))
    flat, offsets, psw = torch.tensor([1, 0, 9, 3, 3, 0, 5]), torch.tensor([0, 3, 3]), torch.rand(7, dtype=d)
    for mode, pad, last, weighted in itertools.product(["sum", "mean", "max"], [None, 0], [False, True], [False, True]):
        if weighted and mode != "sum":
            continue
        kw = {"mode": mode, "padding_idx": pad, "include_last_offset": last}
        cases.append((f"embedding_bag {kw} weighted={weighted}",
                      lambda e, kw=kw, wt=weighted: TF.embedding_bag(flat, e, offsets, per_sample_weights=psw if wt else None,
                                                                     **kw),
                      lambda e, kw=kw, wt=weighted: FF.embedding_bag(_flow(flat), e, _flow(offsets),
                                                                     per_sample_weights=_flow(psw) if wt else None, **kw),
                      [table]))
    a, b = torch.randn(4, 5, dtype=d), torch.randn(3, 5, dtype=d)
    for p in (0.5, 1.0, 2.0, 3.0, float("inf")):
        cases += [(f"cdist p={p}", lambda x, y, p=p: torch.cdist(x, y, p=p), lambda x, y, p=p: flow.cdist(x, y, p=p), [a, b]),
                  (f"pdist p={p}", lambda x, p=p: TF.pdist(x, p=p), lambda x, p=p: FF.pdist(x, p=p), [a]),
                  (f"pairwise_distance p={p}", lambda x, y, p=p: TF.pairwise_distance(x, y[:1], p=p, keepdim=True),
                   lambda x, y, p=p: FF.pairwise_distance(x, y[:1], p=p, keepdim=True), [a, b])]
    # (x2 broadcast along dim: torch takes the norms of the broadcast inputs, each clamped to eps)
    cases += [(f"cosine_similarity dim={dim} eps={eps}", lambda x, y, d_=dim, e=eps: TF.cosine_similarity(x, y[:1], d_, e),
               lambda x, y, d_=dim, e=eps: FF.cosine_similarity(x, y[:1], d_, e), [a, b])
              for dim, eps in ((1, 1e-8), (0, 0.5), (1, 3.0))]
    sweep(_check, cases)


def test_linalg_options_match_torch():
    """Found: linalg.pinv refused atol= and hermitian=True."""
    torch.manual_seed(6)
    d = torch.float64
    A, R, B = torch.randn(2, 4, 4, dtype=d), torch.randn(2, 5, 3, dtype=d), torch.randn(2, 4, 2, dtype=d)
    S = A @ A.mT + 4 * torch.eye(4, dtype=d)
    Ac = torch.randn(3, 3, dtype=torch.complex128)
    L, F = torch.linalg, flow.linalg

    def same(name, *inputs, t=None, f=None):
        return (name, t or getattr(L, name), f or getattr(F, name), list(inputs))
    cases = []
    for o in (None, "fro", "nuc", 1, -1, 2, -2, float("inf"), -float("inf")):
        kw = {} if o is None else {"ord": o}
        cases += [same(f"matrix_norm {o}", R, t=lambda a, kw=kw: L.matrix_norm(a, **kw),
                       f=lambda a, kw=kw: F.matrix_norm(a, **kw)),
                  same(f"norm {o}", R, t=lambda a, kw=kw: L.norm(a, dim=(-2, -1), **kw),
                       f=lambda a, kw=kw: F.norm(a, dim=(-2, -1), **kw))]
    for o, dim, keep in itertools.product([0, 1, 2, 3.5, float("inf"), -float("inf"), -1], [None, -1, (0, 2)],
                                          [False, True]):
        cases.append(same(f"vector_norm {o} {dim} {keep}", R, t=lambda a, o=o, d_=dim, k=keep: L.vector_norm(a, o, d_, k),
                          f=lambda a, o=o, d_=dim, k=keep: F.vector_norm(a, o, d_, k)))
    cases += [same("det", A), same("inv", S), same("pinv", R), same("solve", S, B), same("svdvals", R),
              same("matrix_exp", A * 0.3), same("det complex", Ac, t=L.det, f=F.det),
              same("inv complex", Ac, t=L.inv, f=F.inv), same("svdvals complex", Ac, t=L.svdvals, f=F.svdvals),
              same("slogdet", A, t=lambda a: L.slogdet(a)[1], f=lambda a: F.slogdet(a)[1]),
              same("solve left=False", S, B, t=lambda a, b: L.solve(a, b.mT, left=False),
                   f=lambda a, b: F.solve(a, b.mT, left=False)),
              same("lstsq", R, torch.randn(2, 5, 2, dtype=d), t=lambda a, b: L.lstsq(a, b).solution,
                   f=lambda a, b: F.lstsq(a, b).solution),
              same("lu_factor + lu_solve", S, B, t=lambda a, b: L.lu_solve(*L.lu_factor(a), b),
                   f=lambda a, b: F.lu_solve(*F.lu_factor(a), b)),
              same("lu", R, t=lambda a: (lambda p, lo, u: p @ lo @ u)(*L.lu(a)),
                   f=lambda a: (lambda p, lo, u: p @ lo @ u)(*F.lu(a))),
              same("ldl_factor + ldl_solve", S, B, t=lambda a, b: L.ldl_solve(*L.ldl_factor(a), b),
                   f=lambda a, b: F.ldl_solve(*F.ldl_factor(a), b)),
              same("householder_product", torch.randn(5, 3, dtype=d), torch.randn(3, dtype=d)),
              same("eigvals", S, t=lambda a: L.eigvals(a).abs().sort().values,
                   f=lambda a: F.eigvals(a).abs().sort().values)]
    for kw in ({"atol": 0.5}, {"rtol": 0.3}, {"atol": 0.1, "rtol": 0.2}, {"hermitian": True}):
        M = S if kw.get("hermitian") else R
        cases.append(same(f"pinv {kw}", M, t=lambda a, kw=kw: L.pinv(a, **kw), f=lambda a, kw=kw: F.pinv(a, **kw)))
    for upper in (False, True):
        cases.append(same(f"cholesky upper={upper}", S, t=lambda a, u=upper: L.cholesky(a, upper=u),
                          f=lambda a, u=upper: F.cholesky(a, upper=u)))
    for uplo in ("L", "U"):
        cases += [same(f"eigvalsh {uplo}", S, t=lambda a, u=uplo: L.eigvalsh(a, UPLO=u),
                       f=lambda a, u=uplo: F.eigvalsh(a, UPLO=u)),
                  same(f"eigh {uplo}", S, t=lambda a, u=uplo: L.eigh(a, UPLO=u)[0],
                       f=lambda a, u=uplo: F.eigh(a, UPLO=u)[0])]
    for full in (True, False):
        cases.append(same(f"svd full_matrices={full}", R,
                          t=lambda a, fm=full: (lambda u, s, vh: (u[..., :3] * s.unsqueeze(-2)) @ vh[..., :3, :])(
                              *L.svd(a, full_matrices=fm)),
                          f=lambda a, fm=full: (lambda u, s, vh: (u[..., :3] * s.unsqueeze(-2)) @ vh[..., :3, :])(
                              *F.svd(a, full_matrices=fm))))
    for mode in ("reduced", "complete", "r"):
        cases.append(same(f"qr {mode}", R, t=lambda a, m=mode: L.qr(a, mode=m)[1], f=lambda a, m=mode: F.qr(a, mode=m)[1]))
    for k in (0, 1, 2, 3, -1):
        cases.append(same(f"matrix_power {k}", S * 0.3, t=lambda a, k=k: L.matrix_power(a, k),
                          f=lambda a, k=k: F.matrix_power(a, k)))
    # (torch's backward of cond with these orders fails inside torch itself: values only)
    for p in (None, 2, "fro", 1, float("inf")):
        grad = p in (None, 2)
        cases.append(same(f"cond {p}", S, t=lambda a, p=p, g=grad: L.cond(a if g else a.detach(), p),
                          f=lambda a, p=p, g=grad: F.cond(a if g else a.detach(), p)))
    sweep(_check, cases)

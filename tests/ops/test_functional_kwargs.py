"""nn.functional's keyword combinations against torch, values and gradients (float64): interpolate
(every mode x align_corners x size / scale factor x recompute_scale_factor x antialias), grid_sample
and affine_grid, every pooling's options, conv2d / conv_transpose2d with groups, dilation,
strides and string paddings, and pad in every mode with negative pads (found: circular pad's
gradient with a negative pad went to the uncropped tensor's ends)."""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as TF

import holoflow as flow
import holoflow.nn.functional as FF


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
        (want * w).sum().backward()
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


def _sweep(cases) -> None:
    """Runs ``(name, torch_call, holoflow_call, inputs)`` cases; fails listing every mismatch."""
    failures: list = []
    computed = sum(_check(failures, *case) for case in cases)
    assert not failures, "\n".join(failures[:20])
    assert computed > 0


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
    _sweep((f"interpolate {x.dim()}d {kw}", lambda a, kw=kw: TF.interpolate(a, **kw),
            lambda a, kw=kw: FF.interpolate(a, **kw), [x])
           for x in _inputs() for kw in _interpolate_kwargs(x))


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
    _sweep(cases)


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
    _sweep(cases)


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
    _sweep(cases)


def test_pad_modes_with_negative_pads_match_torch():
    xs = _inputs()
    _sweep((f"pad {mode} {pad} {x.dim()}d", lambda a, p=pad, m=mode: TF.pad(a, p, mode=m),
            lambda a, p=pad, m=mode: FF.pad(a, p, mode=m), [x])
           for mode in ("constant", "reflect", "replicate", "circular")
           for pad in ((1, 2), (2, 1, 0, 3), (1, 1, 1, 1, 1, 1), (-1, 2), (2, -1, -1, 1))
           for x in xs)

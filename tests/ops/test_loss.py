"""Losses vs torch.nn.functional: forward + backward, gradcheck, SBP rules; clear errors."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
import holoflow.nn.functional as HF
from harness import BF16, F32, F64, Case, parametrize, positive, randn

from holoflow.core.dispatch import apply
from holoflow.ops.loss import CLASS_WEIGHT_TOTAL

ALL = (F32, F64, BF16)


def _ce(x_shape, kind="index", weight=False, ignore=False):
    def make(dt, g):
        c = x_shape[1] if len(x_shape) > 1 else x_shape[0]
        x = randn(*x_shape, gen=g, dtype=dt) * 2
        if kind == "index":
            t_shape = x_shape[:1] + x_shape[2:] if len(x_shape) > 1 else ()
            t = torch.randint(0, c, t_shape, generator=g)
            if ignore and t.numel():
                t.view(-1)[::3] = -100
        else:
            t = torch.softmax(randn(*x_shape, gen=g, dtype=F64), 1 if len(x_shape) > 1 else 0).to(dt)
        # torch's class-index losses are not differentiable in weight: then it is built inside the call
        w = (positive(c, gen=g, dtype=dt) if kind == "prob" else "const") if weight else None
        return (x, t, w), {}
    return make


def _wt(lib, x, w):
    if isinstance(w, str):
        c = x.shape[1] if x.dim() > 1 else x.shape[0]
        return lib.linspace(0.5, 2.0, c, dtype=x.dtype, device=x.device)
    return w


def _x(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt) * 2,), {})


def _labels(lib, x):
    return lib.sign(x.detach() + 0.1)  # +-1 labels, not differentiable


CASES = []
for red in ("mean", "sum", "none"):
    for ls in (0.0, 0.2):
        for shape, kind, wt, ig in [((6, 5), "index", False, False), ((6, 5), "index", True, True),
                                    ((3, 4, 5, 3), "index", True, False), ((6, 5), "prob", False, False),
                                    ((3, 4, 5), "prob", True, False), ((5,), "index", False, False),
                                    ((0, 4), "index", False, False)]:
            name = f"cross_entropy-{red}-ls{ls}-{kind}{list(shape)}{'-w' if wt else ''}{'-ignore' if ig else ''}"
            CASES.append(Case(name, lambda x, t, w, r=red, s=ls: HF.cross_entropy(x, t, _wt(flow, x, w), reduction=r, label_smoothing=s),
                              lambda x, t, w, r=red, s=ls: F.cross_entropy(x, t, _wt(torch, x, w), reduction=r, label_smoothing=s),
                              _ce(shape, kind, wt, ig), dtypes=ALL if shape != (0, 4) else (F32, F64),
                              gradcheck=not (red == "mean" and shape == (0, 4))))  # an empty mean is nan
    for shape, wt, ig in [((6, 5), True, True), ((3, 4, 2, 3), False, True), ((4,), False, False)]:
        CASES.append(Case(f"nll_loss-{red}{list(shape)}{'-w' if wt else ''}{'-ignore' if ig else ''}",
                          lambda x, t, w, r=red: HF.nll_loss(x, t, _wt(flow, x, w), reduction=r),
                          lambda x, t, w, r=red: F.nll_loss(x, t, _wt(torch, x, w), reduction=r), _ce(shape, "index", wt, ig), dtypes=ALL))
    CASES.append(Case(f"cross_entropy-ignore_index-{red}", lambda x, t, w, r=red: HF.cross_entropy(x, t, ignore_index=2, reduction=r),
                      lambda x, t, w, r=red: F.cross_entropy(x, t, ignore_index=2, reduction=r), _ce((7, 4))))

    def pair(*shape, t_shape=None, pos=False, unit=False):
        def make(dt, g):
            if unit:
                x = torch.rand(shape, generator=g, dtype=F64).mul(0.9).add(0.05).to(dt)
                t = torch.rand(t_shape or shape, generator=g, dtype=F64).to(dt)
            else:
                x = randn(*shape, gen=g, dtype=dt) * 2
                t = randn(*(t_shape or shape), gen=g, dtype=dt) * 2
            return (x, t), {}
        return make
    for shape in [(4, 5), (0, 3), (3,)]:
        for fn, kw in [("mse_loss", {}), ("l1_loss", {}), ("smooth_l1_loss", {}), ("smooth_l1_loss", {"beta": 0.5}),
                       ("smooth_l1_loss", {"beta": 0.0}), ("huber_loss", {"delta": 0.7}),
                       ("binary_cross_entropy", {}), ("binary_cross_entropy_with_logits", {})]:
            CASES.append(Case(f"{fn}{kw or ''}-{red}{list(shape)}", lambda x, t, f=fn, k=kw, r=red: getattr(HF, f)(x, t, reduction=r, **k),
                              lambda x, t, f=fn, k=kw, r=red: getattr(F, f)(x, t, reduction=r, **k),
                              pair(*shape, unit=fn == "binary_cross_entropy"), dtypes=ALL,
                              # l1 and beta=0 are not smooth; an empty mean is nan whatever the input
                              gradcheck=fn not in ("l1_loss",) and not (fn == "smooth_l1_loss" and kw.get("beta") == 0.0)
                              and not (red == "mean" and 0 in shape)))
    # torch's soft_margin_loss is not differentiable in target: the labels are built inside
    CASES.append(Case(f"soft_margin_loss-{red}", lambda x, r=red: HF.soft_margin_loss(x, _labels(flow, x), reduction=r),
                      lambda x, r=red: F.soft_margin_loss(x, _labels(torch, x), reduction=r), _x(4, 5), dtypes=ALL))
    CASES.append(Case(f"mse_loss-broadcast-{red}", lambda x, t, r=red: HF.mse_loss(x, t, reduction=r),
                      lambda x, t, r=red: F.mse_loss(x, t, reduction=r), pair(3, 4, t_shape=(4,))))


def _bce_w(dt, g):
    x = torch.rand(4, 3, generator=g, dtype=F64).mul(0.9).add(0.05).to(dt)
    return (x, torch.rand(4, 3, generator=g, dtype=F64).to(dt)), {}


def _logits_w(dt, g):
    return (randn(4, 3, gen=g, dtype=dt) * 3, torch.rand(4, 3, generator=g, dtype=F64).to(dt)), {}


def _w(lib, x):  # torch's bce weight is not differentiable: built inside the call
    return lib.linspace(0.5, 2.0, 3, dtype=x.dtype, device=x.device)


def _kl(log_target):
    def make(dt, g):
        x = torch.log_softmax(randn(4, 5, gen=g, dtype=F64), 1).to(dt)
        t = torch.softmax(randn(4, 5, gen=g, dtype=F64), 1)
        return (x, (t.log() if log_target else t).to(dt)), {}
    return make


# the 'mean' denominator of cross_entropy / nll_loss on a global input (ops/loss.py): the total
# weight of the non-ignored targets; its signatures (a split target gives partial sums) checked here
def _weight_total_ref(t, w):
    keep = t != -100
    return (w[t.clamp(min=0)] * keep).sum() if w is not None else keep.sum().to(torch.float32)


for _shape, _wt_on in [((6, 5), False), ((6, 5), True), ((3, 4, 5, 3), True)]:
    CASES.append(Case(f"class_weight_total{list(_shape)}{'-w' if _wt_on else ''}",
                      lambda x, t, w: apply(CLASS_WEIGHT_TOTAL, t, _wt(flow, x, w), ignore_index=-100,
                                            dtype=torch.float32 if w is None else x._data.dtype),
                      lambda x, t, w: _weight_total_ref(t, _wt(torch, x, w)),
                      _ce(_shape, "index", _wt_on, True), grad=False, gradcheck=False))

CASES += [
    Case("binary_cross_entropy-weight", lambda x, t: HF.binary_cross_entropy(x, t, _w(flow, x)),
         lambda x, t: F.binary_cross_entropy(x, t, _w(torch, x)), _bce_w, dtypes=ALL),
    Case("bce_with_logits-weight-pos_weight",
         lambda x, t: HF.binary_cross_entropy_with_logits(x, t, _w(flow, x), pos_weight=_w(flow, x) * 1.5),
         lambda x, t: F.binary_cross_entropy_with_logits(x, t, _w(torch, x), pos_weight=_w(torch, x) * 1.5), _logits_w, dtypes=ALL),
]
# linear_cross_entropy's chunked ops (ops/linear_loss.py): a batch of rows in chunks of 3
def _lce(bias, weight):
    def make(dt, g):
        x, w = randn(7, 5, gen=g, dtype=dt), randn(6, 5, gen=g, dtype=dt)
        t = torch.randint(0, 6, (7,), generator=g)
        t[::3] = -100
        return (x, w, randn(6, gen=g, dtype=dt) if bias else None, t, "const" if weight else None), {}
    return make


def _lce_call(lib, x, w, b, t, cw, red):
    opts = lib.nn.LinearCrossEntropyOptions(batch_chunk_size=3)
    return lib.nn.functional.linear_cross_entropy(x, w, t, linear_bias=b, weight=_wt(lib, w.T, cw), reduction=red,
                                                  options=opts)


for red in ("mean", "sum", "none"):
    for bias, weight in [(True, False), (False, True)]:
        CASES.append(Case(f"linear_cross_entropy-chunked-{red}{'-bias' if bias else ''}{'-w' if weight else ''}",
                          lambda *a, r=red: _lce_call(flow, *a, r), lambda *a, r=red: _lce_call(torch, *a, r),
                          _lce(bias, weight), dtypes=ALL))

for red in ("mean", "sum", "none", "batchmean"):
    for lt in (False, True):
        CASES.append(Case(f"kl_div-{red}-log_target{lt}", lambda x, t, r=red, l=lt: HF.kl_div(x, t, reduction=r, log_target=l),
                          lambda x, t, r=red, l=lt: F.kl_div(x, t, reduction=r, log_target=l), _kl(lt), dtypes=ALL))

globals().update(parametrize(CASES))


def test_cross_entropy_target_errors():
    x = flow.randn(4, 5)
    with pytest.raises(RuntimeError, match=r"class-index target of dtype int64 \(long\) or uint8 \(byte\), got .*int32"):
        HF.cross_entropy(x, flow.zeros(4, dtype=flow.int32))
    with pytest.raises(ValueError, match=r"input of shape \(4, 5\).*target of shape \(4,\), got \(3,\)"):
        HF.cross_entropy(x, flow.zeros(3, dtype=flow.int64))
    with pytest.raises(ValueError, match=r"probability target.*\(4, 5\), got \(4, 4\)"):
        HF.cross_entropy(x, flow.rand(4, 4))
    with pytest.raises(ValueError, match=r"weight of shape \(4,\) should be \(5,\)"):
        HF.cross_entropy(x, flow.zeros(4, dtype=flow.int64), flow.ones(4))
    with pytest.raises(TypeError, match="nll_loss: target must hold class indices"):
        HF.nll_loss(x, flow.rand(4, 5))
    with pytest.raises(ValueError, match="reduction must be one of"):
        HF.mse_loss(x, x, reduction="avg")


def test_bce_shape_error():
    with pytest.raises(ValueError, match=r"target of shape \(3,\) must have the input's shape \(2, 3\)"):
        HF.binary_cross_entropy(flow.rand(2, 3), flow.rand(3))


ALL_IGNORED = {
    "ce": lambda lib, x: lib.nn.functional.cross_entropy(x, lib.tensor([-100, -100, -100])),
    "ce-weight": lambda lib, x: lib.nn.functional.cross_entropy(x, lib.tensor([-100, -100, -100]),
                                                                weight=lib.tensor([0.0, 0, 1, 1])),
    "ce-smoothing": lambda lib, x: lib.nn.functional.cross_entropy(x, lib.tensor([-100, -100, -100]),
                                                                   label_smoothing=0.1),
    "ce-3d": lambda lib, x: lib.nn.functional.cross_entropy(x.reshape(1, 4, 3), lib.tensor([[-100, -100, -100]])),
    "nll": lambda lib, x: lib.nn.functional.nll_loss(x, lib.tensor([-100, -100, -100])),
    "ce-zero-weight-smoothing": lambda lib, x: lib.nn.functional.cross_entropy(
        x, lib.tensor([0, 1, 0]), label_smoothing=0.1, weight=lib.tensor([0.0, 0, 1, 1])),
    "ce-ignored-and-zero-weight": lambda lib, x: lib.nn.functional.cross_entropy(
        x, lib.tensor([-100, 0, 1]), weight=lib.tensor([0.0, 0, 1, 1])),
}


@pytest.mark.parametrize("name", sorted(ALL_IGNORED))
def test_mean_loss_with_zero_total_weight_has_torchs_gradient(name):
    """'mean' over class indices whose total weight is 0 (a batch of only padding): the loss is NaN
    in both, and torch's gradient is 0 on ignored rows (NaN on counted rows with zero weight);
    holoflow's once was NaN (or inf) everywhere, poisoning the parameters."""
    x0 = torch.randn(3, 4, generator=torch.Generator().manual_seed(1))
    got = []
    for lib in (torch, flow):
        x = (flow.from_torch(x0.clone()) if lib is flow else x0.clone()).requires_grad_()
        ALL_IGNORED[name](lib, x).backward()
        got.append(x.grad.to_torch() if lib is flow else x.grad)
    torch.testing.assert_close(got[1], got[0], equal_nan=True)

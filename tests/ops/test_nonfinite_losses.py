"""nn.functional's losses and multi-input functions on special values (0, +-1, +-inf, NaN and each
function's own edge: equal inputs, zero targets, zero vectors, constant rows, fully masked rows),
with seed gradients of ones, of infinities and of NaN: the same values and gradients as torch.

Found (before, holoflow vs torch):
smooth_l1_loss / huber_loss: an infinite difference gave a NaN gradient (the unchosen quadratic side's 0 * inf; torch +-1 / +-delta).
smooth_l1_loss / huber_loss: a NaN difference with the quadratic side read only where chosen gave 0 (torch's kernel: NaN).
binary_cross_entropy: x = 0 or 1 gave NaN gradients (clamped log's 0 * inf); now an op with torch's rule (x - t) / max(x(1-x), 1e-12), d/dt = -logit(x).
binary_cross_entropy_with_logits: values NaN at x = -inf with t != 1 (torch +-inf) and NaN gradients at infinite x; now an op with torch's rule (sigmoid(x) - t).
soft_margin_loss: d/dx at x * t = 0 was twice torch's (clamp_min's tie; torch -t/2) and -inf for an infinite target (torch's exp form: NaN).
gaussian_nll_loss: an infinite variance gave NaN values (the straight-through clamp(v) + (v - v)); now torch's no_grad clamp_ of a clone.
cross_entropy (reduction none, probabilities, label smoothing) with an infinite seed: -inf at the target (torch: log_softmax's backward g - p sum(g), NaN).
nll_loss with an infinite seed: NaN off the targets (a one-hot times inf; torch writes the targets only), and with a zero total weight a whole
  row NaN (torch: the target only); cross_entropy of an ignored row holding NaN was 0 (torch NaN).
scaled_dot_product_attention (math backward) with a fully masked row: NaN dv (softmax of all -inf; torch's _safe_softmax gives 0), and
  torch.nan_to_num hid NaN/inf gradients torch keeps.
multi_margin_loss / multilabel_margin_loss: torch's kernels skip NaN hinge terms (z > 0 is false); clamp_min kept them.
Left (xfail, see KNOWN): pdist's kernel backward with a NaN row (torch's _pdist_backward has no double backward; holoflow's composite
follows torch's norm backward).
Matched already: l1, mse, kl_div (both forms, zero targets), poisson_nll_loss (all forms), margin_ranking, hinge_embedding, cosine_embedding,
multilabel_soft_margin, triplet losses, normalize, cosine_similarity, pairwise_distance, cdist, norms' layers, softmax / log_softmax /
logsumexp of -inf rows, embedding with max_norm.
"""
from __future__ import annotations

import warnings

import pytest
import torch

import holoflow as flow
from harness import same_special

INF, NAN = float("inf"), float("nan")
_V = [-2.0, -1.0, -0.5, 0.0, 0.5, 1.0, 2.0, INF, -INF, NAN]
A = torch.tensor([a for a in _V for _ in _V], dtype=torch.float64)           # every pair of special values
B = torch.tensor([b for _ in _V for b in _V], dtype=torch.float64)
_P = [0.0, 1e-30, 1e-3, 0.25, 0.5, 1.0 - 1e-3, 1.0]                          # probabilities
_T = [0.0, 1e-3, 0.5, 0.999, 1.0]                                          # targets (torch checks them too)
PA = torch.tensor([p for p in _P for _ in _T], dtype=torch.float64)
PT = torch.tensor([t for _ in _P for t in _T], dtype=torch.float64)
SIGN = torch.tensor([1.0, -1.0] * (A.numel() // 2), dtype=torch.float64)    # +-1 targets
ROWS = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [INF, 1.0, 2.0, 3.0],
                     [-INF, -INF, -INF, -INF], [-INF, 1.0, 2.0, 3.0], [NAN, 1.0, 2.0, 3.0], [INF, INF, 1.0, 0.0],
                     [-1.0, 1.0, -INF, INF], [1e-30, 0.0, 0.0, 0.0]], dtype=torch.float64)
ROWS2 = torch.tensor([[1.0, 2.0, 3.0, 4.0], [0.0, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0], [1.0, 1.0, 2.0, 3.0],
                      [-INF, -INF, -INF, -INF], [0.0, 0.0, 0.0, 0.0], [1.0, 1.0, 2.0, 3.0], [INF, 1.0, 1.0, 0.0],
                      [-1.0, 1.0, -INF, INF], [0.0, 0.0, 0.0, 0.0]], dtype=torch.float64)
CLS = torch.tensor([0, 1, 2, 3, 0, 0, 1, 2, 3, 1])
PROBS = torch.tensor([[0.25, 0.25, 0.25, 0.25], [0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.0, 0.5, 0.5, 0.0],
                      [0.0, 0.0, 0.0, 1.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0], [0.5, 0.0, 0.0, 0.5],
                      [0.0, 0.0, 0.0, 1.0], [0.0, 1.0, 0.0, 0.0]], dtype=torch.float64)
Q = torch.linspace(-2, 2, 40, dtype=torch.float64).reshape(10, 4)
W4 = torch.tensor([1.0, 0.0, 2.0, 0.5], dtype=torch.float64)


def _F(m):
    return m.nn.functional


# name -> (fn(m, *tensors), tensors, indices of the differentiable tensors)
LOSSES = {}
for red in ("none", "sum", "mean"):
    r = red
    LOSSES.update({
        f"l1_loss {r}": (lambda m, a, b, r=r: _F(m).l1_loss(a, b, reduction=r), (A, B), (0, 1)),
        f"mse_loss {r}": (lambda m, a, b, r=r: _F(m).mse_loss(a, b, reduction=r), (A, B), (0, 1)),
        f"smooth_l1_loss {r}": (lambda m, a, b, r=r: _F(m).smooth_l1_loss(a, b, reduction=r), (A, B), (0, 1)),
        f"huber_loss {r}": (lambda m, a, b, r=r: _F(m).huber_loss(a, b, reduction=r, delta=0.5), (A, B), (0, 1)),
        f"soft_margin_loss {r}": (lambda m, a, b, r=r: _F(m).soft_margin_loss(a, b, reduction=r), (A, B), (0,)),
        f"bce {r}": (lambda m, a, b, r=r: _F(m).binary_cross_entropy(a, b, reduction=r), (PA, PT), (0, 1)),
        f"bce_with_logits {r}": (lambda m, a, b, r=r: _F(m).binary_cross_entropy_with_logits(a, b, reduction=r),
                                 (A, B), (0, 1)),
        f"kl_div {r}": (lambda m, a, b, r=r: _F(m).kl_div(a, b, reduction=r), (A, B), (0, 1)),
        f"kl_div log_target {r}": (lambda m, a, b, r=r: _F(m).kl_div(a, b, reduction=r, log_target=True), (A, B),
                                   (0, 1)),
        f"poisson_nll_loss {r}": (lambda m, a, b, r=r: _F(m).poisson_nll_loss(a, b, reduction=r), (A, B), (0, 1)),
        f"cross_entropy {r}": (lambda m, x, r=r: _F(m).cross_entropy(x, m.as_tensor(CLS) if m is flow else CLS,
                                                                     reduction=r), (ROWS,), (0,)),
    })
LOSSES.update({
    "smooth_l1_loss beta 0": (lambda m, a, b: _F(m).smooth_l1_loss(a, b, reduction="none", beta=0.0), (A, B), (0, 1)),
    "smooth_l1_loss beta 2": (lambda m, a, b: _F(m).smooth_l1_loss(a, b, reduction="none", beta=2.0), (A, B), (0, 1)),
    "huber_loss delta 2": (lambda m, a, b: _F(m).huber_loss(a, b, reduction="none", delta=2.0), (A, B), (0, 1)),
    "bce weight": (lambda m, a, b, w: _F(m).binary_cross_entropy(a, b, w, reduction="none"), (PA, PT, PT.flip(0)),
                   (0, 1)),
    "bce_with_logits pos_weight": (lambda m, a, b, w: _F(m).binary_cross_entropy_with_logits(
        a, b, reduction="none", pos_weight=w), (A, B, B.flip(0)), (0, 1)),
    "bce_with_logits weight": (lambda m, a, b, w: _F(m).binary_cross_entropy_with_logits(
        a, b, w, reduction="none"), (A, B, B.flip(0)), (0, 1)),
    "poisson_nll_loss full": (lambda m, a, b: _F(m).poisson_nll_loss(a, b, full=True, reduction="none"), (A, B),
                              (0, 1)),
    "poisson_nll_loss rates": (lambda m, a, b: _F(m).poisson_nll_loss(a, b, log_input=False, reduction="none"),
                               (A, B), (0, 1)),
    "poisson_nll_loss rates full": (lambda m, a, b: _F(m).poisson_nll_loss(a, b, log_input=False, full=True,
                                                                           reduction="none"), (A, B), (0, 1)),
    "gaussian_nll_loss": (lambda m, a, b, v: _F(m).gaussian_nll_loss(a, b, v.abs(), reduction="none"),
                          (A, B, B.flip(0)), (0, 1, 2)),
    "gaussian_nll_loss full": (lambda m, a, b, v: _F(m).gaussian_nll_loss(a, b, v.abs(), full=True,
                                                                          reduction="none"), (A, B, A.flip(0)),
                               (0, 1, 2)),
    "margin_ranking_loss": (lambda m, a, b, t: _F(m).margin_ranking_loss(a, b, t, margin=0.5, reduction="none"),
                            (A, B, SIGN), (0, 1, 2)),
    "margin_ranking_loss 0": (lambda m, a, b, t: _F(m).margin_ranking_loss(a, b, t, reduction="none"),
                              (A, B, SIGN), (0, 1, 2)),
    "hinge_embedding_loss": (lambda m, a, t: _F(m).hinge_embedding_loss(a, t, reduction="none"), (A, SIGN), (0, 1)),
    "hinge_embedding_loss b": (lambda m, a, t: _F(m).hinge_embedding_loss(a, t, reduction="none"), (A, B), (0, 1)),
    "soft_margin_loss sign": (lambda m, a, t: _F(m).soft_margin_loss(a, t, reduction="none"), (A, SIGN), (0,)),
    "cosine_embedding_loss": (lambda m, a, b, t: _F(m).cosine_embedding_loss(a, b, t, reduction="none"),
                              (ROWS, ROWS2, SIGN[:10]), (0, 1)),
    "cosine_embedding_loss margin": (lambda m, a, b, t: _F(m).cosine_embedding_loss(a, b, -t, margin=-0.5,
                                                                                    reduction="none"),
                                     (ROWS, ROWS2, SIGN[:10]), (0, 1)),
    "multilabel_soft_margin_loss": (lambda m, x, t: _F(m).multilabel_soft_margin_loss(x, t, reduction="none"),
                                    (ROWS, PROBS), (0, 1)),
    "multilabel_soft_margin_loss w": (lambda m, x, t, w: _F(m).multilabel_soft_margin_loss(x, t, w, reduction="none"),
                                      (ROWS, PROBS, W4), (0, 1, 2)),
    "multi_margin_loss": (lambda m, x: _F(m).multi_margin_loss(x, _cls(m), reduction="none"), (ROWS,), (0,)),
    "multi_margin_loss p2 w": (lambda m, x, w: _F(m).multi_margin_loss(x, _cls(m), p=2, weight=w, reduction="none"),
                               (ROWS, W4), (0,)),
    "multilabel_margin_loss": (lambda m, x: _F(m).multilabel_margin_loss(x, _mlt(m), reduction="none"),
                               (ROWS,), (0,)),
    "triplet_margin_loss": (lambda m, a, p, n: _F(m).triplet_margin_loss(a, p, n, reduction="none"),
                            (ROWS, ROWS2, ROWS2.flip(0)), (0, 1, 2)),
    "triplet_margin_loss p1 swap": (lambda m, a, p, n: _F(m).triplet_margin_loss(a, p, n, p=1, swap=True,
                                                                                 reduction="none"),
                                    (ROWS, ROWS2, ROWS.flip(0)), (0, 1, 2)),
    "triplet_margin_with_distance_loss": (lambda m, a, p, n: _F(m).triplet_margin_with_distance_loss(
        a, p, n, reduction="none"), (ROWS, ROWS2, ROWS2.flip(0)), (0, 1, 2)),
    "triplet_with_cosine": (lambda m, a, p, n: _F(m).triplet_margin_with_distance_loss(
        a, p, n, distance_function=lambda x, y: 1 - _F(m).cosine_similarity(x, y), reduction="none"),
        (ROWS, ROWS2, ROWS2.flip(0)), (0, 1, 2)),
    # class losses
    "cross_entropy probs": (lambda m, x, t: _F(m).cross_entropy(x, t, reduction="none"), (ROWS, PROBS), (0, 1)),
    "cross_entropy probs mean": (lambda m, x, t: _F(m).cross_entropy(x, t), (ROWS, PROBS), (0, 1)),
    "cross_entropy probs ls w": (lambda m, x, t, w: _F(m).cross_entropy(x, t, w, label_smoothing=0.2,
                                                                        reduction="none"), (ROWS, PROBS, W4),
                                 (0, 1)),
    "cross_entropy ls": (lambda m, x: _F(m).cross_entropy(x, _cls(m), label_smoothing=0.2, reduction="none"),
                         (ROWS,), (0,)),
    "cross_entropy ls w mean": (lambda m, x, w: _F(m).cross_entropy(x, _cls(m), w, label_smoothing=0.2),
                                (ROWS, W4), (0,)),
    "cross_entropy w ignore": (lambda m, x, w: _F(m).cross_entropy(x, _cls(m), w, ignore_index=1), (ROWS, W4),
                               (0,)),
    "cross_entropy w ignore none": (lambda m, x, w: _F(m).cross_entropy(x, _cls(m), w, ignore_index=1,
                                                                        reduction="none"), (ROWS, W4), (0,)),
    "nll_loss": (lambda m, x: _F(m).nll_loss(x, _cls(m), reduction="none"), (ROWS,), (0,)),
    "nll_loss w mean": (lambda m, x, w: _F(m).nll_loss(x, _cls(m), w), (ROWS, W4), (0,)),
    "nll_loss zero total weight": (lambda m, x, w: _F(m).nll_loss(x, _cls(m), w * 0), (ROWS, W4), (0,)),
    "cross_entropy zero total weight": (lambda m, x, w: _F(m).cross_entropy(x, _cls(m), w * 0), (ROWS, W4), (0,)),
    "nll_loss w ignore": (lambda m, x, w: _F(m).nll_loss(x, _cls(m), w, ignore_index=0), (ROWS, W4), (0,)),
    # other multi-input functions
    "normalize": (lambda m, x: _F(m).normalize(x, dim=1), (ROWS,), (0,)),
    "normalize p1": (lambda m, x: _F(m).normalize(x, p=1, dim=1), (ROWS,), (0,)),
    "normalize pinf": (lambda m, x: _F(m).normalize(x, p=INF, dim=1), (ROWS,), (0,)),
    "cosine_similarity": (lambda m, a, b: _F(m).cosine_similarity(a, b), (ROWS, ROWS2), (0, 1)),
    "cosine_similarity self": (lambda m, a: _F(m).cosine_similarity(a, a), (ROWS,), (0,)),
    "pairwise_distance": (lambda m, a, b: _F(m).pairwise_distance(a, b), (ROWS, ROWS2), (0, 1)),
    "pairwise_distance p1": (lambda m, a, b: _F(m).pairwise_distance(a, b, p=1), (ROWS, ROWS2), (0, 1)),
    "pairwise_distance pinf": (lambda m, a, b: _F(m).pairwise_distance(a, b, p=INF), (ROWS, ROWS2), (0, 1)),
    "pairwise_distance eps0": (lambda m, a, b: _F(m).pairwise_distance(a, b, eps=0.0), (ROWS, ROWS2), (0, 1)),
    "cdist": (lambda m, a, b: m.cdist(a, b), (ROWS, ROWS2), (0, 1)),
    "cdist mm": (lambda m, a, b: m.cdist(a, b, compute_mode="use_mm_for_euclid_dist"), (ROWS[:3], ROWS2[:3]), (0, 1)),
    "cdist p1": (lambda m, a, b: m.cdist(a, b, p=1), (ROWS, ROWS2), (0, 1)),
    "cdist p3": (lambda m, a, b: m.cdist(a, b, p=3), (ROWS, ROWS2), (0, 1)),
    "cdist pinf": (lambda m, a, b: m.cdist(a, b, p=INF), (ROWS, ROWS2), (0, 1)),
    "cdist p0": (lambda m, a, b: m.cdist(a, b, p=0), (ROWS, ROWS2), (0, 1)),
    "cdist p0.5": (lambda m, a, b: m.cdist(a, b, p=0.5), (ROWS, ROWS2), (0, 1)),
    "pdist": (lambda m, x: _F(m).pdist(x), (ROWS,), (0,)),
    "pdist p1": (lambda m, x: _F(m).pdist(x, p=1), (ROWS,), (0,)),
    "pdist pinf": (lambda m, x: _F(m).pdist(x, p=INF), (ROWS,), (0,)),
    "pdist p3": (lambda m, x: _F(m).pdist(x, p=3), (ROWS,), (0,)),
    "layer_norm": (lambda m, x, w, b: _F(m).layer_norm(x, (4,), w, b), (ROWS, W4, W4.flip(0)), (0, 1, 2)),
    "rms_norm w": (lambda m, x, w: _F(m).rms_norm(x, (4,), w), (ROWS, W4), (0, 1)),
    "group_norm": (lambda m, x, w, b: _F(m).group_norm(x.reshape(5, 4, 2), 2, w, b), (ROWS, W4, W4.flip(0)),
                   (0, 1, 2)),
    "instance_norm": (lambda m, x: _F(m).instance_norm(x.reshape(5, 2, 4)), (ROWS,), (0,)),
    "batch_norm train": (lambda m, x, w, b: _F(m).batch_norm(x.t(), None, None, w[:1].expand(10) * 0 + 1,
                                                             b[:1].expand(10) * 0, training=True),
                         (ROWS, W4, W4), (0,)),
    "batch_norm train w": (lambda m, x, w, b: _F(m).batch_norm(x.reshape(5, 2, 4), None, None, w[:2], b[:2],
                                                               training=True), (ROWS, W4, W4.flip(0)), (0, 1, 2)),
    "batch_norm eval": (lambda m, x, rm, rv: _F(m).batch_norm(x, rm, rv.abs(), training=False),
                        (ROWS, W4, W4.flip(0)), (0,)),
    "softmax": (lambda m, x: m.softmax(x, 1), (ROWS,), (0,)),
    "log_softmax": (lambda m, x: m.log_softmax(x, 1), (ROWS,), (0,)),
    "logsumexp": (lambda m, x: m.logsumexp(x, 1), (ROWS,), (0,)),
    "sdpa -inf mask": (lambda m, q, k, v, msk: _F(m).scaled_dot_product_attention(
        q.reshape(1, 10, 4)[:, :4], k.reshape(1, 10, 4)[:, :4], v.reshape(1, 10, 4)[:, :4], attn_mask=msk),
        (Q, Q.flip(0), Q * 0.5 - 1, torch.tensor([[0.0, -INF, 0.0, 0.0], [-INF] * 4, [0.0] * 4,
                                                          [-INF, 0.0, -INF, -INF]], dtype=torch.float64)),
        (0, 1, 2)),
    "embedding max_norm": (lambda m, w: _F(m).embedding(_cls(m)[:6], w.clone(), max_norm=1.0), (ROWS2,), (0,)),
})


def _cls(m):
    return m.as_tensor(CLS) if m is flow else CLS


def _mlt(m):
    t = torch.tensor([[3, 0, -1, 1]] * 5 + [[1, 2, 3, 0]] * 5)
    return flow.as_tensor(t) if m is flow else t



def _rows(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(t.shape[0], -1) if t.dim() else t.reshape(1, 1)


# torch's own kernels disagree with its composites here; matching them is left (see the docstring)
# torch's margin kernels skip NaN hinge terms in the value and multiply the seed by the hinge mask
# in the backward (an infinite or NaN seed: NaN off the hinge); holoflow selects (0 there). Seeds of
# ones are compared; the non-finite ones are this documented difference
SEEDS = {"multi_margin_loss": (1.0,), "multi_margin_loss p2 w": (1.0,), "multilabel_margin_loss": (1.0,)}
KNOWN = {"pdist p1": "torch's _pdist_backward passes a NaN row's NaN on (torch's norm backward does not)",
         "pdist pinf": "torch's _pdist_backward gives NaN to every row paired with a NaN row"}


@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.xfail(reason=KNOWN[n], strict=True))
                                  if n in KNOWN else n for n in LOSSES])
def test_losses_on_special_values(name):
    fn, tensors, diff = LOSSES[name]
    tt = [t.clone().requires_grad_(i in diff) for i, t in enumerate(tensors)]
    ft = [flow.from_torch(t.clone()).requires_grad_(i in diff) for i, t in enumerate(tensors)]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        y = fn(torch, *tt)
        fy = fn(flow, *ft)
    got = fy.detach().to_torch()
    bad = [i for i in range(_rows(y).shape[0]) if not same_special(_rows(got)[i], _rows(y.detach())[i])]
    assert not bad, f"{name}: values differ at rows {bad[:6]}: torch {_rows(y.detach())[bad[:6]].tolist()}, " \
                    f"holoflow {_rows(got)[bad[:6]].tolist()}"
    for fill in SEEDS.get(name, (1.0, INF, NAN)):
        seed = torch.full(y.shape, fill, dtype=y.dtype)
        want = torch.autograd.grad(y, [tt[i] for i in diff], seed, retain_graph=True, allow_unused=True)
        got = flow.autograd.grad(fy, [ft[i] for i in diff], flow.from_torch(seed), retain_graph=True,
                                 allow_unused=True)
        for i, w, g in zip(diff, want, got):
            w = torch.zeros_like(tensors[i]) if w is None else w
            g = torch.zeros_like(tensors[i]) if g is None else g.to_torch()
            w2, g2 = _rows(w), _rows(g)
            bad = [j for j in range(w2.shape[0]) if not same_special(g2[j], w2[j])]
            inputs = [_rows(t)[bad[:4]].tolist() for t in tensors if _rows(t).shape[0] == w2.shape[0]] if bad else None
            assert not bad, (f"{name}, seed {fill}, d/dinput{i}: rows {bad[:8]} of {w2.shape[0]}; inputs {inputs}: "
                             f"torch {w2[bad[:4]].tolist()}, holoflow {g2[bad[:4]].tolist()}")

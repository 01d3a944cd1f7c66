"""ops/sampling.py, ops/pool3d.py, ops/sequence.py and bicubic interpolate vs torch.nn.functional:
grid_sample, unfold/fold, 3-d pooling, embedding_bag, ctc_loss; forward + backward, gradcheck,
SBP rules on simulated ranks."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
import holoflow.nn.functional as HF
from harness import BF16, F32, F64, Case, parametrize, randn

ALL = (F32, F64, BF16)


def _same(name, kw, make, tag="", **opts):
    return Case(f"{name}{kw or ''}{tag}", lambda *a, n=name, k=kw, **kk: getattr(HF, n)(*a, **k, **kk),
                lambda *a, n=name, k=kw, **kk: getattr(F, n)(*a, **k, **kk), make, **opts)


def _x(*shape):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt),), {})


CASES = []
# -- grid_sample ----------------------------------------------------------------------------------
def _grid(xs, gs, scale=1.1):
    return lambda dt, g: ((randn(*xs, gen=g, dtype=dt), (torch.rand(*gs, generator=g, dtype=torch.float64) * 2 - 1)
                           .mul(scale).to(dt)), {})


for mode in ("bilinear", "nearest", "bicubic"):
    for pad in ("zeros", "border", "reflection"):
        for ac in (False, True):
            CASES.append(_same("grid_sample", {"mode": mode, "padding_mode": pad, "align_corners": ac},
                               _grid((2, 3, 5, 4), (2, 3, 6, 2)), gradcheck=mode != "nearest"))
CASES.append(_same("grid_sample", {"align_corners": False}, _grid((2, 2, 3, 4, 5), (2, 2, 3, 2, 3)), "-5d"))
CASES.append(_same("grid_sample", {"align_corners": False}, _grid((0, 2, 3, 4), (0, 2, 2, 2)), "-empty"))

# -- unfold / fold -------------------------------------------------------------------------------------
for kw, shape in [({"kernel_size": 2}, (2, 3, 4, 5)), ({"kernel_size": (2, 3), "stride": 2, "padding": 1}, (2, 2, 5, 6)),
                  ({"kernel_size": 3, "dilation": 2, "padding": 2}, (1, 2, 5, 5)), ({"kernel_size": 2}, (3, 4, 4))]:
    CASES.append(_same("unfold", kw, _x(*shape), list(shape), dtypes=ALL))
for kw, shape in [({"output_size": (4, 5), "kernel_size": 2}, (2, 12, 12)),
                  ({"output_size": 5, "kernel_size": (2, 3), "stride": 2, "padding": 1}, (2, 12, 9)),
                  ({"output_size": (4, 4), "kernel_size": 2}, (8, 9))]:
    CASES.append(_same("fold", kw, _x(*shape), list(shape), dtypes=ALL))

# -- 3-d pooling -------------------------------------------------------------------------------------
for kw, shape in [({"kernel_size": 2}, (2, 3, 4, 4, 4)), ({"kernel_size": (2, 3, 2), "stride": 1, "padding": 1},
                                                           (1, 2, 3, 4, 5)),
                  ({"kernel_size": 3, "stride": 2, "ceil_mode": True}, (2, 5, 5, 5)),
                  ({"kernel_size": 2, "dilation": 2}, (1, 2, 5, 5, 5)),
                  # one value for all three dims, as ATen expands it (it was a ValueError)
                  ({"kernel_size": (2,), "stride": (1,), "padding": [1], "dilation": (1,)}, (1, 2, 3, 4, 5))]:
    CASES.append(_same("max_pool3d", kw, _x(*shape), list(shape), dtypes=ALL, gradcheck=False))
    kw = {k: v for k, v in kw.items() if k != "dilation"}
    CASES.append(_same("avg_pool3d", kw, _x(*shape), list(shape)))  # no bf16 avg_pool3d in torch on CPU
CASES.append(_same("avg_pool3d", {"kernel_size": 3, "padding": 1, "count_include_pad": False, "divisor_override": 5},
                   _x(2, 2, 4, 4, 4)))
CASES.append(Case("max_pool3d-indices", lambda x: tuple(HF.max_pool3d(x, 2, return_indices=True)),
                  lambda x: tuple(F.max_pool3d(x, 2, return_indices=True)), _x(2, 3, 4, 4, 4), gradcheck=False))
for size, shape in [(2, (2, 3, 5, 6, 7)), ((1, None, 3), (2, 4, 4, 4)), ((3, 2, 1), (1, 2, 6, 4, 5))]:
    CASES.append(_same("adaptive_avg_pool3d", {"output_size": size}, _x(*shape), list(shape), dtypes=ALL))

# -- bicubic interpolate ----------------------------------------------------------------------------------
for kw in [{"scale_factor": 2, "mode": "bicubic"}, {"size": (5, 7), "mode": "bicubic", "align_corners": True},
           {"scale_factor": 0.5, "mode": "bicubic", "align_corners": False}]:
    CASES.append(_same("interpolate", kw, _x(2, 3, 4, 6), dtypes=ALL))


# -- embedding_bag ------------------------------------------------------------------------------------------
def _bag(idx_shape, n=7, d=4, offsets=None, psw=False):
    def make(dt, g):
        idx = torch.randint(0, n, idx_shape, generator=g)
        args = [idx, randn(n, d, gen=g, dtype=dt)]
        kw = {}
        if offsets is not None:
            kw["offsets"] = torch.tensor(offsets)
        if psw:
            kw["per_sample_weights"] = randn(*idx_shape, gen=g, dtype=dt)
        return tuple(args), kw
    return make


for mode in ("sum", "mean", "max"):
    CASES.append(_same("embedding_bag", {"mode": mode}, _bag((3, 5)), "-2d", gradcheck=mode != "max"))
    CASES.append(_same("embedding_bag", {"mode": mode}, _bag((9,), offsets=[0, 2, 2, 6]), "-offsets-empty-bag",
                       gradcheck=mode != "max"))
    CASES.append(_same("embedding_bag", {"mode": mode, "include_last_offset": True}, _bag((9,), offsets=[0, 3, 5, 9]),
                       "-last-offset", gradcheck=mode != "max"))
    CASES.append(_same("embedding_bag", {"mode": mode, "padding_idx": 2}, _bag((4, 6), n=4), "-padding",
                       gradcheck=mode != "max"))
CASES.append(_same("embedding_bag", {"mode": "sum"}, _bag((3, 5), psw=True), "-psw-2d"))
CASES.append(_same("embedding_bag", {"mode": "sum"}, _bag((8,), offsets=[0, 3, 3], psw=True), "-psw-offsets"))
CASES.append(_same("embedding_bag", {"mode": "mean", "scale_grad_by_freq": True}, _bag((3, 5), n=4), "-freq",
                   gradcheck=False))  # the frequency scaling is a deliberate non-gradient, as in torch


# -- ctc_loss ----------------------------------------------------------------------------------------------
def _ctc(T=12, N=3, C=5, S=4, flat=False, lists=False, impossible=False):
    def make(dt, g):
        lp = torch.randn(T, N, C, generator=g, dtype=torch.float64).to(dt)  # logits: see _ctc_case
        tl = torch.randint(1, S + 1, (N,), generator=g)
        il = torch.full((N,), T, dtype=torch.int64) - torch.arange(N)
        if impossible:
            tl[0], il[0] = S, 2
        tg = torch.randint(1, C, (N, S), generator=g)
        if flat:
            tg = torch.cat([tg[i, :tl[i]] for i in range(N)])
        if lists:
            il, tl = tuple(il.tolist()), tuple(tl.tolist())
        return (lp, tg, il, tl), {}
    return make


def _ctc_case(kw, make, tag, **opts):
    """ATen's CTC gradient is the gradient w.r.t. the logits behind normalized log-probs (it
    assumes ``log_softmax``), so the case applies ``log_softmax`` first: then the composite's
    gradient is a true gradient and finite differences check it."""
    return Case(f"ctc_loss{kw}{tag}", lambda x, *a: HF.ctc_loss(x.log_softmax(-1), *a, **kw),
                lambda x, *a: F.ctc_loss(x.log_softmax(-1), *a, **kw), make, **opts)


for red in ("mean", "sum", "none"):
    CASES.append(_ctc_case({"reduction": red}, _ctc(), "-padded"))
    CASES.append(_ctc_case({"reduction": red, "blank": 0}, _ctc(flat=True), "-flat"))
CASES.append(_ctc_case({"reduction": "mean"}, _ctc(lists=True), "-lists"))
CASES.append(_ctc_case({"reduction": "none", "zero_infinity": True}, _ctc(impossible=True), "-zero-inf",
                       gradcheck=False))  # the zeroed infinite loss is flat; finite differences see inf
CASES.append(_ctc_case({"reduction": "sum", "blank": 4}, _ctc(C=5), "-blank4"))
globals().update(parametrize(CASES))


def test_bad_inputs_are_clear():
    with pytest.raises(ValueError, match="grid_sample.*\\(2, 3, 4\\)"):
        HF.grid_sample(flow.randn(2, 3, 4), flow.randn(2, 3, 3, 2))
    with pytest.raises(NotImplementedError, match="embedding_bag.*per_sample_weights.*mode=.sum."):
        HF.embedding_bag(flow.tensor([[0, 1]]), flow.randn(3, 2), mode="mean", per_sample_weights=flow.randn(1, 2))
    with pytest.raises(ValueError, match="embedding_bag: offsets"):
        HF.embedding_bag(flow.tensor([0, 1]), flow.randn(3, 2))
    with pytest.raises(ValueError, match="max_pool3d.*\\(2, 3\\)"):
        HF.max_pool3d(flow.randn(2, 3), 2)
    with pytest.raises(ValueError, match="unfold.*\\(2, 3\\)"):
        HF.unfold(flow.randn(2, 3), 2)


def test_ops_trace_in_graph_mode():
    x, grid = torch.randn(2, 3, 4, 4, dtype=torch.float64), torch.rand(2, 3, 3, 2, dtype=torch.float64) * 2 - 1
    lp = torch.randn(6, 2, 4, dtype=torch.float64).log_softmax(-1)
    tg, il, tl = torch.tensor([[1, 2], [3, 3]]), torch.tensor([6, 5]), torch.tensor([2, 1])
    idx, w = torch.tensor([[0, 2, 1], [3, 3, 0]]), torch.randn(5, 3, dtype=torch.float64)

    def body(lib, x, grid, lp, tg, il, tl, idx, w):
        Fn = lib.nn.functional
        return (Fn.grid_sample(x, grid, align_corners=False).sum() + Fn.fold(Fn.unfold(x, 2), (4, 4), 2).sum()
                + Fn.max_pool3d(x.unsqueeze(2).expand(2, 3, 2, 4, 4), 2).sum() + Fn.ctc_loss(lp, tg, il, tl)
                + Fn.embedding_bag(idx, w).sum() + Fn.interpolate(x, scale_factor=2, mode="bicubic").sum())

    class G(flow.nn.Graph):
        def build(self, *a):
            return body(flow, *a)

    args = (x, grid, lp, tg, il, tl, idx, w)
    got = G()(*[flow.from_torch(a.clone()) for a in args])
    torch.testing.assert_close(got.to_torch(), body(torch, *args))

"""The nn.functional ops that were ops/nn_extra.py (now ops/dropout, activation, pooling, ...) vs
torch.nn.functional: channel/alpha dropout, small activations, 1-D and adaptive pooling, pixel
(un)shuffle, bilinear, distances, local response norm and the margin / NLL losses; forward + backward,
gradcheck, SBP rules on simulated ranks."""
import pytest
import torch
import torch.nn.functional as F

import holoflow as flow
import holoflow.nn.functional as HF
from harness import BF16, F32, F64, Case, check_sbp, parametrize, positive, randn

ALL = (F32, F64, BF16)


def _x(*shape, scale=1.0):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt) * scale,), {})


def _same(name, kw, make, tag="", **opts):
    """A case calling ``F.<name>(*args, **kw)`` under both libraries."""
    return Case(f"{name}{kw or ''}{tag}", lambda *a, n=name, k=kw: getattr(HF, n)(*a, **k),
                lambda *a, n=name, k=kw: getattr(F, n)(*a, **k), make, **opts)


CASES = []
# -- activations (kinks: gradcheck only where smooth) -----------------------------------------------
for name, kw, smooth in [("softsign", {}, True), ("tanhshrink", {}, True), ("celu", {}, True),
                         ("celu", {"alpha": 0.5}, True), ("softshrink", {}, False),
                         ("softshrink", {"lambd": 1.2}, False), ("hardshrink", {}, False),
                         ("hardshrink", {"lambd": 0.1}, False),
                         ("hardshrink", {"lambd": -0.5}, False)]:   # (torch keeps every x; it was refused)
    for shape in [(4, 5), (0, 3), (2, 3, 4)]:
        CASES.append(_same(name, kw, _x(*shape, scale=2.0), list(shape), dtypes=ALL, gradcheck=smooth))


def _prelu(shape, n):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt), randn(n, gen=g, dtype=dt) * 0.3), {})


CASES += [
    _same("prelu", {}, _prelu((2, 3, 4), 3), "-c3", dtypes=ALL, gradcheck=False),  # kink at 0
    _same("prelu", {}, _prelu((2, 3, 4, 2), 1), "-shared", gradcheck=False),
    _same("prelu", {}, _prelu((5,), 1), "-1d", gradcheck=False),
    _same("prelu", {}, _prelu((0, 3), 3), "-empty", gradcheck=False),
    _same("glu", {}, _x(3, 6), dtypes=ALL),
    _same("glu", {"dim": 1}, _x(2, 4, 3)),
    _same("glu", {"dim": 0}, _x(2, 0)),
]

# -- dropout variants: same draws under one seed ------------------------------------------------------
DROPS = [("dropout1d", (2, 3, 5)), ("dropout1d", (3, 5)), ("dropout2d", (2, 3, 4, 4)),
         ("dropout3d", (2, 3, 2, 2, 2)), ("dropout3d", (3, 2, 2, 2)), ("alpha_dropout", (4, 6)),
         ("feature_alpha_dropout", (2, 4, 3))]
for name, shape in DROPS:
    for p in (0.3, 1.0):
        CASES.append(_same(name, {"p": p, "training": True}, _x(*shape), list(shape), random=True))
CASES += [_same("dropout2d", {"p": 0.5, "training": False}, _x(2, 3, 4, 4)),
          _same("alpha_dropout", {"p": 0.5}, _x(2, 3)),  # training defaults to False: identity
          _same("dropout2d", {"p": 0.0, "training": True}, _x(2, 3, 4, 4))]

# -- pooling --------------------------------------------------------------------------------------------
POOL1D = [("max_pool1d", {"kernel_size": 2}), ("max_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1}),
          ("max_pool1d", {"kernel_size": 2, "dilation": 2, "ceil_mode": True}),
          ("avg_pool1d", {"kernel_size": 2}), ("avg_pool1d", {"kernel_size": 3, "stride": 2, "padding": 1,
                                                              "count_include_pad": False}),
          ("avg_pool1d", {"kernel_size": (3,), "stride": (1,), "ceil_mode": True}),
          ("adaptive_avg_pool1d", {"output_size": 3}), ("adaptive_avg_pool1d", {"output_size": 1}),
          ("adaptive_max_pool1d", {"output_size": 3}), ("adaptive_max_pool1d", {"output_size": 4,
                                                                                "return_indices": True}),
          ("max_pool1d", {"kernel_size": 3, "return_indices": True})]
for name, kw in POOL1D:
    for shape in [(2, 3, 9), (3, 7)]:
        CASES.append(_same(name, kw, _x(*shape), list(shape), dtypes=ALL, gradcheck="max" not in name))
for kw in [{"output_size": 2}, {"output_size": (3, 2)}, {"output_size": (None, 3)},
           {"output_size": (2, 4), "return_indices": True}]:
    for shape in [(2, 3, 5, 7), (3, 6, 5)]:
        CASES.append(_same("adaptive_max_pool2d", kw, _x(*shape), list(shape), dtypes=ALL,
                           gradcheck=False))  # max: not smooth where windows tie
CASES.append(_same("adaptive_max_pool2d", {"output_size": 2}, _x(0, 3, 4, 4), "-empty"))

# -- pixel shuffle, bilinear, distances, local response norm --------------------------------------------
CASES += [
    _same("pixel_shuffle", {"upscale_factor": 2}, _x(2, 8, 3, 3), "-4d", dtypes=ALL),
    _same("pixel_shuffle", {"upscale_factor": 3}, _x(9, 2, 2), "-3d"),
    _same("pixel_shuffle", {"upscale_factor": 2}, _x(2, 1, 4, 2, 3), "-5d"),
    _same("pixel_unshuffle", {"downscale_factor": 2}, _x(2, 2, 4, 6), dtypes=ALL),
    _same("pixel_unshuffle", {"downscale_factor": 3}, _x(1, 3, 3)),
]


def _bilinear(lead, i1, i2, o, bias=True):
    def make(dt, g):
        b = randn(o, gen=g, dtype=dt) if bias else None
        return (randn(*lead, i1, gen=g, dtype=dt), randn(*lead, i2, gen=g, dtype=dt),
                randn(o, i1, i2, gen=g, dtype=dt) * 0.3, b), {}
    return make


CASES += [_same("bilinear", {}, _bilinear((4,), 3, 5, 2), "-2d", dtypes=ALL),
          _same("bilinear", {}, _bilinear((2, 3), 2, 4, 3, bias=False), "-3d-nobias"),
          _same("bilinear", {}, _bilinear((0,), 2, 2, 3), "-empty")]


def _pair(s1, s2):
    return lambda dt, g: ((randn(*s1, gen=g, dtype=dt), randn(*s2, gen=g, dtype=dt)), {})


for kw in [{}, {"p": 1.0}, {"p": 3.0, "keepdim": True}, {"eps": 0.1}]:
    CASES.append(_same("pairwise_distance", kw, _pair((4, 5), (4, 5)), dtypes=(F32, F64),
                       gradcheck=kw.get("p") != 1.0))
CASES += [_same("pairwise_distance", {}, _pair((3, 4), (1, 4)), "-broadcast"),
          _same("pairwise_distance", {}, _pair((6,), (6,)), "-1d")]
for kw, shape in [({"size": 3}, (2, 5, 4)), ({"size": 2, "alpha": 0.1, "beta": 0.5, "k": 2.0}, (2, 4, 3, 3)),
                  ({"size": 4}, (1, 3, 2, 2, 2))]:
    # torch's 4-D+ path runs avg_pool3d, which has no bfloat16 kernel on CPU
    CASES.append(_same("local_response_norm", kw, _x(*shape), list(shape), dtypes=ALL if len(shape) == 3 else (F32, F64)))


# -- losses -----------------------------------------------------------------------------------------------
def _ranking(n):
    def make(dt, g):
        t = torch.randint(0, 2, (n,), generator=g).to(dt) * 2 - 1
        return (randn(n, gen=g, dtype=dt), randn(n, gen=g, dtype=dt), t), {}
    return make


def _cos_emb(lead, d):
    def make(dt, g):
        t = (torch.randint(0, 2, lead, generator=g) * 2 - 1).to(dt)
        return (randn(*lead, d, gen=g, dtype=dt), randn(*lead, d, gen=g, dtype=dt), t), {}
    return make


def _gauss(shape, vshape, scalar_var=False):
    def make(dt, g):
        var = 0.7 if scalar_var else positive(*vshape, gen=g, dtype=dt)
        return (randn(*shape, gen=g, dtype=dt), randn(*shape, gen=g, dtype=dt), var), {}
    return make


def _poisson(shape, log_input=True):
    def make(dt, g):
        x = randn(*shape, gen=g, dtype=dt) if log_input else positive(*shape, gen=g, dtype=dt)
        return (x, positive(*shape, gen=g, dtype=dt) * 3), {}
    return make


for red in ("mean", "sum", "none"):
    CASES += [
        _same("margin_ranking_loss", {"margin": 0.3, "reduction": red}, _ranking(7), gradcheck=False),  # hinge
        _same("cosine_embedding_loss", {"margin": 0.2, "reduction": red}, _cos_emb((5,), 4), gradcheck=False),
        _same("gaussian_nll_loss", {"reduction": red}, _gauss((4, 3), (4, 3)), dtypes=ALL),
        _same("poisson_nll_loss", {"reduction": red}, _poisson((3, 4)), dtypes=ALL),
    ]
CASES += [
    _same("margin_ranking_loss", {}, _ranking(0), "-empty", gradcheck=False),  # mean of nothing is nan
    _same("cosine_embedding_loss", {}, _cos_emb((), 6), "-0d-target", gradcheck=False),
    _same("gaussian_nll_loss", {"full": True}, _gauss((4, 3), (4,)), "-var-short"),
    _same("gaussian_nll_loss", {"eps": 0.8}, _gauss((2, 3, 2), (2, 1, 2)), "-var-bcast"),
    _same("gaussian_nll_loss", {}, _gauss((4, 3), (), scalar_var=True), "-float-var"),
    _same("poisson_nll_loss", {"log_input": False, "full": True}, _poisson((3, 4), log_input=False)),
    _same("poisson_nll_loss", {"full": True, "eps": 1e-3}, _poisson((5,))),
]

globals().update(parametrize(CASES))


# -- backward ops, errors and module-level behaviour --------------------------------------------------------
def test_adaptive_max_pool2d_backward_sbp_rules():
    """The grad rule is a scatter_add: its ops' signatures are validated when backward dispatches."""
    def run(x):
        x = x.detach().requires_grad_()
        with flow.enable_grad():
            out = HF.adaptive_max_pool2d(x, (2, 3))
            return flow.autograd.grad([out], [x], [flow.ones_like(out) * 0.5])
    check_sbp(Case("bwd-adaptive_max_pool2d", run, None, _x(3, 3, 5, 4)))
    check_sbp(Case("bwd-adaptive_max_pool2d-one-channel", run, None, _x(3, 1, 5, 4)))  # an empty shard


def test_adaptive_max_pool2d_double_backward_matches_torch():
    x = torch.randn(2, 3, 5, 4, dtype=torch.float64)
    tx, fx = x.clone().requires_grad_(), flow.from_torch(x.clone()).requires_grad_()
    (tg,) = torch.autograd.grad(F.adaptive_max_pool2d(tx, 2).pow(2).sum(), tx, create_graph=True)
    (fg,) = flow.autograd.grad([(HF.adaptive_max_pool2d(fx, 2) ** 2).sum()], [fx], create_graph=True)
    (tgg,) = torch.autograd.grad((tg * tg).sum(), tx)
    (fgg,) = flow.autograd.grad([(fg * fg).sum()], [fx])
    torch.testing.assert_close(fgg.to_torch(), tgg)


@pytest.mark.parametrize("name, shape, kw", [
    ("max_pool2d", (2, 3, 5, 4), dict(kernel_size=2)),
    ("max_pool2d", (3, 7, 6), dict(kernel_size=3, stride=2, padding=1, dilation=1, ceil_mode=True)),
    ("max_pool2d", (2, 2, 7, 7), dict(kernel_size=2, dilation=2)),
    ("max_pool1d", (2, 3, 9), dict(kernel_size=3, stride=2)),
    ("max_pool3d", (2, 2, 4, 5, 4), dict(kernel_size=2, padding=1)),
])
def test_max_pool_double_backward_matches_torch(name, shape, kw):
    """max pooling's backward scatters dy to the argmax: its own derivative gathers at the indices
    (a gradient penalty through a CNN with max pooling)."""
    x = torch.randn(*shape, dtype=torch.float64)
    tx, fx = x.clone().requires_grad_(), flow.from_torch(x.clone()).requires_grad_()
    res = []
    for lib, fns, xs in ((torch, F, tx), (flow, HF, fx)):
        (g,) = lib.autograd.grad((getattr(fns, name)(xs, **kw) ** 3).sum(), xs, create_graph=True)
        res.append(lib.autograd.grad((g * g.sin()).sum(), xs))
    torch.testing.assert_close(res[1][0].to_torch(), res[0][0])


@pytest.mark.parametrize("call, match", [
    (lambda: HF.glu(flow.randn(2, 5)), r"glu: halving dimension must be even.*\(2, 5\)"),
    (lambda: HF.prelu(flow.randn(2, 3), flow.randn(4)), r"prelu: weight of 4 entries needs 4 channels"),
    (lambda: HF.pixel_shuffle(flow.randn(1, 6, 2, 2), 2), r"pixel_shuffle.*\(1, 6, 2, 2\)"),
    (lambda: HF.pixel_unshuffle(flow.randn(1, 1, 3, 4), 2), r"pixel_unshuffle.*divisible by 2"),
    (lambda: HF.max_pool1d(flow.randn(2, 3, 4, 5), 2), r"max_pool1d: expected a 2-D .* or 3-D"),
    (lambda: HF.dropout1d(flow.randn(2, 3, 4, 5)), r"dropout1d: expected a 2-D"),
    (lambda: HF.bilinear(flow.randn(3, 2), flow.randn(3, 4), flow.randn(5, 2, 3)), r"bilinear.*\(5, 2, 3\)"),
    (lambda: HF.cosine_embedding_loss(flow.randn(3, 4), flow.randn(3, 4), flow.ones(3, 1)), r"1-D target"),
    (lambda: HF.gaussian_nll_loss(flow.randn(3, 4), flow.randn(3, 4), flow.ones(2, 4)), r"var of shape \(2, 4\)"),
    (lambda: HF.gaussian_nll_loss(flow.randn(3), flow.randn(3), -flow.ones(3)), r"negative"),
    (lambda: HF.alpha_dropout(flow.randn(3), 1.5, True), r"p must be in \[0, 1\]"),
    (lambda: HF.margin_ranking_loss(flow.randn(3), flow.randn(3), flow.ones(3), reduction="avg"), r"reduction"),
])
def test_clear_errors(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_inplace_forms_write_the_input():
    x = torch.randn(3, 4)
    fx = flow.from_torch(x.clone())
    assert HF.celu(fx, 0.5, inplace=True) is fx
    torch.testing.assert_close(fx.to_torch(), F.celu(x, 0.5))
    fx, tx = flow.from_torch(x.clone()), x.clone()
    flow.manual_seed(3)
    HF.dropout1d(fx, 0.5, True, inplace=True)
    torch.manual_seed(3)
    F.dropout1d(tx, 0.5, True, inplace=True)
    torch.testing.assert_close(fx.to_torch(), tx)


def test_channel_dropout_zeroes_whole_channels():
    out = HF.dropout2d(flow.ones(8, 16, 3, 3), 0.5, True).to_torch()
    per_channel = out.flatten(2)
    assert torch.all(per_channel.amin(-1) == per_channel.amax(-1))
    assert set(per_channel.unique().tolist()) == {0.0, 2.0}

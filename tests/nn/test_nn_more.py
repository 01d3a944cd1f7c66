"""Layers of nn/modules/more.py, each against its torch twin with copied weights: outputs, input
and parameter gradients (float64), reprs, lazy initialisation and torch's exception classes."""
import pytest
import torch

import holoflow as flow
from holoflow import nn
from harness import error_like_torch

from .helpers import compare, twin


def r(*shape, low=None):
    def make(g):
        t = torch.randn(*shape, generator=g, dtype=torch.float64)
        return t if low is None else t.abs() + low
    return make


def ints(high, *shape):
    return lambda g: torch.randint(0, high, shape, generator=g)


def pm1(*shape):
    return lambda g: torch.randint(0, 2, shape, generator=g) * 2 - 1


def distinct(*shape):
    def make(g):
        n = torch.Size(shape).numel()
        return torch.randperm(n, generator=g).double().reshape(shape) / n
    return make


def _weight(lib):
    return (flow if lib is nn else torch).tensor([0.5, 1.0, 2.0, 1.5])


LAYERS = {
    "hardshrink": (lambda l: l.Hardshrink(0.3), [r(3, 4)]),
    "softshrink": (lambda l: l.Softshrink(), [r(3, 4)]),
    "threshold": (lambda l: l.Threshold(0.1, -2.0), [r(3, 4)]),
    "rrelu-eval": (lambda l: l.RReLU(0.1, 0.3).eval(), [r(3, 4)]),
    "softmax2d": (lambda l: l.Softmax2d(), [r(2, 3, 2, 2)]),
    "softmax2d-3d": (lambda l: l.Softmax2d(), [r(3, 2, 2)]),
    "channelshuffle": (lambda l: l.ChannelShuffle(2), [r(2, 4, 3, 3)]),
    "localresponsenorm": (lambda l: l.LocalResponseNorm(3, 0.5, 0.6, 1.5), [r(2, 5, 3, 3)]),
    "lppool1d": (lambda l: l.LPPool1d(2, 3, 2), [r(2, 3, 9)]),
    "lppool2d": (lambda l: l.LPPool2d(1.5, 2), [r(2, 3, 4, 4, low=0.2)]),
    "lppool3d": (lambda l: l.LPPool3d(2, (2, 2, 1)), [r(1, 2, 4, 4, 3)]),
    "adaptivemaxpool3d": (lambda l: l.AdaptiveMaxPool3d((2, 1, 3)), [distinct(2, 3, 4, 4, 5)]),
    "instancenorm3d": (lambda l: l.InstanceNorm3d(3, affine=True), [r(2, 3, 2, 3, 2)]),
    "instancenorm3d-unbatched": (lambda l: l.InstanceNorm3d(3), [r(3, 2, 3, 2)]),
    "featurealphadropout-eval": (lambda l: l.FeatureAlphaDropout(0.3).eval(), [r(2, 3, 4)]),
    "constantpad3d": (lambda l: l.ConstantPad3d((1, 0, 2, 1, 0, 1), 0.5), [r(1, 2, 2, 3, 2)]),
    "zeropad3d": (lambda l: l.ZeroPad3d(1), [r(1, 2, 2, 2, 2)]),
    "reflectionpad3d": (lambda l: l.ReflectionPad3d((1, 1, 2, 0, 1, 1)), [r(1, 2, 3, 3, 3)]),
    "replicationpad3d": (lambda l: l.ReplicationPad3d(1), [r(2, 2, 2, 3)]),
    "circularpad1d": (lambda l: l.CircularPad1d((1, 2)), [r(2, 3, 4)]),
    "circularpad2d": (lambda l: l.CircularPad2d(1), [r(1, 2, 3, 3)]),
    "circularpad3d": (lambda l: l.CircularPad3d((1, 0, 0, 1, 1, 1)), [r(1, 1, 2, 3, 3)]),
    "hingeembeddingloss": (lambda l: l.HingeEmbeddingLoss(0.5), [r(4, 3), pm1(4, 3)]),
    "multimarginloss": (lambda l: l.MultiMarginLoss(), [r(5, 4), ints(4, 5)]),
    "multimarginloss-p2-weight": (lambda l: l.MultiMarginLoss(2, 0.7, _weight(l), reduction="none"),
                                  [r(5, 4), ints(4, 5)]),
    "multilabelmarginloss": (lambda l: l.MultiLabelMarginLoss(),
                             [r(2, 4), lambda g: torch.tensor([[3, 0, -1, 2], [1, -1, 0, 0]])]),
    "multilabelsoftmarginloss": (lambda l: l.MultiLabelSoftMarginLoss(reduction="sum"),
                                 [r(3, 4), lambda g: torch.randint(0, 2, (3, 4), generator=g).double()]),
    "tripletmarginloss": (lambda l: l.TripletMarginLoss(0.5, swap=True), [r(4, 3), r(4, 3), r(4, 3)]),
    "tripletmarginwithdistanceloss": (lambda l: l.TripletMarginWithDistanceLoss(margin=2.0),
                                      [r(4, 3), r(4, 3), r(4, 3)]),
}


@pytest.mark.parametrize("name", list(LAYERS))
def test_layer_matches_torch(name):
    make, inputs = LAYERS[name]
    fm, tm = twin(lambda: make(nn), lambda: make(torch.nn), torch.float64)
    g = torch.Generator().manual_seed(0)
    compare(fm, tm, [f(g) for f in inputs], torch.float64)
    assert repr(fm) == repr(tm)


@pytest.mark.parametrize("k", [1, 2, 3])
def test_max_unpool_layers_invert_max_pool_like_torch(k):
    shape = (2, 3) + (4,) * k
    x = torch.randperm(torch.Size(shape).numel()).double().reshape(shape)
    outs = []
    for lib in (flow, torch):
        xs = flow.from_torch(x) if lib is flow else x
        pool = getattr(lib.nn, f"MaxPool{k}d")(2, return_indices=True)
        unpool = getattr(lib.nn, f"MaxUnpool{k}d")(2)
        v, i = pool(xs)
        v = v.detach().requires_grad_(True)
        out = unpool(v, i, output_size=xs.shape)
        (out * out).sum().backward()
        outs += [out, v.grad]
        assert repr(unpool) == repr(getattr(torch.nn, f"MaxUnpool{k}d")(2))
    torch.testing.assert_close(outs[0].to_torch(), outs[2])
    torch.testing.assert_close(outs[1].to_torch(), outs[3])


def test_fractional_max_pool_layer_like_torch():
    x = torch.randperm(2 * 3 * 49).double().reshape(2, 3, 7, 7)
    for make in (lambda l: l.FractionalMaxPool2d(3, output_ratio=(0.5, 0.5), return_indices=True),
                 lambda l: l.FractionalMaxPool2d(2, output_size=4)):
        flow.manual_seed(4)
        got = make(nn)(flow.from_torch(x))
        torch.manual_seed(4)
        want = make(torch.nn)(x)
        for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            torch.testing.assert_close(a.to_torch(), b)


def test_rrelu_and_feature_alpha_dropout_draw_like_torch():
    x = torch.randn(3, 4, 5, dtype=torch.float64)
    for make in (lambda l: l.RReLU(), lambda l: l.FeatureAlphaDropout(0.4)):
        flow.manual_seed(2)
        got = make(nn)(flow.from_torch(x.clone()))
        torch.manual_seed(2)
        want = make(torch.nn)(x.clone())
        torch.testing.assert_close(got.to_torch(), want)


# -- lazy layers ---------------------------------------------------------------------------------------

LAZY = {
    "LazyLinear": (lambda l: l.LazyLinear(3), (4, 5), "Linear"),
    "LazyLinear-nobias": (lambda l: l.LazyLinear(2, bias=False), (2, 3, 4), "Linear"),
    "LazyConv1d": (lambda l: l.LazyConv1d(4, 3, padding=1), (2, 3, 6), "Conv1d"),
    "LazyConv2d": (lambda l: l.LazyConv2d(4, 2, groups=2), (2, 6, 4, 4), "Conv2d"),
    "LazyConv3d-unbatched": (lambda l: l.LazyConv3d(2, 2), (3, 3, 3, 3), "Conv3d"),
    "LazyConvTranspose1d": (lambda l: l.LazyConvTranspose1d(4, 3, stride=2), (2, 3, 5), "ConvTranspose1d"),
    "LazyConvTranspose2d": (lambda l: l.LazyConvTranspose2d(2, 2, groups=2), (1, 4, 3, 3), "ConvTranspose2d"),
    "LazyConvTranspose3d": (lambda l: l.LazyConvTranspose3d(2, 2), (1, 3, 2, 2, 2), "ConvTranspose3d"),
    "LazyBatchNorm1d": (lambda l: l.LazyBatchNorm1d(), (4, 3), "BatchNorm1d"),
    "LazyBatchNorm2d": (lambda l: l.LazyBatchNorm2d(momentum=0.3), (2, 3, 2, 2), "BatchNorm2d"),
    "LazyBatchNorm3d-noaffine": (lambda l: l.LazyBatchNorm3d(affine=False), (2, 3, 2, 2, 2), "BatchNorm3d"),
    # holoflow's F.instance_norm has no running statistics (UnsupportedError), so not torch's default here
    "LazyInstanceNorm1d": (lambda l: l.LazyInstanceNorm1d(track_running_stats=False), (2, 3, 5), "InstanceNorm1d"),
    "LazyInstanceNorm2d": (lambda l: l.LazyInstanceNorm2d(bias=False, track_running_stats=False), (2, 3, 3, 3),
                           "InstanceNorm2d"),
    "LazyInstanceNorm3d": (lambda l: l.LazyInstanceNorm3d(track_running_stats=False), (2, 3, 2, 2, 2),
                           "InstanceNorm3d"),
}


@pytest.mark.parametrize("name", list(LAZY))
def test_lazy_layer_initialises_and_becomes_its_class_like_torch(name):
    make, shape, cls = LAZY[name]
    fm, tm = make(nn).double(), make(torch.nn).double()
    assert fm.has_uninitialized_params()
    assert sorted(n for n, _ in fm.named_parameters()) == sorted(n for n, _ in tm.named_parameters())
    params = dict(fm.named_parameters())
    assert all(isinstance(p, nn.UninitializedParameter) for p in params.values())
    x = torch.randn(*shape, dtype=torch.float64)
    fm(flow.from_torch(x))
    tm(x)
    assert type(fm) is getattr(nn, cls) and type(tm) is getattr(torch.nn, cls)
    for n, p in fm.named_parameters():   # the same objects, materialised (optimizers keep them)
        assert p is params[n] and type(p) is nn.Parameter
    fs, ts = fm.state_dict(), tm.state_dict()
    assert list(fs) == list(ts)
    for k in ts:
        assert tuple(fs[k].shape) == tuple(ts[k].shape) and fs[k].to_torch().dtype == ts[k].dtype, k
    assert not any(isinstance(b, nn.UninitializedBuffer) for b in fm.buffers())
    assert repr(fm) == repr(tm)
    fm.load_state_dict({k: flow.from_torch(v) for k, v in tm.state_dict().items()})
    compare(fm, tm, [x], torch.float64)


def test_lazy_layer_init_draws_like_torch():
    for make in (lambda l: l.LazyLinear(3), lambda l: l.LazyConv2d(2, 3)):
        flow.manual_seed(0)
        fm = make(nn)
        fm(flow.randn(2, 4, 5, 5) if "Conv" in type(fm).__name__ else flow.randn(2, 4))
        torch.manual_seed(0)
        tm = make(torch.nn)
        tm(torch.randn(2, 4, 5, 5) if "Conv" in type(tm).__name__ else torch.randn(2, 4))
        for (k, a), b in zip(fm.state_dict().items(), tm.state_dict().values()):
            torch.testing.assert_close(a.to_torch(), b, msg=k)


def test_lazy_layer_loads_a_state_dict_before_its_first_forward():
    src = torch.nn.Linear(4, 3).double()
    fm = nn.LazyLinear(3).double()
    fm.load_state_dict({k: flow.from_torch(v.detach()) for k, v in src.state_dict().items()})
    assert not fm.has_uninitialized_params()
    x = torch.randn(2, 4, dtype=torch.float64)
    torch.testing.assert_close(fm(flow.from_torch(x)).to_torch(), src(x).detach())
    assert type(fm) is nn.Linear


def test_lazy_batchnorm_buffers_stay_lazy_through_to():
    m = nn.LazyBatchNorm1d().double()
    assert isinstance(m.running_mean, nn.UninitializedBuffer)
    m(flow.randn(4, 3, dtype=flow.float64))
    assert type(m) is nn.BatchNorm1d and type(m.running_mean) is flow.Tensor
    assert m.running_mean.dtype == flow.float64 and tuple(m.running_var.shape) == (3,)


# -- adaptive softmax --------------------------------------------------------------------------------------

def test_adaptive_log_softmax_like_torch():
    fm, tm = twin(lambda: nn.AdaptiveLogSoftmaxWithLoss(8, 10, [3, 6], div_value=2.0, head_bias=True),
                  lambda: torch.nn.AdaptiveLogSoftmaxWithLoss(8, 10, [3, 6], div_value=2.0, head_bias=True),
                  torch.float64)
    assert repr(fm) == repr(tm)
    x = torch.randn(7, 8, dtype=torch.float64)
    t = torch.tensor([0, 4, 9, 2, 7, 5, 1])
    fx = flow.from_torch(x.clone()).requires_grad_(True)
    tx = x.clone().requires_grad_(True)
    got, want = fm(fx, flow.from_torch(t)), tm(tx, t)
    torch.testing.assert_close(got.output.to_torch(), want.output.detach())
    torch.testing.assert_close(got.loss.to_torch(), want.loss.detach())
    got.loss.backward()
    want.loss.backward()
    torch.testing.assert_close(fx.grad.to_torch(), tx.grad)
    tp = dict(tm.named_parameters())
    for n, p in fm.named_parameters():
        torch.testing.assert_close(p.grad.to_torch(), tp[n].grad, msg=n)
    torch.testing.assert_close(fm.log_prob(flow.from_torch(x)).to_torch(), tm.log_prob(x).detach())
    assert fm.predict(flow.from_torch(x)).tolist() == tm.predict(x).tolist()
    one = fm(flow.from_torch(x[0]), flow.tensor(8))
    torch.testing.assert_close(one.output.to_torch(), tm(x[0], torch.tensor(8)).output.detach())


# -- errors ---------------------------------------------------------------------------------------------

ERRORS = {
    "Softmax2d(2-d)": lambda m: m.nn.Softmax2d()(m.zeros(2, 3)),
    "CircularPad2d(2-d)": lambda m: m.nn.CircularPad2d(1)(m.zeros(2, 3)),
    "MultiMarginLoss(p=3)": lambda m: m.nn.MultiMarginLoss(p=3),
    "TripletMarginLoss(margin=0)": lambda m: m.nn.TripletMarginLoss(margin=0.0),
    "TripletMarginWithDistanceLoss(margin<0)": lambda m: m.nn.TripletMarginWithDistanceLoss(margin=-1.0),
    "FractionalMaxPool2d(no size)": lambda m: m.nn.FractionalMaxPool2d(2),
    "FractionalMaxPool2d(both)": lambda m: m.nn.FractionalMaxPool2d(2, 3, 0.5),
    "FractionalMaxPool2d(ratio)": lambda m: m.nn.FractionalMaxPool2d(2, output_ratio=1.5),
    "AdaptiveLogSoftmaxWithLoss(cutoffs)": lambda m: m.nn.AdaptiveLogSoftmaxWithLoss(4, 5, [3, 2]),
    "AdaptiveLogSoftmaxWithLoss(empty cutoffs)": lambda m: m.nn.AdaptiveLogSoftmaxWithLoss(4, 5, []),
    "AdaptiveLogSoftmaxWithLoss(target range)": lambda m: m.nn.AdaptiveLogSoftmaxWithLoss(4, 5, [2])(
        m.zeros(2, 4), m.tensor([0, 7])),
    "AdaptiveLogSoftmaxWithLoss(2-d target)": lambda m: m.nn.AdaptiveLogSoftmaxWithLoss(4, 5, [2])(
        m.zeros(2, 4), m.zeros(2, 1, dtype=m.int64)),
    "LazyConv2d(in_channels % groups)": lambda m: m.nn.LazyConv2d(4, 2, groups=2)(m.zeros(1, 3, 4, 4)),
    "LazyConv2d(2-d input)": lambda m: m.nn.LazyConv2d(4, 2)(m.zeros(3, 4)),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_like_torch(name):
    error_like_torch(ERRORS[name], name)


@pytest.mark.parametrize("kind,kw", [("embedding", dict(max_norm=1.5)), ("embedding", dict(max_norm=0.7, norm_type=1.0)),
                                     ("bag", dict(max_norm=1.0, mode="sum")), ("bag", dict(max_norm=1.0, mode="max",
                                                                                          norm_type=3.0))])
def test_max_norm_renormalizes_looked_up_rows_like_torch(kind, kw):
    """max_norm: the rows a lookup reads are rescaled in place first (torch.embedding_renorm_),
    the others untouched; outputs, weight and gradient as torch's, eager and in nn.Graph."""
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(10, 4, generator=g) * 2
    idx, off = torch.tensor([1, 2, 4, 2, 9]), torch.tensor([0, 2])
    dy = torch.randn(5 if kind == "embedding" else 2, 4, generator=g)

    def run(lib, w, graph=False):
        i, o = (idx, off) if lib is torch else (flow.from_torch(idx), flow.from_torch(off))
        F = lib.nn.functional
        return F.embedding(i, w, **kw) if kind == "embedding" else F.embedding_bag(i, w, o, **kw)
    tw = torch.nn.Parameter(w0.clone())
    ty = run(torch, tw)
    (ty * dy).sum().backward()
    fw = flow.nn.Parameter(flow.from_torch(w0.clone()))
    fy = run(flow, fw)
    (fy * flow.from_torch(dy)).sum().backward()
    torch.testing.assert_close(fy.detach().to_torch(), ty.detach())
    torch.testing.assert_close(fw.detach().to_torch(), tw.detach())
    torch.testing.assert_close(fw.grad.to_torch(), tw.grad)
    gw = flow.nn.Parameter(flow.from_torch(w0.clone()))

    class G(flow.nn.Graph):
        def build(self):
            return run(flow, gw)
    torch.testing.assert_close(G()().to_torch(), ty.detach())
    torch.testing.assert_close(gw.detach().to_torch(), tw.detach())

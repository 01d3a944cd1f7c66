"""nn.functional functions of nn/functional_more.py and ops/pooling.py against torch: values and
gradients per dtype, a float64 gradcheck and every SBP signature of the ops they dispatch (the
harness), plus torch's exception classes for bad input."""

import pytest
import torch

import holoflow as flow
from harness import F64, Case, error_like_torch, parametrize, randn, quiet


def lib_of(t):
    return flow if isinstance(t, flow.Tensor) else torch


def F(t):
    return lib_of(t).nn.functional


def same(name, fn, make, **kw):
    return Case(name, fn, fn, make, **kw)


def inputs(*shapes, low=None):
    return lambda dt, g: (tuple(randn(*s, gen=g, dtype=dt, low=low) for s in shapes), {})


def distinct(*shape):
    """A permutation of evenly spaced values: no ties, so max pooling's argmax is unique."""
    def make(dt, g):
        n = 1
        for s in shape:
            n *= s
        return (torch.randperm(n, generator=g).to(dt).reshape(shape) / n,), {}
    return make


def with_target(shape, target):
    return lambda dt, g: ((randn(*shape, gen=g, dtype=dt), target(g)), {})


def pm1(*shape):
    """Targets of +-1 (integers: a float target would be differentiated across its jumps)."""
    return lambda g: torch.randint(0, 2, shape, generator=g) * 2 - 1


def classes(n, c):
    return lambda g: torch.randint(0, c, (n,), generator=g)


def ml_target(g):
    return torch.tensor([[3, 0, -1, 1], [1, 2, 3, 0], [-1, 1, 2, 0]])


def _unpool(k):
    pool = {1: "max_pool1d", 2: "max_pool2d", 3: "max_pool3d"}[k]

    def fn(x, **kw):
        f = F(x)
        with torch.no_grad() if isinstance(x, torch.Tensor) else flow.no_grad():
            _, idx = getattr(f, pool)(x.detach(), 2, return_indices=True)
        v = getattr(f, pool)(x, 2)
        return getattr(f, f"max_unpool{k}d")(v, idx, 2, **kw)
    return fn


def _samples(x):
    """Fixed samples, drawn on the CPU (the same numbers whatever the device) and moved to x's."""
    s = torch.rand(2, 3, 2, generator=torch.Generator().manual_seed(5), dtype=torch.float64, device="cpu")
    s = s.to(device=x.to_torch().device if isinstance(x, flow.Tensor) else x.device)
    return flow.from_torch(s).to(x.dtype) if isinstance(x, flow.Tensor) else s.to(x.dtype)


def _unreduced_1d(loss):
    """torch's unreduced margin loss of a 1-D input is 0-d (its CPU and CUDA kernels); its meta
    kernels say ``(1,)``: torch's result is taken as 0-d (a no-op off meta), holoflow's as is."""
    return loss if isinstance(loss, flow.Tensor) else loss.reshape(())


CASES = [
    same("max_pool1d_with_indices", lambda x: F(x).max_pool1d_with_indices(x, 3, 2, 1), distinct(2, 3, 9)),
    same("max_pool2d_with_indices", lambda x: F(x).max_pool2d_with_indices(x, 2), distinct(2, 2, 4, 6)),
    same("max_pool3d_with_indices", lambda x: F(x).max_pool3d_with_indices(x, 2, ceil_mode=True), distinct(1, 2, 3, 4, 4)),
    same("adaptive_max_pool1d_with_indices", lambda x: F(x).adaptive_max_pool1d_with_indices(x, 3), distinct(2, 3, 7)),
    same("adaptive_max_pool2d_with_indices", lambda x: F(x).adaptive_max_pool2d_with_indices(x, (2, 3)),
         distinct(2, 2, 5, 6)),
    same("adaptive_max_pool3d", lambda x: F(x).adaptive_max_pool3d(x, (2, 3, 2)), distinct(2, 3, 4, 5, 4)),
    same("adaptive_max_pool3d-unbatched-none", lambda x: F(x).adaptive_max_pool3d(x, (None, 2, 3), True),
         distinct(3, 3, 4, 5)),
    same("adaptive_max_pool3d_with_indices", lambda x: F(x).adaptive_max_pool3d_with_indices(x, 2),
         distinct(2, 2, 3, 3, 3)),
    same("max_unpool1d", _unpool(1), distinct(2, 3, 8)),
    same("max_unpool2d", _unpool(2), distinct(2, 2, 4, 6)),
    same("max_unpool2d-output_size", lambda x: _unpool(2)(x, output_size=(5, 7)), distinct(1, 2, 4, 6)),
    same("max_unpool3d", _unpool(3), distinct(1, 2, 4, 4, 2)),
    same("lp_pool1d", lambda x: F(x).lp_pool1d(x, 2, 3, 2), inputs((2, 3, 9))),
    same("lp_pool2d", lambda x: F(x).lp_pool2d(x, 3, 2), inputs((2, 2, 4, 6), low=0.2)),
    same("lp_pool2d-p1.5-ceil", lambda x: F(x).lp_pool2d(x, 1.5, (2, 3), 2, ceil_mode=True), inputs((1, 2, 5, 7), low=0.2)),
    same("lp_pool3d", lambda x: F(x).lp_pool3d(x, 2, 2), inputs((1, 2, 4, 4, 4))),
    same("lp_pool2d-inf", lambda x: F(x).lp_pool2d(x, float("inf"), 2), distinct(1, 2, 4, 4)),
    same("conv_transpose3d", lambda x, w, b: F(x).conv_transpose3d(x, w, b, stride=2, padding=1, output_padding=1),
         inputs((2, 4, 3, 2, 3), (4, 3, 3, 2, 2), (3,))),
    same("conv_transpose3d-groups", lambda x, w: F(x).conv_transpose3d(x, w, groups=2, dilation=(1, 2, 1)),
         inputs((1, 4, 2, 3, 2), (4, 1, 2, 2, 2))),
    same("hinge_embedding_loss", lambda x, t: F(x).hinge_embedding_loss(x, t, margin=0.7),
         with_target((4, 5), pm1(4, 5)), grad=True),
    same("hinge_embedding_loss-none", lambda x, t: F(x).hinge_embedding_loss(x, t, reduction="none"),
         with_target((6,), pm1(6))),
    same("multi_margin_loss", lambda x, t: F(x).multi_margin_loss(x, t), with_target((5, 4), classes(5, 4))),
    same("multi_margin_loss-p2-weight",   # torch gives weight no gradient: a constant here
         lambda x, t: F(x).multi_margin_loss(x, t, p=2, margin=0.6, reduction="sum",
                                             weight=lib_of(x).tensor([0.5, 1.5, 2.0, 0.25], dtype=x.dtype,
                                                                    device=x.device)),
         with_target((5, 4), classes(5, 4))),
    same("multi_margin_loss-1d-none", lambda x, t: _unreduced_1d(F(x).multi_margin_loss(x, t, reduction="none")),
         lambda dt, g: ((randn(4, gen=g, dtype=dt), torch.tensor(2)), {})),
    same("multilabel_margin_loss", lambda x, t: F(x).multilabel_margin_loss(x, t), with_target((3, 4), ml_target)),
    same("multilabel_margin_loss-none", lambda x, t: F(x).multilabel_margin_loss(x, t, reduction="none"),
         with_target((3, 4), ml_target)),
    same("multilabel_margin_loss-1d", lambda x, t: _unreduced_1d(F(x).multilabel_margin_loss(x, t, reduction="none")),
         lambda dt, g: ((randn(4, gen=g, dtype=dt), torch.tensor([2, 0, -1, 3])), {})),
    same("multilabel_soft_margin_loss", lambda x, t, w: F(x).multilabel_soft_margin_loss(x, t, w),
         lambda dt, g: ((randn(3, 5, gen=g, dtype=dt), torch.randint(0, 2, (3, 5), generator=g).to(dt),
                         randn(5, gen=g, dtype=dt, low=0.1)), {})),
    same("triplet_margin_loss", lambda a, p, n: F(a).triplet_margin_loss(a, p, n), inputs((4, 5), (4, 5), (4, 5))),
    same("triplet_margin_loss-swap-p1", lambda a, p, n: F(a).triplet_margin_loss(a, p, n, 0.5, 1, swap=True,
                                                                                 reduction="none"),
         inputs((6, 3), (6, 3), (6, 3)), gradcheck=False),
    same("triplet_margin_with_distance_loss", lambda a, p, n: F(a).triplet_margin_with_distance_loss(a, p, n),
         inputs((4, 5), (4, 5), (4, 5))),
    same("triplet_margin_with_distance_loss-cosine-swap",
         lambda a, p, n: F(a).triplet_margin_with_distance_loss(
             a, p, n, distance_function=lambda x, y: 1.0 - F(x).cosine_similarity(x, y), margin=0.3, swap=True,
             reduction="sum"), inputs((5, 4), (5, 4), (5, 4))),
    same("channel_shuffle", lambda x: F(x).channel_shuffle(x, 3), inputs((2, 6, 2, 2))),
    same("native_channel_shuffle", lambda x: F(x).native_channel_shuffle(x, 2), inputs((2, 4, 3)),
         grad=False),   # torch has no derivative for it (holoflow's is channel_shuffle's)
    same("affine_grid-2d", lambda t: F(t).affine_grid(t, [2, 3, 4, 5], align_corners=False), inputs((2, 2, 3))),
    same("affine_grid-2d-align", lambda t: F(t).affine_grid(t, [1, 1, 3, 2], align_corners=True), inputs((1, 2, 3))),
    same("affine_grid-3d", lambda t: F(t).affine_grid(t, (2, 1, 3, 2, 4), False), inputs((2, 3, 4))),
    same("affine_grid-default", quiet(lambda t: F(t).affine_grid(t, [1, 1, 2, 3])), inputs((1, 2, 3))),
    same("upsample_nearest", quiet(lambda x: F(x).upsample_nearest(x, scale_factor=2)), inputs((1, 2, 3, 3))),
    same("upsample_bilinear", quiet(lambda x: F(x).upsample_bilinear(x, size=(5, 4))), inputs((1, 2, 3, 3))),
    same("gumbel_softmax", lambda x: F(x).gumbel_softmax(x, tau=0.5), inputs((3, 5)), random=True),
    same("gumbel_softmax-hard-dim0", lambda x: F(x).gumbel_softmax(x, hard=True, dim=0), inputs((4, 3)), random=True),
    same("fractional_max_pool2d", lambda x: F(x).fractional_max_pool2d(x, 2, output_size=(3, 4), return_indices=True),
         distinct(2, 3, 6, 7), random=True),
    same("fractional_max_pool2d-ratio-unbatched", lambda x: F(x).fractional_max_pool2d(x, (2, 3), output_ratio=(0.5, 0.5)),
         distinct(2, 8, 8), random=True),
    same("fractional_max_pool2d-samples", lambda x: F(x).fractional_max_pool2d(x, 2, (3, 3), _random_samples=_samples(x)),
         distinct(2, 3, 6, 6)),
    same("fractional_max_pool3d", lambda x: F(x).fractional_max_pool3d(x, 2, output_size=2, return_indices=True),
         distinct(1, 2, 4, 5, 4), random=True),
]
globals().update(parametrize(CASES))


# -- in-place activations -----------------------------------------------------------------------------

INPLACE = {
    "elu_": lambda f, y: f.elu_(y, 0.7),
    "selu_": lambda f, y: f.selu_(y),
    "celu_": lambda f, y: f.celu_(y, 1.3),
    "leaky_relu_": lambda f, y: f.leaky_relu_(y, 0.2),
    "hardtanh_": lambda f, y: f.hardtanh_(y, -0.5, 0.8),
}


@pytest.mark.parametrize("name", sorted(INPLACE))
def test_inplace_activations_like_torch(name):
    x0 = torch.randn(4, 5, dtype=torch.float64)
    dy = torch.randn(4, 5, dtype=torch.float64)
    res = []
    for lib in (flow, torch):
        x = (flow.from_torch(x0.clone()) if lib is flow else x0.clone()).requires_grad_(True)
        y = x * 1.5
        out = INPLACE[name](lib.nn.functional, y)
        assert out is y
        y.backward(flow.from_torch(dy) if lib is flow else dy)
        res.append((y.detach(), x.grad))
    for a, b in zip(res[0], res[1]):
        torch.testing.assert_close(a.to_torch(), b)


def test_inplace_activation_of_leaf_refused_like_torch():
    error_like_torch(lambda m: m.nn.functional.elu_(m.ones(3, requires_grad=True)), "elu_ of a leaf")


def test_upsample_names_warn_like_torch():
    with pytest.warns(UserWarning, match="deprecated"):
        flow.nn.functional.upsample_nearest(flow.ones(1, 1, 2, 2), scale_factor=2)
    with pytest.warns(UserWarning, match="align_corners"):
        flow.nn.functional.affine_grid(flow.zeros(1, 2, 3), [1, 1, 2, 2])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("size", [[3, 1, 12, 12], [2, 1, 7, 5], [2, 1, 3, 5, 6]], ids=str)
def test_affine_grid_is_bitwise_torchs(size, dtype):
    """The identity theta (the spatial-transformer init) samples exactly at pixel centres, where
    grid_sample's gradient in the grid is one-sided: the grid, and the gradient of theta, must be
    torch's to the bit, or a 1-ulp difference flips that side."""
    k = len(size) - 2
    theta = torch.eye(k, k + 1, dtype=dtype).repeat(size[0], 1, 1)
    theta[1:] += 0.01 * torch.randn(size[0] - 1, k, k + 1, dtype=dtype)
    w = torch.randn(*size[:1], *size[2:], k, dtype=dtype)
    for align in (False, True):
        res = []
        for lib in (torch, flow):
            th = lib.tensor(theta.numpy()).requires_grad_()
            grid = lib.nn.functional.affine_grid(th, size, align_corners=align)
            (g,) = lib.autograd.grad((grid * lib.tensor(w.numpy())).sum(), th)
            res.append((torch.tensor(grid.detach().numpy()), torch.tensor(g.numpy())))
        for t, f in zip(*res):
            assert torch.equal(f, t), (align, (f - t).abs().max())


def test_max_unpool_roundtrip_values_like_torch():
    x = torch.randn(2, 3, 6, 6)
    v, i = torch.nn.functional.max_pool2d(x, 3, 2, 1, return_indices=True)
    fv, fi = flow.from_torch(v), flow.from_torch(i)
    for kw in ({"output_size": (6, 6)}, {"output_size": (2, 3, 6, 6)}):
        got = flow.nn.functional.max_unpool2d(fv, fi, 3, 2, 1, **kw)
        torch.testing.assert_close(got.to_torch(), torch.nn.functional.max_unpool2d(v, i, 3, 2, 1, **kw))


def test_gumbel_hard_is_one_hot_with_soft_gradient():
    flow.manual_seed(3)
    x = flow.randn(4, 6, requires_grad=True)
    y = flow.nn.functional.gumbel_softmax(x, hard=True)
    assert y.sum(-1).tolist() == [1.0] * 4 and set(y.flatten().tolist()) <= {0.0, 1.0}
    (y * flow.arange(6.0)).sum().backward()
    assert x.grad is not None and float(x.grad.abs().sum()) > 0


# -- errors ---------------------------------------------------------------------------------------------

def _t(m, *shape):
    return m.zeros(*shape)


ERRORS = {
    "affine_grid(int theta)": lambda m: m.nn.functional.affine_grid(m.zeros(1, 2, 3, dtype=m.int64), [1, 1, 2, 2], False),
    "affine_grid(theta shape)": lambda m: m.nn.functional.affine_grid(_t(m, 1, 3, 3), [1, 1, 2, 2], False),
    "affine_grid(3-d size)": lambda m: m.nn.functional.affine_grid(_t(m, 1, 2, 3), [1, 2, 2], False),
    "affine_grid(zero size)": lambda m: m.nn.functional.affine_grid(_t(m, 1, 2, 3), [1, 1, 0, 2], False),
    "max_unpool2d(output_size)": lambda m: m.nn.functional.max_unpool2d(
        _t(m, 1, 1, 2, 2), m.zeros(1, 1, 2, 2, dtype=m.int64), 2, output_size=(9, 9)),
    "max_unpool2d(output_size len)": lambda m: m.nn.functional.max_unpool2d(
        _t(m, 1, 1, 2, 2), m.zeros(1, 1, 2, 2, dtype=m.int64), 2, output_size=(4,)),
    "max_unpool2d(index range)": lambda m: m.nn.functional.max_unpool2d(
        _t(m, 1, 1, 2, 2), m.full((1, 1, 2, 2), 99, dtype=m.int64), 2),
    "multi_margin_loss(p=3)": lambda m: m.nn.functional.multi_margin_loss(_t(m, 2, 3), m.zeros(2, dtype=m.int64), p=3),
    "multi_margin_loss(weight 2-d)": lambda m: m.nn.functional.multi_margin_loss(
        _t(m, 2, 3), m.zeros(2, dtype=m.int64), weight=_t(m, 1, 3)),
    "multi_margin_loss(target range)": lambda m: m.nn.functional.multi_margin_loss(
        _t(m, 2, 3), m.tensor([0, 3])),
    "multi_margin_loss(target size)": lambda m: m.nn.functional.multi_margin_loss(
        _t(m, 2, 3), m.zeros(3, dtype=m.int64)),
    "multi_margin_loss(reduction)": lambda m: m.nn.functional.multi_margin_loss(
        _t(m, 2, 3), m.zeros(2, dtype=m.int64), reduction="avg"),
    "multilabel_margin_loss(target shape)": lambda m: m.nn.functional.multilabel_margin_loss(
        _t(m, 2, 3), m.zeros(2, 2, dtype=m.int64)),
    "multilabel_margin_loss(target range)": lambda m: m.nn.functional.multilabel_margin_loss(
        _t(m, 1, 3), m.tensor([[0, 5, -1]])),
    "triplet_margin_loss(margin)": lambda m: m.nn.functional.triplet_margin_loss(_t(m, 2), _t(m, 2), _t(m, 2), margin=0.0),
    "triplet_margin_loss(dims)": lambda m: m.nn.functional.triplet_margin_loss(_t(m, 2, 3), _t(m, 2, 3), _t(m, 3)),
    "triplet_margin_with_distance_loss(margin)": lambda m: m.nn.functional.triplet_margin_with_distance_loss(
        _t(m, 2), _t(m, 2), _t(m, 2), margin=-1.0),
    "triplet_margin_with_distance_loss(reduction)": lambda m: m.nn.functional.triplet_margin_with_distance_loss(
        _t(m, 2), _t(m, 2), _t(m, 2), reduction="avg"),
    "channel_shuffle(groups)": lambda m: m.nn.functional.channel_shuffle(_t(m, 1, 4, 2), 3),
    "channel_shuffle(2-d)": lambda m: m.nn.functional.channel_shuffle(_t(m, 2, 4), 2),
    "fractional_max_pool2d(no size)": lambda m: m.nn.functional.fractional_max_pool2d(_t(m, 1, 1, 4, 4), 2),
    "conv_transpose3d(channels)": lambda m: m.nn.functional.conv_transpose3d(_t(m, 1, 3, 2, 2, 2), _t(m, 2, 1, 2, 2, 2)),
}


@pytest.mark.parametrize("name", sorted(ERRORS))
def test_errors_like_torch(name):
    error_like_torch(ERRORS[name], name)


def test_case_dtypes_cover_float64():
    assert all(F64 in c.dtypes for c in CASES)

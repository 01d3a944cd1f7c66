"""Double backward of the fused normalization and cross-entropy ops against torch: the gradient
of ``grad(loss, x, create_graph=True)`` with respect to the input, weight and bias (and the
incoming gradient), and a third derivative where torch's double backward is itself differentiable."""
import pytest
import torch
import torch.nn.functional as TF

import holoflow as flow
import holoflow.nn.functional as HF

torch.manual_seed(0)


def lib_tensor(lib, t, requires_grad=True):
    if t is None:
        return None
    if lib is torch:
        return t.clone().requires_grad_(requires_grad)
    return flow.tensor(t.numpy(), requires_grad=requires_grad)


def close(h, t):
    if t is None:
        assert h is None
        return
    assert h is not None
    torch.testing.assert_close(h.to_torch(), t.detach(), rtol=1e-6, atol=1e-8)


def double_backward(lib, F, loss_of, data, params, mix=None):
    """``d/d(x, params) sum(mix * dloss/dx)``: ``loss_of(F, x, *params)`` the loss; ``mix`` weighs the
    first gradient (so the second one depends on more than its sum). Also returns the first
    gradient with respect to every parameter."""
    x = lib_tensor(lib, data)
    ps = [lib_tensor(lib, p) for p in params]
    live = [x] + [p for p in ps if p is not None]
    loss = loss_of(F, x, *ps)
    first = lib.autograd.grad(loss, live, create_graph=True)
    m = lib_tensor(lib, mix if mix is not None else torch.ones_like(data), requires_grad=False)
    second = lib.autograd.grad((first[0] * m).sum() + sum((g * g).sum() for g in first[1:]), live,
                               allow_unused=True)
    return first, second


def check(loss_of, data, params, mix=None):
    want = double_backward(torch, TF, loss_of, data, params, mix)
    got = double_backward(flow, HF, loss_of, data, params, mix)
    for ts, hs in zip(want, got):
        assert len(ts) == len(hs)
        for t, h in zip(ts, hs):
            close(h, t)


D = torch.float64
X3 = torch.randn(4, 3, 5, dtype=D)
X4 = torch.randn(3, 4, 2, 3, dtype=D)
MIX3 = torch.randn(4, 3, 5, dtype=D)
MIX4 = torch.randn(3, 4, 2, 3, dtype=D)


def weighted(F, out):
    return (out * out.sin()).sum()


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("ns", [(5,), (3, 5)])
def test_layer_norm(affine, ns):
    w = torch.randn(ns, dtype=D) if affine else None
    b = torch.randn(ns, dtype=D) if affine else None
    check(lambda F, x, *p: weighted(F, F.layer_norm(x, ns, *p)), X3, [w, b] if affine else [], MIX3)


def test_layer_norm_weight_only_and_bias_only():
    w = torch.randn(5, dtype=D)
    check(lambda F, x, w: weighted(F, F.layer_norm(x, (5,), w)), X3, [w], MIX3)
    # torch's own double backward fails without a weight, so it runs with a constant unit weight
    ones = lambda F: None if F is HF else torch.ones(5, dtype=D)
    check(lambda F, x, b: weighted(F, F.layer_norm(x, (5,), ones(F), b)), X3, [w], MIX3)


@pytest.mark.parametrize("training", [True, False])
@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("data,mix", [(X4, MIX4), (torch.randn(6, 4, dtype=D), torch.randn(6, 4, dtype=D))])
def test_batch_norm(training, affine, data, mix):
    c = data.shape[1]
    w, b = (torch.randn(c, dtype=D), torch.randn(c, dtype=D)) if affine else (None, None)
    rm, rv = torch.randn(c, dtype=D), torch.rand(c, dtype=D) + 0.5

    def loss(F, x, *p):
        lib = torch if F is TF else flow
        stats = [lib_tensor(lib, rm, False), lib_tensor(lib, rv, False)]
        return weighted(F, F.batch_norm(x, *stats, *(p if p else (None, None)), training=training))
    check(loss, data, [w, b] if affine else [], mix)


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("groups", [1, 2, 4])
def test_group_norm(affine, groups):
    w, b = (torch.randn(4, dtype=D), torch.randn(4, dtype=D)) if affine else (None, None)
    check(lambda F, x, *p: weighted(F, F.group_norm(x, groups, *p)), X4, [w, b] if affine else [], MIX4)


def test_layer_norm_grad_of_incoming_gradient():
    """The second derivative with respect to the upstream gradient (dy depends on the parameters)."""
    res, data = [], (X3, torch.randn(5, dtype=D), torch.randn(5, dtype=D))
    for lib, F in ((torch, TF), (flow, HF)):
        x, w, v = (lib_tensor(lib, t) for t in data)
        y = F.layer_norm(x, (5,), w) * v
        (gx,) = lib.autograd.grad(y.pow(2).sum(), x, create_graph=True)
        res.append(lib.autograd.grad((gx * gx).sum(), (x, w, v)))
    for t, h in zip(*res):
        close(h, t)


def test_norm_third_derivative_runs_like_torch():
    """The double backward is itself recorded: grad of a function of it, as torch's."""
    res, w0 = [], torch.randn(5, dtype=D)
    for lib, F in ((torch, TF), (flow, HF)):
        x, w = lib_tensor(lib, X3), lib_tensor(lib, w0)
        (gx,) = lib.autograd.grad(weighted(F, F.layer_norm(x, (5,), w)), x, create_graph=True)
        (gw,) = lib.autograd.grad((gx * gx).sum(), w, create_graph=True)
        res.append(lib.autograd.grad(gw.sum(), (w,)))
    close(res[1][0], res[0][0])


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"label_smoothing": 0.2},
                                {"weight": True}, {"weight": True, "label_smoothing": 0.1, "reduction": "sum"},
                                {"ignore_index": 1}, {"weight": True, "ignore_index": 2}])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)])
def test_cross_entropy_class_indices(kw, shape):
    n = shape[1]
    x = torch.randn(shape, dtype=D)
    t = torch.randint(0, n, shape[:1] + shape[2:])
    cw = torch.rand(n, dtype=D) + 0.5
    mix = torch.randn(shape, dtype=D)

    def loss(F, x):
        lib = torch if F is TF else flow
        args = dict(kw)
        if args.pop("weight", False):
            args["weight"] = lib_tensor(lib, cw, False)
        out = F.cross_entropy(x, lib_tensor(lib, t, False) if lib is torch else flow.tensor(t.numpy()), **args)
        return (out * out).sum() if out.dim() else out * 3
    check(loss, x, [], mix)


@pytest.mark.parametrize("kw", [{}, {"reduction": "none"}, {"label_smoothing": 0.3}])
@pytest.mark.parametrize("weighted_classes", [False, True])
def test_cross_entropy_probability_targets(kw, weighted_classes):
    """Probability targets are differentiable too: target and class weights get second derivatives."""
    x = torch.randn(4, 3, dtype=D)
    tp = torch.rand(4, 3, dtype=D).softmax(1)
    cw = torch.rand(3, dtype=D) + 0.5
    res = []
    for lib, F in ((torch, TF), (flow, HF)):
        xs, ts = lib_tensor(lib, x), lib_tensor(lib, tp)
        ws = lib_tensor(lib, cw) if weighted_classes else None
        out = F.cross_entropy(xs, ts, weight=ws, **kw)
        live = [xs, ts] + ([ws] if weighted_classes else [])
        first = lib.autograd.grad((out * out).sum(), live, create_graph=True)
        res.append(lib.autograd.grad(sum((g * g.cos()).sum() for g in first), live))
    for t, h in zip(*res):
        close(h, t)


def test_cross_entropy_third_derivative():
    res, x0 = [], torch.randn(5, 4, dtype=D)
    for lib, F in ((torch, TF), (flow, HF)):
        x = lib_tensor(lib, x0)
        t = torch.tensor([0, 3, 1, 1, 2]) if lib is torch else flow.tensor([0, 3, 1, 1, 2])
        (g1,) = lib.autograd.grad(F.cross_entropy(x, t), x, create_graph=True)
        (g2,) = lib.autograd.grad((g1 * g1).sum(), x, create_graph=True)
        res.append(lib.autograd.grad((g2 * g2).sum(), x))
    close(res[1][0], res[0][0])


@pytest.mark.parametrize("kw", [{}, {"reduction": "sum"}, {"reduction": "none"}, {"weight": True},
                                {"weight": True, "ignore_index": 2, "reduction": "none"}])
@pytest.mark.parametrize("shape", [(5, 4), (3, 4, 2)])
def test_nll_loss_of_log_softmax(kw, shape):
    """nll_loss's backward is linear in the incoming gradient: its own derivative is nll_loss of
    the cotangent (the second derivative of ``nll_loss(log_softmax(x))`` flows through it)."""
    n = shape[1]
    x = torch.randn(shape, dtype=D)
    t = torch.randint(0, n, shape[:1] + shape[2:])
    cw = torch.rand(n, dtype=D) + 0.5

    def loss(F, x):
        lib = torch if F is TF else flow
        args = dict(kw)
        if args.pop("weight", False):
            args["weight"] = lib_tensor(lib, cw, False)
        out = F.nll_loss(F.log_softmax(x, 1), t if lib is torch else flow.tensor(t.numpy()), **args)
        return (out * out).sum() if out.dim() else out * out
    check(loss, x, [], torch.randn(shape, dtype=D))

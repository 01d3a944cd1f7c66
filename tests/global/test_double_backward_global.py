"""Double backward (``create_graph=True``) through global tensors, on simulated ranks, against
torch on the whole tensors: a gradient penalty ``sum(grad_i ** 2)`` of ``autograd.grad(f(x, w),
(x, w), create_graph=True)`` backpropagated to both inputs, for products, elementwise chains,
reductions and normalizations under every SBP pairing of the inputs (1-D mesh of 2 and a 2x2
mesh), and ``backward(create_graph=True)`` then a penalty of ``.grad``.

A global op's grad rule reads its inputs as local shards: for a leaf such as ``w`` the shard must
stand for ``w`` in the graph the rule records, or the second-order terms through it are lost
(``w.grad`` silently missed the terms of ``dx = dy @ w.T``)."""
import itertools

import pytest
import torch

import holoflow as flow
from dist_fns import partial_of
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full
from holoflow.sbp import B, P, S

X = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
W = torch.randn(6, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))

FNS = {
    "matmul-tanh": lambda lib, x, w: ((x @ w).tanh() ** 2).sum(),
    "mul-exp-mean": lambda lib, x, w: (x * w[:4] * 0.3).exp().mean(),
    "softmax": lambda lib, x, w: (lib.softmax(x @ w, dim=1) * x).sum(),
    "layer_norm": lambda lib, x, w: (lib.nn.functional.layer_norm(x @ w, (6,)) ** 3).sum(),
    "norm-sigmoid": lambda lib, x, w: lib.sigmoid(x @ w).norm(dim=1).sum(),
    "linear-gelu": lambda lib, x, w: lib.nn.functional.gelu(lib.nn.functional.linear(x, w)).pow(2).sum(),
}


def _reference(fn):
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    gx, gw = torch.autograd.grad(fn(torch, x, w), (x, w), create_graph=True)
    pen = (gx ** 2).sum() + (gw ** 2).sum()
    pen.backward()
    return gx.detach(), gw.detach(), x.grad, w.grad, pen.detach()


def _gathered(t):
    return t.to_global(sbp=(B,) * len(t.sbp)).to_local().to_torch()


def _global(full, place, nd, rank):
    return partial_of(full, place, nd, rank) if P in nd else from_full(full, place, nd)


def _penalty_on_ranks(fn, ranks, nd_x, nd_w):
    place = flow.placement("cpu", ranks)

    def run(r):
        x = _global(X, place, nd_x, r).requires_grad_()
        w = _global(W, place, nd_w, r).requires_grad_()
        if P in nd_x or P in nd_w:   # a partial leaf is not a leaf here: made one from its sum
            x, w = (x.to_global(sbp=(B,) * len(nd_x)).detach().requires_grad_() if P in nd_x else x,
                    w.to_global(sbp=(B,) * len(nd_w)).detach().requires_grad_() if P in nd_w else w)
        gx, gw = flow.autograd.grad(fn(flow, x, w), (x, w), create_graph=True)
        pen = (gx ** 2).sum() + (gw ** 2).sum()
        pen.backward()
        return tuple(_gathered(t) for t in (gx, gw, x.grad, w.grad, pen))
    return world.simulate(len(list(itertools.chain.from_iterable(ranks))) if isinstance(ranks[0], list)
                          else len(ranks), run)


ONE_D = [(S(0),), (S(1),), (B,)]
PAIRS_1D = [(a, b) for a in ONE_D for b in ONE_D]


@pytest.mark.parametrize("name", list(FNS))
@pytest.mark.parametrize("nd_x,nd_w", PAIRS_1D, ids=[f"{a[0]}-{b[0]}" for a, b in PAIRS_1D])
def test_gradient_penalty_on_two_ranks(name, nd_x, nd_w):
    want = _reference(FNS[name])
    for got in _penalty_on_ranks(FNS[name], [0, 1], nd_x, nd_w):
        for g, e, what in zip(got, want, ("dx", "dw", "x.grad", "w.grad", "penalty")):
            torch.testing.assert_close(g, e, msg=f"{name} x {nd_x} w {nd_w}: {what}")


PAIRS_2D = [((S(0), B), (B, S(1))), ((S(0), S(1)), (S(0), B)), ((B, S(0)), (S(1), S(0))), ((B, B), (S(0), S(1)))]


@pytest.mark.parametrize("name", ["matmul-tanh", "layer_norm", "linear-gelu"])
@pytest.mark.parametrize("nd_x,nd_w", PAIRS_2D, ids=[f"{a}-{b}" for a, b in PAIRS_2D])
def test_gradient_penalty_on_a_2x2_mesh(name, nd_x, nd_w):
    want = _reference(FNS[name])
    for got in _penalty_on_ranks(FNS[name], [[0, 1], [2, 3]], nd_x, nd_w):
        for g, e, what in zip(got, want, ("dx", "dw", "x.grad", "w.grad", "penalty")):
            torch.testing.assert_close(g, e, msg=f"{name} x {nd_x} w {nd_w}: {what}")


def test_backward_with_create_graph_then_a_penalty_of_grad():
    """WGAN-GP's pattern through ``.grad``: backward(create_graph=True), then the grads' norm."""
    x, w = X.clone().requires_grad_(), W.clone().requires_grad_()
    (x @ w).sin().sum().backward(create_graph=True)
    gn = w.grad.norm()
    wg1 = w.grad.detach().clone()
    w.grad = None
    gn.backward()
    want = (wg1, w.grad)
    place = flow.placement("cpu", [0, 1])

    def run(r):
        gx, gw = from_full(X, place, S(0)).requires_grad_(), from_full(W, place, B).requires_grad_()
        (gx @ gw).sin().sum().backward(create_graph=True)
        norm = gw.grad.norm()
        first = _gathered(gw.grad.detach())
        gw.grad = None
        norm.backward()
        return first, _gathered(gw.grad)
    for got in world.simulate(2, run):
        for g, e in zip(got, want):
            torch.testing.assert_close(g, e)


MODULES = ["ops.test_elementwise", "ops.test_reduction", "ops.test_linalg", "ops.test_shape",
           "ops.test_indexing", "ops.test_nn_ops", "ops.test_loss"]


def _op_tables(module: str, ranks, step: int, n: int) -> None:
    """The op-table cases of ``module`` (every ``step``-th) with second-order gradients, on
    simulated ranks, against the single-process ones (tests/global/dist_fns.py)."""
    import dist_fns
    names = dist_fns.op_case_names(module, step)
    checked, failures, local_only = world.simulate(
        n, lambda r: dist_fns.run_op_cases(r, ranks, module, names, 1, order=2), timeout=600)[0]
    assert not failures, f"{module}: {len(failures)} failures:\n" + "\n".join(failures[:30])
    assert checked >= len(names) - len(local_only), (checked, len(names), local_only)
    assert len(local_only) <= len(names) // 3, f"too many cases could not be globalized: {local_only}"


@pytest.mark.parametrize("module", MODULES)
def test_op_tables_second_order_on_two_ranks(module):
    _op_tables(module, [0, 1], 3, 2)


@pytest.mark.parametrize("module", MODULES)
def test_op_tables_second_order_on_a_2x2_mesh(module):
    _op_tables(module, [[0, 1], [2, 3]], 9, 4)


def _penalized_step(lin, opt, x, graph: bool):
    """One SGD step on ``sum(tanh(lin(x))) + mean((|d/dx| - 1)^2)`` (WGAN-GP's penalty), eager or
    as an nn.Graph."""
    from holoflow.graph import Graph

    def loss_of(x):
        x.requires_grad_()
        y = lin(x).tanh().sum()
        gx, = flow.autograd.grad(y, [x], create_graph=True)
        return y + ((gx.norm(dim=1) - 1) ** 2).mean()
    if not graph:
        opt.zero_grad()
        loss = loss_of(x)
        loss.backward()
        opt.step()
        return loss

    class Step(Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(opt)

        def build(self, x):
            loss = loss_of(x)
            loss.backward()
            return loss
    return Step()(x)


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
def test_a_gradient_penalty_step_on_global_tensors_equals_one_device(graph):
    data = torch.randn(6, 4, generator=torch.Generator().manual_seed(2))

    flow.manual_seed(0)
    init = {k: v.detach().clone() for k, v in flow.nn.Linear(4, 3).state_dict().items()}

    def make():   # (drawn once, above: simulated ranks are threads sharing torch's default generator,
        lin = flow.nn.Linear(4, 3)   # so a draw inside them interleaves with the other ranks')
        lin.load_state_dict(init)
        return lin
    lin = make()
    opt = flow.optim.SGD(lin.parameters(), lr=0.1)
    want = _penalized_step(lin, opt, flow.from_torch(data.clone()), False).detach().to_torch()
    want_w = lin.weight.detach().to_torch()
    place = flow.placement("cpu", [0, 1])

    def run(r):
        lin = make().to_global(place, B)
        opt = flow.optim.SGD(lin.parameters(), lr=0.1)
        x = from_full(data.clone(), place, S(0))
        loss = _penalized_step(lin, opt, x, graph)
        return _gathered(loss.detach()), _gathered(lin.weight.detach())
    for loss, w in world.simulate(2, run):
        torch.testing.assert_close(loss, want)
        torch.testing.assert_close(w, want_w)

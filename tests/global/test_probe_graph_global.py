"""nn.Graph over global tensors against single-process torch: a small Embedding / Linear /
LayerNorm / cross-entropy model with parameters of mixed SBPs (uneven shards included) trained a
few steps under each graph config, the fused update on column-split parameters, and a graph
after eager steps of the same optimizer."""
import pytest
import torch

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.distributed.global_tensor import from_full

V, D, H, C, N, STEPS = 11, 6, 10, 7, 8, 3
_gen = torch.Generator().manual_seed(0)
INIT = {"emb.weight": torch.randn(V, D, generator=_gen), "l1.weight": torch.randn(H, D, generator=_gen) * 0.4,
        "l1.bias": torch.randn(H, generator=_gen) * 0.1, "ln.weight": 1 + 0.1 * torch.randn(H, generator=_gen),
        "ln.bias": 0.1 * torch.randn(H, generator=_gen), "l2.weight": torch.randn(C, H, generator=_gen) * 0.3,
        "l2.bias": torch.randn(C, generator=_gen) * 0.1}
IDS = [torch.randint(0, V, (N, 3), generator=_gen) for _ in range(STEPS)]
TGT = [torch.randint(0, C, (N * 3,), generator=_gen) for _ in range(STEPS)]

# parameter SBPs (the rest broadcast), the inputs' SBP, the targets' SBP
LAYOUTS = {
    "dp": ([0, 1], {}, (S(0),), (S(0),)),
    "tp": ([0, 1], {"l1.weight": S(0), "l1.bias": S(0), "l2.weight": S(1)}, (B,), (B,)),
    # 11 vocab rows, 10 hidden and 7 class rows, 8 batch rows over 4 ranks: uneven shards
    "odd4": ([0, 1, 2, 3], {"emb.weight": S(0), "l1.weight": S(1), "ln.weight": S(0), "l2.weight": S(0),
                            "l2.bias": S(0)}, (S(0),), (S(0),)),
    "2x2": ([[0, 1], [2, 3]], {"emb.weight": (S(0), S(1)), "l1.weight": (S(1), S(0)), "l2.weight": (S(0), S(0)),
                               "ln.weight": (B, S(0))}, (S(0), S(1)), (S(0), B)),
}


def _model(nn):
    class M(nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = nn.Embedding(V, D)
            self.l1 = nn.Linear(D, H)
            self.ln = nn.LayerNorm(H)
            self.drop = nn.Dropout(0.0)
            self.l2 = nn.Linear(H, C)

        def forward(self, ids):
            h = self.emb(ids).reshape(-1, D)
            return self.l2(self.drop(nn.functional.gelu(self.ln(self.l1(h)))))
    return M()


def _opt(lib, params, kind):
    return lib.optim.SGD(params, lr=0.1, momentum=0.9, weight_decay=0.01) if kind == "sgd" else \
        lib.optim.AdamW(params, lr=0.02, weight_decay=0.1)


def _torch_run(kind, clip=None):
    m = _model(torch.nn)
    m.load_state_dict(INIT)
    opt = _opt(torch, m.parameters(), kind)
    out = []
    for ids, t in zip(IDS, TGT):
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(m(ids), t)
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(m.parameters(), clip)
        opt.step()
        out.append((loss.item(), {k: v.detach().clone() for k, v in m.state_dict().items()}))
    return out


def _whole(t):
    return t.to_global(sbp=(B,) * len(t.sbp)).to_local().to_torch().clone()


def _graph_run(layout, kind, config, clip=None):
    mesh, psbp, xsbp, tsbp = LAYOUTS[layout]
    place = flow.placement("cpu", mesh)
    bn = (B,) * place.ndim
    m = _model(flow.nn)
    m.load_state_dict({k: flow.from_torch(v.clone()) for k, v in INIT.items()})
    m.to_global(place, lambda name, t: psbp.get(name, bn))
    opt = _opt(flow, list(m.parameters()), kind)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            config(self)

        def build(self, ids, t):
            loss = flow.nn.functional.cross_entropy(self.m(ids), t)
            loss.backward()
            if clip:
                flow.nn.utils.clip_grad_norm_(self.m.parameters(), clip)
            return loss
    g, out = G(), []
    for ids, t in zip(IDS, TGT):
        loss = g(from_full(ids.clone(), place, xsbp), from_full(t.clone(), place, tsbp))
        out.append((_whole(loss).mean().item(), {k: _whole(v) for k, v in m.state_dict().items()}))
    return out


CONFIGS = {
    "plain": lambda g: None,
    "fuse_update": lambda g: g.config.allow_fuse_model_update_ops(True),
    "grad_acc": lambda g: g.config.set_gradient_accumulation_steps(2),
    "checkpointing": lambda g: setattr(g.graph_module(g.m.l1), "activation_checkpointing", True),
    "zero2": lambda g: g.config.enable_zero(True, stage=2, shard_min_size=8),
    "zero3": lambda g: g.config.enable_zero(True, stage=3, shard_min_size=8),
}


def _check(got_ranks, want, tol=1e-5):
    for got in got_ranks:
        for (loss, params), (wloss, wparams) in zip(got, want):
            assert abs(loss - wloss) <= tol * (1 + abs(wloss)), (loss, wloss)
            for k, v in wparams.items():
                torch.testing.assert_close(params[k], v, rtol=tol, atol=tol, msg=k)


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_mixed_sbp_model_trains_like_torch_under_each_graph_config(layout, config):
    n = 4 if layout in ("odd4", "2x2") else 2
    for kind in ("sgd", "adamw"):
        want = _torch_run(kind)
        _check(world.simulate(n, lambda r: _graph_run(layout, kind, CONFIGS[config]), timeout=120), want)


@pytest.mark.parametrize("layout", ["tp", "2x2"])
def test_clip_grad_norm_over_split_parameters_inside_a_graph_equals_torch(layout):
    n = 4 if layout == "2x2" else 2
    want = _torch_run("adamw", clip=0.5)
    cfg = CONFIGS["zero2"]
    _check(world.simulate(n, lambda r: _graph_run(layout, "adamw", cfg, clip=0.5), timeout=120), want)


def test_compiled_tasks_with_fused_update_on_split_parameters_equal_torch():
    want = _torch_run("adamw")

    def cfg(g):
        g.config.enable_compile(True)
        g.config.allow_fuse_model_update_ops(True)
    _check(world.simulate(2, lambda r: _graph_run("tp", "adamw", cfg), timeout=300), want)


# --- a parameter whose shard is a non-contiguous view (a column split made by from_full) ---------

_W0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1)) * 0.3


def _torch_weights(kind: str) -> list:
    """torch's weight after each step of ``kind`` on ``(x @ w).tanh().square().mean()`` over _XS."""
    tw = _W0.clone().requires_grad_(True)
    topt = _opt(torch, [tw], kind)
    want = []
    for x in _XS:
        topt.zero_grad()
        (x @ tw).tanh().square().mean().backward()
        topt.step()
        want.append(tw.detach().clone())
    return want


def _one_weight_graph(m, opt, loss, configure=lambda config: None):
    """The nn.Graph class training ``m.w`` with ``opt`` on ``loss(x, w)``."""
    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            configure(self.config)

        def build(self, x):
            out = loss(x, self.m.w)
            out.backward()
            return out
    return G
_XS = [torch.randn(6, 8, generator=torch.Generator().manual_seed(2 + i)) for i in range(3)]


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("mesh,sbp", [([0, 1], (S(1),)), ([[0, 1], [2, 3]], (B, S(1))), ([[0, 1], [2, 3]], (S(0), S(1)))])
def test_fused_update_of_a_column_split_parameter_equals_torch(kind, mesh, sbp):
    """torch's fused kernels walk a non-contiguous parameter as if contiguous: the graph's fused
    update must run them on contiguous memory (graph/passes/fuse_update.py)."""
    want = _torch_weights(kind)

    def run(rank):
        place = flow.placement("cpu", mesh)
        m = flow.nn.Module()
        m.w = flow.nn.Parameter(from_full(_W0.clone(), place, sbp))
        assert not m.w.to_local()._data.is_contiguous()   # the case under test
        opt = _opt(flow, [m.w], kind)

        G = _one_weight_graph(m, opt, lambda x, w: (x @ w).tanh().square().mean(),
                              lambda config: config.allow_fuse_model_update_ops(True))
        g, out = G(), []
        for x in _XS:
            g(from_full(x.clone(), place, (B,) * place.ndim))
            out.append(_whole(m.w))
        return out
    for got in world.simulate(4 if isinstance(mesh[0], list) else 2, run, timeout=60):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --- a graph after eager steps of the same optimizer --------------------------------------------

@pytest.mark.parametrize("kind", ["sgd", "adamw"])
@pytest.mark.parametrize("sbp", [None, (S(1),), (B,)])
def test_graph_steps_after_eager_steps_ignore_the_leftover_eager_grad(kind, sbp):
    """An eager step leaves ``p.grad`` set; the graph traced afterwards must not bake it into
    every step's gradient (graph/graph.py clears grads while tracing)."""
    want = _torch_weights(kind)

    def run(rank):
        place = flow.placement("cpu", [0, 1]) if sbp is not None else None
        w = flow.from_torch(_W0.clone()) if sbp is None else from_full(_W0.clone(), place, sbp)
        m = flow.nn.Module()
        m.w = flow.nn.Parameter(w)
        opt = _opt(flow, [m.w], kind)

        G = _one_weight_graph(m, opt, lambda x, w: (x @ w).tanh().square().mean())
        g, out = G(), []
        for i, x in enumerate(_XS):
            x = flow.from_torch(x.clone()) if sbp is None else from_full(x.clone(), place, (S(0),))
            if i == 0:   # eager: leaves m.w.grad set
                opt.zero_grad()
                (x @ m.w).tanh().square().mean().backward()
                opt.step()
            else:
                g(x)
            out.append(_whole(m.w) if sbp is not None else m.w.detach().to_torch().clone())
        return out
    for got in world.simulate(2, run, timeout=60):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fused", [False, True], ids=["foreach", "fused"])
@pytest.mark.parametrize("sbp", [S(1), B], ids=["S1", "B"])
def test_sgd_momentum_graph_then_eager_then_graph_equals_torch(fused, sbp):
    """SGD's momentum buffer, created by a graph's first update from this rank's gradient piece,
    is global like its parameter: eager steps after graph steps (and graph steps after those)
    train on as torch does."""
    w0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    x0 = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))

    def run(rank):
        P = flow.placement("cpu", [0, 1])
        m = flow.nn.Module()
        m.w = flow.nn.Parameter(from_full(w0.clone(), P, (sbp,)))
        opt = flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)

        G = _one_weight_graph(m, opt, lambda x, w: (x @ w).square().mean(),
                              lambda config: config.allow_fuse_model_update_ops(fused))
        x = from_full(x0, P, (S(0),))
        g = G()
        g(x)
        g(x)
        opt.zero_grad()
        (x @ m.w).square().mean().backward()
        opt.step()
        g(x)
        return m.w.to_global(sbp=[B]).to_local().to_torch()
    tw = torch.nn.Parameter(w0.clone())
    topt = torch.optim.SGD([tw], lr=0.1, momentum=0.9)
    for _ in range(4):
        topt.zero_grad()
        (x0 @ tw).square().mean().backward()
        topt.step()
    for w in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(w, tw.detach())


@pytest.mark.parametrize("stage,order", [(1, "egg"), (2, "egg"), (3, "egg"), (3, "gge"), (3, "gegeg")])
def test_zero_graph_and_eager_steps_of_one_optimizer_equal_torch(stage, order):
    """ZeRO graphs and eager steps of one AdamW: eager state before a graph becomes its rows
    (stages 1, 2), or is re-laid out with its ZeRO-3 parameter; a ZeRO-3 parameter's state stays
    global, so eager steps after graph steps go on as torch's."""
    w0 = torch.randn(8, 16, generator=torch.Generator().manual_seed(1))
    x0 = torch.randn(6, 8, generator=torch.Generator().manual_seed(2))

    def run(rank):
        P = flow.placement("cpu", [0, 1])
        m = flow.nn.Module()
        m.w = flow.nn.Parameter(from_full(w0.clone(), P, (B,)))
        opt = flow.optim.AdamW(m.parameters(), lr=0.1)

        G = _one_weight_graph(m, opt, lambda x, w: (x @ w).square().mean(),
                              lambda config: config.enable_zero(True, stage=stage, shard_min_size=16))
        x = from_full(x0, P, (S(0),))
        g = G()
        for c in order:
            if c == "g":
                g(x)
            else:
                opt.zero_grad()
                (x @ m.w).square().mean().backward()
                opt.step()
        return m.w.to_global(sbp=[B]).to_local().to_torch()
    tw = torch.nn.Parameter(w0.clone())
    topt = torch.optim.AdamW([tw], lr=0.1)
    for _ in order:
        topt.zero_grad()
        (x0 @ tw).square().mean().backward()
        topt.step()
    for w in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(w, tw.detach())


@pytest.mark.parametrize("stage", [1, 2])
def test_an_eager_step_after_zero_graph_steps_equals_torch(stage):
    """ZeRO 1/2 keep each rank's rows of the optimizer state as the pieces of a global S(0)
    tensor (they used to be local tensors an eager step had to refuse): an eager step after the
    graph's steps reads them whole, as torch's next step does."""
    w0 = torch.ones(8, 16)
    x0 = torch.ones(6, 8)

    def run(rank):
        P = flow.placement("cpu", [0, 1])
        m = flow.nn.Module()
        m.w = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(P, flow.sbp.broadcast))
        opt = flow.optim.AdamW(m.parameters(), lr=0.1)

        G = _one_weight_graph(m, opt, lambda x, w: (x @ w).square().mean(),
                              lambda config: config.enable_zero(True, stage=stage, shard_min_size=16))
        x = flow.from_torch(x0).to_global(P, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0))
        G()(x)
        opt.zero_grad()
        (x @ m.w).square().mean().backward()
        opt.step()
        return m.w.to_global(sbp=[B]).to_local().detach().to_torch()
    tw = torch.nn.Parameter(w0.clone())
    topt = torch.optim.AdamW([tw], lr=0.1)
    for _ in range(2):
        topt.zero_grad()
        (x0 @ tw).square().mean().backward()
        topt.step()
    for w in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(w, tw.detach())

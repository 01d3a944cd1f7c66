"""One program on every rank (tests/global/test_one_program*.py): functions run unchanged on
simulated ranks (``world.simulate``) and on real Gloo worlds (``world2.run`` / ``world4.run``).
Each returns plain torch values for the test to compare with single-process torch."""
from __future__ import annotations

import threading

import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.sbp import B, P, S

# simulated ranks are threads sharing torch's generator: seeding and drawing happen under a lock
# (never around a collective), so every rank draws what one process would
SEED_LOCK = threading.Lock()


def _whole(t) -> torch.Tensor:
    """The logical value of global ``t`` on every rank (OneFlow's ``numpy()``: a collective that
    every rank calls, ranks outside the placement included)."""
    return torch.from_numpy(t.detach().numpy())


def pipeline_data(steps: int = 3, seed: int = 0):
    """One batch repeated ``steps`` times (so the loss must decrease) and the two weights."""
    g = torch.Generator().manual_seed(seed)
    x, y = torch.randn(8, 6, generator=g), torch.randn(8, 3, generator=g)
    return (x.expand(steps, 8, 6).clone(), y.expand(steps, 8, 3).clone(),
            torch.randn(6, 10, generator=g) * 0.3, torch.randn(10, 3, generator=g) * 0.3)


def two_stage_pipeline(rank: int, data, steps: int, single: bool = False):
    """OneFlow's documented eager 2-stage pipeline (placements [0] and [1], ``cpu`` for
    ``cuda``): stage 0 on P0, ``out.to_global(placement=P1, sbp=B)``, stage 1 on P1, backward,
    one SGD optimizer over both stages. ``single``: the same model in one process, no placement.
    Returns the losses and the final weights of both stages (whole, on every rank)."""
    xs, ys, w1, w2 = data
    p0 = None if single else flow.placement("cpu", [0])
    p1 = None if single else flow.placement("cpu", [1])
    stage0 = flow.nn.Sequential(flow.nn.Linear(6, 10), flow.nn.ReLU())
    stage1 = flow.nn.Linear(10, 3)
    with flow.no_grad():
        stage0[0].weight.copy_(flow.from_torch(w1.t().contiguous()))
        stage0[0].bias.fill_(0.1)
        stage1.weight.copy_(flow.from_torch(w2.t().contiguous()))
        stage1.bias.fill_(-0.1)
    if not single:
        stage0.to_global(placement=p0, sbp=B)
        stage1.to_global(placement=p1, sbp=B)
    opt = flow.optim.SGD(list(stage0.parameters()) + list(stage1.parameters()), lr=0.1, momentum=0.9)
    losses = []
    for i in range(steps):
        x, y = flow.from_torch(xs[i].clone()), flow.from_torch(ys[i].clone())
        if not single:
            x = x.to_global(placement=p0, sbp=B)
            y = y.to_global(placement=p1, sbp=B)
        out = stage0(x)
        if not single:
            out = out.to_global(placement=p1, sbp=B)
        loss = flow.nn.functional.mse_loss(stage1(out), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(_whole(loss))
    params = [_whole(p) if not single else p.detach().to_torch()
              for p in list(stage0.parameters()) + list(stage1.parameters())]
    return losses, params


def moves_with_grads(rank: int, cases, shape, seed: int = 0):
    """For each (src ranks, src sbp, dst ranks, dst sbp): a leaf x on the source, moved to the
    destination, loss = sum(moved * w) there; returns x's gradient's whole and SBP, the moved
    value's whole, and the local numels of both (empty outside their placements)."""
    g = torch.Generator().manual_seed(seed)
    full = torch.randn(shape, generator=g, dtype=torch.float64)
    w = torch.randn(shape, generator=g, dtype=torch.float64)
    out = []
    for src_ranks, src, dst_ranks, dst in cases:
        sp, dp = flow.placement("cpu", src_ranks), flow.placement("cpu", dst_ranks)
        x = from_full(full, sp, src).requires_grad_()
        y = x.to_global(placement=dp, sbp=dst)
        loss = (y * from_full(w, dp, (B,) * dp.ndim)).sum()
        loss.backward()
        out.append((_whole(x.grad), tuple(x.grad.sbp), _whole(y), x.grad._data.numel(), y._data.numel()))
    return full, w, out


def local_leaves(rank: int, n: int, seed: int = 0):
    """Local leaves made global, and global leaves converted (grad_sbp, copy, to_local): the
    gradients each rank's leaves receive (compared with torch by the test)."""
    g = torch.Generator().manual_seed(seed)
    locals_ = torch.randn(n, 3, 4, generator=g, dtype=torch.float64)
    w = torch.randn(n * 3, 4, generator=g, dtype=torch.float64)
    c = torch.randn(n, n * 3, 4, generator=g, dtype=torch.float64)
    place = flow.placement("cpu", list(range(n)))
    got = {}
    for name, sbp in (("S0", S(0)), ("B", B), ("P", P)):
        a = flow.from_torch(locals_[rank].clone()).requires_grad_()
        y = a.to_global(placement=place, sbp=sbp)
        wy = w if sbp == S(0) else w[:3]
        (y * from_full(wy, place, B)).sum().backward()
        got[name] = None if a.grad is None else a.grad.to_torch()
    a = flow.from_torch(locals_[rank].clone()).requires_grad_()    # a non-leaf made global
    y = (a * 2).to_global(placement=place, sbp=B, copy=True)
    (y * from_full(w[:3], place, B)).sum().backward()
    got["nonleaf_B"] = a.grad.to_torch()
    a = flow.from_torch(locals_[rank].clone())                       # copy=True: a copy, not a view
    y = a.to_global(placement=place, sbp=S(0), copy=True)
    y.to_local().add_(1.0)
    got["copy_local"] = bool((a.to_torch() == locals_[rank]).all())
    wg = from_full(w, place, B)
    for name, kw in (("grad_sbp", {"sbp": S(0), "grad_sbp": B}), ("copy", {"sbp": S(0), "copy": True}),
                     ("grad_sbp_box", {"sbp": B, "grad_sbp": P})):
        x = from_full(w, place, S(0)).requires_grad_()
        y = x.to_global(**kw)
        (y * wg).sum().backward()
        got[name] = (_whole(x.grad), tuple(x.grad.sbp))
    for name, sbp in (("to_local_S0", S(0)), ("to_local_B", B)):
        x = from_full(w, place, sbp).requires_grad_()
        local = x.to_local()
        (local * flow.from_torch(c[rank][:local.shape[0]].clone())).sum().backward()
        got[name] = (_whole(x.grad), tuple(x.grad.sbp))
    return got


# -- OneFlow's documented pipeline example, eager, ``cpu`` for ``cuda`` -----------------------------

class Stage0Module(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.flatten = flow.nn.Flatten()
        self.linear0 = flow.nn.Linear(28 * 28, 64)
        self.relu0 = flow.nn.ReLU()

    def forward(self, x):
        return self.relu0(self.linear0(self.flatten(x)))


class Stage1Module(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear1 = flow.nn.Linear(64, 64)
        self.relu1 = flow.nn.ReLU()
        self.linear2 = flow.nn.Linear(64, 10)
        self.relu2 = flow.nn.ReLU()

    def forward(self, x):
        return self.relu2(self.linear2(self.relu1(self.linear1(x))))


class PipelineModule(flow.nn.Module):
    """The doc's module: stage 0 on ``p0``, stage 1 on ``p1``, the activation moved between them
    (``None`` placements: the same model in one process)."""

    def __init__(self, p0, p1, sbp):
        super().__init__()
        self.p1, self.sbp = p1, sbp
        with SEED_LOCK:
            flow.manual_seed(0)
            self.m_stage0 = Stage0Module()
            self.m_stage1 = Stage1Module()
        if p0 is not None:
            self.m_stage0.to_global(placement=p0, sbp=B)
            self.m_stage1.to_global(placement=p1, sbp=B)

    def forward(self, x):
        out_stage0 = self.m_stage0(x)
        if self.p1 is not None:
            out_stage0 = out_stage0.to_global(placement=self.p1, sbp=self.sbp)
        return self.m_stage1(out_stage0)


def oneflow_pipeline(rank: int, stages, steps: int, data_sbp=B):
    """Trains the documented example ``steps`` SGD steps on one batch (16 images): ``stages``
    are the two stages' rank lists (None: one process). Data is ``data_sbp`` on each stage (S(0)
    with two ranks a stage adds data parallelism). Returns the losses and every parameter whole,
    on every rank, and the local numels of the parameters."""
    g = torch.Generator().manual_seed(0)
    x_t, y_t = torch.randn(16, 1, 28, 28, generator=g), torch.randint(0, 10, (16,), generator=g)
    p0, p1 = (None, None) if stages is None else (flow.placement("cpu", stages[0]), flow.placement("cpu", stages[1]))
    model = PipelineModule(p0, p1, data_sbp)
    loss_fn = flow.nn.CrossEntropyLoss()
    opt = flow.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    losses = []
    for _ in range(steps):
        x, y = flow.from_torch(x_t.clone()), flow.from_torch(y_t.clone())
        if p0 is not None:
            x = x.to_global(placement=p0, sbp=B).to_global(sbp=data_sbp)
            y = y.to_global(placement=p1, sbp=B).to_global(sbp=data_sbp)
        loss = loss_fn(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(_whole(loss) if p0 is not None else loss.detach().to_torch())
    params = [_whole(p) if p0 is not None else p.detach().to_torch() for p in model.parameters()]
    return losses, params, [p._data.numel() for p in model.parameters()]


def outside_op_cases(rank: int, module: str, names):
    """Each named op-table case on placement [1] of a 2-rank world, inputs broadcast: rank 0 is
    outside. Per case, what this rank sees: the outputs' (shape, dtype, placement, sbp, local
    numel), the input gradients' (shape, sbp, local numel), or the exception's class and text."""
    import importlib

    from harness import leaves
    from holoflow.distributed.global_tensor import make_global
    mod = importlib.import_module(module)
    cases = {c.name: c for c in mod.CASES}
    place = flow.placement("cpu", [1])
    out = {}
    for name in names:
        case = cases[name]
        args, kwargs = case.make(torch.float64, torch.Generator().manual_seed(0))

        def conv(x):
            if isinstance(x, torch.Tensor):
                local = x.clone() if rank == 1 else x.new_empty((0,))
                t = make_global(flow.from_torch(local), place, (B,), x.shape)
                return t.requires_grad_() if case.grad and x.is_floating_point() else t
            if isinstance(x, (list, tuple)):
                return type(x)(conv(v) for v in x)
            if isinstance(x, dict):
                return {k: conv(v) for k, v in x.items()}
            return x
        try:
            gargs, gkw = conv(args), conv(kwargs)
            got = leaves(case.flow_fn(*gargs, **gkw))
            seen = [(tuple(o.shape), o.dtype, o.placement == place, tuple(o.sbp), o._data.numel() > 0)
                    for o in got]
            ins = [x for x in leaves((gargs, gkw)) if x.requires_grad]
            outs = [o for o in got if o.requires_grad]
            if ins and outs:
                ups = [flow.ones(tuple(o.shape), dtype=o.dtype, placement=place, sbp=B) for o in outs]
                grads = flow.autograd.grad(outs, ins, ups, allow_unused=True)
                seen.append([None if g is None else (tuple(g.shape), tuple(g.sbp), g._data.numel() > 0)
                             for g in grads])
            out[name] = seen
        except Exception as e:  # compared between the ranks by the test
            out[name] = f"{type(e).__name__}: {str(e).splitlines()[0][:200]}"
    return out


def clipped_pipeline(rank: int, single: bool):
    """Two stages on [0] and [1] (single: one process), gradients clipped by their total norm
    across both stages (clip_grad_norm_ moves each norm to the first parameter's placement, as
    OneFlow does), one SGD step. Returns the total norm and the parameters, whole."""
    with SEED_LOCK:
        flow.manual_seed(0)
        s0, s1 = flow.nn.Linear(4, 5), flow.nn.Linear(5, 2)
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
    x = flow.from_torch(torch.arange(12.0).reshape(3, 4))
    if not single:
        s0.to_global(p0, B)
        s1.to_global(p1, B)
        x = x.to_global(placement=p0, sbp=B)
    h = s0(x)
    if not single:
        h = h.to_global(placement=p1, sbp=B)
    (s1(h) ** 2).sum().backward()
    params = list(s0.parameters()) + list(s1.parameters())
    total = flow.nn.utils.clip_grad_norm_(params, 1.0)
    flow.optim.SGD(params, lr=0.1).step()
    return _whole(total), [_whole(p) for p in params]

"""Functions run on every rank (simulated threads or the Gloo workers of tests/dist/pool.py) by
the tests of global nn.Graphs in tests/global (test_graph_micro_batches.py, test_graph_step_hooks.py,
test_graph_state_layouts.py, test_graph_resume.py, test_graph_megatron_2d.py,
test_graph_relayouts.py): gradient accumulation (micro-batches as runtime iterations), optimizer
step hooks, a GradScaler, saving and resuming ZeRO state, a data x tensor parallel mesh, pipeline
stages and re-layouts inside build(), each with the single-process torch program it must equal."""
from __future__ import annotations

import torch

import holoflow as flow
from holoflow.sbp import B, S

STEPS = 2


def data(m: int, steps: int = STEPS, rows: int = 8, seed: int = 0):
    """Per step: a batch ``x`` (rows x 6) and integer labels ``y`` (rows); and the weights."""
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(rows, 6, generator=g) for _ in range(steps)]
    ys = [torch.randint(0, 5, (rows,), generator=g) for _ in range(steps)]
    return xs, ys, torch.randn(6, 5, generator=g) * 0.4


def train_graph(modules: dict, opt, loss_of, *, acc: int | None = None, stages: tuple = (), lr_sch=None,
                scaler: bool = False, after=None) -> flow.nn.Graph:
    """A training nn.Graph: ``modules`` its attributes (name -> module), ``stages`` the
    ``(name, placement)`` of each pipeline stage in order, ``acc`` gradient accumulation steps,
    ``opt`` (with ``lr_sch``) added, a GradScaler with ``scaler``. ``build(*inputs)`` calls ``loss_of(graph,
    *inputs)`` (the loss, or a tuple starting with it: returned whole), backward on the loss, then
    ``after(graph)`` (gradient clipping)."""
    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            for name, mod in modules.items():
                setattr(self, name, mod)
            for i, (name, place) in enumerate(stages):
                getattr(self, name).config.set_stage(i, place)
            if acc is not None:
                self.config.set_gradient_accumulation_steps(acc)
            self.add_optimizer(opt, lr_sch=lr_sch)
            if scaler:
                self.set_grad_scaler(flow.amp.GradScaler("cpu", init_scale=64.0))

        def build(self, *inputs):
            out = loss_of(self, *inputs)
            (out[0] if isinstance(out, tuple) else out).backward()
            if after is not None:
                after(self)
            return out
    return Train()


def micro_rows(rows: int, shards: int, m: int, k: int) -> torch.Tensor:
    """The rows of micro-batch ``k`` of a batch split ``S(0)`` into ``shards`` blocks: the
    ``k``-th chunk of each rank's rows (what each rank cuts without communication)."""
    per, c = rows // shards, rows // shards // m
    return torch.cat([torch.arange(s * per + k * c, s * per + (k + 1) * c) for s in range(shards)])


def torch_label_steps(m: int, shards: int, steps: int = STEPS):
    """Torch, one process: SGD with momentum on ``cross_entropy(x @ w, y)``, each step
    accumulating ``m`` micro-batches made of the same rows of ``x`` and of ``y``; the loss of every
    micro-batch, the logits ``x @ w`` of each step before its update, and the final weight."""
    xs, ys, w0 = data(m, steps)
    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9)
    losses, logits = [], []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        logits.append((x @ w).detach().clone())
        per = []
        for k in range(m):
            r = micro_rows(x.shape[0], shards, m, k)
            loss = torch.nn.functional.cross_entropy(x[r] @ w, y[r])
            (loss / m).backward()
            per.append(loss.item())
        opt.step()
        losses.append(per)
    return losses, logits, w.detach()


def label_steps(rank: int, m: int, ranks, x_sbp, y_sbp, steps: int = STEPS):
    """The same as :func:`torch_label_steps` as a global graph: ``x`` laid out ``x_sbp`` and the
    labels ``y_sbp`` (a broadcast label beside a split batch) on the placement of ``ranks``;
    ``build`` returns the loss, the logits (partial-sum: ``x`` is split along the contraction)
    and ``x`` itself. Returns, whole: the losses, the logits, the returned ``x`` and the weight."""
    place = flow.placement("cpu", ranks)
    xs, ys, w0 = data(m, steps)
    nb = (B,) * place.ndim
    w = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(place, nb))
    mod = flow.nn.Module()
    mod.w = w
    opt = flow.optim.SGD([w], lr=0.5, momentum=0.9)

    def loss_of(g, x, y):
        logits = x.to_global(sbp=[S(1)] * place.ndim) @ g.mod.w.to_global(sbp=[S(0)] * place.ndim)
        return flow.nn.functional.cross_entropy(logits, y), logits, x
    g = train_graph({"mod": mod}, opt, loss_of, acc=m)
    out = []
    for x, y in zip(xs, ys):
        loss, logits, xo = g(flow.from_torch(x).to_global(place, nb).to_global(sbp=x_sbp),
                             flow.from_torch(y).to_global(place, nb).to_global(sbp=y_sbp))
        out.append([t.to_global(sbp=nb).to_local().to_torch() for t in (loss, logits, xo)])
    return out, w.to_global(sbp=nb).to_local().detach().to_torch()


def square_loss_steps(rank: int | None, m: int, lr_by_step: bool = False, steps: int = 3):
    """SGD with momentum on ``(x @ w.T) ** 2).mean()`` for ``steps`` steps of ``m`` micro-batches,
    as a graph of a broadcast weight and an ``S(0)`` batch on ranks ``[0, 1]`` (``rank`` None: a
    local graph). The traced order puts the backward's read of ``x @ w.T`` after the forward's
    square, whose input the memory plan may overwrite. ``lr_by_step``: the learning rate set to
    ``0.1 * (step + 1)`` before each call. Returns the weight after each step, whole."""
    xs, _, w0 = data(m, steps)
    lin = flow.nn.Linear(6, 5, bias=False)
    with flow.no_grad():
        lin.weight.copy_(flow.from_torch(w0.t().contiguous()))
    place = flow.placement("cpu", [0, 1]) if rank is not None else None
    if place is not None:
        lin.to_global(place, B)
    opt = flow.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)

    g = train_graph({"lin": lin}, opt, lambda g, x: (g.lin(x) ** 2).mean(), acc=m)
    out = []
    for i, x in enumerate(xs):
        if lr_by_step:
            opt.param_groups[0]["lr"] = 0.1 * (i + 1)
        t = flow.from_torch(x)
        g(t.to_global(place, B).to_global(sbp=S(0)) if place is not None else t)
        w = lin.weight.to_global(sbp=B).to_local() if place is not None else lin.weight
        out.append(w.detach().to_torch().clone())
    return out


def torch_square_loss_steps(m: int, lr_by_step: bool = False, steps: int = 3):
    """Torch, one process: what :func:`square_loss_steps` computes (the loss is a mean over rows,
    so micro-batches of equal size sum to the whole batch's gradient)."""
    xs, _, w0 = data(m, steps)
    w = w0.t().contiguous().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    out = []
    for i, x in enumerate(xs):
        if lr_by_step:
            opt.param_groups[0]["lr"] = 0.1 * (i + 1)
        opt.zero_grad()
        ((x @ w.t()) ** 2).mean().backward()
        opt.step()
        out.append(w.detach().clone())
    return out


def square_loss_graph(lin, opt, mode: str, lr_sch=None) -> flow.nn.Graph:
    """The ``mean(lin(x) ** 2)`` training graph of the step tests, configured by ``mode``: ``acc``
    (2 micro-batches), ``zero`` (ZeRO stage 2) or ``zero1``..``zero3``, ``fuse`` (the fused
    update), ``scaler``/``overflow`` (a GradScaler); anything else plain."""
    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(opt, lr_sch=lr_sch)
            if mode == "acc":
                self.config.set_gradient_accumulation_steps(2)
            elif mode.startswith("zero"):
                self.config.enable_zero(True, stage=int(mode[-1]) if mode[-1].isdigit() else 2, shard_min_size=1)
            elif mode == "fuse":
                self.config.allow_fuse_model_update_ops(True)
            elif mode in ("scaler", "overflow"):
                self.set_grad_scaler(flow.amp.GradScaler("cpu", init_scale=64.0))

        def build(self, x):
            loss = (self.lin(x) ** 2).mean()
            loss.backward()
            return loss
    return Train()


def hooked_steps(rank: int | None, mode: str, lib=flow, steps: int = 3):
    """``steps`` steps of SGD with momentum on a linear layer whose optimizer has a pre-step hook
    setting the learning rate from how many steps ran (``0.1 * (done + 1)``) and a post-step hook
    recording the updated weight. ``lib``: ``torch`` for the eager reference, else holoflow as a
    graph (``mode``: ``plain``, ``acc`` (2 micro-batches), ``zero`` (stage 2), ``fuse`` (fused
    update), ``scaler`` (a GradScaler), ``groups`` (two parameter groups)) on ranks ``[0, 1]``
    (``rank`` None: local). Returns the hook log: ("pre", lr seen) and ("post", weight) entries."""
    xs, _, w0 = data(2, steps)
    lin = lib.nn.Linear(6, 5)
    with lib.no_grad():
        lin.weight.copy_(w0.t() if lib is torch else flow.from_torch(w0.t().contiguous()))
        lin.bias.zero_()
    place = flow.placement("cpu", [0, 1]) if rank is not None and lib is flow else None
    if place is not None:
        lin.to_global(place, B)
    params = [{"params": [lin.weight]}, {"params": [lin.bias], "lr": 0.05}] if mode == "groups" else \
        lin.parameters()
    opt = lib.optim.SGD(params, lr=0.1, momentum=0.9)
    log: list = []

    def whole(t):
        t = t.to_global(sbp=B).to_local() if getattr(t, "is_global", False) else t
        return t.detach().to_torch().clone() if lib is flow else t.detach().clone()

    def pre(o, args, kwargs):
        done = sum(e[0] == "post" for e in log)
        o.param_groups[0]["lr"] = 0.1 * (done + 1)
        log.append(("pre", o.param_groups[0]["lr"]))

    def post(o, args, kwargs):
        log.append(("post", whole(o.param_groups[0]["params"][0])))
    opt.register_step_pre_hook(pre)
    opt.register_step_post_hook(post)
    if lib is torch:
        for x in xs:
            opt.zero_grad()
            (lin(x) ** 2).mean().backward()
            opt.step()
        return log

    g = square_loss_graph(lin, opt, mode)
    for x in xs:
        t = flow.from_torch(x)
        g(t.to_global(place, B).to_global(sbp=S(0)) if place is not None else t)
    return log


def scaled_steps(rank: int):
    """test_graph_zero's GradScaler training (an overflowing step 1) as a global graph without
    ZeRO on ranks ``[0, 1]``: the final parameters and each step's scale."""
    from test_graph_zero import _run_scaled
    return _run_scaled(flow.placement("cpu", [0, 1]), 0)


def _mlp_weights():
    g = torch.Generator().manual_seed(11)
    ws = [torch.randn(16, 8, generator=g) * 0.3, torch.randn(16, generator=g) * 0.1,
          torch.randn(4, 16, generator=g) * 0.3, torch.randn(4, generator=g) * 0.1]
    xs = [torch.randn(8, 8, generator=g) for _ in range(4)]
    ys = [torch.randint(0, 4, (8,), generator=g) for _ in range(4)]
    return ws, xs, ys


def torch_resumed_mlp():
    """Torch, one process: four steps of AdamW (weight decay) with a StepLR schedule on a
    two-layer MLP; its final parameters (what a run saved after two steps and resumed equals)."""
    ws, xs, ys = _mlp_weights()
    l1, l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    ps = [l1.weight, l1.bias, l2.weight, l2.bias]
    with torch.no_grad():
        for p, w in zip(ps, ws):
            p.copy_(w)
    opt = torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1)
    sch = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(l2(torch.relu(l1(x))), y).backward()
        opt.step()
        sch.step()
    return [p.detach() for p in ps]


def _mlp_graph(place, stage: int, tp: bool):
    model = flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.ReLU(), flow.nn.Linear(16, 4))
    model.to_global(place, B)
    ws, _, _ = _mlp_weights()
    sbps = [S(0), S(0), S(1), B] if tp else [B] * 4
    for (mod, name), w, sbp in zip([(model[0], "weight"), (model[0], "bias"), (model[2], "weight"),
                                    (model[2], "bias")], ws, sbps):
        setattr(mod, name, flow.nn.Parameter(flow.from_torch(w.clone()).to_global(place, B).to_global(sbp=sbp)))
    opt = flow.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)
    sch = flow.optim.lr_scheduler.StepLR(opt, 1, 0.7)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt, lr_sch=sch)
            if stage:
                self.config.enable_zero(True, stage=stage, shard_min_size=1)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.model(x), y)
            loss.backward()
            return loss
    return model, Train()


def resumed_mlp(rank: int, stage: int, tp: bool, path: str | None, then: str = "same", then_stage: int = 0):
    """Two graph steps of the MLP of :func:`torch_resumed_mlp` on ranks ``[0, 1]`` (ZeRO ``stage``;
    ``tp``: Megatron column/row SBPs), then two more after resuming: ``then`` = ``same`` (the
    graph's ``state_dict`` saved to ``path`` with ``flow.save`` (None: kept in memory), loaded into
    a new model, optimizer, scheduler and graph with ZeRO ``then_stage``) or ``eager`` (eager
    steps of the same optimizer). Returns the final parameters, whole."""
    place = flow.placement("cpu", [0, 1])
    _, xs, ys = _mlp_weights()

    def feed(i):
        return (flow.from_torch(xs[i]).to_global(place, B).to_global(sbp=S(0)),
                flow.from_torch(ys[i]).to_global(place, B).to_global(sbp=S(0)))
    model, g = _mlp_graph(place, stage, tp)
    for i in range(2):
        g(*feed(i))
    if then == "eager":
        opt, sch = g._optimizers[0]
        for i in range(2, 4):
            x, y = feed(i)
            opt.zero_grad()
            flow.nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sch.step()
        final = model
    else:
        sd = g.state_dict()
        if path is not None:
            flow.save(sd, path)
            sd = flow.load(path)
        final, g2 = _mlp_graph(place, then_stage, tp)
        g2.load_state_dict(sd)
        for i in range(2, 4):
            g2(*feed(i))
    return [p.to_global(sbp=B).to_local().detach().to_torch() for p in final.parameters()]


def torch_megatron(m: int, clip: float = 0.5):
    """Torch, one process: the MLP of :func:`torch_resumed_mlp` trained 3 steps with AdamW,
    gradient clipping and ``m`` micro-batches made as a 2-way ``S(0)`` batch cuts them; each
    micro-batch's loss and the final parameters."""
    ws, xs, ys = _mlp_weights()
    l1, l2 = torch.nn.Linear(8, 16), torch.nn.Linear(16, 4)
    ps = [l1.weight, l1.bias, l2.weight, l2.bias]
    with torch.no_grad():
        for p, w in zip(ps, ws):
            p.copy_(w)
    opt = torch.optim.AdamW(ps, lr=0.05, weight_decay=0.1)
    losses = []
    for x, y in zip(xs[:3], ys[:3]):
        opt.zero_grad()
        per = []
        for k in range(m):
            r = micro_rows(8, 2, m, k)
            loss = torch.nn.functional.cross_entropy(l2(torch.relu(l1(x[r]))), y[r])
            (loss / m).backward()
            per.append(loss.item())
        torch.nn.utils.clip_grad_norm_(ps, clip)
        opt.step()
        losses.append(per)
    return losses, [p.detach() for p in ps]


def megatron_2d(rank: int, m: int, label_sbp, clip: float = 0.5):
    """:func:`torch_megatron` on a 2 x 2 mesh: data parallel along mesh axis 0 (the batch
    ``(S(0), B)``), Megatron tensor parallel along axis 1 (column-parallel first layer
    ``(B, S(0))``, row-parallel second ``(B, S(1))``), in an nn.Graph with AdamW, clipping and
    ``m`` micro-batches; labels laid out ``label_sbp``. Returns the losses and parameters, whole."""
    place = flow.placement("cpu", [[0, 1], [2, 3]])
    ws, xs, ys = _mlp_weights()
    model = flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.ReLU(), flow.nn.Linear(16, 4))
    model.to_global(place, [B, B])
    sbps = [[B, S(0)], [B, S(0)], [B, S(1)], [B, B]]
    for (mod, name), w, sbp in zip([(model[0], "weight"), (model[0], "bias"), (model[2], "weight"),
                                    (model[2], "bias")], ws, sbps):
        setattr(mod, name, flow.nn.Parameter(flow.from_torch(w.clone()).to_global(place, [B, B]).to_global(sbp=sbp)))
    opt = flow.optim.AdamW(model.parameters(), lr=0.05, weight_decay=0.1)

    g = train_graph(
        {"model": model}, opt, lambda g, x, y: flow.nn.functional.cross_entropy(g.model(x), y), acc=m,
        after=lambda g: flow.nn.utils.clip_grad_norm_(g.model.parameters(), clip))
    losses = []
    for x, y in zip(xs[:3], ys[:3]):
        loss = g(flow.from_torch(x).to_global(place, [B, B]).to_global(sbp=[S(0), B]),
                 flow.from_torch(y).to_global(place, [B, B]).to_global(sbp=label_sbp))
        losses.append(loss.to_global(sbp=[B, B]).to_local().to_torch().reshape(-1).tolist())
    return losses, [p.to_global(sbp=[B, B]).to_local().detach().to_torch() for p in model.parameters()]


def _stage_weights():
    g = torch.Generator().manual_seed(21)
    return [torch.randn(6, 6, generator=g) * 0.4 for _ in range(2)], \
        [torch.randn(8, 6, generator=g) for _ in range(2)]


def torch_two_stage_square(m: int, lr_by_step: bool = False):
    """Torch, one process: ``((tanh(x @ w0) @ w1) ** 2).mean()`` trained 2 steps with SGD with
    momentum on ``m`` equal micro-batches (rows in order); the final weights. ``lr_by_step``: the
    learning rate ``0.1 * (step + 1)``."""
    ws, xs = _stage_weights()
    ws = [w.clone().requires_grad_() for w in ws]
    opt = torch.optim.SGD(ws, lr=0.1, momentum=0.9)
    for i, x in enumerate(xs):
        if lr_by_step:
            opt.param_groups[0]["lr"] = 0.1 * (i + 1)
        opt.zero_grad()
        for x_k in x.chunk(m):
            ((((torch.tanh(x_k @ ws[0]) @ ws[1]) ** 2).mean()) / m).backward()
        opt.step()
    return [w.detach() for w in ws]


class _Lin(flow.nn.Module):
    """A stage of the two-stage tests: ``x @ w``, tanh'd when ``act``; ``w`` broadcast on ``place``."""

    def __init__(self, w, place, act: bool):
        super().__init__()
        self.w = flow.nn.Parameter(flow.from_torch(w.clone()).to_global(place, B))
        self.act = act

    def forward(self, x):
        y = x @ self.w
        return flow.tanh(y) if self.act else y


def two_stage_square(rank: int, m: int, checkpointing: bool, schedule: str = "1f1b", hooks: bool = False):
    """:func:`torch_two_stage_square` as a pipeline: ``w0`` on stage 0 (rank 0), ``w1`` and the
    square loss on stage 1 (rank 1), ``m`` micro-batches, each stage's module checkpointed or not.
    Returns the final weights, whole, on every rank; with ``hooks``, a pre-step hook sets the
    learning rate to ``0.1 * (step + 1)`` and records which parameters have a ``.grad``, a post
    hook records the step: also returns that log."""
    ws, xs = _stage_weights()
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])

    s0, s1 = _Lin(ws[0], p0, True), _Lin(ws[1], p1, False)
    opt = flow.optim.SGD(list(s0.parameters()) + list(s1.parameters()), lr=0.1, momentum=0.9)
    log: list = []
    if hooks:
        def pre(o, args, kwargs):
            o.param_groups[0]["lr"] = 0.1 * (1 + sum(e == "post" for e in log))
            log.append(tuple(p.grad is not None for p in o.param_groups[0]["params"]))
        opt.register_step_pre_hook(pre)
        opt.register_step_post_hook(lambda o, args, kwargs: log.append("post"))

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.s0, self.s1 = s0, s1
            for i, (mod, place) in enumerate(((self.s0, p0), (self.s1, p1))):
                mod.to(flow.nn.graph.GraphModule).set_stage(i, place)
                mod.to(flow.nn.graph.GraphModule).activation_checkpointing = checkpointing
            self.config.set_gradient_accumulation_steps(m)
            self.config.set_pipeline_schedule(schedule)
            self.add_optimizer(opt)

        def build(self, x):
            loss = (self.s1(self.s0(x).to_global(placement=p1)) ** 2).mean()
            loss.backward()
            return loss
    g = Train()
    for x in xs:
        g(flow.from_torch(x).to_global(p0, B))
    every = flow.placement("cpu", [0, 1])
    out = [w.to_global(placement=every, sbp=B).to_local().detach().to_torch() for w in (s0.w, s1.w)]
    return (out, log) if hooks else out


def _dp_stage_data():
    g = torch.Generator().manual_seed(31)
    ws = [torch.randn(8, 8, generator=g) * 0.4 for _ in range(2)]
    return ws, [torch.randn(8, 8, generator=g) for _ in range(2)], [torch.randint(0, 8, (8,), generator=g)
                                                                     for _ in range(2)]


def torch_dp_stages(m: int):
    """Torch, one process: ``cross_entropy(tanh(x @ w0) @ w1, y)`` trained 2 steps with SGD with
    momentum on ``m`` micro-batches made as a 2-way ``S(0)`` batch cuts them; the final weights."""
    ws, xs, ys = _dp_stage_data()
    ws = [w.requires_grad_() for w in ws]
    opt = torch.optim.SGD(ws, lr=0.3, momentum=0.9)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        for k in range(m):
            r = micro_rows(8, 2, m, k)
            (torch.nn.functional.cross_entropy(torch.tanh(x[r] @ ws[0]) @ ws[1], y[r]) / m).backward()
        opt.step()
    return [w.detach() for w in ws]


def dp_stages(rank: int, m: int, label_sbp):
    """:func:`torch_dp_stages` as two pipeline stages of two data-parallel ranks each (stage 0 on
    ranks 0, 1 reads the ``S(0)`` batch; stage 1 on ranks 2, 3 the labels, laid out
    ``label_sbp``); the final weights, whole, on every rank."""
    ws, xs, ys = _dp_stage_data()
    p0, p1 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [2, 3])

    s0, s1 = _Lin(ws[0], p0, True), _Lin(ws[1], p1, False)
    opt = flow.optim.SGD(list(s0.parameters()) + list(s1.parameters()), lr=0.3, momentum=0.9)

    g = train_graph(
        {"s0": s0, "s1": s1}, opt, lambda g, x, y: flow.nn.functional.cross_entropy(
            g.s1(g.s0(x).to_global(placement=p1)), y), acc=m, stages=(("s0", p0), ("s1", p1)))
    for x, y in zip(xs, ys):
        g(flow.from_torch(x).to_global(p0, B).to_global(sbp=S(0)), flow.from_torch(y).to_global(p1, B).to_global(sbp=label_sbp))
    every = flow.placement("cpu", [0, 1, 2, 3])
    return [w.to_global(placement=every, sbp=B).to_local().detach().to_torch() for w in (s0.w, s1.w)]


def _relayout_data():
    g = torch.Generator().manual_seed(41)
    return (torch.randn(8, 8, generator=g) * 0.3, torch.randn(8, 4, generator=g) * 0.3,
            [torch.randn(8, 8, generator=g) for _ in range(3)], [torch.randint(0, 4, (8,), generator=g) for _ in range(3)])


def _relayout_forward(lib, w1, w2, bn, x, relayout):
    """``x @ w1`` (a partial sum when ``w1`` is row split), half of two columns scaled in place
    through a view, BatchNorm over the batch, tanh, ``@ w2``; ``relayout(t, sbp)`` re-lays a
    global value out (the identity for torch)."""
    h = relayout(x, S(1)) @ w1
    h = relayout(h, S(1)).clone()
    h[:, 1:3].mul_(0.5)
    h = bn(relayout(h, S(0)))
    return lib.tanh(h) @ w2


def torch_relayouts(m: int):
    """Torch, one process: :func:`_relayout_forward` trained 3 steps with AdamW on ``m``
    micro-batches made as a 2-way ``S(0)`` batch cuts them; losses per micro-batch and the final
    weights, BatchNorm affine parameters and running statistics."""
    w1, w2, xs, ys = _relayout_data()
    w1, w2 = w1.clone().requires_grad_(), w2.clone().requires_grad_()
    bn = torch.nn.BatchNorm1d(8)
    opt = torch.optim.AdamW([w1, w2, *bn.parameters()], lr=0.05)
    losses = []
    for x, y in zip(xs, ys):
        opt.zero_grad()
        per = []
        for k in range(m):
            r = micro_rows(8, 2, m, k)
            loss = torch.nn.functional.cross_entropy(_relayout_forward(torch, w1, w2, bn, x[r], lambda t, s: t), y[r])
            (loss / m).backward()
            per.append(loss.item())
        opt.step()
        losses.append(per)
    return losses, [w1.detach(), w2.detach(), bn.weight.detach(), bn.bias.detach(), bn.running_mean, bn.running_var]


def relayouts(rank: int, m: int, mode: str):
    """:func:`torch_relayouts` on ranks ``[0, 1]``: ``w1`` row split ``S(0)``, ``w2`` and the
    BatchNorm broadcast, the batch ``S(0)``, the labels broadcast; ``build`` re-lays values out
    with ``to_global`` (``S(0) -> S(1)``, ``P -> S(1)``, ``S(1) -> S(0)``) around an in-place write
    through a view. ``mode``: ``graph`` (an nn.Graph with ``m`` micro-batches) or ``eager`` (global
    eager steps, ``m`` = 1). Returns the losses and the state of :func:`torch_relayouts`, whole."""
    place = flow.placement("cpu", [0, 1])
    w1, w2, xs, ys = _relayout_data()

    class Net(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w1 = flow.nn.Parameter(flow.from_torch(w1.clone()).to_global(place, B).to_global(sbp=S(0)))
            self.w2 = flow.nn.Parameter(flow.from_torch(w2.clone()).to_global(place, B))
            self.bn = flow.nn.BatchNorm1d(8).to_global(place, B)

        def forward(self, x):
            return _relayout_forward(flow, self.w1, self.w2, self.bn, x, lambda t, s: t.to_global(sbp=s))
    net = Net()
    opt = flow.optim.AdamW(net.parameters(), lr=0.05)

    g = train_graph(
        {"net": net}, opt, lambda g, x, y: flow.nn.functional.cross_entropy(g.net(x), y), acc=m) if mode == "graph" else None
    losses = []
    for x, y in zip(xs, ys):
        xg = flow.from_torch(x).to_global(place, B).to_global(sbp=S(0))
        yg = flow.from_torch(y).to_global(place, B)
        if g is not None:
            loss = g(xg, yg)
        else:
            opt.zero_grad()
            loss = flow.nn.functional.cross_entropy(net(xg), yg)
            loss.backward()
            opt.step()
        losses.append(loss.to_global(sbp=B).to_local().detach().to_torch().reshape(-1).tolist())
    state = [net.w1, net.w2, net.bn.weight, net.bn.bias, net.bn.running_mean, net.bn.running_var]
    return losses, [t.to_global(sbp=B).to_local().detach().to_torch() for t in state]


def _tied_data():
    g = torch.Generator().manual_seed(51)
    return torch.randn(6, 6, generator=g) * 0.4, [torch.randn(4, 6, generator=g) for _ in range(2)]


def torch_tied_stages(m: int):
    """Torch, one process: ``(tanh(x @ w) @ w.T) ** 2`` (one weight used twice, as tied
    embeddings) trained 2 steps with SGD on ``m`` micro-batches; the final weight."""
    w0, xs = _tied_data()
    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.1, momentum=0.9)
    for x in xs:
        opt.zero_grad()
        for x_k in x.chunk(m):
            ((torch.tanh(x_k @ w) @ w.t()).pow(2).mean() / m).backward()
        opt.step()
    return w.detach()


def tied_stages(rank: int, m: int):
    """:func:`torch_tied_stages` as two pipeline stages: the weight lives on stage 0 (rank 0) and
    stage 1 (rank 1) reads it through ``w.to_global(placement=stage 1)`` inside build; the final
    weight, whole, on every rank."""
    w0, xs = _tied_data()
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
    w = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(p0, B))

    class First(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = w

        def forward(self, x):
            return flow.tanh(x @ self.w)

    class Second(flow.nn.Module):
        def forward(self, h):
            return h @ w.to_global(placement=p1, sbp=B).t()
    s0, s1 = First(), Second()
    opt = flow.optim.SGD([w], lr=0.1, momentum=0.9)

    g = train_graph(
        {"s0": s0, "s1": s1}, opt, lambda g, x: g.s1(g.s0(x).to_global(placement=p1)).pow(2).mean(), acc=m,
        stages=(("s0", p0), ("s1", p1)))
    for x in xs:
        g(flow.from_torch(x).to_global(p0, B))
    return w.to_global(placement=flow.placement("cpu", [0, 1]), sbp=B).to_local().detach().to_torch()


def after_uneven_compiles(rank: int):
    """Rank 0 first compiles and runs a local graph that rank 1 does not (ranks hold different
    numbers of generated programs, as a pipeline's ranks off a stage do), then every rank trains
    :func:`square_loss_steps`'s model as a ZeRO-2 global graph, whose update all-gathers from
    inside the generated program. Returns the weight after each step, whole."""
    if rank == 0:
        lin = flow.nn.Linear(3, 2)

        class Local(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.lin = lin

            def build(self, x):
                return self.lin(x)
        Local()(flow.ones(2, 3))
    xs, _, w0 = data(1, 3)
    lin = flow.nn.Linear(6, 5, bias=False)
    with flow.no_grad():
        lin.weight.copy_(flow.from_torch(w0.t().contiguous()))
    place = flow.placement("cpu", [0, 1])
    lin.to_global(place, B)
    opt = flow.optim.SGD(lin.parameters(), lr=0.1, momentum=0.9)

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.lin = lin
            self.add_optimizer(opt)
            self.config.enable_zero(True, stage=2, shard_min_size=1)

        def build(self, x):
            loss = (self.lin(x) ** 2).mean()
            loss.backward()
            return loss
    g = Train()
    out = []
    for x in xs:
        g(flow.from_torch(x).to_global(place, B).to_global(sbp=S(0)))
        out.append(lin.weight.to_global(sbp=B).to_local().detach().to_torch().clone())
    return out


def counted_steps(rank: int | None, mode: str, lib=flow, steps: int = 3):
    """``steps`` steps of Adam over two parameter groups of a linear layer (the weight at lr 0.1,
    the bias at lr 0.05) with a StepLR schedule attached (``add_optimizer(opt, lr_sch=...)`` in a
    graph, ``sch.step()`` after ``opt.step()`` in eager); ``lib`` and ``mode`` as in
    :func:`hooked_steps` (``lib`` torch: eager torch, the reference), or ``eager`` (holoflow's
    eager steps) or ``overflow`` (a GradScaler, step 2's batch overflowing in its last row: that
    step is skipped, its ``opt.step()`` not run). Returns, after each step: the optimizer's step
    count (``opt._step_count``; torch keeps none: the number of ``opt.step()`` calls, counted by
    a post hook), each parameter's ``state['step']``, the scheduler's ``get_last_lr()`` and
    ``last_epoch``; then the final parameters, whole."""
    xs, _, w0 = data(2, steps)
    if mode == "overflow":
        xs[1] = xs[1].clone()
        xs[1][-1] = 3e38
    lin = lib.nn.Linear(6, 5)
    with lib.no_grad():
        lin.weight.copy_(w0.t() if lib is torch else flow.from_torch(w0.t().contiguous()))
        lin.bias.fill_(0.1)
    place = flow.placement("cpu", [0, 1]) if rank is not None and lib is flow else None
    if place is not None:
        lin.to_global(place, B)
    opt = lib.optim.Adam([{"params": [lin.weight]}, {"params": [lin.bias], "lr": 0.05}], lr=0.1)
    sch = lib.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    ps = [lin.weight, lin.bias]
    stepped = []
    if lib is torch:
        opt.register_step_post_hook(lambda o, a, k: stepped.append(1))

    def record() -> tuple:
        count = len(stepped) if lib is torch else opt._step_count
        return (count, [float(opt.state[p]["step"]) if "step" in opt.state[p] else 0.0 for p in ps],
                list(sch.get_last_lr()), sch.last_epoch)

    def whole(t):
        t = t.to_global(sbp=B).to_local() if getattr(t, "is_global", False) else t
        return t.detach().to_torch().clone() if lib is flow else t.detach().clone()
    log = []
    if lib is torch or mode == "eager":
        scaler = torch.amp.GradScaler("cpu", init_scale=64.0) if mode in ("scaler", "overflow") else None
        for x in xs:
            opt.zero_grad()
            t = x if lib is torch else flow.from_torch(x)
            if place is not None:
                t = t.to_global(place, B).to_global(sbp=S(0))
            loss = (lin(t) ** 2).mean()
            if scaler is not None:
                scaler.scale(loss).backward()
                scaler.step(opt)
                scaler.update()
            else:
                loss.backward()
                opt.step()
            sch.step()
            log.append(record())
        return log, [whole(p) for p in ps]

    g = square_loss_graph(lin, opt, mode, lr_sch=sch)
    for x in xs:
        t = flow.from_torch(x)
        g(t.to_global(place, B).to_global(sbp=S(0)) if place is not None else t)
        log.append(record())
    return log, [whole(p) for p in ps]


def _counted_stage_data():
    g = torch.Generator().manual_seed(61)
    return [torch.randn(6, 6, generator=g) * 0.4 for _ in range(2)], torch.randn(6, generator=g) * 0.1, \
        [torch.randn(8, 6, generator=g) for _ in range(3)]


def torch_counted_stages(m: int):
    """Torch, one process: ``((tanh(x @ w0 + b0) @ w1) ** 2).mean()`` trained 3 steps on ``m``
    micro-batches with Adam over two groups (``w0``; ``b0`` and ``w1`` at lr 0.05) and a StepLR
    schedule. Per step: the number of ``opt.step()`` calls, each parameter's ``state['step']``
    (``w0``, ``b0``, ``w1``) and ``get_last_lr()``; then the final parameters."""
    ws, b, xs = _counted_stage_data()
    w0, w1, b0 = ws[0].clone().requires_grad_(), ws[1].clone().requires_grad_(), b.clone().requires_grad_()
    opt = torch.optim.Adam([{"params": [w0]}, {"params": [b0, w1], "lr": 0.05}], lr=0.1)
    sch = torch.optim.lr_scheduler.StepLR(opt, 1, 0.7)
    log = []
    for i, x in enumerate(xs):
        opt.zero_grad()
        for x_k in x.chunk(m):
            ((((torch.tanh(x_k @ w0 + b0) @ w1) ** 2).mean()) / m).backward()
        opt.step()
        sch.step()
        log.append((i + 1, [float(opt.state[p]["step"]) for p in (w0, b0, w1)], list(sch.get_last_lr())))
    return log, [p.detach() for p in (w0, b0, w1)]


def counted_stages(rank: int, m: int, scaler: bool = False):
    """:func:`torch_counted_stages` as a pipeline: ``w0`` and ``b0`` on stage 0 (rank 0; one
    parameter of each group), ``w1`` on stage 1 (rank 1), ``m`` micro-batches, the scheduler
    attached with ``add_optimizer``, a GradScaler or not. Per step: this rank's
    ``opt._step_count``, ``state['step']`` of the parameters of its stage (None for the others)
    and ``get_last_lr()``; then the final parameters, whole, on every rank."""
    ws, b, xs = _counted_stage_data()
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])

    class First(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = flow.nn.Parameter(flow.from_torch(ws[0].clone()).to_global(p0, B))
            self.b = flow.nn.Parameter(flow.from_torch(b.clone()).to_global(p0, B))

        def forward(self, x):
            return flow.tanh(x @ self.w + self.b)
    s0, s1 = First(), _Lin(ws[1], p1, False)
    params = [s0.w, s0.b, s1.w]
    opt = flow.optim.Adam([{"params": [s0.w]}, {"params": [s0.b, s1.w], "lr": 0.05}], lr=0.1)
    sch = flow.optim.lr_scheduler.StepLR(opt, 1, 0.7)

    g = train_graph(
        {"s0": s0, "s1": s1}, opt, lambda g, x: (g.s1(g.s0(x).to_global(placement=p1)) ** 2).mean(), acc=m,
        stages=(("s0", p0), ("s1", p1)), lr_sch=sch, scaler=scaler)
    log = []
    for x in xs:
        g(flow.from_torch(x).to_global(p0, B))
        log.append((opt._step_count, [float(opt.state[p]["step"]) if "step" in opt.state[p] else None
                                      for p in params], list(sch.get_last_lr())))
    every = flow.placement("cpu", [0, 1])
    return log, [p.to_global(placement=every, sbp=B).to_local().detach().to_torch() for p in params]


def torch_stage_grad_hooks(m: int, steps: int = 2):
    """Torch, one process: :func:`torch_two_stage_square` with step hooks logging what they see as
    ``.grad`` (the pre hook: ``("pre", [sum of w0's grad, sum of w1's grad])``, the post hook the
    same as ``"post"``); the log and the final weights."""
    ws, xs = _stage_weights()
    ws = [w.clone().requires_grad_() for w in ws]
    opt = torch.optim.SGD(ws, lr=0.1, momentum=0.9)
    log: list = []
    opt.register_step_pre_hook(lambda o, a, k: log.append(("pre", [float(w.grad.sum()) for w in ws])))
    opt.register_step_post_hook(lambda o, a, k: log.append(("post", [float(w.grad.sum()) for w in ws])))
    for x in xs[:steps]:
        opt.zero_grad()
        for x_k in x.chunk(m):
            ((((torch.tanh(x_k @ ws[0]) @ ws[1]) ** 2).mean()) / m).backward()
        opt.step()
    return log, [w.detach() for w in ws]


def stage_grad_hooks(rank: int, m: int, scaler: bool):
    """:func:`torch_stage_grad_hooks` as :func:`two_stage_square`'s pipeline (``w0`` on rank 0,
    ``w1`` on rank 1), with a GradScaler (``init_scale`` 64, whose pre hooks see the unscaled
    gradients, as torch's ``scaler.step(opt)`` hands ``opt.step()`` them) or without: the hooks
    log the sum of each gradient this stage's rank sees (its piece as a global tensor; None for
    the other stage's parameter, which has no ``.grad`` there). The log and the final weights."""
    ws, xs = _stage_weights()
    p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
    s0, s1 = _Lin(ws[0], p0, True), _Lin(ws[1], p1, False)
    opt = flow.optim.SGD([s0.w, s1.w], lr=0.1, momentum=0.9)
    log: list = []

    def sums():
        return [float(p.grad.to_local().sum()) if p.grad is not None else None for p in (s0.w, s1.w)]
    opt.register_step_pre_hook(lambda o, a, k: log.append(("pre", sums())))
    opt.register_step_post_hook(lambda o, a, k: log.append(("post", sums())))

    g = train_graph(
        {"s0": s0, "s1": s1}, opt, lambda g, x: (g.s1(g.s0(x).to_global(placement=p1)) ** 2).mean(), acc=m,
        stages=(("s0", p0), ("s1", p1)), scaler=scaler)
    for x in xs:
        g(flow.from_torch(x).to_global(p0, B))
    every = flow.placement("cpu", [0, 1])
    return log, [w.to_global(placement=every, sbp=B).to_local().detach().to_torch() for w in (s0.w, s1.w)]

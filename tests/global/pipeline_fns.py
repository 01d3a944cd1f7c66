"""Pipelined nn.Graph training on one rank of a world (simulated ranks or Gloo workers), and the
single-process full-batch reference it must equal (tests/global/test_pipeline*.py)."""
import numpy as np
import torch

import holoflow as flow
from holoflow.core.sbp import B, S

D_IN, D_H, D_OUT = 6, 8, 4


def data(batch: int = 16, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, D_IN, generator=g), torch.randint(0, D_OUT, (batch,), generator=g)


class Stage0(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = flow.nn.Linear(D_IN, D_H)
        self.act = flow.nn.Tanh()

    def forward(self, x):
        return self.act(self.fc(x))


class Stage1(flow.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = flow.nn.Linear(D_H, D_H)
        self.fc2 = flow.nn.Linear(D_H, D_OUT)

    def forward(self, h):
        return self.fc2(torch_relu(self.fc1(h)))


def torch_relu(x):
    return flow.nn.functional.relu(x)


class Net(flow.nn.Module):
    def __init__(self, p0=None, p1=None, sbp=None, explicit_move=True, init=None):
        super().__init__()
        self.s0, self.s1 = Stage0(), Stage1()
        self.p1, self.sbp, self.explicit = p1, sbp, explicit_move
        if init is not None:   # the same start on every (simulated) rank: threads share one RNG
            self.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
        if p0 is not None:
            self.s0.to_global(placement=p0, sbp=[B] * p0.ndim)
            self.s1.to_global(placement=p1, sbp=[B] * p1.ndim)

    def forward(self, x):
        h = self.s0(x)
        if self.p1 is not None and self.explicit:
            h = h.to_global(placement=self.p1, sbp=self.sbp)
        return self.s1(h)


def make(seed: int = 0, **kw):
    flow.manual_seed(seed)
    return Net(**kw)


def reference(steps: int = 3, lr: float = 0.1, batch: int = 16, opt: str = "sgd"):
    """Single-process full-batch training: final parameters and losses."""
    net = make()
    o = _opt(opt, net.parameters(), lr)
    losses = []
    for s in range(steps):
        x, y = data(batch, s)
        loss = flow.nn.functional.cross_entropy(net(flow.tensor(x)), flow.tensor(y))
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, losses


def _opt(name, params, lr):
    return flow.optim.SGD(params, lr=lr, momentum=0.9) if name == "sgd" else flow.optim.AdamW(params, lr=lr)


def init_state(seed: int = 0):
    return {k: v.detach().numpy().copy() for k, v in make(seed).state_dict().items()}


def pipelined(rank: int, init: dict, steps: int = 3, m: int = 4, lr: float = 0.1, batch: int = 16, dp: int = 1,
              schedule: str = "1f1b", spelling: str = "to", opt: str = "sgd", explicit_move: bool = True,
              trace: str | None = None, amp: bool = False, ckpt: bool = False, keep: list | None = None):
    """This rank's share of pipelined training on ``2 * dp`` ranks: stage 0 on ranks [0..dp),
    stage 1 on [dp..2dp), batch split S(0) over each stage's ranks (broadcast when dp == 1).
    Returns the full parameters (gathered) on every rank, the losses (per micro-batch, on stage 1
    ranks), and the pipeline's memory record."""
    p0 = flow.placement("cpu", ranks=list(range(dp)))
    p1 = flow.placement("cpu", ranks=list(range(dp, 2 * dp)))
    sbp = [S(0)] if dp > 1 else [B]
    net = Net(p0=p0, p1=p1, sbp=sbp, explicit_move=explicit_move, init=init)
    o = _opt(opt, net.parameters(), lr)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            if spelling == "to":
                self.net.s0.to(flow.nn.graph.GraphModule).set_stage(stage_id=0, placement=p0)
                self.net.s1.to(flow.nn.graph.GraphModule).set_stage(stage_id=1, placement=p1)
            elif spelling == "config":
                self.net.s0.config.set_stage(stage_id=0, placement=p0)
                self.net.s1.config.set_stage(stage_id=1, placement=p1)
            elif spelling == "stage_id":
                self.net.s0.config.stage_id = 0
                self.net.s1.config.stage_id = 1
            self.config.set_gradient_accumulation_steps(m)
            self.config.set_pipeline_schedule(schedule)
            if amp:
                self.config.enable_amp(True)
            if ckpt:
                self.net.s1.config.activation_checkpointing = True
            self.add_optimizer(o)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            return loss

    g = G()
    if keep is not None:   # the caller inspects the graph (explain, boxing)
        keep.append(g)
    losses = []
    for s in range(steps):
        x, y = data(batch, s)
        # every rank holds the whole batch: broadcast, then split (the logical batch is the batch)
        xg = flow.tensor(x).to_global(placement=p0, sbp=[B]).to_global(sbp=sbp)
        yg = flow.tensor(y).to_global(placement=p1, sbp=[B]).to_global(sbp=sbp)
        loss = g(xg, yg)
        if rank in p1.flat_ranks:
            losses.append(loss.to_local().numpy().copy())
    if trace is not None:
        g.write_trace(trace)
    c = next(iter(g._compiled.values()))
    params = {}
    for k, v in net.state_dict().items():
        place = p0 if k.startswith("s0") else p1
        full = v.to_global(placement=place, sbp=[B]).to_local() if rank in place.flat_ranks else None
        params[k] = full.numpy().copy() if full is not None else None
    return params, losses, dict(c.mem), c.stage


def run_example(rank: int, iterations: int = 20, trace: str | None = None, predict: bool = False):
    """holoflow/examples/pipeline.py (OneFlow's documented example, cpu for cuda) on this rank
    (``predict``: with its --predict, the step predicted before training)."""
    from holoflow.examples import pipeline as example
    flow.manual_seed(1)
    return example.main(iterations, trace, verbose=False, predict=predict)


# -- GPT: PP 2 x DP 2 --------------------------------------------------------------------------------

def gpt_cfg():
    from holoflow.examples import gpt
    return gpt.Config(n_layer=2, n_embd=16, n_head=2, block_size=8, batch_size=8, tie=False, corpus_chars=5000)


def gpt_batches(steps: int):
    from holoflow.examples import corpus, gpt
    cfg = gpt_cfg()
    data, _ = corpus.splits(cfg.corpus_chars)
    rng = np.random.default_rng(0)
    return [corpus.get_batch(data, cfg.block_size, cfg.batch_size, rng) for _ in range(steps)], gpt


def gpt_init():
    from holoflow.examples import gpt
    return {k: v.detach().numpy().copy() for k, v in gpt.make_model(flow, gpt_cfg()).state_dict().items()}


def _gpt_opt(gpt, model, opt: str):
    # SGD: parameters comparable at rel 1e-5 (AdamW turns round-off in near-zero gradients into +-lr steps)
    return flow.optim.SGD(model.parameters(), lr=0.5, momentum=0.9) if opt == "sgd" else \
        gpt.make_optimizer(flow, model, gpt_cfg())


def gpt_reference(steps: int = 3, opt: str = "sgd"):
    """Single-process full-batch GPT training (constant lr, no clipping)."""
    batches, gpt = gpt_batches(steps)
    model = gpt.make_model(flow, gpt_cfg())
    opt = _gpt_opt(gpt, model, opt)
    losses = []
    for xb, yb in batches:
        _, loss = model(flow.tensor(xb), flow.tensor(yb))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}, losses


STAGE0 = ("tok", "pos", "blocks.0")


def gpt_pipelined(rank: int, init: dict, steps: int = 3, m: int = 2, dp: int = 2, opt: str = "sgd",
                  schedule: str = "1f1b", memory: str | None = None, plan: dict | None = None):
    """GPT with its embeddings and first block on stage 0 (ranks [0, dp)), the rest on stage 1,
    data parallel inside each stage; this rank's full parameters and per-micro-batch losses
    (``plan``, if given, gets the compiled plan's stage, zb_delay, zb_bytes, zb_w_share and memory record)."""
    batches, gpt = gpt_batches(steps)
    cfg = gpt_cfg()
    p0 = flow.placement("cpu", ranks=list(range(dp)))
    p1 = flow.placement("cpu", ranks=list(range(dp, 2 * dp)))
    model = gpt.build(flow)(cfg.vocab_size, cfg.block_size, cfg.n_layer, cfg.n_embd, cfg.n_head, cfg.tie)
    model.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
    parts = {name: (p0 if name in STAGE0 else p1) for name in ("tok", "pos", "blocks.0", "blocks.1", "ln_f", "head")}
    for name, place in parts.items():
        model.get_submodule(name).to_global(placement=place, sbp=[B])
    opt = _gpt_opt(gpt, model, opt)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            for name, place in parts.items():
                self.model.get_submodule(name).to(flow.nn.graph.GraphModule).set_stage(0 if place == p0 else 1, place)
            self.config.set_gradient_accumulation_steps(m)
            self.config.set_pipeline_schedule(schedule, **({"memory": memory} if memory else {}))
            self.add_optimizer(opt)

        def build(self, x, y):
            with flow.utils.global_view.global_mode(True, placement=p0, sbp=[B]):
                _, loss = self.model(x, y)
            loss.backward()
            return loss

    g = G()
    losses = []
    for xb, yb in batches:
        x = flow.tensor(xb).to_global(placement=p0, sbp=[S(0)])
        y = flow.tensor(yb).to_global(placement=p1, sbp=[S(0)])
        loss = g(x, y)
        if rank in p1.flat_ranks:
            losses.append(loss.to_global(sbp=[B]).to_local().numpy().copy())
    if plan is not None:
        c = next(iter(g._compiled.values()))
        plan.update(stage=c.stage, zb_delay=c.zb_delay, zb_bytes=c.zb_bytes, zb_w_share=c.zb_w_share,
                    mem=dict(c.mem))
    params = {}
    for k, v in model.state_dict().items():
        place = p0 if k.startswith(STAGE0) else p1
        params[k] = v.to_local().numpy().copy() if rank in place.flat_ranks else None
    return params, losses


def reference_graph(steps: int = 2, m: int = 4, amp: bool = False, ckpt: bool = False, lr: float = 0.1,
                    batch: int = 16):
    """The same training as a single-process (local) nn.Graph with gradient accumulation."""
    net = make()
    o = _opt("sgd", net.parameters(), lr)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.config.set_gradient_accumulation_steps(m)
            if amp:
                self.config.enable_amp(True)
            if ckpt:
                self.net.s1.config.activation_checkpointing = True
            self.add_optimizer(o)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            return loss
    g = G()
    for s in range(steps):
        x, y = data(batch, s)
        g(flow.tensor(x), flow.tensor(y))
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


# -- PP 2 x TP 2: Megatron-style column/row split Linears inside each stage ------------------------------

class TPNet(flow.nn.Module):
    """Stage 0: column-split fc (weight/bias S(0)), tanh, row-split fc_b (weight S(1), no bias);
    stage 1: column-split fc1, relu, row-split fc2. Forward and backward both hold all-reduces."""

    def __init__(self, p0=None, p1=None, init=None):
        super().__init__()
        self.fc, self.fc_b = flow.nn.Linear(D_IN, D_H), flow.nn.Linear(D_H, D_H, bias=False)
        self.fc1, self.fc2 = flow.nn.Linear(D_H, D_H), flow.nn.Linear(D_H, D_OUT, bias=False)
        self.p1 = p1
        if init is not None:
            self.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
        if p0 is not None:
            for lin, place, s in ((self.fc, p0, S(0)), (self.fc_b, p0, S(1)), (self.fc1, p1, S(0)),
                                  (self.fc2, p1, S(1))):
                lin.to_global(placement=place, sbp=[s])

    def forward(self, x):
        h = self.fc_b(flow.nn.functional.tanh(self.fc(x)))
        if self.p1 is not None:
            h = h.to_global(sbp=[B]).to_global(placement=self.p1, sbp=[B])
        return self.fc2(flow.nn.functional.relu(self.fc1(h)))


def train_staged(net, opt, stages: list, m: int, schedule: str, x_place, y_place, steps: int, batch: int,
                 memory: str | None = None) -> tuple:
    """``net`` in a graph with ``stages`` (``(module, stage id, placement)``; none: stages by
    placement) and ``m`` micro-batches, trained ``steps`` steps on ``data``: (compiled plan,
    per-step outputs)."""
    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            for module, sid, place in stages:
                module.to(flow.nn.graph.GraphModule).set_stage(sid, place)
            self.config.set_gradient_accumulation_steps(m)
            self.config.set_pipeline_schedule(schedule, **({"memory": memory} if memory else {}))
            self.add_optimizer(opt)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            return loss

    g, outs = G(), []
    for s in range(steps):
        x, y = data(batch, s)
        outs.append(g(flow.tensor(x).to_global(placement=x_place, sbp=[B]),
                      flow.tensor(y).to_global(placement=y_place, sbp=[B])))
    return next(iter(g._compiled.values())), outs


def compute_order(c) -> list:
    """A pipelined plan's compute acts (phase, micro-batch) in the order they ran."""
    return [(a["phase"], a["mb"]) for a in sorted(c.acts(), key=lambda a: a["start"])
            if a["lane"] == "compute" and a["phase"] in ("F", "B", "W")]


def tp_init(seed: int = 0):
    flow.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in TPNet().state_dict().items()}


def tp_reference(init: dict, steps: int = 3, lr: float = 0.1, batch: int = 16):
    net = TPNet(init=init)
    o = _opt("sgd", net.parameters(), lr)
    losses = []
    for s in range(steps):
        x, y = data(batch, s)
        loss = flow.nn.functional.cross_entropy(net(flow.tensor(x)), flow.tensor(y))
        o.zero_grad()
        loss.backward()
        o.step()
        losses.append(loss.item())
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}, losses


def tp_pipelined(rank: int, init: dict, steps: int = 3, m: int = 4, schedule: str = "1f1b", lr: float = 0.1,
                 batch: int = 16):
    """PP 2 x TP 2 on 4 ranks: stage 0 on [0, 1], stage 1 on [2, 3]; this rank's full parameters,
    losses (stage 1) and its stage's compute acts in order."""
    p0, p1 = flow.placement("cpu", ranks=[0, 1]), flow.placement("cpu", ranks=[2, 3])
    net = TPNet(p0, p1, init=init)
    c, outs = train_staged(net, _opt("sgd", net.parameters(), lr), [], m, schedule, p0, p1, steps, batch)
    losses = [loss.to_local().numpy().copy() for loss in outs] if rank in p1.flat_ranks else []
    order = compute_order(c)
    params = {}
    for k, v in net.state_dict().items():
        place = p0 if k.startswith("fc.") or k.startswith("fc_b") else p1
        params[k] = v.to_global(placement=place, sbp=[B]).to_local().numpy().copy() if rank in place.flat_ranks \
            else None
    return params, losses, order, c.stage


class LNStage(flow.nn.Module):
    """Linear -> LayerNorm -> Tanh: a norm whose backward gives the input gradient (sent to the
    previous stage) and its weight and bias gradients in one op."""

    def __init__(self, d_in, d_out):
        super().__init__()
        self.fc, self.ln = flow.nn.Linear(d_in, d_out), flow.nn.LayerNorm(d_out)

    def forward(self, x):
        return flow.tanh(self.ln(self.fc(x)))


class LNNet(flow.nn.Module):
    def __init__(self, p0=None, p1=None, init=None):
        super().__init__()
        self.s0, self.s1, self.head = LNStage(D_IN, D_H), LNStage(D_H, D_H), flow.nn.Linear(D_H, D_OUT)
        if init is not None:
            self.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
        if p0 is not None:
            self.s0.to_global(placement=p0, sbp=[B])
            self.s1.to_global(placement=p1, sbp=[B])
            self.head.to_global(placement=p1, sbp=[B])

    def forward(self, x):
        return self.head(self.s1(self.s0(x)))


def ln_init(seed: int = 0):
    flow.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in LNNet().state_dict().items()}


def ln_reference(init: dict, steps: int = 2, lr: float = 0.1, batch: int = 16):
    net = LNNet(init=init)
    o = _opt("sgd", net.parameters(), lr)
    for s in range(steps):
        x, y = data(batch, s)
        loss = flow.nn.functional.cross_entropy(net(flow.tensor(x)), flow.tensor(y))
        o.zero_grad()
        loss.backward()
        o.step()
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def ln_pipelined(rank: int, init: dict, steps: int = 2, m: int = 4, schedule: str = "zb-h1", lr: float = 0.1,
                 batch: int = 16, memory: str | None = None):
    """LNNet on two stages (s0 | s1 + head): this rank's full parameters, its program's source,
    its compute acts in order and its memory record."""
    p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
    net = LNNet(p0, p1, init=init)
    c, _ = train_staged(net, _opt("sgd", net.parameters(), lr), [(net.s0, 0, p0), (net.s1, 1, p1), (net.head, 1, p1)],
                        m, schedule, p0, p1, steps, batch, memory)
    params = {}
    for k, v in net.state_dict().items():
        place = p0 if k.startswith("s0") else p1
        params[k] = v.to_local().numpy().copy() if rank in place.flat_ranks else None
    return params, c.program.source, compute_order(c), dict(c.mem)


class BNNet(flow.nn.Module):
    """Stage 0: Linear -> BatchNorm1d -> Tanh; stage 1: Linear."""

    def __init__(self, p0=None, p1=None, init=None):
        super().__init__()
        self.s0 = flow.nn.Sequential(flow.nn.Linear(D_IN, D_H), flow.nn.BatchNorm1d(D_H), flow.nn.Tanh())
        self.s1 = flow.nn.Linear(D_H, D_OUT)
        if init is not None:
            self.load_state_dict({k: flow.tensor(v) for k, v in init.items()})
        if p0 is not None:
            self.s0.to_global(placement=p0, sbp=[B])
            self.s1.to_global(placement=p1, sbp=[B])

    def forward(self, x):
        return self.s1(self.s0(x))


def bn_init(seed: int = 0):
    flow.manual_seed(seed)
    return {k: v.detach().numpy().copy() for k, v in BNNet().state_dict().items()}


def bn_reference(init: dict, steps: int = 2, m: int = 4, lr: float = 0.1, batch: int = 16):
    """Eager training with gradient accumulation (OneFlow's semantics of
    set_gradient_accumulation_steps): m forwards (each a momentum update of the running
    statistics), backward of loss / m each, one optimizer step."""
    net = BNNet(init=init)
    o = _opt("sgd", net.parameters(), lr)
    for s in range(steps):
        x, y = data(batch, s)
        o.zero_grad()
        for xk, yk in zip(x.chunk(m), y.chunk(m)):
            loss = flow.nn.functional.cross_entropy(net(flow.tensor(xk)), flow.tensor(yk))
            (loss / m).backward()
        o.step()
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


def bn_pipelined(rank: int, init: dict, steps: int = 2, m: int = 4, schedule: str = "1f1b", lr: float = 0.1,
                 batch: int = 16):
    """BNNet on two stages: this rank's parameters and buffers (its stage's)."""
    p0, p1 = flow.placement("cpu", ranks=[0]), flow.placement("cpu", ranks=[1])
    net = BNNet(p0, p1, init=init)
    train_staged(net, _opt("sgd", net.parameters(), lr), [(net.s0, 0, p0), (net.s1, 1, p1)], m, schedule, p0, p1,
                 steps, batch)
    out = {}
    for k, v in net.state_dict().items():
        place = p0 if k.startswith("s0") else p1
        out[k] = v.to_local().numpy().copy() if rank in place.flat_ranks else None
    return out

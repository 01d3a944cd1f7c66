"""State written in place inside ``nn.Graph.build()`` of a training graph, against the optimizer's
step. Eager's program order is the reference: ``build()`` runs forward (a write at its place in
it), backward, and the optimizer's step comes after everything ``build()`` did (``add_optimizer``
adds it at the end), so a parameter written in ``build()`` is stepped from the written value
with the gradients eager computes. The graph writes state back before the update effects
(graph/ir.py ``execution_order``).

Every program runs eagerly on torch, eagerly on holoflow and in a training graph, over several
steps, with several optimizers (state included: momentum buffers, Adam's moments), the fused
update (``allow_fuse_model_update_ops``) and gradient accumulation; parameters, buffers and
optimizer state must agree after each step. A write that eager refuses (a tensor a grad rule
saved, changed in place before the backward) is refused by the graph's trace too. Global graphs
over simulated ranks: data parallel with ZeRO stages 0-3, and gradient accumulation run as runtime
micro-batches (graph/pipeline_run.py), against single-process eager."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow.graph import Graph

RNG = np.random.default_rng(11)
X0 = RNG.standard_normal((8, 3)).astype(np.float32)
W0 = RNG.standard_normal((3, 3)).astype(np.float32)
B0 = RNG.standard_normal((3,)).astype(np.float32)
STEPS = 3


def _module(lib):
    class M(lib.nn.Module):
        def __init__(self):
            super().__init__()
            self.w = lib.nn.Parameter(lib.tensor(W0))
            self.b = lib.nn.Parameter(lib.tensor(B0))
            self.u = lib.nn.Parameter(lib.tensor(B0 * 0.5), requires_grad=False)   # the optimizer never steps it
            self.bn = lib.nn.BatchNorm1d(3)
            self.register_buffer("stat", lib.zeros(3))
    return M()


# -- the programs: (lib, module, x, backward) -> loss; ``backward(loss)`` runs the backward ---------

def _loss(lib, m, x):
    return (m.bn(x @ m.w) * m.b + m.u).sin().sum()


def write_before_forward(lib, m, x, backward):
    with lib.no_grad():
        m.w.mul_(0.5)
    loss = _loss(lib, m, x)
    backward(loss)
    return loss


def write_through_detach_before_forward(lib, m, x, backward):
    m.w.detach().mul_(0.5)
    m.b.detach()[1:].add_(1.0)
    loss = _loss(lib, m, x)
    backward(loss)
    return loss


def write_between_forward_and_backward(lib, m, x, backward):
    # ``x @ w`` saves x (w's gradient reads it), not w; ``+ u`` saves nothing: both may change
    loss = _loss(lib, m, x)
    with lib.no_grad():
        m.w.mul_(0.5)
    m.u.detach().add_(1.0)
    backward(loss)
    return loss


def write_after_backward(lib, m, x, backward):
    loss = _loss(lib, m, x)
    backward(loss)
    with lib.no_grad():
        m.w.clamp_(-0.5, 0.5)
        m.b[0] = 2.0
    return loss


def write_reading_the_gradient(lib, m, x, backward):
    loss = _loss(lib, m, x)
    backward(loss)
    with lib.no_grad():
        m.w.sub_(m.w.grad * 0.5)   # a hand-written step, then the optimizer's
    return loss


def write_through_data_after_backward(lib, m, x, backward):
    loss = _loss(lib, m, x)
    backward(loss)
    m.w.data.mul_(0.9)
    return loss


def writes_before_and_after(lib, m, x, backward):
    with lib.no_grad():
        m.w.add_(0.25)
    loss = _loss(lib, m, x)
    backward(loss)
    with lib.no_grad():
        m.w.mul_(0.5)
        m.w.add_(m.b.unsqueeze(0))
    return loss


def write_to_a_parameter_without_grad(lib, m, x, backward):
    with lib.no_grad():
        m.u.mul_(-1.0)
    loss = _loss(lib, m, x)
    backward(loss)
    with lib.no_grad():
        m.u.add_(0.5)
    return loss


def write_to_buffers(lib, m, x, backward):
    loss = _loss(lib, m, x)   # (BatchNorm's running statistics are written in its forward)
    with lib.no_grad():
        m.stat.mul_(0.9).add_(x.mean(0) * 0.1)
    backward(loss)
    with lib.no_grad():
        m.bn.running_mean.mul_(0.5)
        m.bn.weight.mul_(2.0)   # the affine weight: a parameter the optimizer steps too
    return loss


PROGRAMS = [write_before_forward, write_through_detach_before_forward, write_between_forward_and_backward,
            write_after_backward, write_reading_the_gradient, write_through_data_after_backward,
            writes_before_and_after, write_to_a_parameter_without_grad, write_to_buffers]
# a gradient read in build() is a micro-batch's under gradient accumulation, the running sum in eager
ACC_PROGRAMS = [p for p in PROGRAMS if p is not write_reading_the_gradient]

OPTIMIZERS = {
    "sgd": lambda lib, ps: lib.optim.SGD(ps, lr=0.1),
    "sgd_momentum": lambda lib, ps: lib.optim.SGD(ps, lr=0.1, momentum=0.9, weight_decay=0.01),
    "adam": lambda lib, ps: lib.optim.Adam(ps, lr=0.05),
    "adamw": lambda lib, ps: lib.optim.AdamW(ps, lr=0.05, weight_decay=0.1),
}


def _np(t) -> np.ndarray:
    t = t._data if hasattr(t, "_data") else t
    return t.detach().cpu().numpy().copy()


def _snapshot(m, opt) -> dict:
    """Parameters, buffers and the optimizer's per-parameter state, by name."""
    got = {f"param {k}": _np(v) for k, v in m.named_parameters()}
    got.update({f"buffer {k}": _np(v) for k, v in m.named_buffers()})
    for k, p in m.named_parameters():
        for name, v in (opt.state[p].items() if p in opt.state else ()):
            if name == "step":   # (a tensor in torch, a number or tensor in holoflow)
                continue
            got[f"state {k}.{name}"] = _np(v)
    return got


def _batches(lib, acc: int) -> list:
    return [lib.tensor(X0[k::acc].copy()) for k in range(acc)] if acc > 1 else [lib.tensor(X0)]


def _eager(lib, program, optimizer: str, acc: int = 1) -> list:
    """Eager steps: ``acc`` micro-batches (rows ``k::acc`` of the batch), each ``(loss / acc).backward()``,
    then ``opt.step()``."""
    m = _module(lib)
    opt = OPTIMIZERS[optimizer](lib, list(m.parameters()))
    got = []
    for _ in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for x in _batches(lib, acc):
            program(lib, m, x, lambda loss: (loss / acc).backward())
        opt.step()
        got.append(_snapshot(m, opt))
    return got


class _Train(Graph):
    def __init__(self, m, opt, program, acc: int = 1, fuse: bool = False):
        super().__init__()
        self.m, self.program = m, program
        self.add_optimizer(opt)
        if acc > 1:
            self.config.set_gradient_accumulation_steps(acc)
        if fuse:
            self.config.allow_fuse_model_update_ops(True)

    def build(self, x):
        return self.program(flow, self.m, x, lambda loss: loss.backward())


def _graph(program, optimizer: str, acc: int = 1, fuse: bool = False) -> list:
    m = _module(flow)
    opt = OPTIMIZERS[optimizer](flow, list(m.parameters()))
    g = _Train(m, opt, program, acc, fuse)
    # the graph splits the batch into contiguous micro-batches: feed it the eager ones, stacked
    x = np.concatenate([X0[k::acc] for k in range(acc)]) if acc > 1 else X0
    got = []
    for _ in range(STEPS):
        g(flow.tensor(x))
        got.append(_snapshot(m, opt))
    return got


def _assert_same(got: list, want: list, what: str) -> None:
    for step, (a, b) in enumerate(zip(got, want)):
        assert a.keys() == b.keys(), f"{what}, step {step}: {sorted(a)} vs {sorted(b)}"
        for name in b:
            torch.testing.assert_close(torch.from_numpy(a[name]), torch.from_numpy(b[name]), rtol=1e-4, atol=1e-5,
                                       msg=lambda msg: f"{what}, step {step}, {name}: {msg}")


@pytest.mark.parametrize("optimizer", list(OPTIMIZERS))
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_state_written_in_build_then_stepped(program, optimizer):
    want = _eager(torch, program, optimizer)
    _assert_same(_eager(flow, program, optimizer), want, "holoflow eager vs torch")
    _assert_same(_graph(program, optimizer), want, "graph vs torch")


@pytest.mark.parametrize("optimizer", ["sgd_momentum", "adam"])
@pytest.mark.parametrize("program", PROGRAMS, ids=lambda p: p.__name__)
def test_state_written_in_build_with_fused_update(program, optimizer):
    want = _eager(torch, program, optimizer)
    _assert_same(_graph(program, optimizer, fuse=True), want, "fused-update graph vs torch")


@pytest.mark.parametrize("optimizer", ["sgd", "adam"])
@pytest.mark.parametrize("program", ACC_PROGRAMS, ids=lambda p: p.__name__)
def test_state_written_in_build_with_gradient_accumulation(program, optimizer):
    """Each micro-batch writes the state as each eager micro-batch does (the next reads it);
    the step, once, from the last written value with the summed gradients."""
    want = _eager(torch, program, optimizer, acc=2)
    _assert_same(_eager(flow, program, optimizer, acc=2), want, "holoflow eager vs torch")
    _assert_same(_graph(program, optimizer, acc=2), want, "graph vs torch")
    _assert_same(_graph(program, optimizer, acc=2, fuse=True), want, "fused-update graph vs torch")


# -- writes eager refuses ---------------------------------------------------------------------------

def saved_parameter_written_under_no_grad(lib, m, x, backward):
    loss = (m.w * m.w).sum() + (x @ m.w).sum()   # mul saves w for its own gradient
    with lib.no_grad():
        m.w.mul_(0.5)
    backward(loss)
    return loss


def saved_parameter_written_through_detach(lib, m, x, backward):
    loss = (m.w * m.w).sum()
    m.w.detach().mul_(0.5)
    backward(loss)
    return loss


def saved_parameter_view_written_through_detach(lib, m, x, backward):
    loss = (m.w * m.w).sum()
    m.w[0].detach().zero_()
    backward(loss)
    return loss


def saved_buffer_written(lib, m, x, backward):
    loss = (x * m.stat).sum() * m.b.sum()   # mul saves the buffer for x... and m.b's sum
    loss = (m.b * m.stat).sum() + loss
    with lib.no_grad():
        m.stat.add_(1.0)
    backward(loss)
    return loss


def saved_frozen_parameter_written(lib, m, x, backward):
    loss = (m.b * m.u).sum()   # u (no grad) saved for b's gradient
    with lib.no_grad():
        m.u.mul_(2.0)
    backward(loss)
    return loss


REFUSED = [saved_parameter_written_under_no_grad, saved_parameter_written_through_detach,
           saved_parameter_view_written_through_detach, saved_buffer_written, saved_frozen_parameter_written]


@pytest.mark.parametrize("program", REFUSED, ids=lambda p: p.__name__)
def test_write_of_a_saved_state_tensor_is_refused_as_in_eager(program):
    """A parameter or buffer a grad rule saved, written in place before the backward: torch and
    holoflow eager refuse the backward (the version counter moved), and so does the graph's trace,
    instead of computing the gradient from the written value."""
    for lib in (torch, flow):
        with pytest.raises(RuntimeError, match="modified by an in-?place operation"):
            _eager(lib, program, "sgd")
    with pytest.raises(Exception, match="modified by an in-place operation") as e:
        _graph(program, "sgd")
    assert "build() failed while tracing" in str(e.value)


def saved_parameter_written_through_data(lib, m, x, backward):
    loss = (m.w * m.w).sum()
    m.w.data.mul_(0.5)   # ``.data``: a version counter of its own, unseen by autograd's checks
    backward(loss)
    return loss


def test_write_of_a_saved_parameter_through_data_is_read_by_backward():
    """``w.data`` writes are not refused (torch's ``.data`` has its own version counter): the
    backward reads the written value, in eager and in the graph."""
    want = _eager(torch, saved_parameter_written_through_data, "sgd")
    _assert_same(_eager(flow, saved_parameter_written_through_data, "sgd"), want, "holoflow eager vs torch")
    _assert_same(_graph(saved_parameter_written_through_data, "sgd"), want, "graph vs torch")


def test_write_back_runs_before_the_update_in_the_program():
    """The update task assigns the state written in build(), then runs the optimizer's update."""
    m = _module(flow)
    g = _Train(m, flow.optim.SGD(m.parameters(), lr=0.1), write_after_backward)
    g(flow.tensor(X0))
    c = next(iter(g._compiled.values()))
    (task,) = [t for t in c.program.tasks if t.stream == "update"]
    ops = [n.op for n in task.nodes]
    assert ops.index("sgd_update") > max(i for i, op in enumerate(ops) if op == "assign"), ops


# -- global graphs: ZeRO -----------------------------------------------------------------------------

def _global_model():
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(16, 64), flow.nn.GELU(), flow.nn.Linear(64, 16))
    gen = torch.Generator().manual_seed(5)
    with flow.no_grad():
        for p in m.parameters():
            p.copy_(flow.from_torch(torch.randn(tuple(p.shape), generator=gen) * 0.3))
    return m


def _global_step(m, x):
    with flow.no_grad():
        m[0].weight.mul_(0.9)   # a sharded parameter (ZeRO-3 keeps it S(0) between steps)
    loss = m(x).square().mean()
    loss.backward()
    with flow.no_grad():
        m[2].weight.add_(0.01)
        m[0].bias.mul_(0.5)     # (too small to shard: kept whole)
    return loss


def _global_batch(i: int) -> torch.Tensor:
    return torch.randn(8, 16, generator=torch.Generator().manual_seed(i))


def _global_opt(kind: str, m):
    return flow.optim.AdamW(m.parameters(), lr=0.01) if kind == "adamw" else \
        flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9)


@pytest.mark.parametrize("opt_kind", ["sgd", "adamw"])
@pytest.mark.parametrize("stage", [0, 1, 2, 3])
def test_global_graph_with_zero_steps_parameters_written_in_build(stage, opt_kind):
    """A data-parallel global graph over two ranks (ZeRO ``stage``: sharded updates, and at stage
    3 parameters kept sharded) trains as single-process eager with the same writes."""
    from holoflow.distributed import world
    from holoflow.sbp import B, S
    m = _global_model()
    opt = _global_opt(opt_kind, m)
    for i in range(STEPS):
        opt.zero_grad(set_to_none=True)
        _global_step(m, flow.from_torch(_global_batch(i)))
        opt.step()
    want = [p.detach().to_torch() for p in m.parameters()]

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        m = _global_model()
        m.to_global(place, B)
        opt = _global_opt(opt_kind, m)

        class G(Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)
                if stage:
                    self.config.enable_zero(True, stage=stage, shard_min_size=64)

            def build(self, x):
                return _global_step(self.m, x)
        g = G()
        for i in range(STEPS):
            g(flow.from_torch(_global_batch(i)).to_global(place, B).to_global(sbp=S(0)))
        return [p.to_global(sbp=B).to_local().detach().to_torch() for p in m.parameters()]
    for got in world.simulate(2, run):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _global_acc_after_backward(m, x, backward):
    loss = m(x).square().mean()
    backward(loss)
    with flow.no_grad():
        m[2].weight.add_(0.01)   # after the backward, from no data: the forward's phase
    return loss


def _global_acc_before_forward(m, x, backward):
    with flow.no_grad():
        m[0].weight.mul_(0.9)
    loss = m(x).square().mean()
    backward(loss)
    return loss


def _global_acc_between(m, x, backward):
    h = m[1](m[0](x))
    m[0].weight.data.mul_(0.9)   # (``.data``: a write no version check sees, as torch's)
    loss = m[2](h).square().mean()
    backward(loss)
    with flow.no_grad():
        m[2].bias.add_(m[0].weight.sum(0)[:16] * 0.01)
    return loss


def _eager_accumulated(m, opt, program, acc: int) -> list:
    """``STEPS`` eager steps of ``program`` over ``acc`` micro-batches of 4 rows each: the
    parameters after them."""
    for i in range(STEPS):
        opt.zero_grad(set_to_none=True)
        for k in range(acc):
            program(m, flow.from_torch(_global_batch(i)[k * 4:(k + 1) * 4]), lambda loss: (loss / acc).backward())
        opt.step()
    return [p.detach().to_torch() for p in m.parameters()]


def _accumulating_graph(m, opt, program, acc: int, schedule: str | None = None) -> Graph:
    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.set_gradient_accumulation_steps(acc)
            if schedule is not None:
                self.config.set_pipeline_schedule(schedule)

        def build(self, x):
            return program(self.m, x, lambda loss: loss.backward())
    return G()


@pytest.mark.parametrize("schedule", ["1f1b", "gpipe", "zb-h1"])
@pytest.mark.parametrize("program", [_global_acc_after_backward, _global_acc_before_forward, _global_acc_between],
                         ids=lambda p: p.__name__[12:])
def test_global_graph_with_gradient_accumulation_steps_parameters_written_in_build(program, schedule):
    """A global graph runs its micro-batches as runtime iterations (graph/pipeline_run.py): state
    written from no data belongs to the forward's phase, written back after each micro-batch's
    forward (the next one reads it, as in eager); that micro-batch's backward still reads the
    value its forward read, and the step, once, starts from the last written value."""
    from holoflow.distributed import world
    from holoflow.sbp import B
    acc = 2
    m = _global_model()
    want = _eager_accumulated(m, _global_opt("sgd", m), program, acc)

    def run(rank):
        place = flow.placement("cpu", [0])
        m = _global_model()
        m.to_global(place, B)
        g = _accumulating_graph(m, _global_opt("sgd", m), program, acc, schedule)
        for i in range(STEPS):
            g(flow.from_torch(_global_batch(i)).to_global(place, B))
        return [p.to_global(sbp=B).to_local().detach().to_torch() for p in m.parameters()]
    for got in world.simulate(1, run):
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


class _TwoStages(flow.nn.Module):
    """Two Linear layers, the first on placement ``p0``, the second on ``p1`` (pipeline stages)."""

    def __init__(self, p0=None, p1=None):
        super().__init__()
        self.a, self.b = flow.nn.Linear(16, 32), flow.nn.Linear(32, 8)
        gen = torch.Generator().manual_seed(5)
        with flow.no_grad():
            for p in self.parameters():
                p.copy_(flow.from_torch(torch.randn(tuple(p.shape), generator=gen) * 0.3))
        self.p1 = p1
        if p0 is not None:
            from holoflow.sbp import B
            self.a.to_global(placement=p0, sbp=B)
            self.b.to_global(placement=p1, sbp=B)

    def forward(self, x):
        h = self.a(x).tanh()
        if self.p1 is not None:
            from holoflow.sbp import B
            h = h.to_global(placement=self.p1, sbp=B)
        return self.b(h)


def _two_stage_step(m, x, backward):
    loss = m(x).square().mean()
    backward(loss)
    with flow.no_grad():   # each stage's backward reads its weight: the value before these writes
        m.b.weight.add_(0.01)
        m.a.weight.mul_(0.9)
    return loss


def test_pipeline_stages_step_parameters_written_after_backward():
    """Two pipeline stages on two ranks, two micro-batches: as single-process eager."""
    from holoflow.distributed import world
    from holoflow.sbp import B
    acc = 2
    m = _TwoStages()
    want = _eager_accumulated(m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), _two_stage_step, acc)

    def run(rank):
        p0, p1 = flow.placement("cpu", [0]), flow.placement("cpu", [1])
        m = _TwoStages(p0, p1)
        g = _accumulating_graph(m, flow.optim.SGD(m.parameters(), lr=0.1, momentum=0.9), _two_stage_step, acc)
        for i in range(STEPS):
            g(flow.from_torch(_global_batch(i)).to_global(p0, B))
        return [p.to_local().detach().to_torch() if rank in p.placement.flat_ranks else None for p in m.parameters()]
    got = world.simulate(2, run)
    for k, b in enumerate(want):
        a = got[0][k] if got[0][k] is not None else got[1][k]
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

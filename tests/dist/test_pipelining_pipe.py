"""torch's tracer frontend of ``torch.distributed.pipelining``: ``pipeline(module, mb_args,
split_spec=...)`` and ``pipe_split()`` against torch's own ``pipeline()`` on the same models and
weights. In one process: an MLP split at the BEGINNING of layers, a model whose activation crosses
two split points (and a ``detach()`` across a boundary), a stack of transformer blocks split at
their END, a ``pipe_split()`` marker with a keyword input read after it, batch norm's running
statistics written in a stage, in-place writes through views; the stages' composition gives the
module's output and gradients (torch's, and the unsplit holoflow module's), each stage holds
torch's state_dict keys; a ``no_grad`` region (torch's own pipeline() fails on it) against the
unsplit module. On 2 Gloo
ranks: the same script under torch and under mock_torch, ``pipe.build_stage(rank, device)`` run by
GPipe and 1F1B, every rank's outputs, losses, gradients and stepped weights equal torch's. And
torch's refusals: a split_spec key naming no submodule, data-dependent control flow, both
split_spec and split_policy, a stage index out of range."""
import math

import numpy as np
import pytest
import torch
import torch.fx
from test_dtensor_api import _compare, _run
from torch.distributed.pipelining import SplitPoint as TorchSplitPoint
from torch.distributed.pipelining import pipe_split as torch_pipe_split
from torch.distributed.pipelining import pipeline as torch_pipeline

import holoflow as flow
from holoflow.distributed_pipelining import Pipe, build_stage, pipe_split, pipeline
from holoflow.distributed_pipelining.stage import SplitPoint


def models(T, marker):
    """The models, written once on a torch-like library ``T`` (torch or holoflow) with its
    ``pipe_split``: name -> (constructor, mb_args shapes, mb_kwargs shapes, split_spec)."""
    nn = T.nn

    class Skip(nn.Module):   # h = a(x) is read in d's stage: it crosses two split points
        def __init__(self):
            super().__init__()
            self.a, self.b, self.c, self.d = (nn.Linear(6, 6) for _ in range(4))
            self.register_buffer("scale", T.tensor(0.5))

        def forward(self, x):
            h = T.tanh(self.a(x))
            y = T.tanh(self.b(h))
            z = self.c(y) * y.detach()   # (y comes from the previous stage: no gradient through this read)
            return self.d(z) + h * self.scale

    class Block(nn.Module):
        def __init__(self, d, seq):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)
            self.register_buffer("mask", T.triu(T.full((seq, seq), float("-inf")), 1), persistent=False)

        def forward(self, x):
            q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
            att = (q @ k.transpose(-2, -1)) / math.sqrt(q.shape[-1]) + self.mask
            x = x + self.proj(T.softmax(att, dim=-1) @ v)
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class Tiny(nn.Module):   # transformer-ish: blocks, a final norm, a head
        def __init__(self):
            super().__init__()
            self.blocks = nn.ModuleList(Block(8, 5) for _ in range(3))
            self.norm, self.head = nn.LayerNorm(8), nn.Linear(8, 4)

        def forward(self, x):
            for b in self.blocks:
                x = b(x)
            return self.head(self.norm(x))

    class Marked(nn.Module):   # pipe_split() in forward; the keyword input is read after it
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x, bias=None):
            h = T.relu(self.a(x))
            marker()
            return self.b(h + bias), h.sum()

    class InPlace(nn.Module):   # in-place writes through views, a view read across the split
        def __init__(self):
            super().__init__()
            self.a, self.b = nn.Linear(6, 6), nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x)
            v = h.view(4, 3, 2)
            v[:, 0].mul_(2.0)
            h.add_(1.0)
            marker()
            g = (h * 3).detach()
            return self.b(T.relu_(h) + g), v.transpose(1, 2)

    def mlp():
        return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(), nn.Linear(8, 8), nn.Tanh(),
                             nn.Linear(8, 3))

    def bn():
        return nn.Sequential(nn.Linear(6, 6), nn.BatchNorm1d(6), nn.Tanh(), nn.Linear(6, 3))

    return {"mlp": (mlp, [(4, 6)], {}, {"2": "BEGINNING", "4": "BEGINNING"}),
            "skip": (Skip, [(4, 6)], {}, {"b": "BEGINNING", "c": "BEGINNING", "d": "BEGINNING"}),
            "tiny": (Tiny, [(2, 5, 8)], {}, {"blocks.0": "END", "blocks.1": "END"}),
            "marked": (Marked, [(4, 6)], {"bias": (4, 6)}, {}),
            "inplace": (InPlace, [(4, 6)], {}, {}),
            "bn": (bn, [(4, 6)], {}, {"3": "BEGINNING"})}


def _flow(t: torch.Tensor) -> flow.Tensor:
    return flow.tensor(t.detach().numpy().copy())


def _both(name: str) -> tuple:
    """torch's and holoflow's module with the same weights, their inputs (requiring grad) and
    their pipes."""
    make_t, shapes, kw_shapes, spec = models(torch, torch_pipe_split)[name]
    make_f = models(flow, pipe_split)[name][0]
    torch.manual_seed(0)
    mt, mf = make_t(), make_f()
    mf.load_state_dict({k: _flow(v) for k, v in mt.state_dict().items()})
    gen = torch.Generator().manual_seed(1)
    args_t = [torch.randn(*s, generator=gen).requires_grad_() for s in shapes]
    kwargs_t = {k: torch.randn(*s, generator=gen).requires_grad_() for k, s in kw_shapes.items()}
    args_f = [_flow(a).requires_grad_() for a in args_t]
    kwargs_f = {k: _flow(v).requires_grad_() for k, v in kwargs_t.items()}
    pt = torch_pipeline(mt, tuple(args_t), kwargs_t, split_spec={k: getattr(TorchSplitPoint, v) for k, v in spec.items()})
    pf = pipeline(mf, tuple(args_f), kwargs_f, split_spec={k: getattr(SplitPoint, v) for k, v in spec.items()})
    return (mt, args_t, kwargs_t, pt), (mf, args_f, kwargs_f, pf)


def _close(got, want, what: str) -> None:
    if want is None:
        assert got is None, what
        return
    assert got is not None, what
    np.testing.assert_allclose(got.detach().numpy(), want.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=what)


def _loss(out, T):
    """A loss reading every output (weighted, so no gradient is all ones)."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    return sum(((o * T.arange(o.numel()).reshape(o.shape).to(o.dtype).cos()).sum() for o in outs), T.tensor(0.0))


@pytest.mark.parametrize("name", ["mlp", "skip", "tiny", "marked", "inplace", "bn"])
def test_stages_compose_to_the_module_with_torchs_gradients_and_keys(name):
    (mt, args_t, kwargs_t, pt), (mf, args_f, kwargs_f, pf) = _both(name)
    assert isinstance(pf, Pipe) and pf.num_stages == pt.num_stages > 1
    assert [n for n, _ in pf.split_gm.named_children()] == [n for n, _ in pt.split_gm.named_children()]
    for i in range(pt.num_stages):
        assert list(pf.get_stage_module(i).state_dict()) == list(pt.get_stage_module(i).state_dict()), i
    # torch's stages composed (fx's interpreter over split_gm: no detaching between stages)
    out_t = torch.fx.Interpreter(pt.split_gm).run(*args_t, *kwargs_t.values())
    out_t = out_t[0] if len(out_t) == 1 else out_t
    _loss(out_t, torch).backward()
    # holoflow's stages composed, one after the other, then the unsplit module on fresh inputs
    stages = [pf.get_stage_module(i) for i in range(pf.num_stages)]
    out = stages[0](*args_f, **kwargs_f)
    for s in stages[1:]:
        out = s(*out)
    _loss(out, flow).backward()
    got = {i: {n: p.grad for n, p in s.named_parameters()} for i, s in enumerate(stages)}
    input_grads = [a.grad for a in args_f + list(kwargs_f.values())]
    running = {k: v.clone() for k, v in mf.state_dict().items() if "running" in k}
    mf.load_state_dict({k: _flow(v) for k, v in models(torch, None)[name][0]().state_dict().items()
                        if "running" in k or "num_batches" in k}, strict=False)   # (the unsplit run updates them anew)
    mf.zero_grad()
    fresh = [_flow(a).requires_grad_() for a in args_t + list(kwargs_t.values())]
    ref = mf(*fresh[:len(args_t)], **dict(zip(kwargs_f, fresh[len(args_t):])))
    _loss(ref, flow).backward()
    outs = (out, out_t, ref) if isinstance(out, tuple) else ((out,), (out_t,), (ref,))
    for k, (o, t, r) in enumerate(zip(*outs)):
        _close(o, t, f"output {k} vs torch's")
        _close(o, r, f"output {k} vs the unsplit module's")
    for i in range(pt.num_stages):
        want = dict(pt.get_stage_module(i).named_parameters())
        assert set(got[i]) == set(want), i
        for n, g in got[i].items():
            _close(g, want[n].grad, f"stage {i} {n}.grad vs torch's")
            _close(g, dict(mf.named_parameters())[n].grad, f"stage {i} {n}.grad vs the unsplit module's")
    for k, (g, t, f) in enumerate(zip(input_grads, args_t + list(kwargs_t.values()), fresh)):
        _close(g, t.grad, f"input {k} grad vs torch's")
        _close(g, f.grad, f"input {k} grad vs the unsplit module's")
    for k, v in running.items():   # batch norm's statistics, written by the stage that computes them
        _close(v, mt.state_dict()[k], f"{k} vs torch's")


def test_a_skip_value_is_relayed_through_the_stages_between():
    """Stage 0's ``h`` is read by stage 3: stages 1 and 2 take it and hand it on (a PipelineStage
    talks only to its neighbours); the gradient comes back the same way."""
    _, (mf, args_f, _, pf) = _both("skip")
    s0, s1, s2, s3 = (pf.get_stage_module(i) for i in range(4))
    (h,) = s0(*args_f)
    h1, y = s1(h)
    h2, z = s2(h1, y)
    assert h1 is h and h2 is h   # handed on as they came
    out = s3(h2, z)
    np.testing.assert_allclose(out.detach().numpy(), mf(*args_f).detach().numpy(), rtol=1e-6)


def test_a_no_grad_region_stays_out_of_the_gradients():
    """The IR has no node for a ``no_grad`` region: the stage replays its ops cut from autograd as
    traced. (torch's own pipeline() fails on such a region: its export makes it a submodule that
    split_module loses.)"""
    class NoGrad(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = flow.nn.Linear(6, 6), flow.nn.Linear(6, 3)

        def forward(self, x):
            h = self.a(x)
            pipe_split()
            with flow.no_grad():
                g = h * 3
            return self.b(h + g) * g.sum()

    model = NoGrad()
    x = flow.randn(4, 6, requires_grad=True)
    pipe = pipeline(model, (x,))
    out = pipe(x)
    out.sum().backward()
    got = [p.grad.clone() for p in model.parameters()] + [x.grad.clone()]
    model.zero_grad()
    x.grad = None
    ref = model(x)
    ref.sum().backward()
    np.testing.assert_allclose(out.detach().numpy(), ref.detach().numpy(), rtol=1e-6)
    for g, p in zip(got, list(model.parameters()) + [x]):
        np.testing.assert_allclose(g.numpy(), p.grad.numpy(), rtol=1e-5, atol=1e-6)


def test_build_stage_moves_the_stage_and_the_devices_its_ops_create_on():
    """build_stage gives a PipelineStage of the stage module; ops that create tensors (a device
    attribute, or none: the default device) create them on the stage's device, as torch's
    build_stage rewrites the devices its trace burned in."""
    class Creates(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = flow.nn.Linear(4, 4), flow.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x) + flow.arange(4.0)
            pipe_split()
            return self.b(h) * flow.ones(4, device=x.device)

    model = Creates()
    x = flow.randn(3, 4)
    pipe = pipeline(model, (x,))
    stages = [pipe.build_stage(i, flow.device("cpu"), group=[0, 1]) for i in range(2)]
    assert [s.submod for s in stages] == [pipe.get_stage_module(0), pipe.get_stage_module(1)]
    assert [s.stage_index for s in stages] == [0, 1] and stages[1].is_last
    out = stages[1].submod(*stages[0].submod(x))
    np.testing.assert_allclose(out.detach().numpy(), model(x).detach().numpy(), rtol=1e-6)
    again = build_stage(pipe.get_stage_module(1), 1, pipe.info(), "cpu", group=[0, 1])   # torch's module-level form
    assert again.submod is pipe.get_stage_module(1) and again.num_stages == pipe.info().num_stages == 2


def test_pipe_split_is_a_no_op_eagerly_and_the_stages_share_the_module_parameters():
    _, (mf, args_f, kwargs_f, pf) = _both("marked")
    out, total = mf(*args_f, **kwargs_f)
    assert tuple(out.shape) == (4, 3) and tuple(total.shape) == ()
    stage_params = {id(p) for p in pf.parameters()}
    assert stage_params == {id(p) for p in mf.parameters()}


def test_a_split_spec_key_naming_no_submodule_raises_torchs_error_naming_it():
    for key, says in (("blocks.7.ln1", "blocks.7"), ("blocks.0.nope", "nope"), ("wrong", "wrong")):
        make_t, shapes, _, _ = models(torch, torch_pipe_split)["tiny"]
        with pytest.raises(AttributeError, match=says):
            torch_pipeline(make_t(), (torch.randn(*shapes[0]),), split_spec={key: TorchSplitPoint.END})
        make_f = models(flow, pipe_split)["tiny"][0]
        model = make_f()
        with pytest.raises(AttributeError, match=says):
            pipeline(model, (flow.randn(*shapes[0]),), split_spec={key: SplitPoint.END})
        assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())   # (none left behind)


def test_refusals_use_torchs_exception_classes():
    class Branchy(flow.nn.Module):
        def __init__(self):
            super().__init__()
            self.a = flow.nn.Linear(4, 4)

        def forward(self, x):
            h = self.a(x)
            return h * 2 if h.sum() > 0 else h   # data-dependent control flow: not traceable

    x = flow.randn(3, 4)
    with pytest.raises(RuntimeError, match="cannot capture your model as a full graph"):
        pipeline(Branchy(), (x,), split_spec={"a": SplitPoint.END})
    class WritesInput(flow.nn.Module):
        def forward(self, x):
            return x.mul_(2)

    with pytest.raises(NotImplementedError, match=r"writes its input\(s\) \[0\] in place"):
        pipeline(WritesInput(), (x,))
    lin = flow.nn.Linear(4, 4)
    with pytest.raises(ValueError, match="Cannot specify both"):
        pipeline(lin, (x,), split_spec={}, split_policy=lambda gm: gm)
    with pytest.raises(NotImplementedError, match="split_spec"):
        pipeline(lin, (x,), split_policy=lambda gm: gm)
    pipe = pipeline(lin, (x,))
    assert pipe.num_stages == 1
    with pytest.raises(ValueError, match="Invalid stage index 1"):
        pipe.get_stage_module(1)


def test_a_parameter_read_in_two_stages_is_copied_per_stage_as_torchs():
    """torch copies such a parameter into each stage (``replicated_params``; the user all-reduces
    their gradients). Known divergence: torch's export names the second call's module ``a@1``
    (stage 1 holds ``a@1.weight`` and ``a.weight``); holoflow keeps the original name."""
    def make(T, marker):
        class Twice(T.nn.Module):
            def __init__(self):
                super().__init__()
                self.a = T.nn.Linear(4, 4)

            def forward(self, x):
                h = self.a(x)
                marker()
                return self.a(T.tanh(h))
        return Twice()

    torch.manual_seed(0)
    mt, mf = make(torch, torch_pipe_split), make(flow, pipe_split)
    mf.load_state_dict({k: _flow(v) for k, v in mt.state_dict().items()})
    pt = torch_pipeline(mt, (torch.randn(2, 4),))
    pf = pipeline(mf, (flow.randn(2, 4),))
    assert [list(d) for d in pf.replicated_params] == [list(d) for d in pt.replicated_params] == \
        [["submod_pp_0", "submod_pp_1"]] * 2
    assert pf.replicated_params == [{"submod_pp_0": "a.weight", "submod_pp_1": "a.weight"},
                                    {"submod_pp_0": "a.bias", "submod_pp_1": "a.bias"}]
    w0, w1 = pf.get_stage_module(0).a.weight, pf.get_stage_module(1).a.weight
    assert w0 is not w1 and w0 is not mf.a.weight and flow.equal(w0, w1)
    x = flow.randn(2, 4)
    out = pf.get_stage_module(1)(*pf.get_stage_module(0)(x))
    np.testing.assert_allclose(out.detach().numpy(), mf(x).detach().numpy(), rtol=1e-6)


PIPE_SCRIPT = '''
from torch.distributed.pipelining import ScheduleGPipe, Schedule1F1B, SplitPoint, pipeline
import math
dist.init_process_group("gloo")
rank = dist.get_rank()

class Skip(nn.Module):   # h crosses the split into the second stage
    def __init__(self):
        super().__init__()
        self.a, self.b, self.c, self.d = (nn.Linear(6, 6) for _ in range(4))
    def forward(self, x):
        h = torch.tanh(self.a(x))
        y = torch.tanh(self.b(h))
        return self.d(self.c(y) * y) + h

class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln, self.qkv, self.fc = nn.LayerNorm(8), nn.Linear(8, 24), nn.Linear(8, 8)
    def forward(self, x):
        q, k, v = self.qkv(self.ln(x)).chunk(3, dim=-1)
        x = x + torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(8), dim=-1) @ v
        return x + self.fc(nn.functional.gelu(x))

def tiny():
    return nn.Sequential(Block(), Block(), Block(), nn.Linear(8, 2))

def loss_fn(out, target):
    return ((out - target) ** 2).mean()

gen = torch.Generator().manual_seed(1)
cases = {"skip": (Skip, torch.randn(8, 6, generator=gen), torch.randn(8, 6, generator=gen), {"c": SplitPoint.BEGINNING}),
         "tiny": (tiny, torch.randn(8, 5, 8, generator=gen), torch.randn(8, 5, 2, generator=gen), {"1": SplitPoint.END})}
for name, (make, x, y, spec) in cases.items():
    for sched_name, cls in (("gpipe", ScheduleGPipe), ("1f1b", Schedule1F1B)):
        torch.manual_seed(0)
        model = make()
        pipe = pipeline(model, (x[:4],), split_spec=spec)
        stage = pipe.build_stage(rank, torch.device("cpu"))
        mine = pipe.get_stage_module(rank)
        sched = cls(stage, n_microbatches=2, loss_fn=loss_fn)
        opt = torch.optim.SGD(mine.parameters(), lr=0.1)
        res = []
        for step in range(2):
            opt.zero_grad()
            if rank == 0:
                res.append(sched.step(x) is None)
            else:
                losses = []
                out = sched.step(target=y, losses=losses)
                res.append([r6(out), [round(l.item(), 5) for l in losses]])
            grads = {k: r6(p.grad) for k, p in mine.named_parameters()}
            opt.step()
        OUT[f"{name}_{sched_name}"] = [pipe.num_stages, res, list(mine.state_dict()), grads,
                                       {k: r6(v) for k, v in mine.state_dict().items()}]
'''


def test_build_stage_schedules_equal_torchs_on_two_ranks(tmp_path):
    want = _run(tmp_path, "torch", "pipe", PIPE_SCRIPT, 2)
    got = _run(tmp_path, "holoflow", "pipe", PIPE_SCRIPT, 2)
    _compare(got, want)

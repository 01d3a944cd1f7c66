"""Global state meeting nn.Graph, against torch on one process: a parameter re-laid out with
``to_global`` inside ``build()`` is read live each call and trained through the conversion (it
used to be boxed once while tracing: a constant of the first call's values in an inference graph,
silently stale after the weights changed, and a crash in backward); a parameter moved to another
pipeline stage inside ``build()`` (tied weights) is sent each micro-batch and trained through both
uses; and a GradScaler on a global
graph without ZeRO (it used to crash handing local gradient pieces to ``scaler.step``) skips an
overflowing step on every rank, as one process does; and ``to_local()`` of a traced value or of
a parameter inside ``build()`` is refused with what to do instead."""
import pytest
import torch

import micro_fns
import holoflow as flow
from holoflow.distributed import world
from holoflow.sbp import B, S

from test_graph_zero import _run_scaled


def _weights():
    g = torch.Generator().manual_seed(3)
    return torch.randn(6, 5, generator=g), torch.randn(4, 6, generator=g), torch.randint(0, 5, (4,), generator=g)


@pytest.mark.parametrize("held,used", [(S(0), B), (B, S(0)), (S(1), S(0))], ids=["S0-B", "B-S0", "S1-S0"])
def test_inference_graph_reads_a_converted_parameter_live(held, used):
    w0, x0, _ = _weights()

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(place, B).to_global(sbp=held))
        mod = flow.nn.Module()
        mod.w = w

        class Infer(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod

            def build(self, x):
                return x @ self.mod.w.to_global(sbp=used)
        g = Infer()
        x = flow.from_torch(x0).to_global(place, B)
        out = [g(x).to_global(sbp=B).to_local().to_torch()]
        with flow.no_grad():
            w.mul_(2.0)
        out.append(g(x).to_global(sbp=B).to_local().to_torch())
        return out
    for first, second in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(first, x0 @ w0, rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(second, x0 @ (2 * w0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("m", [1, 2])
def test_training_through_a_parameter_converted_in_build(m):
    """``x.to_global(S(1)) @ w.to_global(S(0))`` (a partial-sum product of a broadcast weight
    re-laid out in build) trained with SGD: the weight equals torch's after two steps."""
    w0, _, _ = _weights()
    g = torch.Generator().manual_seed(4)
    xs = [torch.randn(8, 6, generator=g) for _ in range(2)]
    ys = [torch.randint(0, 5, (8,), generator=g) for _ in range(2)]
    w = w0.clone().requires_grad_()
    opt = torch.optim.SGD([w], lr=0.5, momentum=0.9)
    for x, y in zip(xs, ys):
        opt.zero_grad()
        torch.nn.functional.cross_entropy(x @ w, y).backward()
        opt.step()

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        p = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(place, B))
        mod = flow.nn.Module()
        mod.w = p
        o = flow.optim.SGD([p], lr=0.5, momentum=0.9)

        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod
                self.add_optimizer(o)
                self.config.set_gradient_accumulation_steps(m)

            def build(self, x, y):
                loss = flow.nn.functional.cross_entropy(x.to_global(sbp=S(1)) @ self.mod.w.to_global(sbp=S(0)), y)
                loss.backward()
                return loss
        tr = Train()
        for x, y in zip(xs, ys):
            tr(flow.from_torch(x).to_global(place, B), flow.from_torch(y).to_global(place, B))
        return p.to_global(sbp=B).to_local().detach().to_torch()
    for got in world.simulate(2, run, timeout=120):
        torch.testing.assert_close(got, w.detach(), rtol=1e-5, atol=1e-6)


def test_grad_scaler_on_a_global_graph_without_zero_equals_single_process():
    want_params, want_scales = _run_scaled(None, 0)
    assert want_scales == [2.0 ** 10, 2.0 ** 9, 2.0 ** 9, 2.0 ** 10], want_scales   # skipped, then grew
    place = flow.placement("cpu", [0, 1])
    for params, scales in world.simulate(2, lambda r: _run_scaled(place, 0)):
        assert scales == want_scales
        for a, b in zip(params, want_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_grad_scaler_on_a_global_graph_without_zero_on_gloo(world2):
    want_params, want_scales = _run_scaled(None, 0)
    for params, scales in world2.run(micro_fns.scaled_steps):
        assert scales == want_scales
        for a, b in zip(params, want_params):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_to_local_of_a_traced_value_is_refused_naming_it():
    """``y.to_local()`` inside build used to go on as the whole logical value (``.sum()`` summing
    every rank's shard, unlike eager's local sum), silently."""
    w0, x0, _ = _weights()

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.nn.Parameter(flow.from_torch(w0.clone()).to_global(place, B).to_global(sbp=S(1)))
        mod = flow.nn.Module()
        mod.w = w

        class Infer(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod

            def build(self, x):
                return (x @ self.mod.w).to_local().sum()
        Infer()(flow.from_torch(x0).to_global(place, B))
    with pytest.raises(RuntimeError, match=r"to_local: inside nn.Graph's build\(\), the global tensor \(shape "
                                           r"\(4, 5\), sbp \(S\(1\)\).*return the global tensor from build\(\)"):
        world.simulate(2, run, timeout=60)


@pytest.mark.parametrize("m", [1, 2])
def test_a_parameter_moved_to_another_stage_in_build_simulated(m):
    """A weight tied across pipeline stages (stage 1 reads stage 0's parameter through
    ``to_global(placement=...)`` in build): its copy is sent each micro-batch and its gradient
    comes back, as torch's two uses of one weight."""
    want = micro_fns.torch_tied_stages(m)
    for got in world.simulate(2, lambda r: micro_fns.tied_stages(r, m), timeout=120):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_a_parameter_moved_to_another_stage_in_build_on_gloo(world2):
    want = micro_fns.torch_tied_stages(2)
    for got in world2.run(micro_fns.tied_stages, 2):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("train", [False, True], ids=["inference", "training"])
def test_to_local_of_a_parameter_in_build_is_refused_naming_it(train):
    """``w.to_local()`` of a live parameter inside build used to take this rank's shard while
    tracing: in a training graph its gradient went to ``.grad`` at trace time (a confusing
    ".grad was set outside build()" error), in an inference graph a local alias of the storage it
    held then (stale once ZeRO-3 or a load re-lays it out). As a traced value's ``to_local()`` is,
    it is refused, naming what to do."""
    w0, x0, _ = _weights()

    def run(rank):
        place = flow.placement("cpu", [0, 1])
        w = flow.nn.Parameter(flow.from_torch(w0.t().contiguous()).to_global(place, B).to_global(sbp=S(0)))
        mod = flow.nn.Module()
        mod.w = w
        opt = flow.optim.SGD([w], lr=0.1)

        class G(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.mod = mod
                if train:
                    self.add_optimizer(opt)

            def build(self, x):
                loss = (x @ self.mod.w.to_local().t()).sum()
                if train:
                    loss.backward()
                return loss
        G()(flow.from_torch(x0))
    with pytest.raises(RuntimeError, match=r"to_local: inside nn.Graph's build\(\), a global tensor made outside it "
                                           r"\(a parameter or buffer; shape \(5, 6\), sbp \(S\(0\)\).*Compute on "
                                           r"it globally inside build\(\).*or call .to_local\(\) outside build\(\)"):
        world.simulate(2, run, timeout=60)

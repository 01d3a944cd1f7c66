"""Optimizer step hooks (``register_step_pre_hook`` / ``register_step_post_hook`` and every
optimizer's) run around each step an nn.Graph lowers, as around eager's ``opt.step()``: once per
graph call (gradient accumulation included), pre hooks before the update (a learning rate they
set is the one the update uses), post hooks after it; on local and global graphs, with ZeRO, a
fused update, a GradScaler and parameter groups. They used to be skipped silently."""
import pytest
import torch

import holoflow as flow
import micro_fns as F
from holoflow.distributed import world

MODES = ["plain", "acc", "zero", "fuse", "scaler", "groups"]


def _check(got: list, want: list) -> None:
    assert [e[0] for e in got] == [e[0] for e in want]
    for (kind, a), (_, b) in zip(got, want):
        if kind == "pre":
            assert a == pytest.approx(b)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("mode", MODES)
def test_step_hooks_run_around_each_local_graph_step(mode):
    _check(F.hooked_steps(None, mode), F.hooked_steps(None, mode, lib=torch))


@pytest.mark.parametrize("mode", MODES)
def test_step_hooks_run_around_each_global_graph_step_simulated(mode):
    want = F.hooked_steps(None, mode, lib=torch)
    for got in world.simulate(2, lambda r: F.hooked_steps(r, mode), timeout=120):
        _check(got, want)


def test_step_hooks_on_gloo(world2):
    for mode in ("plain", "acc", "zero"):
        want = F.hooked_steps(None, mode, lib=torch)
        for got in world2.run(F.hooked_steps, mode):
            _check(got, want)


def test_hooks_added_or_removed_after_compiling():
    """A hook registered after the first call runs from the next call on (the plan is compiled
    again); a removed one no longer runs; the global hooks of every optimizer run too."""
    lin = flow.nn.Linear(3, 2)
    opt = flow.optim.SGD(lin.parameters(), lr=0.1)

    g, seen = F.train_graph({"lin": lin}, opt, lambda g, x: g.lin(x).sum()), []
    x = flow.ones(4, 3)
    g(x)
    h = opt.register_step_post_hook(lambda o, a, k: seen.append("post"))
    g(x)
    assert seen == ["post"]
    every = flow.optim.optimizer.register_optimizer_step_pre_hook(lambda o, a, k: seen.append("every"))
    try:
        g(x)
        assert seen == ["post", "every", "post"]
        h.remove()
        g(x)
        assert seen == ["post", "every", "post", "every"]
    finally:
        every.remove()
    g(x)
    assert seen == ["post", "every", "post", "every"]


def test_a_malformed_pre_hook_result_raises():
    lin = flow.nn.Linear(3, 2)
    opt = flow.optim.SGD(lin.parameters(), lr=0.1)
    opt.register_step_pre_hook(lambda o, a, k: 3)

    with pytest.raises(Exception, match=r"pre-hook of SGD must return None or a tuple"):
        F.train_graph({"lin": lin}, opt, lambda g, x: g.lin(x).sum())(flow.ones(4, 3))


def _grad_norm_log(rank, mode: str, eager_torch: bool = False):
    """Hooks that read the gradients (``p.grad``, as eager's): the pre hook records the total
    gradient norm, the post hook the weight's gradient sum; ``mode`` as in ``micro_fns``
    (``eager_torch``: torch's eager steps, the reference)."""
    lib = torch if eager_torch else flow
    xs, _, w0 = F.data(2, 2)
    lin = lib.nn.Linear(6, 5)
    with lib.no_grad():
        lin.weight.copy_(w0.t() if lib is torch else flow.from_torch(w0.t().contiguous()))
        lin.bias.fill_(0.1)
    place = flow.placement("cpu", [0, 1]) if rank is not None and lib is flow else None
    if place is not None:
        lin.to_global(place, flow.sbp.broadcast)
    opt = lib.optim.SGD(lin.parameters(), lr=0.1)
    log = []

    def val(t):
        return float(t.numpy()) if lib is flow else float(t)
    opt.register_step_pre_hook(lambda o, a, k: log.append(val(lib.stack([p.grad.norm() for p in lin.parameters()])
                                                                .norm())))
    opt.register_step_post_hook(lambda o, a, k: log.append(val(lin.weight.grad.sum())))
    if lib is torch:
        for x in xs:
            opt.zero_grad()
            (lin(x) ** 2).mean().backward()
            opt.step()
        return log

    g = F.square_loss_graph(lin, opt, mode)
    for x in xs:
        t = flow.from_torch(x)
        g(t.to_global(place, flow.sbp.broadcast).to_global(sbp=flow.sbp.split(0)) if place is not None else t)
    assert lin.weight.grad is None   # only while the hooks run
    return log


@pytest.mark.parametrize("mode", ["plain", "acc", "zero", "scaler"])
def test_hooks_see_the_step_gradients(mode):
    want = _grad_norm_log(None, mode, True)
    assert _grad_norm_log(None, mode) == pytest.approx(want, rel=1e-5)
    for got in world.simulate(2, lambda r: _grad_norm_log(r, mode), timeout=120):
        assert got == pytest.approx(want, rel=1e-5)


def test_hooks_see_the_step_gradients_on_gloo(world2):
    for mode in ("plain", "zero"):
        want = _grad_norm_log(None, mode, True)
        for got in world2.run(_grad_norm_log, mode):
            assert got == pytest.approx(want, rel=1e-5)


def test_step_hooks_run_on_every_pipeline_stage():
    """Each stage's rank runs the hooks once per step, seeing its own stage's gradients; a
    learning rate a pre hook sets is the one every stage's update uses."""
    want = F.torch_two_stage_square(2, lr_by_step=True)
    for rank, (got, log) in enumerate(world.simulate(2, lambda r: F.two_stage_square(r, 2, False, hooks=True),
                                                     timeout=120)):
        mine = (True, False) if rank == 0 else (False, True)
        assert log == [mine, "post", mine, "post"]
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("scaler", [False, True], ids=["plain", "scaler"])
def test_pipeline_step_hooks_see_each_stage_gradients(scaler):
    """Each stage's hooks see its parameters' ``.grad`` (this rank's piece, as a global tensor;
    with a GradScaler unscaled, as torch's ``scaler.step(opt)`` hands them to ``opt.step()``), and
    no ``.grad`` of the other stage's. With a scaler they used to see no gradient at all."""
    want_log, want = F.torch_stage_grad_hooks(2)
    for rank, (log, got) in enumerate(world.simulate(2, lambda r: F.stage_grad_hooks(r, 2, scaler), timeout=120)):
        assert [kind for kind, _ in log] == [kind for kind, _ in want_log]
        for (_, sums), (_, want_sums) in zip(log, want_log):
            assert sums[1 - rank] is None
            assert sums[rank] == pytest.approx(want_sums[rank], rel=1e-5)
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)

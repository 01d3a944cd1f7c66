"""fully_shard communicates while the ranks compute (simulated ranks): the next group's
all-gather is issued before this group's forward computes (the group that ran next in the last
pass, or ``set_modules_to_forward_prefetch``'s), the next call's refill before this call's
backward computes (or ``set_modules_to_backward_prefetch``'s), a gather issued ahead is not used
if a shard was written since, one issued for a group that does not run is dropped, and training
is bit for bit what it is without prefetching."""
import numpy as np
import pytest

import holoflow as flow
from holoflow.distributed import world
from holoflow.distributed.device_mesh import DeviceMesh
from holoflow.dtensor.fsdp import _fully_shard, fully_shard


def _weights() -> dict:
    rng = np.random.default_rng(5)
    out = {}
    for i in range(4):
        out[f"{i}.0.weight"] = rng.standard_normal((6, 6)).astype(np.float32) * 0.4
        out[f"{i}.0.bias"] = rng.standard_normal(6).astype(np.float32) * 0.1
    return out


class _Skippable(flow.nn.Sequential):
    """Blocks in order; a block named in ``skip`` does not run."""

    skip: tuple = ()

    def forward(self, x):
        for i, block in enumerate(self):
            if i not in self.skip:
                x = block(x)
        return x


def _model(weights: dict, log: list | None = None) -> _Skippable:
    m = _Skippable(*[flow.nn.Sequential(flow.nn.Linear(6, 6), flow.nn.Tanh()) for _ in range(4)])
    m.load_state_dict({k: flow.tensor(v) for k, v in weights.items()})
    if log is not None:
        for i, block in enumerate(m):
            block[0].register_forward_pre_hook(lambda mod, a, i=i: log.append(f"fwd{i}"))
            block[0].register_full_backward_hook(lambda mod, gi, go, i=i: log.append(f"bwd{i}"))
    return m


def _shard(m: _Skippable, reshard: bool | None = None) -> None:
    mesh = DeviceMesh("cpu", [0, 1])
    for block in m:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(m, mesh=mesh)


@pytest.fixture
def gathers(monkeypatch):
    """Every all-gather issued, as ``gather<block>`` in each simulated rank's log, every
    reduce-scatter as ``reduce<block>`` when issued and ``landed<block>`` when its gradients are
    added to the shards' ``.grad``."""
    logs: dict = {}
    owners: dict = {}
    issue, reduce, land = _fully_shard._gather_flat_async, _fully_shard._reduce_scatter_flat_async, \
        _fully_shard._State._land

    def blocks(shards) -> str:
        return ",".join(sorted({owners[id(s)] for s in shards}))

    def logged(shards, mesh, dtype=None):
        logs.setdefault(world.rank(), []).append("gather" + blocks(shards))
        return issue(shards, mesh, dtype)

    def logged_reduce(items, mesh, divide=1.0):
        logs.setdefault(world.rank(), []).append("reduce" + blocks([s for s, _ in items]))
        return reduce(items, mesh, divide)

    def logged_land(self, shards, locals_):
        logs.setdefault(world.rank(), []).append("landed" + blocks(shards))
        return land(self, shards, locals_)
    monkeypatch.setattr(_fully_shard, "_gather_flat_async", logged)
    monkeypatch.setattr(_fully_shard, "_reduce_scatter_flat_async", logged_reduce)
    monkeypatch.setattr(_fully_shard._State, "_land", logged_land)

    def own(m: _Skippable) -> None:
        for i, block in enumerate(m):
            for p in block.parameters():
                owners[id(p)] = str(i)
    return logs, own


def _order(r, weights, x, gathers, setup=None) -> list:
    """Rank ``r``'s gathers and computations in the second of two training steps."""
    logs, own = gathers
    log = logs.setdefault(r, [])
    m = _model(weights, log)
    _shard(m)
    own(m)
    if setup is not None:
        setup(m)
    opt = flow.optim.SGD(m.parameters(), lr=0.1)
    for _ in range(2):
        log.clear()
        (m(flow.tensor(x)) ** 2).sum().backward()
        opt.step()
        opt.zero_grad()
    return list(log)


X = np.linspace(-1, 1, 12, dtype=np.float32).reshape(2, 6)


def _gathers_and_compute(log: list) -> list:
    return [e for e in log if not e.startswith(("reduce", "landed"))]


def test_the_next_groups_gather_is_issued_before_this_group_computes(gathers):
    """Default: in forward each block's pre-hook issues the next block's gather (the order of
    the last pass), in backward each block's pre-backward issues the refill of the block before
    it: every gather after the first of each direction is in flight while a block computes. A
    block's reduce-scatter is issued when its gradients are complete (after the block's backward
    hook: the engine runs the newest ready node first, as torch's, so the block's input gradient
    before its parameters' older gradient nodes, as torch FSDP2's post-backward) and lands (its
    gradients added to the shards) once the next block's are: it runs while that block's backward
    computes. The first block's lands before backward returns."""
    weights = _weights()
    for log in world.simulate(2, lambda r: _order(r, weights, X, gathers)):
        assert [e for e in log if e.startswith(("reduce", "landed", "bwd"))] == [
            "bwd3", "reduce3", "bwd2", "reduce2", "landed3", "bwd1", "reduce1", "landed2", "bwd0", "reduce0",
            "landed1", "landed0"]
        assert _gathers_and_compute(log) == ["gather0", "gather1", "fwd0", "gather2", "fwd1", "gather3", "fwd2", "fwd3",
                       "gather3", "gather2", "bwd3", "gather1", "bwd2", "gather0", "bwd1", "bwd0"]


def test_explicit_prefetch_lists_replace_the_default_ones(gathers):
    """Empty lists: every gather where it is used; block 0 naming blocks 1 and 2 in forward,
    block 3 naming blocks 2 and 1 in backward: those issued there."""
    weights = _weights()

    def none(m):
        for block in m:
            block.set_modules_to_forward_prefetch([])
            block.set_modules_to_backward_prefetch([])
        m.set_modules_to_forward_prefetch([])
    for log in world.simulate(2, lambda r: _order(r, weights, X, gathers, none)):
        assert _gathers_and_compute(log) == ["gather0", "fwd0", "gather1", "fwd1", "gather2", "fwd2", "gather3", "fwd3",
                       "gather3", "bwd3", "gather2", "bwd2", "gather1", "bwd1", "gather0", "bwd0"]

    def two_ahead(m):
        none(m)
        m[0].set_modules_to_forward_prefetch([m[1], m[2]])
        m[3].set_modules_to_backward_prefetch([m[2], m[1]])
    for log in world.simulate(2, lambda r: _order(r, weights, X, gathers, two_ahead)):
        assert _gathers_and_compute(log) == ["gather0", "gather1", "gather2", "fwd0", "fwd1", "fwd2", "gather3", "fwd3",
                       "gather3", "gather2", "gather1", "bwd3", "bwd2", "bwd1", "gather0", "bwd0"]


def test_prefetch_lists_take_fully_shard_modules_only():
    def f(r):
        m = _model(_weights())
        _shard(m)
        with pytest.raises(ValueError, match="takes modules sharded by fully_shard, got \\['Linear'\\]"):
            m[0].set_modules_to_forward_prefetch([m[1][0]])
        return True
    assert world.simulate(2, f) == [True, True]


def _train(r, weights, xs, prefetch: bool, reshard, skip_at: int | None = None) -> dict:
    m = _model(weights)
    _shard(m, reshard)
    if not prefetch:
        for block in [*m, m]:
            block.set_modules_to_forward_prefetch([])
            block.set_modules_to_backward_prefetch([])
    opt = flow.optim.AdamW(m.parameters(), lr=0.05)
    for step, x in enumerate(xs[r]):
        m.skip = (2,) if step == skip_at else ()
        (m(flow.tensor(x)) ** 2).mean().backward()
        assert all(b._fsdp_state.ahead is None for b in m)   # (a prefetched block that did not run: dropped)
        opt.step()
        opt.zero_grad()
    return {k: p.full_tensor().detach().numpy() for k, p in m.named_parameters()}


def _one_process(weights, xs, skip_at: int | None = None) -> dict:
    m = _model(weights)
    opt = flow.optim.AdamW(m.parameters(), lr=0.05)
    for step in range(len(xs[0])):
        m.skip = (2,) if step == skip_at else ()
        (sum((m(flow.tensor(x[step])) ** 2).mean() for x in xs) / len(xs)).backward()
        opt.step()
        opt.zero_grad()
    return {k: p.detach().numpy() for k, p in m.named_parameters()}


@pytest.mark.parametrize("reshard", [None, False], ids=["resharded", "kept"])
def test_prefetching_trains_bit_for_bit_as_gathering_in_place(reshard):
    """Four AdamW steps, each rank its own batches; block 2 skipped in the third step (the gather
    block 1 issued for it is waited for and dropped when the forward ends): prefetching or not,
    the same bits, and one process's data parallel values."""
    weights = _weights()
    xs = [[X * (1 + r + s / 4) for s in range(4)] for r in range(2)]
    on = world.simulate(2, lambda r: _train(r, weights, xs, True, reshard, skip_at=2))
    off = world.simulate(2, lambda r: _train(r, weights, xs, False, reshard, skip_at=2))
    want = _one_process(weights, xs, skip_at=2)
    for a, b in zip(on, off):
        for k in want:
            np.testing.assert_array_equal(a[k], b[k])
            np.testing.assert_allclose(a[k], want[k], rtol=1e-5, atol=1e-6)


def test_a_gather_issued_before_the_shards_changed_is_not_used():
    """``unshard(async_op=True)``, then the shards written (an optimizer step): the forward
    gathers the new values; the handle's ``wait()`` registers the unsharded parameters."""
    def f(r):
        m = flow.nn.Linear(4, 4)
        fully_shard(m, mesh=DeviceMesh("cpu", [0, 1]))
        x = flow.ones(1, 4)
        handle = m.unshard(async_op=True)
        with flow.no_grad():
            for p in m.parameters():
                p.add_(1.0)
        stale_issued = m(x)
        fresh = m(x)
        handle = m.unshard(async_op=True)
        handle.wait()
        registered = not m.weight.is_global
        m.reshard()
        return stale_issued.detach().numpy(), fresh.detach().numpy(), registered, handle
    for stale, fresh, registered, _ in world.simulate(2, f):
        np.testing.assert_array_equal(stale, fresh)
        assert registered

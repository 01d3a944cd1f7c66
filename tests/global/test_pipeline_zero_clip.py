"""Pipeline stages with ZeRO (1, 2, 3), gradient clipping and a GradScaler: ZeRO inside
data-parallel stages and clipping each stage's parameters equal single-process full-batch
training; what is not supported (one clip over several stages' parameters, a GradScaler) raises
UnsupportedError naming it instead of training wrongly."""
import pytest

import holoflow as flow
from holoflow.core.errors import UnsupportedError
from holoflow.core.sbp import B, S
from holoflow.distributed import world
from holoflow.graph.zero import state_bytes

import pipeline_fns as F
from test_pipeline_stages import INIT, _rel


def _run(rank, dp=2, zero=0, clip=None, scaler=False, steps=3, m=4):
    p0 = flow.placement("cpu", ranks=list(range(dp)))
    p1 = flow.placement("cpu", ranks=list(range(dp, 2 * dp)))
    sbp = [S(0)] if dp > 1 else [B]
    net = F.Net(p0=p0, p1=p1, sbp=sbp, init=INIT)
    o = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.net = net
            self.net.s0.to(flow.nn.graph.GraphModule).set_stage(0, p0)
            self.net.s1.to(flow.nn.graph.GraphModule).set_stage(1, p1)
            self.config.set_gradient_accumulation_steps(m)
            if zero:
                self.config.enable_zero(True, stage=zero, shard_min_size=1)
            if scaler:
                self.set_grad_scaler(flow.amp.GradScaler("cpu", init_scale=1024.0))
            self.add_optimizer(o)

        def build(self, x, y):
            loss = flow.nn.functional.cross_entropy(self.net(x), y)
            loss.backward()
            if clip == "per_stage":
                for part in (self.net.s0, self.net.s1):
                    flow.nn.utils.clip_grad_norm_(part.parameters(), 0.05)
            elif clip == "whole":
                flow.nn.utils.clip_grad_norm_(self.net.parameters(), 0.05)
            return loss

    g = G()
    for s in range(steps):
        x, y = F.data(16, s)
        g(flow.tensor(x).to_global(placement=p0, sbp=sbp), flow.tensor(y).to_global(placement=p1, sbp=sbp))
    params = {}
    for k, v in net.state_dict().items():
        place = p0 if k.startswith("s0") else p1
        params[k] = v.to_global(placement=place, sbp=[B]).to_local().numpy().copy() \
            if rank in place.flat_ranks else None
    return params, state_bytes(o)


def _reference(clip=None, steps=3):
    net = F.make()
    o = flow.optim.SGD(net.parameters(), lr=0.1, momentum=0.9)
    for s in range(steps):
        x, y = F.data(16, s)
        loss = flow.nn.functional.cross_entropy(net(flow.tensor(x)), flow.tensor(y))
        o.zero_grad()
        loss.backward()
        if clip == "per_stage":
            for part in (net.s0, net.s1):
                flow.nn.utils.clip_grad_norm_(part.parameters(), 0.05)
        o.step()
    return {k: v.detach().numpy().copy() for k, v in net.state_dict().items()}


@pytest.mark.parametrize("zero", [1, 2, 3])
def test_zero_inside_pp2_x_dp2_stages_equals_full_batch_and_shards_state(zero):
    want = _reference()
    plain = world.simulate(4, lambda r: _run(r, zero=0))
    res = world.simulate(4, lambda r: _run(r, zero=zero))
    for (params, nbytes), (_, full) in zip(res, plain):
        assert _rel(params, want) < 1e-5
        assert 0 < nbytes < full      # momentum buffers hold this rank's rows only


def test_clip_grad_norm_per_stage_equals_full_batch():
    want = _reference(clip="per_stage")
    assert _rel(want, _reference()) > 1e-3          # the clip changes training
    for dp in (1, 2):
        for params, _ in world.simulate(2 * dp, lambda r: _run(r, dp=dp, clip="per_stage")):
            assert _rel(params, want) < 1e-5


def test_clip_over_several_stages_and_a_grad_scaler_raise_unsupported():
    def run(rank, **kw):
        try:
            _run(rank, dp=1, steps=1, **kw)
        except UnsupportedError as e:
            return str(e)
        return None
    for msg in world.simulate(2, lambda r: run(r, clip="whole")):
        assert msg is not None and "clip_grad_norm_" in msg and "stage 1" in msg and "stage 0" in msg
    for msg in world.simulate(2, lambda r: run(r, scaler=True)):
        assert msg is not None and "GradScaler" in msg

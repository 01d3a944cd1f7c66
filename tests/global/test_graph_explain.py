"""explain on global graphs: every boxing node with its user line, bytes and predicted time; the
predicted payload bytes equal what flow.comm.count measures, for a data-parallel training step
(bucketed gradients, the loss's partial sums) and under ZeRO; debug(1) prints the table."""
import pytest
import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.graph.global_graph import LinkModel, calibrate, link_model
from holoflow.sbp import B, S


def _train_step(rank: int, zero: int, debug: int = 0):
    place = flow.placement("cpu", [0, 1])
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(16, 64), flow.nn.GELU(), flow.nn.Linear(64, 10))
    m.to_global(place, B)
    opt = flow.optim.AdamW(m.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(0.004)   # a few buckets
            if zero:
                self.config.enable_zero(True, stage=zero, shard_min_size=64)
            self.debug(debug)
            self.config.set_executor("sequential")

        def build(self, x, t):
            loss = flow.nn.functional.cross_entropy(self.m(x), t, ignore_index=3)
            loss.backward()
            return loss
    g = G()
    gen = torch.Generator().manual_seed(1)
    x = flow.from_torch(torch.randn(8, 16, generator=gen)).to_global(place, B).to_global(sbp=S(0))
    t = flow.from_torch(torch.randint(0, 10, (8,), generator=gen)).to_global(place, B).to_global(sbp=S(0))
    # simulated ranks: the shared in-memory communicator logs each collective once, with the
    # payload of the group's first rank (rank 0 here, which also logs it, so this is in order);
    # the sequential executor runs every collective of a step before the call returns. Two
    # steps, the first compiling (and calibrating the links, with debug)
    calls = world.comm().calls
    n0 = len(calls)
    g(x, t)
    g(x, t)
    n1 = len(calls)
    step = [(kind, nbytes) for kind, _, nbytes in calls[n0:n1] if kind != "meta"]
    measured = sum(nbytes for _, nbytes in step)
    predicted = 2 * sum(p.payload_bytes(0) for p in g.boxing())
    return measured, predicted, g.explain(), step


@pytest.mark.parametrize("zero", [0, 2, 3])
def test_predicted_bytes_equal_measured_for_a_training_step(zero):
    for measured, predicted, text, counts in world.simulate(2, lambda r: _train_step(r, zero)):
        assert predicted == measured > 0, (predicted, measured, counts)
        assert "cross_entropy" in text or "test_graph_explain.py:" in text
        assert "predicted" in text and " ms" in text


def test_debug_1_prints_the_boxing_table_with_calibrated_links(capsys):
    world.simulate(2, lambda r: _train_step(r, 0, debug=1))
    printed = capsys.readouterr().out
    assert "boxing node(s)" in printed and "calibrated)" in printed and "not calibrated" not in printed


def test_calibration_measures_latency_and_bandwidth_and_predicts_from_bytes():
    place = flow.placement("cpu", [0, 1])
    links = world.simulate(2, lambda r: calibrate(place, nbytes=1 << 18, repeats=2))
    assert links[0] == links[1] and links[0].calibrated   # the same figures on every rank
    assert links[0].latency_s > 0 and links[0].bytes_per_s > 0
    assert link_model(place) == links[0]
    default = LinkModel()
    assert not default.calibrated and "not calibrated" in str(default)


def _bucket_points(rank: int):
    place = flow.placement("cpu", [0, 1])
    m = flow.nn.Sequential(flow.nn.Linear(16, 64), flow.nn.GELU(), flow.nn.Linear(64, 10))
    m.to_global(place, B)
    opt = flow.optim.SGD(m.parameters(), lr=0.01)

    class G(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.m = m
            self.add_optimizer(opt)
            self.config.set_executor("sequential")

        def build(self, x):
            loss = self.m(x).square().mean()
            loss.backward()
            return loss
    g = G()
    g(flow.from_torch(torch.ones(8, 16)).to_global(place, B).to_global(sbp=S(0)))
    return g.boxing()


def test_a_buckets_latency_is_predicted_once_not_per_member():
    """A bucket of gradients is one all-reduce: its predicted time is one latency plus its bytes
    over the links, however many gradients it holds (each member carries its share)."""
    link = LinkModel(latency_s=1e-3, bytes_per_s=1e9)
    points = world.simulate(2, _bucket_points)[0]
    buckets: dict = {}   # a bucket's members are its node with one input each, sharing its attrs
    for p in points:
        if p.node.op == "global_box_bucket":
            buckets.setdefault(id(p.node.attrs), []).append(p)
    members = [p for ps in buckets.values() for p in ps]
    assert buckets and len(members) >= 2          # the parameters' gradients, bucketed
    predicted = sum(link.seconds(p) for p in members)
    expected = len(buckets) * 1e-3 + sum(p.comm_bytes for p in members) / 1e9
    assert predicted == pytest.approx(expected, rel=1e-9)


def test_collectives_issued_in_flight_are_marked():
    """Data parallel's gradient all-reduces (one collective each) are issued in flight and say
    so; on a 2 x 2 mesh a partial sum over both axes boxed to broadcast takes two all-reduces
    one after the other, which hold the caller: not marked."""
    from holoflow.graph.global_graph import GLOBAL_BOX, BoxingPoint
    from holoflow.graph.ir import Node, Value
    from holoflow.sbp import P
    for _, _, text, _ in world.simulate(2, lambda r: _train_step(r, 0)):
        grads = [line for line in text.splitlines() if "all_reduce" in line and "[backward]" in line]
        assert grads and all("[in flight]" in line for line in grads), text
    mesh = flow.placement("cpu", [[0, 1], [2, 3]])
    x, y = Value((4,), torch.float32), Value((4,), torch.float32)
    node = Node(GLOBAL_BOX.name, (x,), {"place": mesh, "src": (P, P), "dst": (B, B)}, (y,))
    one = node.with_(attrs={"place": mesh, "src": (P, B), "dst": (B, B)})
    assert not BoxingPoint(node, (P, P), (B, B), 16, 16.0, ()).in_flight
    assert BoxingPoint(one, (P, B), (B, B), 16, 16.0, ()).in_flight

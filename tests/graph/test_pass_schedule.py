"""schedule: collectives issued as early as their inputs allow, readers of their results sunk,
random draws and collectives in traced order, the same order from the same graph, and a global
graph's results bit-equal to the traced order's; lowering then issues the collective where it
stands and waits for it just before its first reader (global_graph.issue_collectives)."""
import threading

import torch

import holoflow as flow
from holoflow.distributed import world
from holoflow.graph.global_graph import GLOBAL_BOX, GLOBAL_BOX_BUCKET, issue_collectives
from holoflow.graph.ir import IRGraph, Node, Value, check, split_tasks
from holoflow.graph.passes import schedule as sched
from holoflow.graph.passes.bucket_gathers import bucket_gathers
from holoflow.graph.passes.shard_elementwise import shard_elementwise
from holoflow.sbp import B, P, S

PLACE = flow.placement("cpu", [0, 1])


def val(*shape, name=""):
    return Value(tuple(shape), torch.float32, name=name)


def box(x, out):
    return Node(GLOBAL_BOX.name, (x,), {"place": PLACE, "src": (P,), "dst": (B,)}, (out,), source="t.py:1")


def node(op, ins, outs, **attrs):
    return Node(op, tuple(ins), attrs, tuple(outs), source="t.py:1")


def loss_graph():
    """forward (a chain on x), then a denominator made from the targets only and all-reduced,
    the loss dividing by it, and a dropout before and after the denominator's draw-free cone."""
    x, y, w = val(4, name="x"), val(4, name="y"), val(4, name="w")
    h1, h2, m1, h3, m3, tot, tot_b, loss = (val(4) for _ in range(8))
    nodes = (node("mul", (x, w), (h1,)),
             node("dropout", (h1,), (h2, m1), p=0.5, training=True, generator=None),
             node("exp", (h2,), (h3,)),
             node("abs", (y,), (tot,)),                 # the targets' local total
             box(tot, tot_b),                           # its all-reduce
             node("dropout", (h3,), (m3, val(4)), p=0.5, training=True, generator=None),
             node("div", (m3, tot_b), (loss,)))         # reads the collective's result
    return check(IRGraph((x, y), ((w, torch.ones(4)),), nodes, (loss,)))


def ops(g):
    return [n.op for n in g.nodes]


def test_collective_hoisted_to_its_inputs_and_its_reader_sunk():
    g = loss_graph()
    h = check(sched.schedule(g))
    assert ops(h) == ["abs", "global_box", "mul", "dropout", "exp", "dropout", "div"]
    assert sched.moved(g, h) == [("global_box", 4, 1)]


def test_same_order_every_time_and_from_an_equal_graph():
    a, b = loss_graph(), loss_graph()    # the same program traced twice (new Values, new nodes)
    assert sched.order(a) == sched.order(b) == sched.order(a)


def test_random_draws_keep_their_order_even_inside_a_collective_cone():
    x, w = val(4, name="x"), val(4, name="w")
    d1, k1, d2, k2, big, s, sb, out = (val(4) for _ in range(8))
    nodes = (node("dropout", (x,), (d1, k1), p=0.5, training=True, generator=None),
             node("mul", (d1, w), (big,)),
             node("dropout", (w,), (d2, k2), p=0.5, training=True, generator=None),   # the cone's draw
             node("abs", (d2,), (s,)),
             box(s, sb),
             node("add", (big, sb), (out,)))
    g = check(IRGraph((x,), ((w, torch.ones(4)),), nodes, (out,)))
    h = check(sched.schedule(g))
    draws = [n for n in h.nodes if n.op == "dropout"]
    assert draws == [n for n in g.nodes if n.op == "dropout"]     # first draw still first
    assert ops(h).index("global_box") < ops(h).index("mul")      # yet the collective went up


def test_collectives_keep_their_order_and_state_reads_are_not_hoisted():
    x, w = val(4, name="x"), val(4, name="w")
    a, b, c, ab, cb, wb, out = (val(4) for _ in range(7))
    nodes = (node("exp", (x,), (a,)),
             node("exp", (a,), (b,)),
             box(b, ab),                  # first collective: its cone is the two exps
             node("abs", (x,), (c,)),
             box(c, cb),                  # cheaper cone, yet stays after the first
             node("mul", (x, x), (out,)),
             box(w, wb),                  # reads state (a ZeRO-3 style gather): not hoisted
             node("add", (out, wb), (val(4),)))
    g = check(IRGraph((x,), ((w, torch.ones(4)),), nodes, (out,)))
    h = check(sched.schedule(g))
    boxes = [n.inputs[0] for n in h.nodes if n.op == "global_box"]
    assert boxes == [b, c, w]
    assert ops(h).index("mul") < [n.inputs[0] for n in h.nodes].index(w)


def test_the_collective_is_issued_where_it_stands_and_waited_for_at_its_first_reader():
    h = issue_collectives(sched.schedule(loss_graph()))
    tasks = [(t.stream, [n.op for n in t.nodes]) for t in split_tasks(h)]
    # one thread runs it all: the issue hands the payload over, the forward runs meanwhile
    assert tasks == [("compute", ["abs", "global_box_issue", "mul", "dropout", "exp", "dropout",
                                  "global_box_wait", "div"])]
    issue, wait = (n for n in h.nodes if n.op.startswith("global_box"))
    div = next(n for n in h.nodes if n.op == "div")
    assert wait.inputs == issue.outputs and wait.outputs == div.inputs[1:]


def _bucket_graph(write_in_place: bool):
    """Two gradients all-reduced as one bucket, a node after the issue writing in place (as the
    memory plan may choose: a view of ``g1`` is dead for the plan after the issue) into memory the
    first one shares, or into a buffer of its own."""
    x = val(4, name="x")
    g1, g2, v, t, r1, r2, u = (val(4) for _ in range(7))
    bucket = Node(GLOBAL_BOX_BUCKET.name, (g1, g2), {"place": PLACE, "src": (P,), "dst": (B,)}, (r1, r2),
                  source="t.py:1")
    writer = node("exp", (v if write_in_place else t,), (val(4),)).with_(tags=frozenset({"inplace"}))
    nodes = (node("exp", (x,), (g1,)), node("sin", (x,), (g2,)),
             node("reshape", (g1,), (v,), shape=(4,)), node("cos", (x,), (t,)),
             bucket, writer, node("add", (r1, r2), (u,)))
    return check(IRGraph((x,), (), nodes, (u,)))


def test_a_bucket_is_read_late_only_when_nothing_after_it_writes_its_memory():
    for write, late in ((False, True), (True, False)):
        h = issue_collectives(_bucket_graph(write))
        issue = next(n for n in h.nodes if n.op == "global_box_issue")
        assert issue.attrs.get("read_late", False) is late, (write, issue.attrs)
        assert [n.op for n in h.nodes][-3:] == ["exp", "global_box_wait", "add"]


def gather(x, out):
    return Node(GLOBAL_BOX.name, (x,), {"place": PLACE, "src": (S(0),), "dst": (B,), "shape": (8,)}, (out,),
                source="t.py:1")


def _layers_graph(write_w3: bool = False):
    """Three layers, each reading a parameter all-gathered from its rows just before (ZeRO-3
    style), then an all-gather of an activation; ``write_w3``: layer 2 writes in place into
    memory w3 shares (as the memory plan may choose)."""
    x, w1, w2, w3 = val(8, name="x"), val(4, name="w1"), val(4, name="w2"), val(4, name="w3")
    g1, g2, g3, h1, h2, h3, a, ab, alias = (val(8) for _ in range(9))
    layer2 = node("mul", (h1, g2), (h2,))
    if write_w3:
        layer2 = node("add", (alias, g2), (h2,)).with_(tags=frozenset({"inplace"}))
    nodes = (node("reshape", (w3,), (alias,), shape=(4,)),
             gather(w1, g1), node("mul", (x, g1), (h1,)),
             gather(w2, g2), layer2,
             gather(w3, g3), node("mul", (h2, g3), (h3,)),
             node("exp", (h3,), (a,)), gather(a, ab), node("sum", (ab,), (val(),)))
    return check(IRGraph((x,), tuple((w, torch.ones(4)) for w in (w1, w2, w3)), nodes, (ab,)))


def _issued(h):
    """The sequence of issues (by the name of what they gather), waits and other ops."""
    out = []
    for n in h.nodes:
        if n.op == "global_box_issue":
            out.append("issue " + (n.inputs[0].name or "a"))
        elif n.op != "global_box_wait":
            out.append(n.op)
        else:
            out.append("wait")
    return out


def test_an_all_gather_of_state_is_issued_one_all_gather_ahead():
    h = issue_collectives(_layers_graph())
    # w2's rows travel while layer 1 computes, w3's while layer 2 does; the activation's gather
    # cannot move (its input is made just before it)
    assert _issued(h) == ["reshape", "issue w1", "issue w2", "wait", "mul", "issue w3", "wait", "mul",
                          "wait", "mul", "exp", "issue a", "wait", "sum"], _issued(h)
    waits = [n for n in h.nodes if n.op == "global_box_wait"]
    issues = [n for n in h.nodes if n.op == "global_box_issue"]
    assert [w.inputs for w in waits] == [i.outputs for i in issues]


def test_an_all_gather_is_not_moved_above_a_write_into_its_memory():
    h = issue_collectives(_layers_graph(write_w3=True))
    assert _issued(h)[:10] == ["reshape", "issue w1", "issue w2", "wait", "mul", "wait", "add", "issue w3",
                               "wait", "mul"], _issued(h)


def test_the_gathers_of_one_module_unit_share_one_collective():
    """Gathers of parameters of blocks.0 (two modules of it) go in one bucket, blocks.1's in the next,
    issued while blocks.0 computes; a gather with uneven rows, or of another unit, stays alone."""
    ws = [val(4, name=f"w{i}") for i in range(4)] + [val(3, name="odd")]
    gs = [val(8) for _ in range(4)] + [val(5)]
    h = [val(8) for _ in range(5)]
    x = val(8, name="x")
    scopes = ["m/m.blocks.0/m.blocks.0.fc", "m/m.blocks.0/m.blocks.0.proj", "m/m.blocks.1/m.blocks.1.fc",
              "m/m.blocks.1/m.blocks.1.proj", "m/m.head"]
    nodes, prev = [], x
    for k in range(5):
        nodes.append(gather(ws[k], gs[k]).with_(scope=scopes[k],
                                                attrs={**gather(ws[k], gs[k]).attrs, "rank": 0, "shape": gs[k].shape}))
        nodes.append(node("mul" if k < 4 else "sum", (prev, gs[k]) if k < 4 else (gs[k],), (h[k],)).with_(scope=scopes[k]))
        prev = h[k]
    g = check(IRGraph((x,), tuple((w, torch.ones(w.shape)) for w in ws), tuple(nodes), (h[3], h[4])))
    out = issue_collectives(check(bucket_gathers(g)))
    issues = [n for n in out.nodes if n.op == "global_box_issue"]
    assert [[v.name for v in n.inputs] for n in issues] == [["w0", "w1"], ["w2", "w3"], ["odd"]]
    assert _issued(out) == ["issue w0", "issue w2", "wait", "mul", "mul", "issue odd", "wait", "mul", "mul",
                            "wait", "sum"], _issued(out)
    waits = [n for n in out.nodes if n.op == "global_box_wait"]
    assert [w.outputs for w in waits] == [tuple(gs[:2]), tuple(gs[2:4]), (gs[4],)]


def test_a_gathers_only_elementwise_reader_runs_on_the_shards():
    """cast(gather(w)) becomes gather(cast(w)) (the same bits, half the bytes moved); a gather read
    twice, or read by a two-input op, or returned, or by an op writing in place (it would write
    the parameter's rows), keeps its reader after it."""
    w1, w2, w3, w4, w5, x = (val(4, name=n) for n in ("w1", "w2", "w3", "w4", "w5", "x"))
    g1, g2, g3, g4, g5, e2, e2b, s3, c4, e5 = (val(8) for _ in range(10))
    low = Value((8,), torch.bfloat16)
    nodes = (gather(w1, g1), node("cast", (g1,), (low,), dtype=torch.bfloat16),
             gather(w2, g2), node("exp", (g2,), (e2,)), node("neg", (g2,), (e2b,)),
             gather(w3, g3), node("add", (g3, x), (s3,)),
             gather(w4, g4), node("exp", (g4,), (c4,)),
             gather(w5, g5), node("exp", (g5,), (e5,)).with_(tags=frozenset({"inplace"})))
    g = check(IRGraph((x,), tuple((w, torch.ones(4)) for w in (w1, w2, w3, w4, w5)), nodes,
                      (low, e2, e2b, s3, g4, e5)))
    out = check(shard_elementwise(g))
    ops = [(n.op, [v.name or v.dtype for v in n.value_inputs()]) for n in out.nodes]
    assert ops[:2] == [("cast", ["w1"]), ("global_box", [torch.bfloat16])], ops
    moved = out.nodes[1]
    assert moved.outputs == (low,) and out.nodes[0].outputs[0].shape == (4,)   # the cast of the rows
    assert [n.op for n in out.nodes[2:]] == [n.op for n in nodes[2:]]   # the other four as they were


def test_no_collectives_no_change():
    x = val(4, name="x")
    g = check(IRGraph((x,), (), (node("exp", (x,), (val(4),)),), ()))
    assert sched.schedule(g) is g


# -- a global graph: scheduled = traced order, bit for bit ------------------------------------------

_BUILD = threading.Lock()   # simulated ranks are threads sharing torch's RNG: build one at a time


def _train(rank):
    with _BUILD:
        flow.manual_seed(0)
        model = flow.nn.Sequential(flow.nn.Embedding(11, 16), flow.nn.Linear(16, 16), flow.nn.Tanh(),
                                   flow.nn.Linear(16, 11))
    model.to_global(PLACE, B)   # (a collective: outside the lock)
    opt = flow.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(1)
    batches = [(torch.randint(0, 11, (8, 5), generator=g), torch.randint(0, 11, (8, 5), generator=g))
               for _ in range(3)]

    class Train(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.set_allreduce_bucket_mb(0.001)   # several buckets

        def build(self, x, y):
            logits = self.model(x)
            loss = flow.nn.functional.cross_entropy(logits.reshape(-1, 11), y.reshape(-1))
            loss.backward()
            return loss
    train = Train()
    losses = []
    for x, y in batches:
        x, y = (flow.from_torch(t).to_global(PLACE, B).to_global(sbp=S(0)) for t in (x, y))
        losses.append(train(x, y).to_global(sbp=B).to_local().to_torch())
    c = next(reversed(train._compiled.values()))
    ops = [[n.op for n in t.nodes] for t in c.program.tasks]
    return losses, [p.to_global(sbp=B).to_local().to_torch() for p in model.parameters()], ops


def test_global_graph_scheduled_equals_traced_order_bit_for_bit(monkeypatch):
    got = world.simulate(2, lambda r: _train(r))
    monkeypatch.setattr(sched, "order", lambda g: list(range(len(g.nodes))))
    want = world.simulate(2, lambda r: _train(r))
    for (l1, p1, s1), (l0, p0, s0) in zip(got, want):
        assert all(torch.equal(a, b) for a, b in zip(l1, l0))
        assert all(torch.equal(a, b) for a, b in zip(p1, p0))
        # scheduled: the loss's all-reduce is issued after a few nodes on the targets, before
        # the forward; traced order computes the whole forward first
        assert len(s1) == len(s0) == 2 and s1[0].index("global_box_issue") <= 3 < s0[0].index("global_box_issue")

"""CSE: equal nodes merge and every reader is rewired; random, effect and unequal nodes stay."""
import math

import pytest
import torch

import holoflow  # noqa: F401  (declares the ops)
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes.cse import const_key, cse


def val(*shape, dtype=torch.float32, name=""):
    return Value(tuple(shape), dtype, name=name)


def run(g: IRGraph, feeds: dict) -> list:
    """The reference interpreter: a short loop over the equations."""
    env = {v: t for v, t in feeds.items()}
    env.update({v: t for v, t in g.state})
    for n in g.nodes:
        out = n.fn()(*(env[x] if isinstance(x, Value) else x for x in n.inputs), **n.attrs)
        outs = (out,) if isinstance(out, torch.Tensor) else tuple(out or ())
        env.update(zip(n.outputs, outs))
    return [env[o] for o in g.outputs]


def test_merges_duplicates_and_rewires_outputs_effects_updates():
    x, w = val(3, name="x"), val(3, name="w")
    a1, a2, b1, b2, s = val(3), val(3), val(3), val(3), val(3)
    got = []
    target = torch.zeros(3)
    nodes = (Node("mul", (x, w), {}, (a1,)),
             Node("mul", (x, w), {}, (a2,)),           # duplicate of a1
             Node("exp", (a1,), {}, (b1,)),
             Node("exp", (a2,), {}, (b2,)),            # duplicate once a2 -> a1
             Node("add", (b1, b2), {"alpha": 1}, (s,)),
             Node("sgd_update", (b2,), {}, (), effect=True, kernel=lambda g: got.append(g)))
    g = check(IRGraph((x,), ((w, torch.full((3,), 2.0)),), nodes, (s, b2), ((target, a2),)))
    h = check(cse(g))
    assert [n.op for n in h.nodes] == ["mul", "exp", "add", "sgd_update"]
    assert h.outputs == (s, b1)
    assert h.nodes[-1].inputs == (b1,)
    assert h.updates[0][1] is a1
    assert h.nodes[2].inputs == (b1, b1)
    xs = torch.tensor([0.0, 1.0, -1.0])
    for want, have in zip(run(g, {x: xs}), run(h, {x: xs})):
        torch.testing.assert_close(want, have)


def test_keeps_random_effects_and_different_attrs():
    x = val(4)
    o = [val(4) for _ in range(6)]
    nodes = (Node("dropout", (x,), {"p": 0.5, "training": True, "generator": None}, (o[0], val(4, dtype=torch.bool))),
             Node("dropout", (x,), {"p": 0.5, "training": True, "generator": None}, (o[1], val(4, dtype=torch.bool))),
             Node("mul", (x, 2), {}, (o[2],)),
             Node("mul", (x, 2.0), {}, (o[3],)),       # 2 vs 2.0: different result dtype for ints
             Node("add", (x, x), {"alpha": 1}, (o[4],)),
             Node("add", (x, x), {"alpha": 2}, (o[5],)))
    g = check(IRGraph((x,), (), nodes, tuple(o)))
    assert len(cse(g).nodes) == len(nodes)


def test_recompute_copies_are_not_merged_with_originals():
    x, a, b = val(2), val(2), val(2)
    nodes = (Node("exp", (x,), {}, (a,)), Node("exp", (x,), {}, (b,), tags=frozenset({"bw", "recompute"})))
    assert len(cse(IRGraph((x,), (), nodes, (a, b))).nodes) == 2
    nodes = (Node("exp", (x,), {}, (a,)), Node("exp", (x,), {}, (b,), tags=frozenset({"bw"})))
    assert len(cse(IRGraph((x,), (), nodes, (a, b))).nodes) == 1


def test_const_key_is_exact():
    assert const_key(float("nan")) == const_key(math.nan)
    assert const_key(0.0) != const_key(-0.0)
    assert const_key(1) != const_key(1.0) != const_key(True)
    assert const_key((1, [2, 3])) == const_key((1, [2, 3]))
    assert const_key({"a": [1]}) == const_key({"a": [1]})
    t = torch.ones(2)
    assert const_key(t) == const_key(t) and const_key(t) != const_key(torch.ones(2))
    assert const_key(torch.Size([2, 3])) != const_key((2, 3))
    hash(const_key({"k": [torch.ones(1), slice(1, None)]}))


def test_unhashable_and_tensor_attrs_merge_only_when_identical():
    x = val(2)
    t = torch.tensor([1.0, 2.0])
    o = [val(2) for _ in range(3)]
    nodes = (Node("mul", (x, t), {}, (o[0],)),
             Node("mul", (x, t), {}, (o[1],)),
             Node("mul", (x, torch.tensor([1.0, 2.0])), {}, (o[2],)))
    h = check(cse(IRGraph((x,), (), nodes, tuple(o))))
    assert len(h.nodes) == 2 and h.outputs == (o[0], o[0], o[2])


@pytest.mark.parametrize("n", [1, 3])
def test_no_change_returns_same_graph(n):
    x = val(2)
    nodes = tuple(Node("exp", (x,), {}, (val(2),), tags=frozenset({f"t{i}"})) for i in range(n))
    g = IRGraph((x,), (), nodes, tuple(nd.outputs[0] for nd in nodes))
    assert cse(g) is g

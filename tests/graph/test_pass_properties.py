"""Passes ask ops' declared properties (core/registry.py: elementwise, fresh, commutative, axpy,
add_to_output), never their names: an op declared here, under a name no pass knows, is planned,
fused and swapped as its declaration says."""
import pathlib
import re

import pytest
import torch

import holoflow.graph.passes as graph_passes
from holoflow.core.registry import REGISTRY, defop
from holoflow.graph.ir import IRGraph, Node, Value, check
from holoflow.graph.passes.fuse_add_to_output import fuse_add_to_output
from holoflow.graph.passes.fuse_elementwise import regions
from holoflow.graph.passes.memory_plan import memory_plan

def _declare() -> list:
    return [
        # an elementwise family member: fresh, fusible, in-place-able by family default
        defop("test_props_twice", lambda x: x * 2, family="elementwise", inplace_kernel=lambda x: x.mul_(2)),
        # the same kernel declared as possibly returning its input: never written in place
        defop("test_props_twice_alias", lambda x: x * 2, family="elementwise", fresh=False,
              inplace_kernel=lambda x: x.mul_(2)),
        # not elementwise (e.g. a device move): outside fused regions
        defop("test_props_twice_move", lambda x: x * 2, family="elementwise", elementwise=False),
        # a commutative binary op: its second input's buffer may be reused by swapping
        defop("test_props_hypot", torch.hypot, family="elementwise", commutative=True,
              inplace_kernel=torch.Tensor.hypot_),
        # a matmul that knows its add-to-output kernel, and an axpy op
        defop("test_props_mm", torch.mm, family="einsum", add_to_output=lambda shapes, beta, alpha:
              lambda a, b, r: torch.addmm(r, a, b, beta=beta, alpha=alpha)),
        defop("test_props_axpy", lambda a, b, alpha=1: a + alpha * b, family="elementwise", axpy=True),
    ]


@pytest.fixture(autouse=True, scope="module")
def _test_ops():
    """The ops exist only while these tests run (the registry-wide SBP coverage test never sees them)."""
    ops = _declare()
    yield
    for op in ops:
        del REGISTRY[op.name]

def val(*shape):
    return Value(tuple(shape), torch.float32)


def _chain(op: str) -> IRGraph:
    """``op(exp(x))``: exp's output dies at ``op``, which may write into it."""
    x, a, b = val(4, 4), val(4, 4), val(4, 4)
    return check(IRGraph((x,), (), (Node("exp", (x,), {}, (a,)), Node(op, (a,), {}, (b,))), (b,)))


def test_memory_plan_asks_elementwise_and_fresh():
    def inplace(op: str) -> bool:
        h = memory_plan(_chain(op))
        return any("inplace" in n.tags for n in h.nodes)
    assert inplace("test_props_twice")
    assert not inplace("test_props_twice_alias")  # not fresh: may be its input
    assert not inplace("test_props_twice_move")   # not elementwise


def test_memory_plan_swaps_declared_commutative_inputs():
    x, a, b, c = val(4, 4), val(4, 4), val(4, 4), val(4, 4)
    # hypot(x, a): x is a feed (never written), a dies here: only the swapped order reuses a
    g = check(IRGraph((x,), (), (Node("exp", (x,), {}, (a,)), Node("test_props_hypot", (x, a), {}, (b,)),
                              Node("sin", (b,), {}, (c,))), (c,)))
    n = memory_plan(g).nodes[1]
    assert "inplace" in n.tags and n.inputs[0] is a
    xs = torch.rand(4, 4)
    torch.testing.assert_close(n.kernel(torch.exp(xs), xs), torch.hypot(xs, torch.exp(xs)), rtol=0, atol=0)


def test_fuse_elementwise_asks_elementwise():
    x, a, b, c = val(4, 4), val(4, 4), val(4, 4), val(4, 4)
    nodes = (Node("exp", (x,), {}, (a,)), Node("test_props_twice", (a,), {}, (b,)), Node("sin", (b,), {}, (c,)))
    assert [[n.op for n in r] for r in regions(check(IRGraph((x,), (), nodes, (c,))))] == \
        [["exp", "test_props_twice", "sin"]]
    nodes = (Node("exp", (x,), {}, (a,)), Node("test_props_twice_move", (a,), {}, (b,)), Node("sin", (b,), {}, (c,)))
    assert regions(check(IRGraph((x,), (), nodes, (c,)))) == []


def test_fuse_add_to_output_asks_add_to_output_and_axpy():
    a, b, r, o, s = val(3, 4), val(4, 5), val(3, 5), val(3, 5), val(3, 5)
    g = check(IRGraph((a, b, r), (), (Node("test_props_mm", (a, b), {}, (o,)),
                                    Node("test_props_axpy", (r, o), {"alpha": 0.5}, (s,))), (s,)))
    h = fuse_add_to_output(g)
    assert [n.op for n in h.nodes] == ["fused_test_props_mm_add"]
    ta, tb, tr = torch.randn(3, 4), torch.randn(4, 5), torch.randn(3, 5)
    torch.testing.assert_close(h.nodes[0].kernel(ta, tb, tr), tr + 0.5 * (ta @ tb))


def test_passes_name_no_op():
    """No pass compares an op name: ``n.op == "add"``, ``p.op in {...}`` and name tables are gone."""
    passes = pathlib.Path(graph_passes.__file__).parent
    named = re.compile(r"\b\w+\.op\s*(==|!=|not in(?! REGISTRY)|in(?! REGISTRY))|MATMUL_LIKE|FRESH_OPS|"
                       r"MAY_RETURN_INPUT|COMMUTATIVE|OPT_DTYPE")
    hits = [f"{f.name}: {line.strip()}" for f in sorted(passes.glob("*.py"))
            for line in f.read_text().splitlines() if named.search(line)]
    assert hits == []

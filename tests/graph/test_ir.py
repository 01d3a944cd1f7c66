"""The IR checker names the first broken invariant; the IR prints as readable Python."""
import pytest
import torch

import holoflow  # noqa: F401  (declares the ops)
from holoflow.core.errors import HoloflowError
from holoflow.graph.ir import Graph, Node, Value, check, to_python


def val(*shape, name=""):
    return Value(tuple(shape), torch.float32, name=name)


def test_valid_graph_passes():
    x, w, y = val(2, name="x"), val(2, name="w"), val(2)
    g = Graph((x,), ((w, torch.ones(2)),), (Node("mul", (x, w), {}, (y,)),), (y,))
    assert check(g) is g


def test_use_before_def():
    x, a, b = val(2), val(2), val(2)
    g = Graph((x,), (), (Node("exp", (a,), {}, (b,)), Node("exp", (x,), {}, (a,))), (b,))
    with pytest.raises(HoloflowError, match=r"node 0 \(exp\) reads .* before it is defined"):
        check(g, "mypass")
    with pytest.raises(HoloflowError, match="after mypass"):
        check(g, "mypass")


def test_redefinition_is_not_ssa():
    x, a = val(2), val(2)
    g = Graph((x,), (), (Node("exp", (x,), {}, (a,)), Node("neg", (x,), {}, (a,))), (a,))
    with pytest.raises(HoloflowError, match=r"node 1 \(neg\) redefines"):
        check(g)
    with pytest.raises(HoloflowError, match="redefines"):
        check(Graph((x,), (), (Node("exp", (x,), {}, (x,)),), (x,)))


def test_feed_defined_twice():
    x = val(2)
    with pytest.raises(HoloflowError, match="defined twice"):
        check(Graph((x,), ((x, torch.ones(2)),), (), (x,)))


def test_unknown_op_without_kernel():
    x, a = val(2), val(2)
    with pytest.raises(HoloflowError, match="unknown op 'no_such_op'"):
        check(Graph((x,), (), (Node("no_such_op", (x,), {}, (a,)),), (a,)))
    check(Graph((x,), (), (Node("no_such_op", (x,), {}, (a,), kernel=torch.neg),), (a,)))


def test_undefined_output_and_update():
    x, a = val(2), val(2)
    with pytest.raises(HoloflowError, match="output .* never defined"):
        check(Graph((x,), (), (), (a,)))
    with pytest.raises(HoloflowError, match="state update reads undefined"):
        check(Graph((x,), (), (), (x,), ((torch.ones(2), a),)))
    with pytest.raises(HoloflowError, match="shape"):
        check(Graph((x,), (), (), (x,), ((torch.ones(3), x),)))


def test_non_value_output():
    x = val(2)
    with pytest.raises(HoloflowError, match="non-Value output"):
        check(Graph((x,), (), (Node("exp", (x,), {}, (3,)),), (x,)))


def test_printing():
    x, w, y, z = val(2, 3, name="x"), val(3, name="w"), val(2, 3), val(2, 3)
    nodes = (Node("mul", (x, w), {}, (y,), source="model.py:7"),
             Node("add", (y, 1.5), {"alpha": 2, "_hidden": 0}, (z,)),
             Node("sgd_update", (z,), {}, (), effect=True, kernel=lambda g: None))
    g = Graph((x,), ((w, torch.ones(3)),), nodes, (z,), ((torch.ones(2, 3), z),))
    text = str(g)
    assert text.splitlines()[0] == "def graph(x):"
    assert "    w = state()  # (3,) float32" in text
    assert f"    {y!r} = mul(x, w)  # (2, 3)  @ model.py:7" in text
    assert f"    {z!r} = add({y!r}, 1.5, alpha=2)  # (2, 3)" in text and "_hidden" not in text
    assert f"    _ = sgd_update({z!r})  # " in text and "[effect]" in text
    assert f"    assign(state, {z!r})" in text
    assert text.splitlines()[-1] == f"    return {z!r}"
    short = to_python(g, max_nodes=1)
    assert "# 2 more nodes" in short and "add(" not in short

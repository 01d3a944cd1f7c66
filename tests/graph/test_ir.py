"""The IR checker names the first broken invariant; the IR prints as the Python program that
runs (exec'd, it gives the compiled graph's numbers); every node keeps its user source line; the
pass log keeps the IR after every pass."""
import os
import re
import traceback

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.core.errors import HoloflowError
from holoflow.core.registry import REGISTRY
from holoflow.core.tensor import Tensor
from holoflow.graph import GraphRunError
from holoflow.graph.graph import Graph as NNGraph
from holoflow.graph.ir import IRGraph, Node, Value, check, program, to_python

HERE = os.path.basename(__file__)


def val(*shape, name=""):
    return Value(tuple(shape), torch.float32, name=name)


def test_valid_graph_passes():
    x, w, y = val(2, name="x"), val(2, name="w"), val(2)
    g = IRGraph((x,), ((w, torch.ones(2)),), (Node("mul", (x, w), {}, (y,)),), (y,))
    assert check(g) is g


def test_use_before_def():
    x, a, b = val(2), val(2), val(2)
    g = IRGraph((x,), (), (Node("exp", (a,), {}, (b,)), Node("exp", (x,), {}, (a,))), (b,))
    with pytest.raises(HoloflowError, match=r"node 0 \(exp\) reads .* before it is defined"):
        check(g, "mypass")
    with pytest.raises(HoloflowError, match="after mypass"):
        check(g, "mypass")


def test_redefinition_is_not_ssa():
    x, a = val(2), val(2)
    g = IRGraph((x,), (), (Node("exp", (x,), {}, (a,)), Node("neg", (x,), {}, (a,))), (a,))
    with pytest.raises(HoloflowError, match=r"node 1 \(neg\) redefines"):
        check(g)
    with pytest.raises(HoloflowError, match="redefines"):
        check(IRGraph((x,), (), (Node("exp", (x,), {}, (x,)),), (x,)))


def test_feed_defined_twice():
    x = val(2)
    with pytest.raises(HoloflowError, match="defined twice"):
        check(IRGraph((x,), ((x, torch.ones(2)),), (), (x,)))


def test_unknown_op_without_kernel():
    x, a = val(2), val(2)
    with pytest.raises(HoloflowError, match="unknown op 'no_such_op'"):
        check(IRGraph((x,), (), (Node("no_such_op", (x,), {}, (a,)),), (a,)))
    check(IRGraph((x,), (), (Node("no_such_op", (x,), {}, (a,), kernel=torch.neg),), (a,)))


def test_undefined_output_and_update():
    x, a = val(2), val(2)
    with pytest.raises(HoloflowError, match="output .* never defined"):
        check(IRGraph((x,), (), (), (a,)))
    with pytest.raises(HoloflowError, match="state update reads undefined"):
        check(IRGraph((x,), (), (), (x,), ((torch.ones(2), a),)))
    with pytest.raises(HoloflowError, match="shape"):
        check(IRGraph((x,), (), (), (x,), ((torch.ones(3), x),)))


def test_non_value_output():
    x = val(2)
    with pytest.raises(HoloflowError, match="non-Value output"):
        check(IRGraph((x,), (), (Node("exp", (x,), {}, (3,)),), (x,)))


def test_missing_source_line_when_required():
    x, a = val(2), val(2)
    g = IRGraph((x,), (), (Node("exp", (x,), {}, (a,), source="m.py:1"), Node("neg", (a,), {}, (val(2),))), (a,))
    check(g)
    with pytest.raises(HoloflowError, match=r"after mypass: node 1 \(neg\) has no source line"):
        check(g, "mypass", sources=True)


def test_program_of_a_hand_built_graph():
    x, w, y, z, u = val(2, 3, name="x"), val(3, name="model.w"), val(2, 3), val(2, 3), val(2, 3)
    w_t, s_t = Tensor._make(torch.arange(3.0)), Tensor._make(torch.zeros(2, 3))
    seen = []
    nodes = (Node("mul", (x, w), {}, (y,), source="model.py:7"),
             Node("add", (y, 1.5), {"alpha": 2}, (z,), source="model.py:8"),
             Node("where", (torch.tensor([True, False, True]), z, float("inf")), {}, (u,), source="model.py:9"),
             Node("sgd_update", (u,), {}, (), source="model.py:10", effect=True, kernel=seen.append))
    g = check(IRGraph((x,), ((w, w_t),), nodes, (z, None, u), ((s_t, z),)))
    text = str(g)
    assert text == to_python(g) == program(g).source
    compile(text, "printed", "exec")  # valid Python
    lines = text.splitlines()
    assert "    model_w = state['model_w']._data  # state f32[3]" in lines
    assert f"    {y!r} = mul(x, model_w)  # model.py:7  f32[2, 3]" in lines
    assert f"    {z!r} = add({y!r}, 1.5, alpha=2)  # model.py:8  f32[2, 3]" in lines
    assert f"    {u!r} = where(const0, {z!r}, const1)  # model.py:9  f32[2, 3]" in lines
    assert "#   const0 = tensor b8[3]" in lines and "#   const1 = inf" in lines
    assert f"    sgd_update({u!r})  # model.py:10" in lines
    assert f"    assign(state['updated'], {z!r})  # model.py:8" in lines
    assert lines[-1] == f"    return ({z!r}, None, {u!r})" and "def program(x):" in lines
    xs = torch.randn(2, 3)
    ns = program(g).load()
    got = ns["program"](xs)
    want_z = xs * torch.arange(3.0) + 2 * 1.5
    assert torch.equal(got[0], want_z) and got[1] is None
    assert torch.equal(got[2], torch.where(torch.tensor([True, False, True]), want_z, float("inf")))
    assert torch.equal(seen[0], got[2]) and torch.equal(s_t._data, want_z)   # effect ran, state written


# -- nn.Graph: the printed program, source lines, the pass log --------------------------------------------

class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, 2 * d), nn.Linear(2 * d, d)

    def forward(self, x):
        return x + self.fc2(nn.functional.gelu(self.fc1(x)))


class Net(nn.Module):
    def __init__(self, d=8, bn=False):
        super().__init__()
        self.block = Block(d)
        self.norm = nn.BatchNorm1d(d) if bn else nn.LayerNorm(d)

    def forward(self, x):
        return (self.norm(self.block(x)).tanh() * 2 + 1).sum(-1)


class Train(NNGraph):
    def __init__(self, m, opt):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)

    def build(self, x):
        loss = (self.model(x) ** 2).mean()
        loss.backward()
        return loss, x.shape[0]


def _case(bn=False):
    flow.manual_seed(0)
    m = Net(bn=bn)
    return m, flow.optim.Adam(m.parameters(), lr=1e-2)


def _batch():
    return flow.tensor(np.random.default_rng(0).standard_normal((6, 8)).astype(np.float32))


def _all_passes(g):
    g.config.set_gradient_accumulation_steps(2)
    g.graph_module(g.model.block).activation_checkpointing = True
    g.config.allow_fuse_add_to_output(True)
    g.config.allow_fuse_elementwise(True)
    g.config.fuse_elementwise_compile = "off"
    g.config.allow_fuse_model_update_ops(True)
    return g


def test_printed_program_runs_as_the_compiled_graph(capsys):
    x = _batch()
    g = Train(*_case(bn=True))
    g.debug(2)
    first = g(x)
    printed = capsys.readouterr().out
    c = next(iter(g._compiled.values()))
    assert c.program.source in printed                       # debug(2) shows the executed source verbatim
    text = printed[printed.index("# holoflow program"):]
    assert "assign(state[" in text                           # BatchNorm's running stats are written back
    ns = dict(c.program.namespace)
    for name, fn in ns.items():                              # op kernels are the registry's, by op name
        if name in REGISTRY:
            assert fn is REGISTRY[name].kernel
    exec(compile(text, "printed program", "exec"), ns)
    second = ns["program"](x._data)                          # the printed text, run by hand: step 2
    third = g(x)
    ref = Train(*_case(bn=True))                             # the same model run by the graph 3 times
    want = [ref(x) for _ in range(3)]
    for got, w in zip([first[0]._data, second[0], third[0]._data], want):
        assert torch.equal(got, w[0]._data)
    assert second[1] == first[1] == 6
    for p, q in zip(g.model.state_dict().values(), ref.model.state_dict().values()):
        assert torch.equal(p._data, q._data)


def test_every_node_has_a_source_line_in_this_file():
    g = _all_passes(Train(*_case()))
    g(_batch())
    lines = open(__file__).read().splitlines()
    for rec in g.passes_log:
        assert rec.graph.nodes
        for n in rec.graph.nodes:
            m = re.fullmatch(rf"{re.escape(HERE)}:(\d+)", n.source)
            assert m, (rec.name, n.op, n.source)
            assert lines[int(m.group(1)) - 1].strip(), (rec.name, n.op, n.source)
    prog = next(iter(g._compiled.values())).program
    src = prog.source.splitlines()
    assert prog.lines and all(src[i - 1].split("  # ")[1].startswith(f"{HERE}:") for i in prog.lines)


def test_pass_log_keeps_the_ir_after_every_pass(capsys):
    g = _all_passes(Train(*_case()))
    g.debug(3)
    g(_batch())
    log = g.passes_log
    printed = capsys.readouterr().out
    for rec in log:                                          # debug(3): the IR after every pass, as Python
        assert f"  {rec.summary()}" in printed and str(rec) in printed
    assert [r.name for r in log] == ["trace", "grad_acc", "checkpointing", "cse", "dce", "recompute",
                                     "fuse_add_to_output", "fuse_elementwise", "fuse_update", "memory_plan"]
    for prev, rec in zip(log, log[1:]):
        assert rec.before == len(prev.graph.nodes) and rec.after == len(rec.graph.nodes)
        assert rec.seconds >= 0
        check(rec.graph, rec.name)
        compile(str(rec), rec.name, "exec")                  # each step prints as valid Python
    by = {r.name: r for r in log}
    assert by["grad_acc"].after > by["grad_acc"].before
    assert dict(by["fuse_elementwise"].ops)["fused_elementwise"] > 0
    assert dict(by["fuse_add_to_output"].ops)["add"] < 0
    assert any(n.op.startswith("fused_") and n.op.endswith("update") for n in by["fuse_update"].graph.nodes)
    assert by["memory_plan"].graph.frees is not None and by["memory_plan"].rewritten > 0
    text = g.explain()
    assert "pass fuse_elementwise" in text and next(iter(g._compiled.values())).program.source in text
    plain = Train(*_case())
    plain(_batch())
    assert [r.name for r in plain.passes_log] == ["trace", "cse", "dce", "recompute", "memory_plan"]


def test_run_time_error_names_the_program_line():
    class Pick(NNGraph):
        def __init__(self):
            super().__init__()
            self.lin = nn.Linear(3, 3)

        def build(self, x, i):
            return self.lin(x).index_select(0, i)

    g, x = Pick(), flow.randn(4, 3)
    assert g(x, flow.tensor([0, 1])).shape == (2, 3)
    with pytest.raises(GraphRunError, match=rf"source: {HERE}:\d+\n  program line \d+: ") as e:
        g(x, flow.tensor([0, 9]))
    k = int(re.search(r"program line (\d+): (.*)", str(e.value)).group(1))
    line = next(iter(g._compiled.values())).program.source.splitlines()[k - 1]
    assert "= index_select(" in line and line.strip() in str(e.value)
    tb = "".join(traceback.format_exception(e.value.__cause__))   # the traceback quotes the program's line
    assert line.strip() in tb


def test_alias_groups_join_a_nodes_outputs_and_inputs_and_nothing_else():
    """``AliasGroups``: a node that may alias puts all its outputs and inputs in one set (a
    many-in many-out node, as a bucket's all-reduce, as well); a fresh op's output stays apart,
    and a node without outputs joins nothing (its inputs stay in their own sets)."""
    from holoflow.graph.ir import AliasGroups
    ins = [val(2, name=f"i{k}") for k in range(4)]
    outs = [val(2, name=f"o{k}") for k in range(4)]
    lone = [val(2, name=f"l{k}") for k in range(2)]
    fresh_out, chained = val(2), val(2)
    nodes = [Node("many", tuple(ins), {}, tuple(outs), tags=frozenset({"inplace"})),
             Node("exp", (ins[0],), {}, (fresh_out,)),                      # fresh: no alias
             Node("view_as_it", (outs[3],), {}, (chained,), tags=frozenset({"inplace"})),
             Node("sink", tuple(lone), {}, (), tags=frozenset({"inplace"}))]
    groups = AliasGroups(nodes)
    root = groups.find(ins[0])
    assert all(groups.find(v) is root for v in (*ins, *outs, chained))
    assert groups.find(fresh_out) is fresh_out
    assert groups.find(lone[0]) is not groups.find(lone[1])

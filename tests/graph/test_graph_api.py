"""nn.Graph API: executors, errors with the user's line, plan cache, nested I/O, state_dict,
streaming and profiling."""
import copy
import json

import numpy as np
import pytest
import torch

import holoflow as flow
from holoflow import nn
from holoflow.graph import Graph, GraphBuildError, GraphRunError


def make(seed=0):
    flow.manual_seed(seed)
    m = nn.Sequential(nn.Linear(6, 12), nn.GELU(), nn.Linear(12, 3))
    return m, flow.optim.Adam(m.parameters(), lr=1e-2)


class Train(Graph):
    def __init__(self, m, opt):
        super().__init__()
        self.model = m
        self.add_optimizer(opt)

    def build(self, x):
        loss = self.model(x).square().mean()
        loss.backward()
        return loss


class Infer(Graph):
    def __init__(self, m):
        super().__init__()
        self.model = m

    def build(self, x):
        return self.model(x)


def data(n=4, b=8):
    flow.manual_seed(1)
    return [flow.randn(b, 6) for _ in range(n)]


def params(m):
    return [p._data.clone() for p in m.parameters()]


def test_actor_and_sequential_bit_identical():
    xs = data()
    runs = []
    for ex in ("actor", "sequential"):
        m, opt = make()
        g = Train(m, opt)
        g.config.set_executor(ex)
        runs.append(([g(x)._data for x in xs], params(m)))
    for a, b in zip(runs[0][0] + runs[0][1], runs[1][0] + runs[1][1]):
        assert torch.equal(a, b)


def test_stream_equals_repeated_calls():
    xs = data(6)
    m, opt = make()
    calls = [Train(m, opt)(x)._data for x in xs]
    m2, opt2 = make()
    streamed = [out._data for out in Train(m2, opt2).stream(xs)]
    assert all(torch.equal(a, b) for a, b in zip(calls, streamed))
    assert all(torch.equal(a, b) for a, b in zip(params(m), params(m2)))


def test_error_in_build_names_user_line():
    class Bad(Infer):
        def build(self, x):
            return self.model(x) @ flow.ones(5, 2)   # (8, 3) @ (5, 2)

    with pytest.raises(GraphBuildError, match=r"test_graph_api.py:\d+"):
        Bad(make()[0])(data(1)[0])


def test_error_at_run_time_names_op_and_line():
    class Bad(Infer):
        def build(self, x, i):
            return self.model(x).index_select(0, i)

    g = Bad(make()[0])
    x = data(1)[0]
    assert g(x, flow.tensor([0, 1])).shape == (2, 3)
    with pytest.raises(GraphRunError, match=r"index_select.*\n.*source: test_graph_api.py:\d+"):
        g(x, flow.tensor([0, 99]))                    # out of range only at run time
    assert g(x, flow.tensor([1, 0])).shape == (2, 3)  # and the graph still runs after it


def test_backward_rules():
    class NonScalar(Train):
        def build(self, x):
            y = self.model(x)
            y.backward()
            return y

    with pytest.raises(GraphBuildError, match="scalar loss, got shape \\(8, 3\\)"):
        NonScalar(*make())(data(1)[0])

    class InferBackward(Infer):
        def build(self, x):
            y = self.model(x).sum()
            y.backward()
            return y
    with pytest.raises(GraphBuildError, match="inference graph"):
        InferBackward(make()[0])(data(1)[0])


def test_new_shape_compiles_new_plan():
    m, opt = make()
    g = Train(m, opt)
    g(flow.randn(8, 6))
    g(flow.randn(8, 6))
    assert len(g._compiled) == 1
    g(flow.randn(5, 6))
    assert len(g._compiled) == 2
    m.eval()
    Infer(m)(flow.randn(5, 6))
    assert "(IR):" in repr(g) and "(MODULE:model)" in repr(g) and "(CONFIG)" in repr(g)


def test_nested_inputs_and_outputs():
    class Nested(Graph):
        def __init__(self, m):
            super().__init__()
            self.model = m

        def build(self, batch, scale=2.0):
            a, (b,) = batch["pair"]
            ya, yb = self.model(a), self.model(b)
            return {"sum": [ya + yb, scale], "parts": (ya, yb)}

    m = make()[0]
    a, b = data(2)
    out = Nested(m)({"pair": (a, [b])}, scale=3.0)
    with flow.no_grad():
        ya, yb = m(a), m(b)
    assert out["sum"][1] == 3.0
    assert torch.equal(out["sum"][0]._data, (ya + yb)._data)
    assert torch.equal(out["parts"][1]._data, yb._data)


def test_state_dict_round_trip():
    xs = data(3)
    m, opt = make()
    g = Train(m, opt)
    g(xs[0])
    state = copy.deepcopy(g.state_dict())   # live references, as in torch
    snapshot = {k: v._data.clone() for k, v in m.state_dict().items()}
    after = [g(x)._data for x in xs[1:]]
    m2, opt2 = make(seed=5)
    g2 = Train(m2, opt2)
    g2(xs[0])                       # compiled, then restored
    g2.load_state_dict(state)
    assert all(torch.equal(snapshot[k], v._data) for k, v in m2.state_dict().items())
    again = [g2(x)._data for x in xs[1:]]
    assert all(torch.equal(a, b) for a, b in zip(after, again))


def test_profiling_table_and_trace(tmp_path, capsys):
    m, opt = make()
    g = Train(m, opt)
    path = str(tmp_path / "trace.json")
    g.config.enable_profiling(True, path)
    for x in data(3):
        g(x)
    g.print_profile()
    out = capsys.readouterr().out
    assert "linear" in out and "ms/iter" in out and "adam_update" in out and "actors:" in out
    events = json.load(open(path))["traceEvents"]
    assert {e["name"] for e in events if e.get("ph") == "X"} >= {"compute0", "update1"}


@pytest.mark.parametrize("read", [lambda t: float(t), lambda t: t.item(), lambda t: t.tolist(),
                                  lambda t: t.numpy(), lambda t: int(t)],
                         ids=["float", "item", "tolist", "numpy", "int"])
def test_reading_a_buffer_value_inside_build_raises(read):
    """A buffer's value read inside build() would be frozen into the graph at trace time (a step
    counter read as 0 forever): it raises naming the read, also for real (state) storage."""
    m = nn.BatchNorm1d(3)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            return x * read(self.m.num_batches_tracked)

    with pytest.raises(GraphBuildError, match=r"reads a value, but inside build\(\) tensors are symbolic"):
        G()(flow.ones(2, 3))


def test_batchnorm_cumulative_average_in_a_graph_matches_torch():
    """BatchNorm(momentum=None) averages over every batch seen: the factor 1/num_batches_tracked
    is a tensor inside a graph, so each call of the compiled graph uses its own step's factor."""
    flow.manual_seed(0)
    m, ref = nn.BatchNorm1d(4, momentum=None), torch.nn.BatchNorm1d(4, momentum=None)

    class G(Graph):
        def __init__(self):
            super().__init__()
            self.m = m

        def build(self, x):
            return self.m(x)

    g, gen = G(), torch.Generator().manual_seed(1)
    for _ in range(4):
        x = torch.randn(8, 4, generator=gen) * 3 + 1
        torch.testing.assert_close(g(flow.tensor(x.numpy())).to_torch(), ref(x))
    torch.testing.assert_close(m.running_mean.to_torch(), ref.running_mean)
    torch.testing.assert_close(m.running_var.to_torch(), ref.running_var)
    assert int(m.num_batches_tracked) == 4


@pytest.mark.parametrize("fn,match", [
    (lambda x: flow.nn.functional.one_hot(x), r"op 'one_hot'\(num_classes=-1\) cannot be traced: it reads the "
                                              r"values .* num_classes"),
    (lambda x: x.nonzero(), r"op 'nonzero' cannot be traced .* depends on data"),
    (lambda x: x[x > 0], r"op 'index' cannot be traced .* depends on data"),
], ids=["one_hot", "nonzero", "mask_index"])
def test_data_dependent_shapes_raise_naming_the_op_and_the_fix(fn, match):
    class G(Graph):
        def build(self, x):
            return fn(x)
    with pytest.raises(GraphBuildError, match=match):
        G()(flow.tensor([0, 2, 1]))


def test_one_hot_with_num_classes_traces():
    class G(Graph):
        def build(self, x):
            return flow.nn.functional.one_hot(x, 4)
    x = flow.tensor([0, 2, 1])
    assert torch.equal(G()(x)._data, torch.nn.functional.one_hot(x._data, 4))


def test_reading_a_plain_meta_tensor_names_meta_not_graph():
    """A meta tensor outside any graph has no data: the error says that, not "inside build()"."""
    t = flow.empty(2, 3, device="meta")
    for read in (lambda: t.item(), lambda: t.tolist(), lambda: t.numpy()):
        with pytest.raises(RuntimeError, match=r"meta tensor \(shape \(2, 3\)") as e:
            read()
        assert "build()" not in str(e.value)


def test_remembered_meta_outputs_keep_strides():
    """A trace runs each op's kernel on meta tensors once per (op, input metas with strides,
    attrs) (graph/trace.py ``_meta_outputs``): a remembered output is a fresh tensor with the
    strides the kernel gave (a softmax of a transposed input keeps its layout, as eager's does);
    a run with a real tensor among its inputs is never remembered; a warm trace equals a cold one."""
    from holoflow.core.registry import REGISTRY
    from holoflow.graph import trace
    a = torch.empty(3, 4, device="meta").t()
    want = torch.softmax(torch.randn(3, 4).t(), -1).stride()
    cold = trace._meta_outputs(REGISTRY["softmax"], [a], {"dim": -1})
    warm = trace._meta_outputs(REGISTRY["softmax"], [a], {"dim": -1})
    assert cold.stride() == warm.stride() == want and warm is not cold
    same = torch.empty(2, 2, device="meta")
    ident = flow.graph.trace._meta_key(REGISTRY["softmax"], [same, torch.ones(1)], {})
    assert ident is None                                        # a real tensor among the inputs

    class Soft(Graph):
        def build(self, x):
            return x.t().softmax(-1) * 2
    x = flow.randn(3, 4)
    outs = [Soft()(x).numpy() for _ in range(2)]                # cold, then warm
    np.testing.assert_allclose(outs[0], torch.softmax(x._data.t(), -1).numpy() * 2, rtol=1e-6)
    np.testing.assert_array_equal(outs[0], outs[1])


def test_write_through_detach_reaches_the_tensor_in_graph():
    """A traced ``z.detach()`` is an alias of ``z`` (core/views.py ``detached_from``): the write
    through it reaches ``z``, a graph input here, as eager's shared storage does (more cases:
    tests/graph/test_graph_detach_alias.py)."""
    z0 = np.random.default_rng(0).standard_normal((2, 4)).astype(np.float32)

    class G(Graph):
        def build(self, z):
            z.detach().relu_()   # writes z's storage in eager
            return z * 1.0
    z, ze = flow.tensor(z0), flow.tensor(z0)
    out = G()(z)
    ze.detach().relu_()
    torch.testing.assert_close(out._data, ze._data)
    torch.testing.assert_close(z._data, ze._data)


def test_detach_of_a_view_after_its_base_was_written_in_graph():
    """A traced ``v.detach()`` re-derives the view ``v`` after its base was written in place (it
    read the values from before the write)."""
    z = flow.tensor(np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32))

    def f(z):
        p = z * 1.0
        t = p.transpose(0, 1)
        p.mul_(2.0)
        return t.detach()

    class G(Graph):
        def build(self, z):
            return f(z)
    torch.testing.assert_close(G()(z)._data, f(z)._data)


def test_a_traced_elementwise_op_keeps_a_strided_inputs_layout():
    """gelu of a transposed tensor keeps its strides in eager (TensorIterator), so a reshape of it
    copies and a write into that copy leaves it alone; the trace laid the output out contiguous,
    the reshape became a view and the write reached it (graph fuzzer seed 732)."""
    w0 = np.random.default_rng(0).standard_normal((4, 8)).astype(np.float32)

    def prog(lib, w):
        g = lib.nn.functional.gelu(w.t())
        r = g.reshape(-1)
        r[18:26] = 0.5
        return g * 1.0, r * 1.0

    class G(Graph):
        def build(self, w):
            return prog(flow, w)
    want = prog(torch, torch.tensor(w0))
    for got, w in zip(G()(flow.tensor(w0)), want):
        torch.testing.assert_close(got._data, w)

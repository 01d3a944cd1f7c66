"""No training step leaves reference cycles behind: what a step made (its inputs, outputs,
autograd graph and the tensors that graph saved) is freed when the last reference goes, not when
Python's cyclic collector happens to run. A cycle through a compiled call's outputs kept every
step's saved activations alive into the next step: holoflow.compile's peak memory doubled."""
import contextlib
import gc
import weakref

import pytest

import holoflow as flow
from holoflow.graph.pytree import flatten, unflatten


@contextlib.contextmanager
def collector_off():
    gc.collect()
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def cycles_left(step, n: int = 3) -> int:
    """Objects in unreachable cycles after ``n`` calls of ``step`` (after two warm-up calls)."""
    for _ in range(2):
        step()
    with collector_off():
        for _ in range(n):
            step()
        return gc.collect()


def _model():
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(8, 16), flow.nn.GELU(), flow.nn.Linear(16, 4))
    return m, flow.optim.AdamW(m.parameters(), lr=1e-3), flow.randn(5, 8)


def test_a_compiled_calls_graph_and_saved_tensors_die_with_its_output():
    m, _, x = _model()
    cm = flow.compile(m)
    cm(x).sum().backward()   # (traced and compiled)
    with collector_off():
        out = cm(x)
        node = weakref.ref(out.grad_fn)
        out.sum().backward()
        inp = flow.randn(5, 8)
        held = weakref.ref(inp)
        cm(inp).sum().backward()
        del out, inp
        assert node() is None and held() is None


@pytest.mark.parametrize("kind", ["eager", "compile", "graph"])
def test_training_steps_make_no_cycles(kind):
    m, opt, x = _model()
    if kind == "graph":
        class Train(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.m = m
                self.add_optimizer(opt)

            def build(self, x):
                loss = self.m(x).sum()
                loss.backward()
                return loss
        step = Train().__call__
        assert cycles_left(lambda: step(x)) == 0
        return
    f = flow.compile(m) if kind == "compile" else m

    def step():
        opt.zero_grad()
        f(x).sum().backward()
        opt.step()
    assert cycles_left(step) == 0


def test_load_state_dict_keeps_nothing_of_the_state_dict():
    m, _, _ = _model()
    sd = {k: v.clone() for k, v in m.state_dict().items()}
    assert cycles_left(lambda: m.load_state_dict(sd)) == 0
    with collector_off():
        loaded = {k: v.clone() for k, v in sd.items()}
        held = weakref.ref(loaded["0.weight"])
        m.load_state_dict(loaded)
        del loaded
        assert held() is None


def test_a_source_ranks_load_keeps_nothing(tmp_path):
    m, _, _ = _model()
    path = str(tmp_path / "m")
    flow.save(m.state_dict(), path)
    flow.load(path, global_src_rank=0)
    with collector_off():
        got = flow.load(path, global_src_rank=0)
        held = weakref.ref(got["0.weight"])
        del got
        assert held() is None and gc.collect() == 0


def test_pytree_round_trip_makes_no_cycles():
    class Leaf:
        pass
    leaf = Leaf()
    tree = ({"a": [leaf, (leaf, 3)], "b": None}, [leaf])
    held = weakref.ref(leaf)
    with collector_off():
        leaves, spec = flatten(tree)
        assert unflatten(leaves, spec) == tree and len(leaves) == 5
        del leaf, tree, leaves
        assert held() is None and gc.collect() == 0

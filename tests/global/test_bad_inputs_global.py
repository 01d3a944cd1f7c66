"""Bad inputs of global tensors and ``nn.Graph``, table-driven (the global twin of
tests/test_bad_inputs.py).

Each case runs the same code on every simulated rank of ``world.simulate`` and asserts that
*every* rank raises the expected exception class (torch's: ``RuntimeError`` for a bad value
torch would report at run time, ``TypeError`` for a wrong type, ``IndexError`` for a dim out of
range, ``NotImplementedError`` for what is not supported) with a message containing every
needle (compared with brackets and quotes dropped, case-insensitive): the op, the offending
shapes / dtypes / SBPs and what would be legal. It also asserts that the error is raised by
holoflow's own code, not deep inside torch or numpy (the innermost traceback frame), and the
short collective timeout turns a hang into a failure instead of a stalled suite.

The namespace: ``L`` is holoflow, ``F`` / ``nn`` its ``nn.functional`` / ``nn``, ``S``/``B``/``P``
the SBPs, ``P2`` = ranks [0, 1], ``P4`` = ranks [0, 1, 2, 3], ``P22`` = the 2x2 mesh
[[0, 1], [2, 3]], ``G(shape, sbp, place=P2)`` a global tensor of ``np.arange`` values (no RNG),
``T(...)`` a local tensor from numpy values, ``rank`` this rank.
"""
from __future__ import annotations

import os
import re
import traceback

import numpy as np
import pytest

import holoflow as flow
from harness import error_table_params
from holoflow.distributed import world
from holoflow.sbp import B, P, S

QUICK = 10.0  # simulated collective timeout: a hang fails fast instead of stalling the suite
HOLOFLOW_SRC = os.path.dirname(flow.__file__)


class Case:
    def __init__(self, id: str, code: str, exc: type, needles: tuple, n: int, raisers: tuple | None,
                 timeout: float) -> None:
        self.id, self.code, self.exc, self.needles, self.n = id, code, exc, needles, n
        self.raisers = tuple(range(n)) if raisers is None else raisers
        self.timeout = timeout


def E(id: str, code: str, exc: type, *needles: str, n: int = 2, raisers: tuple | None = None,
      timeout: float = QUICK) -> Case:
    """``code`` (statements; the last one must raise) raises ``exc`` naming every needle on the
    ranks ``raisers`` (default: all ``n``); the others must finish without an error."""
    return Case(id, code, exc, needles, n, raisers, timeout)


def _ns(rank: int) -> dict:
    p2, p4 = flow.placement("cpu", [0, 1]), flow.placement("cpu", [0, 1, 2, 3])
    p22 = flow.placement("cpu", [[0, 1], [2, 3]])

    def G(shape, sbp, place=p2, dtype=np.float32, requires_grad=False):
        values = np.arange(int(np.prod(shape)), dtype=dtype).reshape(shape)
        x = flow.tensor(values).to_global(place, (B,) * place.ndim).to_global(sbp=sbp)
        return x.requires_grad_() if requires_grad else x

    def T(values, dtype=np.float32):
        return flow.tensor(np.asarray(values, dtype=dtype))

    return {"L": flow, "F": flow.nn.functional, "nn": flow.nn, "np": np, "S": S, "B": B, "P": P,
            "P2": p2, "P4": p4, "P22": p22, "G": G, "T": T, "rank": rank}


def _norm(s: str) -> str:
    return re.sub(r"[\[\]()'\"`]", "", str(s)).lower()


def _raise_site(e: BaseException) -> str:
    frames = traceback.extract_tb(e.__traceback__)
    return frames[-1].filename if frames else "?"


def _run_rank(code: str, rank: int):
    try:
        exec(compile(code, "<case>", "exec"), _ns(rank))
    except Exception as e:  # noqa: BLE001 - the case decides what is expected
        return e, _raise_site(e)
    return None, None


CASES: list[Case] = []

# ---- placements and SBPs -----------------------------------------------------------------------
CASES += [
    E("sbp-list-too-long", "T(np.ones((4, 3))).to_global(P2, [S(0), B])", RuntimeError, "1-D mesh", "got 2"),
    E("sbp-list-too-short-2d", "T(np.ones((4, 3))).to_global(P22, S(0))", RuntimeError, "2-D mesh", "got 1", n=4),
    E("sbp-not-an-sbp", "T(np.ones((4, 3))).to_global(P2, 'split')", TypeError, "to_global", "split", "str"),
    E("split-dim-missing", "T(np.ones((4, 3))).to_global(P2, S(2))", RuntimeError,
      "split(dim=2)", "2 dimension(s)", "legal split dims are 0..1"),
    E("split-dim-missing-boxing", "G((4, 3), S(0)).to_global(sbp=S(5))", RuntimeError, "split(dim=5)", "0..1"),
    E("split-axis-float", "S(1.5)", TypeError, "split", "1.5"),
    E("placement-rank-outside-world", "T(np.ones(4)).to_global(L.placement('cpu', [0, 1, 5]), B)", RuntimeError,
      "ranks 5", "outside the world of 2", "0..1"),
    E("placement-bad-device", "L.placement('tpu', [0, 1])", RuntimeError, "tpu", "cpu", "cuda"),
    E("placement-ranks-not-ints", "L.placement('cpu', ['0', '1'])", RuntimeError, "ints"),
    E("placement-not-a-placement", "T(np.ones(4)).to_global('cpu', B)", TypeError, "to_global", "placement", "str"),
    E("to-global-local-no-placement", "T(np.ones(4)).to_global(sbp=B)", RuntimeError, "to_global",
      "both placement= and sbp=", "placement=None"),
    E("creation-sbp-without-placement", "L.ones(4, sbp=B)", RuntimeError, "ones", "placement"),
    E("creation-placement-without-sbp", "L.zeros(4, placement=P2)", RuntimeError, "zeros", "sbp"),
    E("sbp-of-local", "T(np.ones(2)).sbp", RuntimeError, "sbp", "local", "to_global"),
    E("unbalanced-local-shards", "T(np.ones((2 + rank, 3))).to_global(P2, S(0))", RuntimeError,
      "to_global", "rank 0", "2, 3", "3, 3", "balanced"),
]

# ---- ranks that run different programs: never a hang ---------------------------------------------
CASES += [
    E("ranks-diverge-shapes", "G((4,), S(0)) if rank == 0 else G((6,), S(0))", RuntimeError,
      "to_global", "rank 1", "shape 6,", "logical shape 4,"),
    E("ranks-diverge-collectives", "x = G((4,), S(0))\n"
      "x.to_global(sbp=B) if rank == 0 else x.to_global(sbp=P).to_global(sbp=B)", RuntimeError,
      "does not match across ranks", "rank 0: all_gather", "rank 1: all_reduce", "same order"),
    E("rank-skips-a-collective", "x = G((4,), S(0))\nif rank == 0:\n    x.to_global(sbp=B)", RuntimeError,
      "all_gather", "timed out", "ranks [1] did not arrive", raisers=(0,), timeout=2.0),
]

# ---- ops on global tensors ----------------------------------------------------------------------
CASES += [
    E("mixed-placements", "G((4, 3), B) + G((4, 3), B, place=P4)", RuntimeError,
      "different placements", "ranks=[0, 1]", "ranks=[0, 1, 2, 3]", n=4),
    E("mixed-placements-cat", "L.cat([G((4, 3), S(0)), G((4, 3), S(0), place=P4)])", RuntimeError,
      "cat", "different placements", n=4),
    E("mixed-local-global", "G((4, 3), S(0)) * T(np.ones((4, 3)))", RuntimeError,
      "holoflow.mul", "local tensor of shape", ".to_global("),
    E("partial-to-local-then-mixed", "y = G((4, 3), S(1)) @ G((3, 2), S(0)); y.to_local() + y", RuntimeError,
      "add", "local tensor", ".to_global("),
    E("global-shape-mismatch", "G((4, 3), S(0)) + G((5, 3), S(0))", RuntimeError, "4, 3", "5, 3"),
    E("global-matmul-inner", "G((4, 3), S(0)) @ G((4, 3), B)", RuntimeError, "matmul", "4, 3"),
    E("global-dtype-inplace", "x = G((4,), S(0), dtype=np.int64); x.add_(G((4,), S(0)) * 0.5)", RuntimeError,
      "float", "long"),
    E("global-sum-dim", "G((4, 3), S(0)).sum(2)", IndexError, "2"),
    E("global-to-other-device-type", "G((4,), S(0)).to('cuda')", RuntimeError,
      "holoflow.to", "type=cpu", "to_global(placement=holoflow.placement(cuda"),
    E("global-pin-memory", "G((4,), S(0)).pin_memory()", NotImplementedError, "pin_memory", "global",
      "to_local().pin_memory()"),
    E("item-of-non-scalar-global", "G((4,), S(0)).item()", RuntimeError, "item", "4"),
    E("numpy-requires-grad-global", "G((4,), S(0), requires_grad=True).numpy()", RuntimeError,
      "numpy", "requires grad", "detach"),
]

# ---- autograd -----------------------------------------------------------------------------------
# a custom Function on a global tensor whose backward returns {grad}
_FUNCTION = """
class Double(L.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x * 2
    @staticmethod
    def backward(ctx, g):
        return {grad}
Double.apply(G((4,), S(0), requires_grad=True)).sum().backward()
"""

CASES += [
    E("backward-non-scalar-global", "x = G((4, 3), S(0), requires_grad=True); (x * 2).backward()", RuntimeError,
      "scalar"),
    E("backward-grad-wrong-shape-global", "x = G((4,), S(0), requires_grad=True); (x * 2).backward(G((3,), S(0)))",
      RuntimeError, "3", "4"),
    E("backward-local-grad-for-global", "x = G((4,), S(0), requires_grad=True); (x * 2).backward(T(np.ones(4)))",
      RuntimeError, "backward", "local tensor of shape 4,", "S0", "to_global"),
    E("grad-assign-local-to-global", "x = G((4,), S(0), requires_grad=True); x.grad = T(np.ones(4))",
      RuntimeError, "assigned grad", "local, shape 4,", "global, shape 4,", "ranks=[0, 1]", "to_global"),
    E("grad-assign-other-placement", "x = G((4,), S(0), requires_grad=True, place=P4); x.grad = G((4,), S(0))",
      RuntimeError, "assigned grad", "ranks=[0, 1]", "ranks=[0, 1, 2, 3]", n=4),
    E("function-backward-local-grad", _FUNCTION.format(grad="T(np.ones(4))"), RuntimeError,
      "Double", "local gradient of shape 4,", "index 0", "global input", "to_global"),
    E("function-backward-wrong-shape", _FUNCTION.format(grad="G((3,), S(0))"), RuntimeError,
      "DoubleBackward", "invalid gradient", "3", "4"),
    E("requires-grad-int-global", "G((4,), S(0), dtype=np.int64).requires_grad_()", RuntimeError, "int64"),
]

# ---- nn.Graph -----------------------------------------------------------------------------------
_MODEL = """
model = nn.Linear(3, 2)
model.to_global(P2, B)
opt = L.optim.SGD(model.parameters(), lr=0.1)
x = G((4, 3), S(0))
"""


def _graph(build: str, init: str = "", setup: str = _MODEL, call: str = "g(x)") -> str:
    """A Graph subclass over ``model`` with ``init`` in ``__init__`` and ``build``'s body."""
    body = "\n".join("        " + line for line in build.strip().splitlines())
    extra = "\n".join("        " + line for line in init.strip().splitlines())
    return (f"{setup}\nclass Net(nn.Graph):\n    def __init__(self):\n        super().__init__()\n"
            f"        self.model = model\n{extra}\n    def build(self, x):\n{body}\n"
            f"g = Net()\n{call}\n")


# two stages, one rank each: {s0} / {s1} are the stage ids given to the two layers, {layout}
# places the model and makes the input
_PIPE = """
Q0, Q1 = L.placement('cpu', [0]), L.placement('cpu', [1])
model = nn.Sequential(nn.Linear(3, 3), nn.Linear(3, 2))
{layout}
opt = L.optim.SGD(model.parameters(), lr=0.1)
class Net(nn.Graph):
    def __init__(self):
        super().__init__()
        self.model = model
        self.add_optimizer(opt)
        model[0].to(nn.graph.GraphModule).set_stage({s0}, Q0)
        model[1].to(nn.graph.GraphModule).set_stage({s1}, Q1)
        self.config.set_gradient_accumulation_steps(2)
    def build(self, x):
        loss = self.model(x).sum()
        loss.backward()
        return loss
Net()(x)
"""
_STAGED = "model[0].to_global(Q0, B)\nmodel[1].to_global(Q1, B)\nx = G((4, 3), S(0), place=Q0)"

CASES += [
    E("graph-too-many-inputs", _graph("return self.model(x)", call="g(x, x)"), TypeError, "build", "2"),
    E("graph-too-few-inputs", _graph("return self.model(x)", call="g()"), TypeError, "build", "x"),
    E("graph-item-in-build", _graph("return self.model(x).sum().item()"), RuntimeError,
      ".item()", "build", "symbolic"),
    E("graph-float-in-build", _graph("loss = self.model(x).sum()\nprint(float(loss))\nreturn loss"), RuntimeError,
      "float()", "at <case>:", "symbolic", "return the tensor from build()"),
    E("graph-numpy-in-build", _graph("y = self.model(x)\nnp.save('/dev/null', y.numpy())\nreturn y"), RuntimeError,
      ".numpy()", "at <case>:", "symbolic"),
    E("graph-data-dependent-if", _graph("y = self.model(x)\nif y.sum() > 0:\n    y = y * 2\nreturn y"),
      RuntimeError, "build", "at <case>:", "bool()", "if x.sum() > 0", "symbolic"),
    E("graph-add-optimizer-twice", _graph("return self.model(x).sum()", init="self.add_optimizer(opt)\n"
                                          "self.add_optimizer(opt)"), RuntimeError, "add_optimizer", "SGD",
      "already added"),
    E("graph-two-optimizers-same-params", _graph("return self.model(x).sum()", init="self.add_optimizer(opt)\n"
      "self.add_optimizer(L.optim.AdamW(model.parameters()))"), RuntimeError, "add_optimizer", "2 parameter(s)",
      "already updated"),
    E("graph-add-optimizer-not-optimizer", _graph("return self.model(x)", init="self.add_optimizer(model)"),
      TypeError, "add_optimizer", "Linear"),
    E("graph-input-other-placement", _graph("return self.model(x)", call="g(G((4, 3), S(0), place=P4))"),
      RuntimeError, "mixes placements", "input0", "model.weight", "ranks=[0, 1, 2, 3]", "ranks=[0, 1]", n=4),
    E("graph-local-input-global-params", _graph("return self.model(x)", call="g(T(np.ones((4, 3))))"),
      RuntimeError, "input0", "local", "to_global"),
    E("graph-backward-non-scalar", _graph("y = self.model(x)\ny.backward()\nreturn y", init="self.add_optimizer(opt)"),
      RuntimeError, "scalar", "4, 2"),
    E("graph-backward-inference", _graph("y = self.model(x).sum()\ny.backward()\nreturn y"),
      RuntimeError, "inference", "add_optimizer"),
    E("graph-grad-acc-indivisible", _graph(
        "loss = self.model(x).sum()\nloss.backward()\nreturn loss",
        init="self.add_optimizer(opt)\nself.config.set_gradient_accumulation_steps(3)"),
      RuntimeError, "3 micro-batches", "4, 3", "multiple of 3"),
    E("graph-grad-acc-str", _graph("return self.model(x)", init="self.config.set_gradient_accumulation_steps('2')"),
      TypeError, "gradient accumulation", "str"),
    E("graph-grad-acc-zero", _graph("return self.model(x)", init="self.config.set_gradient_accumulation_steps(0)"),
      ValueError, "gradient accumulation", ">= 1", "0"),
    E("graph-zero-stage-str", _graph("return self.model(x)", init="self.config.enable_zero(True, stage='2')"),
      TypeError, "stage", "str"),
    E("graph-zero-stage-4", _graph("return self.model(x)", init="self.config.enable_zero(True, stage=4)"),
      NotImplementedError, "ZeRO stage 4", "1, 2 and 3"),
    E("graph-bucket-str", _graph("return self.model(x)", init="self.config.set_allreduce_bucket_mb('25')"),
      TypeError, "bucket", "str"),
    E("graph-cost-ratio-str", _graph("return self.model(x)",
                                     init="self.config.set_auto_parallel_computation_cost_ratio('1')"),
      TypeError, "set_auto_parallel_computation_cost_ratio", "1", "str"),
    E("graph-debug-str", _graph("return self.model(x)", init="self.debug('1')"), TypeError, "debug", "v_level",
      "int", "str"),
    E("graph-amp-dtype-str", _graph("return self.model(x)", init="self.config.enable_amp(True, dtype='fp16')"),
      TypeError, "enable_amp", "fp16"),
    E("graph-schedule-bad", _graph("return self.model(x)", init="self.config.set_pipeline_schedule('1f2b')"),
      ValueError, "1f1b", "gpipe", "1f2b"),
    E("graph-executor-bad", _graph("return self.model(x)", init="self.config.set_executor('threads')"),
      ValueError, "actor", "sequential", "threads"),
    E("graph-set-stage-negative", _graph("return self.model(x)", init="self.model.config.set_stage(-1, P2)"),
      ValueError, "stage", "-1"),
    E("graph-model-moved-placement", _graph("return self.model(x)", call="g(x)\nmodel.to_global(P4, B)\ng(x)"),
      RuntimeError, "mixes placements", "model.weight", "ranks=[0, 1, 2, 3]", "input0", "ranks=[0, 1]", n=4),
    E("pipeline-stage-ids-gap", _PIPE.format(s0=0, s1=2, layout=_STAGED), RuntimeError, "stage ids", "0, 1, ..., p-1", "0, 2"),
    E("pipeline-stage-two-placements", _PIPE.format(s0=0, s1=0, layout=_STAGED), RuntimeError, "stage 0", "two placements",
      "ranks=[0]", "ranks=[1]"),
    E("pipeline-local-model", _PIPE.format(s0=0, s1=1, layout="x = T(np.ones((4, 3)))"), NotImplementedError, "pipeline stages need global tensors", "to_global"),
    E("graph-set-stage-placement-str", _graph("return self.model(x)", init="self.model.config.set_stage(0, 'cpu')"),
      TypeError, "set_stage", "placement", "str"),
]


# ---- the runner ---------------------------------------------------------------------------------
# fixes that belong to other owners' files (strict xfails: they start passing when fixed)
XFAIL: dict[str, str] = {}




@pytest.mark.parametrize("case", error_table_params(CASES, XFAIL))
def test_bad_input_global(case: Case):
    outs = world.simulate(case.n, lambda r: _run_rank(case.code, r), timeout=case.timeout)
    for rank, (err, site) in enumerate(outs):
        if rank not in case.raisers:
            assert err is None, f"rank {rank} raised {type(err).__name__}: {err}"
            continue
        assert err is not None, f"rank {rank} raised nothing: expected {case.exc.__name__}"
        assert isinstance(err, case.exc), f"rank {rank} raised {type(err).__name__} ({err}); " \
                                          f"expected {case.exc.__name__}"
        missing = [n for n in case.needles if _norm(n) not in _norm(err)]
        assert not missing, f"rank {rank}: message lacks {missing}: {type(err).__name__}: {err}"
        assert site.startswith(HOLOFLOW_SRC), \
            f"rank {rank}: raised deep inside {site}, not by holoflow: {type(err).__name__}: {err}"


# ---- behaviour next to the errors ----------------------------------------------------------------
def test_enable_zero_on_a_local_graph_warns_and_trains(caplog):
    """OneFlow's own example enables ZeRO on a local model, so it is accepted; but it does nothing
    there, and the user is told so instead of believing the state is sharded."""
    model = flow.nn.Linear(3, 2)
    opt = flow.optim.SGD(model.parameters(), lr=0.1)

    class Net(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            self.config.enable_zero(True, stage=2)

        def build(self, x):
            loss = self.model(x).sum()
            loss.backward()
            return loss
    with caplog.at_level("WARNING", logger="holoflow.graph"):
        Net()(flow.tensor(np.ones((4, 3), dtype=np.float32)))
    msgs = [r.getMessage() for r in caplog.records]
    assert any("enable_zero(stage=2) has no effect" in m and "to_global" in m for m in msgs), msgs


def test_graph_recompiles_for_a_model_laid_out_anew():
    """``model.to_global(...)`` between calls re-lays the parameters out; the next call compiles a
    new plan and computes what eager computes. With the same inputs and a new SBP the old plan
    used to run, reading the whole broadcast weight as if it were its S(0) shard: an output of
    shape (4, 8) for the logical (4, 4), silently. (With inputs left on the old placement the call
    says so: the graph-model-moved-placement case.)"""
    def run(rank):
        ns = _ns(rank)
        setup = "model = nn.Linear(3, 4)\nmodel.to_global(P2, S(0))\nx = G((4, 3), B)\n"
        call = ("g(x)\nmodel.to_global(P2, B)\ny_sbp, e_sbp = g(x), model(x)\n"
                "model.to_global(P4, S(0))\nx4 = G((4, 3), B, place=P4)\ny_place, e_place = g(x4), model(x4)")
        exec(compile(_graph("return self.model(x)", setup=setup, call=call), "<case>", "exec"), ns)
        return [(y.placement, tuple(y.shape), y.to_global(sbp=(B,)).numpy(), e.detach().to_global(sbp=(B,)).numpy())
                for y, e in ((ns["y_sbp"], ns["e_sbp"]), (ns["y_place"], ns["e_place"]))]
    for got in world.simulate(4, run, timeout=QUICK):
        for (place, shape, y, eager), want in zip(got, ([0, 1], [0, 1, 2, 3])):
            assert place == flow.placement("cpu", want) and shape == (4, 4)
            np.testing.assert_allclose(y, eager, rtol=1e-6)


def test_grad_of_a_global_leaf_through_views():
    """A global leaf used through a slice and a view gets its gradient as a global tensor of its
    own placement and SBP, with torch's values; the view (not a leaf) has no ``.grad``. A local
    leaf taken as this rank's shard by ``to_global`` gets a local ``.grad`` of its own shape."""
    def run(rank):
        ns = _ns(rank)
        x = ns["G"]((6,), S(0), requires_grad=True)
        v = x[1:]
        (v.view(5) * ns["G"]((5,), B)).sum().backward()
        # a local leaf made global: its .grad is local, this rank's piece of the logical gradient
        loc = ns["T"](np.arange(3) + 3 * rank).requires_grad_()
        y = loc.to_global(ns["P2"], S(0))
        (y * y).sum().backward()
        return (x.grad.placement, tuple(x.grad.sbp), x.grad.to_global(sbp=B).numpy(), v.grad,
                loc.grad.is_global, loc.grad.numpy(), y.grad)
    for rank, (place, sbp, grad, view_grad, loc_global, loc_grad, y_grad) in \
            enumerate(world.simulate(2, run, timeout=QUICK)):
        assert place == flow.placement("cpu", [0, 1]) and sbp == (S(0),)
        np.testing.assert_array_equal(grad, [0, 0, 1, 2, 3, 4])
        assert view_grad is None and y_grad is None
        assert not loc_global
        np.testing.assert_array_equal(loc_grad, 2 * (np.arange(3) + 3 * rank))


def test_custom_function_on_global_tensors_sees_global_gradients():
    """A custom Function's backward receives the global gradient of its global output and returns
    global gradients for its global inputs (it used to receive this rank's local piece, shape (2,),
    and fail torch's shape check against the logical (4, 3)); eager and nn.Graph agree."""
    class Scale(flow.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return x * w

        @staticmethod
        def backward(ctx, g):
            x, w = ctx.saved_tensors
            assert g.is_global and tuple(g.shape) == (4, 3), (g.is_global, tuple(g.shape))
            return g * w, (g * x).sum(0)

    def run(rank):
        ns = _ns(rank)
        x, w = ns["G"]((4, 3), S(0)), ns["G"]((3,), B, requires_grad=True)
        Scale.apply(x, w).sum().backward()
        eager = (tuple(w.grad.sbp), w.grad.to_global(sbp=B).numpy())
        w.grad = None
        opt = flow.optim.SGD([w], lr=1.0)

        class Net(flow.nn.Graph):
            def __init__(self):
                super().__init__()
                self.add_optimizer(opt)

            def build(self, x):
                loss = Scale.apply(x, w).sum()
                loss.backward()
                return loss
        before = w.detach().to_global(sbp=B).numpy().copy()
        Net()(x)
        return eager, before - w.detach().to_global(sbp=B).numpy()
    want = np.arange(12, dtype=np.float32).reshape(4, 3).sum(0)
    for (sbp, eager), step in world.simulate(2, run, timeout=QUICK):
        assert sbp == (B,)
        np.testing.assert_allclose(eager, want)
        np.testing.assert_allclose(step, want)


def test_enough_cases():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    assert len(ids) >= 30, len(ids)

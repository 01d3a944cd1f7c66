"""The runtime layer sits below graph and above core: it imports no ops, nn or graph code."""
import ast
import pathlib

import torch

from holoflow.runtime import Plan, Runtime, SequentialExecutor, TaskSpec

RUNTIME = pathlib.Path(__file__).parents[2] / "src" / "holoflow" / "runtime"


def test_runtime_imports_only_core_and_itself():
    files = sorted(RUNTIME.glob("*.py"))
    assert len(files) >= 7
    for f in files:
        for node in ast.walk(ast.parse(f.read_text())):
            if isinstance(node, ast.ImportFrom) and node.level >= 2:
                assert (node.module or "").startswith("core"), f"{f.name} imports ..{node.module}"
            if isinstance(node, ast.Import) or (isinstance(node, ast.ImportFrom) and node.level == 0):
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module]
                assert not any(n.startswith(("holoflow", "torch")) for n in names), f"{f.name} imports {names}"


def test_a_plan_without_tasks_passes_inputs_through():
    plan = Plan([], inputs=("x",), outputs=("x",))
    feeds = [{"x": torch.full((2,), float(i))} for i in range(3)]
    with Runtime(plan) as rt:
        got = rt.run(feeds)
    assert all(g["x"] is f["x"] for g, f in zip(got, feeds))       # references, never copies


def test_a_plan_without_inputs_runs_once_per_empty_feed():
    calls = []
    plan = Plan([TaskSpec("tick", "compute", lambda n: (calls.append(n) or n + 1,), ("n",), ("n",), register_num=2)],
                outputs=("n",), initial={"n": 0})
    with Runtime(plan) as rt:
        assert rt.run([{}] * 4) == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]
    assert calls == [0, 1, 2, 3]                                   # never runs ahead of the feeds
    assert SequentialExecutor(plan).run([{}] * 4) == [{"n": 1}, {"n": 2}, {"n": 3}, {"n": 4}]


def test_side_effect_tasks_finish_before_run_returns():
    log = []
    plan = Plan([TaskSpec("a", "compute", lambda x: (x,), ("x",), ("y",)),
                 TaskSpec("log", "comm", lambda y: (log.append(y), ())[1], ("y",), ())],
                inputs=("x",))
    with Runtime(plan) as rt:
        assert rt.run({"x": i} for i in range(5)) == [{}] * 5
        assert log == [0, 1, 2, 3, 4]


def test_intermediates_are_not_kept_alive_after_a_run():
    import gc
    import weakref
    made = []

    def mid(x):
        y = x * 2
        made.append(weakref.ref(y))
        return (y,)
    plan = Plan([TaskSpec("mid", "compute", mid, ("x",), ("y",), register_num=2),
                 TaskSpec("end", "comm", lambda y: (y.sum(),), ("y",), ("s",))],
                inputs=("x",), outputs=("s",))
    with Runtime(plan) as rt:
        rt.run({"x": torch.ones(3)} for _ in range(4))
        gc.collect()
        assert len(made) == 4 and all(r() is None for r in made)

"""The plan checker: every malformed plan fails at construction with an error that says why."""
import dataclasses

import pytest

from holoflow.runtime import Plan, PlanError, SequentialExecutor, TaskSpec

def T(name, consumes=(), produces=(), stream="compute", **kw):
    fn = kw.pop("fn", lambda *v: tuple(range(len(produces))))
    return TaskSpec(name, stream, fn, consumes, produces, **kw)


@pytest.mark.parametrize("build, message", [
    (lambda: Plan([T("a", ("x",), ("y",)), T("a", ("y",), ("z",))], inputs=("x",)), "task name 'a' is used twice"),
    (lambda: Plan([T("a", ("x",), ("y",)), T("b", ("x",), ("y",))], inputs=("x",)), "regst 'y' is produced by"),
    (lambda: Plan([T("a", ("x",), ("x",))], inputs=("x",)), "regst 'x' is produced by the source"),
    (lambda: Plan([T("a", ("q",), ("y",))], inputs=("x",)), "consumes regst 'q', which no task produces"),
    (lambda: Plan([T("a", ("x",), ("y",))], inputs=("x",), outputs=("z",)), "output 'z' is produced by no task"),
    (lambda: Plan([T("a", ("x",), ("y",))], inputs=("x",), initial={"w": 1}), "initial regst 'w' has no producer"),
    (lambda: Plan([T("a", ("x",), ("y",))], inputs=("x",), initial={"x": 1}), "both an input and initial"),
    (lambda: Plan([T("a", ("x",), ("y",), register_num=0)], inputs=("x",)), "register_num must be an int >= 1"),
    (lambda: Plan([T("a", ("x",), ("y",), fn=3)], inputs=("x",)), "fn is not callable"),
    (lambda: Plan([T("a", ("x", "x"), ("y",))], inputs=("x",)), "consumes names a regst twice"),
    (lambda: Plan([T("a", ("x",), ("y",))], inputs=("x", "x")), "inputs name a regst twice"),
    (lambda: Plan([T("a", ("x",), ("y",))], inputs=("x",), input_register_num=0), "input_register_num"),
    (lambda: Plan([T("<sink>", ("x",), ("y",))], inputs=("x",)), "reserved"),
])
def test_malformed_plans_are_rejected(build, message):
    with pytest.raises(PlanError, match=message):
        build()


def test_cycle_without_initial_names_the_tasks():
    with pytest.raises(PlanError, match=r"cycle without an initial value through tasks \['b', 'c', 'b'\]"):
        Plan([T("a", ("x",), ("p",)), T("b", ("p", "r"), ("q",)), T("c", ("q",), ("r",))], inputs=("x",))


def test_cycle_through_an_initial_value_is_legal():
    plan = Plan([T("b", ("x", "r"), ("q",)), T("c", ("q",), ("r",))], inputs=("x",), initial={"r": 0})
    assert [t.name for t in plan.topo_order()] == ["b", "c"]


def test_self_update_with_one_slot_deadlocks_and_says_what_to_raise():
    # upd holds w[i] while it needs a slot for w[i+1]: two slots are required
    with pytest.raises(PlanError, match=r"deadlocks: task 'upd' needs a free slot of regst 'w' \(register_num=1\)"
                                        r".*raise its register_num"):
        Plan([T("upd", ("w",), ("w",))], initial={"w": 0})
    Plan([T("upd", ("w",), ("w",), register_num=2)], initial={"w": 0})


def test_state_read_downstream_of_its_producer_needs_two_slots():
    # upd makes w[i+1] and g[i]; fwd reads w[i] with g[i], so w[i] is held while w[i+1] needs a slot
    tasks = lambda rn: [T("upd", ("w",), ("w", "g"), register_num=rn), T("fwd", ("w", "g"), ("y",))]
    with pytest.raises(PlanError, match="deadlocks"):
        Plan(tasks(1), outputs=("y",), initial={"w": 0})
    Plan(tasks(2), outputs=("y",), initial={"w": 0})


def test_back_edge_between_two_tasks_runs_with_one_slot():
    Plan([T("a", ("x", "w"), ("y",)), T("b", ("y",), ("w",))], inputs=("x",), initial={"w": 0})


def test_plan_and_taskspec_are_immutable():
    t = T("a", ["x"], ["y"], meta={"k": 1})
    assert t.consumes == ("x",) and t.produces == ("y",)
    with pytest.raises(dataclasses.FrozenInstanceError):
        t.name = "b"
    with pytest.raises(TypeError):
        t.meta["k"] = 2
    plan = Plan([t], inputs=["x"], initial={})
    with pytest.raises(TypeError):
        plan.initial["y"] = 1
    assert isinstance(plan.tasks, tuple) and plan.inputs == ("x",)


def test_feed_must_hold_exactly_the_inputs():
    plan = Plan([T("a", ("x",), ("y",), fn=lambda x: (x,))], inputs=("x",), outputs=("y",))
    with pytest.raises(PlanError, match=r"feed for iteration 0 must be a dict with exactly the inputs \['x'\], got \['z'\]"):
        SequentialExecutor(plan).step({"z": 1})


def test_repr_prints_one_line_per_task():
    plan = Plan([T("a", ("x",), ("y",), stream="comm")], inputs=("x",), outputs=("y",))
    assert "comm | y = a(x)  register_num=1" in repr(plan)

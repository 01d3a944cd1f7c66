"""holoflow.runtime: executes a *plan* — OneFlow's decentralized actor runtime, and its reference.

The layer sits below ``graph`` (whose lowering produces plans) and above ``core``; it knows no ops:
its units of work are plain Python callables.

The plan format
---------------
``Plan(tasks, inputs=(), outputs=(), initial={}, input_register_num=2)``, checked on construction
(`PlanError` on failure), immutable. Each task is

``TaskSpec(name, stream, fn, consumes=(), produces=(), register_num=1, source=None, meta={})``

- ``fn(*values of consumes) -> tuple`` with one value per name in ``produces`` (a 1-tuple for one).
- A *regst* is a named value produced once per iteration (a *piece*) by exactly one producer:
  a task, or the source actor for the names in ``inputs`` (fed by the caller every iteration).
- ``register_num`` is the number of slots of each regst the task produces: at most that many
  pieces of it are alive (written and not yet returned by all its consumers). The source's input
  regsts have ``input_register_num`` slots: how far the source may run ahead.
- ``initial`` pre-fills regsts for iteration 0: loop-carried state. A consumer of ``w`` at
  iteration ``i`` reads the value its producer wrote at iteration ``i-1`` (``initial["w"]`` at
  0). This is how parameters flow: ``update(w, g) -> (w,)`` feeds the next iteration's forward.
  Every initial regst needs a producer; a cycle is legal only through a regst with an initial value.
- ``outputs`` are returned per iteration (for an initial regst: the value produced in that
  iteration). ``stream`` names the thread a task runs on (any name; graph lowering uses
  'compute' and 'update'); the source and sink run on stream ``'source'``. ``source`` is the
  user's source line for errors; ``meta`` is free-form data for tools.

Executors
---------
``SequentialExecutor(plan)`` runs tasks in topological order on the calling thread: the reference.
``Runtime(plan, trace=False, timeout=300.0, threads=None, devices=None)`` runs each task as an
actor (act when every consumed regst has a readable piece and every produced regst a free slot;
then announce the new pieces and return the consumed ones), streaming iterations with
back-pressure. Actors run on workers: one thread per stream by default; ``threads`` maps streams
onto shared workers, `CALLER` being the caller's own thread (it runs them while it waits: no
hand-off). ``devices`` maps every stream to a `DeviceStream` (a CUDA stream): acts are then
ordered by events on the device, not by the host waiting.
Both offer ``run(feeds) -> list[dict]``, ``stream(feeds) -> Iterator[dict]``, ``__call__(feed)``,
``state`` (loop-carried values between runs), ``timeline`` (the recorded acts, with ``trace=True``),
``write_trace(path)``, ``trace_table()``, ``close()`` and the context-manager protocol. A failing
fn raises `TaskError` naming the task, stream, iteration and source line, with the original
exception as ``__cause__``; the runtime then shuts down.

>>> plan = Plan([TaskSpec("fwd", "compute", lambda x, w: (x @ w,), ("x", "w"), ("y",)),
...              TaskSpec("upd", "compute", lambda w: (w * 0.9,), ("w",), ("w",), register_num=2)],
...             inputs=("x",), outputs=("y",), initial={"w": w0})
>>> with Runtime(plan) as rt:
...     ys = rt.run({"x": x} for x in xs)
"""
from .errors import RuntimeStall, TaskError
from .executor import SequentialExecutor
from .plan import SINK, SOURCE, SOURCE_STREAM, Plan, PlanError, TaskSpec, check_plan
from .runtime import Runtime
from .streams import CALLER, DeviceStream
from .timeline import Act, TaskStats, Timeline

__all__ = ["Act", "CALLER", "DeviceStream", "Plan", "PlanError", "Runtime", "RuntimeStall", "SequentialExecutor",
           "SINK", "SOURCE", "SOURCE_STREAM", "TaskError", "TaskSpec", "TaskStats", "Timeline", "check_plan"]

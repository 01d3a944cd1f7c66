"""What ``nn.Graph`` shows of its compiles (docs/architecture.md, "Graph"): ``debug()``'s
verbosity, ``explain()``, ``boxing()``, ``passes_log``, the profile of plans compiled with
``config.enable_profiling()``, and the graph's ``repr``.
"""
from __future__ import annotations

from ..core.errors import ArgTypeError, HoloflowError
from . import passes
from . import pipeline
from .global_graph import explain as explain_boxing
from .global_graph import boxing_points, is_global
from .lower import Compiled
from .pipeline_run import PipelineCompiled


class GraphPrinting:
    """The printing side of :class:`graph.Graph` (a base class of it: reads the compiled plans,
    config and modules ``Graph.__init__`` sets)."""

    def debug(self, v_level: int = 0, *, ranks=None, max_py_stack_depth: int = 2) -> None:
        """What each compile prints: ``v_level >= 1`` a summary, what every pass did and, for a global
        graph, the boxing table of :meth:`explain` (the links calibrated once per placement: a short
        collective measurement on every rank); ``>= 2`` also the program that runs (the Python
        source the plan executes, verbatim); ``>= 3`` also the IR after every pass. ``passes_log``
        and :meth:`explain` give the same afterwards."""
        if isinstance(v_level, bool) or not isinstance(v_level, int):
            raise ArgTypeError(f"holoflow.nn.Graph.debug: v_level takes an int (0 quiet .. 3 the IR after every "
                               f"pass), got {v_level!r} (a {type(v_level).__name__})")
        self._debug = v_level

    @property
    def passes_log(self) -> list:
        """The most recent compile's pipeline: a ``PassRecord`` (name, ``graph`` = the IR after it,
        ``seconds``, node counts, per-op changes) for the trace and each pass that ran;
        ``print(record)`` shows the IR after that pass as Python."""
        return list(self._log)

    def explain(self) -> str:
        """The most recent compile's summary, what each pass did, the auto-parallel plan, every
        boxing with its source line (global graphs), and the program that runs."""
        if not self._compiled:
            return f"(GRAPH:{type(self).__name__}) not compiled yet: call it once first"
        c = next(reversed(self._compiled.values()))
        boxing = f"\n{explain_boxing(c.logical)}" if is_global(c.logical) else ""
        if isinstance(c, PipelineCompiled):   # moves between stages: send/recv with their bytes
            boxing += "\n" + pipeline.explain_moves(pipeline.stage_moves(c.logical, c.placements, c.m))
        planned = f"\n{self._auto_plan}" if self._auto_plan is not None else ""
        return f"{self._summary(c)}{planned}{boxing}\n{c.program.source}"

    def boxing(self) -> list:
        """Every redistribution of the most recent compile of a global graph: ``BoxingPoint``s
        with the node (and its user source line), SBP before -> after, the collectives, bytes; then,
        for a pipelined graph, each move between stages (``pipeline.StageMove``: send/recv, bytes)."""
        if not self._compiled:
            raise HoloflowError(f"holoflow.nn.Graph {type(self).__name__}: not compiled yet: call it once first")
        c = next(reversed(self._compiled.values()))
        moves = pipeline.stage_moves(c.logical, c.placements, c.m) if isinstance(c, PipelineCompiled) else []
        return boxing_points(c.logical) + moves

    # -- profiling -------------------------------------------------------------------------------
    def profile_table(self) -> str:
        """Per-op time per iteration and the actors' acts, for each plan compiled with
        ``config.enable_profiling()``."""
        return "\n".join(f"plan {i}:\n{c.profile_table()}" for i, c in enumerate(self._compiled.values())
                         if c.profile)

    def write_trace(self, path: str) -> None:
        """The actors' acts of the most recently compiled plan as a Chrome/Perfetto trace."""
        c = next(reversed(self._compiled.values()))
        if isinstance(c, PipelineCompiled):   # every rank's acts in one file (collective)
            c.write_trace(path)
            return
        c.executor.write_trace(path)

    def print_profile(self) -> None:
        print(self.profile_table())
        if self.config.profile_path:
            self.write_trace(self.config.profile_path)
            print(f"(GRAPH:{type(self).__name__}) trace written to {self.config.profile_path}")

    # -- printing --------------------------------------------------------------------------------
    def _notes(self) -> list[str]:
        notes = []
        passes.load_all()
        for flag, name in (("fuse_add_to_output", "fuse_add_to_output"), ("fuse_model_update", "fuse_update")):
            if getattr(self.config, flag) and not any(p.name == name for p in passes.PIPELINE):
                notes.append(f"{flag} is recorded; no pass implements it yet")
        return notes

    def _summary(self, c: Compiled) -> str:
        lines = [f"(GRAPH:{type(self).__name__}) compiled in {c.compile_s:.2f}s: {len(c.ir.nodes)} nodes, "
                 f"{len(c.lowered.tasks)} tasks, planned peak {c.peak_bytes / 2**20:.2f} MiB"]
        lines += [f"  {r.summary()}" for r in c.passes_log]
        lines += [f"  note: {n}" for n in self._notes()]
        return "\n".join(lines)

    def __repr__(self) -> str:
        lines = [f"(GRAPH:{type(self).__name__}):"]
        for name, m in self._modules.items():
            lines.append(f"  (MODULE:{name}): " + repr(m).replace("\n", "\n    "))
        lines.append(f"  (CONFIG): {self.config}")
        lines += [f"  (NOTE): {n}" for n in self._notes()]
        for c in self._compiled.values():
            ops: dict[str, int] = {}
            for n in c.ir.nodes:
                ops[n.op] = ops.get(n.op, 0) + 1
            top = ", ".join(f"{k}x{v}" for k, v in sorted(ops.items(), key=lambda kv: -kv[1])[:8])
            lines.append(f"  (IR): {len(c.ir.nodes)} nodes, {len(c.ir.feeds)} feeds, {len(c.ir.state)} state "
                         f"tensors, {len(c.lowered.tasks)} tasks, planned peak {c.peak_bytes / 2**20:.2f} MiB; "
                         f"ops: {top}")
        return "\n".join(lines)

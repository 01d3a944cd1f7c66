"""``graph.config``: OneFlow's names for what the passes do."""
from __future__ import annotations

import copy

from ..core import dtype as _dtype
from ..core.errors import ArgTypeError
from .zero import Zero


def _number(what: str, v) -> None:
    """A config value that must be a number (a str such as ``"25"`` is a TypeError naming the call)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise ArgTypeError(f"holoflow.nn.Graph: {what} takes a number, got {v!r} (a {type(v).__name__})")


class GraphConfig:
    """Switches read by the passes (graph/passes/*) and the lowering. A switch whose feature is not
    built yet (ZeRO stage 3) raises ``UnsupportedError`` instead of being recorded and
    ignored."""

    def __init__(self) -> None:
        self.amp = False
        self.amp_dtype = _dtype.bfloat16
        self.grad_acc_steps = 1
        self.fuse_add_to_output = False
        self.fuse_model_update = False
        self.fuse_elementwise = False
        self.executor = "actor"   # or "sequential" (the reference executor)
        self.checkpointed_scopes: set[str] = set()   # module paths recomputed in backward
        self.profiling = False
        self.profile_path: str | None = None
        self.zero: Zero | None = None   # config.enable_zero (graph/zero.py)
        self.allreduce_bucket_mb = 25.0  # global graphs: gradient all-reduces bucketed (0: one each)
        self.pipeline_schedule = "1f1b"  # pipeline stages: "1f1b" or "gpipe" (graph/pipeline.py)
        self.pipeline_memory: str | None = None   # "1f1b": zb-h1 holds no more than 1F1B does
        self.pipeline_schedule_set = False   # set_pipeline_schedule called (else auto-parallel may choose)
        self.compile_tasks = False   # config.enable_compile (graph/compile_tasks.py)
        self.gather_ahead = True     # global graphs: an all-gather of early values issued one ahead
        # config.enable_auto_parallel (graph/auto_parallel.py) and its OneFlow knobs
        self.auto_parallel = False
        self.auto_parallel_ignore_user_sbp = False
        self.auto_parallel_calibrate = False
        self.auto_parallel_ratio = 1.0
        self.auto_parallel_wait_s = 0.0
        self.auto_memory = "AdaptiveMemory"
        self.auto_memory_limit: int | None = None
        # set_gradient_accumulation_steps called (else auto-parallel may choose the micro-batches
        # of a graph with pipeline stages)
        self.grad_acc_steps_set = False
        # the planner chose the micro-batches: the graph's outputs keep one batch's shape (a mean
        # output averaged over the micro-batches, graph/pipeline_run.py)
        self.grad_acc_steps_planned = False
        # config.enable_auto_parallel_stage_cuts: the planner may move the stages' cuts in a stack
        self.auto_parallel_stage_cuts = False

    def set_allreduce_bucket_mb(self, mb: float) -> None:
        """Global graphs: backward's gradient all-reduces are grouped into buckets of at most
        ``mb`` MB (default 25, like DDP's ``bucket_cap_mb``), each one collective on the
        communication stream as soon as its gradients exist; 0 reduces each gradient alone."""
        _number("set_allreduce_bucket_mb", mb)
        if mb < 0:
            raise ValueError(f"holoflow.nn.Graph: allreduce bucket size must be >= 0 MB, got {mb}")
        self.allreduce_bucket_mb = float(mb)

    def enable_amp(self, mode: bool = True, *, dtype=None) -> None:
        """Mixed precision: matmul-like ops in ``dtype`` (bfloat16 on CPU, float16 on CUDA)."""
        if dtype is not None:
            try:
                ok = _dtype.to_torch(dtype).is_floating_point
            except TypeError:
                ok = False
            if not ok:
                raise ArgTypeError(f"holoflow.nn.Graph: enable_amp(dtype=...) takes a floating dtype "
                                   f"(holoflow.bfloat16, holoflow.float16), got {dtype!r}")
            self.amp_dtype = dtype
        self.amp = mode

    def set_gradient_accumulation_steps(self, value: int) -> None:
        """Splits each batch into ``value`` micro-batches along dim 0, each with its own forward
        and backward, summing their gradients (as eager would with ``(loss / value).backward()``
        per micro-batch) before one update. Outputs come back per micro-batch, as in OneFlow: a
        scalar loss has shape ``(value,)``, other outputs are concatenated along dim 0.

        Left unset on a graph with pipeline stages, ``enable_auto_parallel()`` chooses the count
        where micro-batches train as the whole batch would (docs/pipeline.md)."""
        if not isinstance(value, int) or isinstance(value, bool):
            raise ArgTypeError(f"holoflow.nn.Graph: gradient accumulation steps must be an int >= 1, got {value!r} "
                               f"(a {type(value).__name__})")
        if value < 1:
            raise ValueError(f"holoflow.nn.Graph: gradient accumulation steps must be an int >= 1, got {value!r}")
        self.grad_acc_steps = value
        self.grad_acc_steps_set = True

    def set_pipeline_schedule(self, name: str, *, memory: str | None = None) -> None:
        """Pipeline stages (graph/pipeline.py): ``"1f1b"`` (default: a stage holds at most its
        ``p - stage`` micro-batches in flight), ``"gpipe"`` (all ``m`` forwards, then backwards), or
        ``"zb-h1"`` (1F1B whose weight gradients run as a separate task, deferred by ``p - 1 -
        stage`` micro-batches, after the input gradients are sent: zero-bubble H1). The order
        emerges from the tasks' register counts, not from a scheduler loop.

        ``memory="1f1b"`` (zb-h1 only): each stage stays within 1F1B's peak activation memory
        (``p`` micro-batches of activations): where a micro-batch's weight-gradient inputs outweigh
        its activations (fused attention), a stage defers only the weight gradients that fit in one
        micro-batch's activations, most estimated work per byte first, and runs the rest with the
        input gradients (``stages.split_weight_grads_within``); the full ZB-H1 otherwise.

        Left unset, ``enable_auto_parallel()`` chooses the schedule with the stages' layouts (by
        predicted step time, within the memory limit)."""
        if name not in ("1f1b", "gpipe", "zb-h1"):
            raise ValueError(f"holoflow.nn.Graph: pipeline schedule must be '1f1b', 'gpipe' or 'zb-h1', got {name!r}")
        if memory not in (None, "1f1b") or (memory is not None and name != "zb-h1"):
            raise ValueError(f"holoflow.nn.Graph: set_pipeline_schedule(memory=...) takes None or '1f1b', and only "
                             f"with 'zb-h1'; got memory={memory!r} for {name!r}")
        self.pipeline_schedule, self.pipeline_memory, self.pipeline_schedule_set = name, memory, True

    def allow_fuse_add_to_output(self, mode: bool = True) -> None:
        self.fuse_add_to_output = mode

    def allow_fuse_model_update_ops(self, mode: bool = True) -> None:
        self.fuse_model_update = mode

    def allow_fuse_elementwise(self, mode: bool = True) -> None:
        """Fuses chains of elementwise ops into one generated kernel (torch.compile)."""
        self.fuse_elementwise = mode

    def enable_zero(self, mode: bool = True, *, stage: int = 1, shard_min_size: int = 1024,
                    shard_restore_level: int = 1) -> None:
        """ZeRO for graphs of global tensors (graph/zero.py): data-parallel parameters of at least
        ``shard_min_size`` elements get their optimizer state (stage 1) and gradients (stage 2)
        sharded along dim 0 across the ranks; stage 3 also keeps the parameters sharded, gathered
        just before each use in forward and backward."""
        self.zero = Zero(stage, shard_min_size) if mode else None

    def enable_compile(self, mode: bool = True) -> None:
        """Compiles each compute task's generated function with Inductor (whole task, static
        shapes) on its first run: conv + batch-norm + activation regions and elementwise chains of
        forward and backward fuse. A task that cannot be traced warns once and runs uncompiled;
        comm, copy and update tasks, and profiled graphs, stay plain (graph/compile_tasks.py).
        Read at compile time: plans compiled before are kept."""
        self.compile_tasks = bool(mode)

    def enable_auto_parallel(self, mode: bool = True, *, calibrate: bool = False) -> None:
        """Before the first compile, holoflow chooses the SBP of the graph's global parameters
        (those left broadcast) to minimize the predicted step time under the memory mode
        (graph/auto_parallel.py); ``graph.auto_parallel_plan()`` shows the choice. ``calibrate``:
        measure the device and the links first (else round default figures: the same plan on
        every machine)."""
        self.auto_parallel = bool(mode)
        self.auto_parallel_calibrate = bool(calibrate)

    def enable_auto_parallel_stage_cuts(self, mode: bool = True) -> None:
        """Auto-parallel may also move where the pipeline stages' cuts fall in a stack of repeated
        blocks the user put on stages (each block of a ``ModuleList`` / ``Sequential`` of one class
        given its own ``set_stage``, stages in order along the stack): which contiguous blocks
        each stage holds, chosen by predicted step time within the memory limit; the modules
        before and after the stack stay where the user put them. The moved blocks' parameters
        (and buffers, optimizer state) go to their new stage's placement before the first
        compile. Off, the user's cuts are kept (docs/pipeline.md)."""
        self.auto_parallel_stage_cuts = bool(mode)

    def enable_auto_parallel_ignore_user_sbp_config(self, mode: bool = True) -> None:
        """Auto-parallel also re-plans parameters the user laid out split."""
        self.auto_parallel_ignore_user_sbp = bool(mode)

    def set_auto_parallel_computation_cost_ratio(self, ratio: float) -> None:
        """The weight of predicted compute time against communication time (default 1)."""
        _number("set_auto_parallel_computation_cost_ratio", ratio)
        if not ratio >= 0:
            raise ValueError(f"holoflow.nn.Graph: computation cost ratio must be >= 0, got {ratio!r}")
        self.auto_parallel_ratio = float(ratio)

    def set_auto_parallel_wait_time(self, cost: float) -> None:
        """Extra seconds every collective costs in the auto-parallel cost model (default 0)."""
        _number("set_auto_parallel_wait_time", cost)
        if not cost >= 0:
            raise ValueError(f"holoflow.nn.Graph: auto-parallel wait time must be >= 0 seconds, got {cost!r}")
        self.auto_parallel_wait_s = float(cost)

    def enable_auto_memory(self, mode: str = "AdaptiveMemory", *, limit: int | None = None) -> None:
        """How auto-parallel weighs memory: ``"Disable"`` (time only), ``"AdaptiveMemory"`` (time
        within ``limit`` bytes per rank: on CUDA the device's memory by default), or
        ``"HeavyMemoryDown"`` (least memory, then time). Where memory decides (a limit the
        user's layout misses, or ``HeavyMemoryDown``) the plan may also turn on ZeRO (a stage)
        and recompute the stacks' blocks, unless the user set either."""
        from .auto_parallel import MEMORY_MODES
        if mode not in MEMORY_MODES:
            raise ValueError(f"holoflow.nn.Graph enable_auto_memory: mode must be one of {', '.join(MEMORY_MODES)}; "
                             f"got {mode!r}")
        if limit is not None and not (isinstance(limit, int) and limit > 0):
            raise ValueError(f"holoflow.nn.Graph enable_auto_memory: limit must be a positive int of bytes, "
                             f"got {limit!r}")
        self.auto_memory, self.auto_memory_limit = mode, limit

    def enable_profiling(self, mode: bool = True, path: str | None = None) -> None:
        """Times every node of the generated code and records every actor act; after running,
        ``graph.profile_table()`` gives the per-op table and ``graph.write_trace(path)`` the
        Chrome/Perfetto trace (written to ``path`` by ``graph.print_profile()``). Read at compile
        time: plans compiled before are recompiled."""
        self.profiling, self.profile_path = bool(mode), path

    def for_passes(self, flagged: set[str]) -> "GraphConfig":
        """The config the passes see: modules flagged with ``activation_checkpointing = True``
        join ``checkpointed_scopes``."""
        c = copy.copy(self)
        c.checkpointed_scopes = set(self.checkpointed_scopes) | set(flagged)
        return c

    def set_executor(self, name: str) -> None:
        if name not in ("actor", "sequential"):
            raise ValueError(f"holoflow.nn.Graph: executor must be 'actor' or 'sequential', got {name!r}")
        self.executor = name

    def __repr__(self) -> str:
        on = {k: v for k, v in vars(self).items()
              if (v not in (False, 0, 1, None) and v != set() and v != {}) or k == "executor"}
        return f"GraphConfig({', '.join(f'{k}={v}' for k, v in on.items())})"

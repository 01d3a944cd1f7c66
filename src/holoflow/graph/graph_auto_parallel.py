"""``nn.Graph`` before it compiles (docs/architecture.md, "Auto-parallel"): ``build()`` traced and
passed, never run, for the cost model's ``predict()`` and for the auto-parallel planner
(``config.enable_auto_parallel()``), which lays the parameters (and, as the plan says, inputs and
blocks' outputs) out before the first compile.
"""
from __future__ import annotations

import logging

import torch

from ..core.errors import HoloflowError
from ..core.tensor import Tensor
from . import passes, pipeline
from .pytree import flatten
from .global_graph import is_global
from .passes.stages import is_move
from .graph_compile import GraphCompiling


LOG = logging.getLogger("holoflow.graph")


class GraphAutoParallel(GraphCompiling):
    """The cost model's and the auto-parallel planner's view of :class:`graph.Graph` (a base class
    of it: keeps the plan chosen in the ``_auto_plan``, ``_feed_sbp`` and ``_act_vars`` that
    ``Graph.__init__`` sets)."""

    def auto_parallel_plan(self):
        """The plan ``config.enable_auto_parallel`` chose (``graph/auto_parallel.Plan``: each
        parameter's SBP before and after, the predicted step and memory of both)."""
        if self._auto_plan is None:
            raise HoloflowError(f"holoflow.nn.Graph {type(self).__name__}: no auto-parallel plan: enable "
                                f"config.enable_auto_parallel() and call the graph once")
        return self._auto_plan

    def predict(self, *args, device=None, link=None, **kwargs):
        """The cost model's prediction of one step on these inputs (``graph/cost_model.Prediction``:
        compute, communication, collectives, memory per rank; for pipeline stages or micro-batches,
        the busiest stage's figures and the schedule's bubble, ``cost_model.predict_pipeline``),
        with the auto-parallel plan first when ``config.enable_auto_parallel()`` is on (under the
        same figures). Traced and passed, never run, so ranks that exist only as simulated ones
        (``distributed.world.simulate(64, ...)``: the others need only convert the model) predict
        a cluster that is not there (``device``: a ``cost_model.DeviceModel`` such as
        ``DeviceModel.default("cuda")``; ``link``: a ``global_graph.LinkModel``)."""
        from . import auto_parallel, cost_model
        leaves, spec = flatten((args, kwargs))
        params = [p for p in self._all_params() if p._global is not None]
        dev = device or cost_model.DeviceModel.default(
            next((p._data.device.type for p in params), "cpu"))
        k = auto_parallel.state_per_param([o for o, _ in self._optimizers])
        cfg = self.config
        if cfg.auto_parallel and self._auto_plan is None:
            self._plan_parallel(leaves, spec, device, link)
        ir, pipe = self._passed(self._lay_out(leaves, spec), spec)
        if pipe is not None:
            return cost_model.predict_pipeline(ir, *pipe, cfg.pipeline_schedule, params, k, dev,
                                               cfg.auto_parallel_ratio, cfg.auto_parallel_wait_s, link,
                                               memory=cfg.pipeline_memory, zero=cfg.zero)
        return cost_model.predict(ir, params, k, dev, cfg.auto_parallel_ratio, cfg.auto_parallel_wait_s, link,
                                  zero=cfg.zero)

    def _lay_out(self, leaves: list, spec) -> list:
        """The inputs as the auto-parallel plan lays them out (planning first if it is due): with
        ``enable_auto_parallel_ignore_user_sbp_config`` the plan may choose an input's SBP too
        (a broadcast batch split for data parallelism: a local slice); the caller's tensors keep
        theirs."""
        if self.config.auto_parallel and self._auto_plan is None:
            self._plan_parallel(leaves, spec)
        if not self._feed_sbp:
            return leaves
        return [x.to_global(sbp=list(self._feed_sbp[i]))
                if i in self._feed_sbp and isinstance(x, Tensor) and x._global is not None
                and x._global.sbp != self._feed_sbp[i] else x for i, x in enumerate(leaves)]

    def _plan_parallel(self, leaves: list, spec, device=None, link=None) -> None:
        """``config.enable_auto_parallel``: the parameters' SBP chosen by the cost model before the
        first compile (graph/auto_parallel.py), each candidate traced and passed, then applied; with
        pipeline stages each stage's on its own mesh, the schedule and the micro-batch count unless
        the user set them, and with ``enable_auto_parallel_stage_cuts`` where the stack's cuts fall."""
        from . import auto_parallel
        from .passes.checkpointing import flagged_paths
        cfg = self.config
        names = self._state_names()
        params = {names.get(id(p), f"param{i}"): p for i, p in enumerate(self._all_params())}
        feeds = {f"input{i}": x for i, x in enumerate(leaves) if isinstance(x, Tensor) and x._global is not None}

        def trace():
            return self._passed(leaves, spec)
        limit = cfg.auto_memory_limit
        dev = self._device(leaves)
        if limit is None and dev is not None and dev.type == "cuda":
            limit = torch.cuda.get_device_properties(dev).total_memory
        settings = []
        if cfg.auto_memory == "HeavyMemoryDown" or limit is not None:   # memory may decide: blocks'
            self._act_vars = self._block_outputs(leaves, spec)           # outputs are variables too,
            settings = auto_parallel.memory_settings(                    # ZeRO and recomputation
                cfg, [] if flagged_paths(self) else [path for path, m in self._repeated_blocks()
                                                      if next(m.children(), None) is not None])
        schedule = auto_parallel.schedule_setting(cfg)
        micro = auto_parallel.micro_batch_setting(cfg, self._micro_batch_options(leaves, spec, params))
        cuts = self._stage_cuts()
        chosen = auto_parallel.plan(trace, params, [o for o, _ in self._optimizers],
                                    ignore_user_sbp=cfg.auto_parallel_ignore_user_sbp, memory_mode=cfg.auto_memory,
                                    limit=limit, ratio=cfg.auto_parallel_ratio, wait_s=cfg.auto_parallel_wait_s,
                                    calibrate=cfg.auto_parallel_calibrate, device=device, link=link, feeds=feeds,
                                    activations=self._act_vars, settings=settings, zero=lambda: cfg.zero,
                                    schedule=schedule, pipeline=lambda: (cfg.pipeline_schedule, cfg.pipeline_memory),
                                    micro=micro, cuts=cuts)
        auto_parallel.apply(chosen, params)
        if cuts is not None:
            self._apply_cuts(chosen.choices[cuts.name][1])
        for setting in (*settings, *(s for s in (schedule, micro) if s is not None)):
            if setting.name in chosen.choices:
                setting.set(chosen.choices[setting.name][1])
        cfg.grad_acc_steps_planned = micro is not None and cfg.grad_acc_steps > 1
        if self._micro_refusal is not None:
            chosen.kept["micro-batches"] = f"1, {self._micro_refusal}"
        if self._cuts_refusal is not None:
            chosen.kept["stage cuts"] = f"the user's, {self._cuts_refusal}"
        for path, var in list(self._act_vars.items()):   # the chosen block outputs stay boxed
            before, after = chosen.choices[f"{path} (output)"]
            var.chosen = after if after != before else None
            if var.chosen is None:
                del self._act_vars[path]
        if limit is not None and chosen.chosen.memory_bytes > limit:
            LOG.warning(f"holoflow.nn.Graph {type(self).__name__}: enable_auto_parallel found no layout within the "
                        f"memory limit of {limit / 2**20:.1f} MiB per rank; the least memory it found is "
                        f"{chosen.chosen.memory_bytes / 2**20:.1f} MiB ({chosen.chosen.state_bytes / 2**20:.1f} of "
                        f"parameters and optimizer state), kept"
                        + (f" (it tried {' and '.join(s.name for s in settings)} too)" if settings else "")
                        + ". To fit: "
                        + ("enable_zero(True, stage=3) (shards what stays data parallel), " if
                           not any(s.name == "ZeRO" for s in settings) and (cfg.zero is None or cfg.zero.stage < 3)
                           else "")
                        + ("activation checkpointing, " if not any(s.name != "ZeRO" for s in settings) else "")
                        + "a smaller batch per rank, or more ranks")
        self._feed_sbp = {int(name[len("input"):]): after for name, (before, after) in chosen.choices.items()
                          if name in feeds and before != after}
        self._auto_plan = chosen
        if self._debug >= 1:
            print(chosen)

    def _micro_batch_options(self, leaves: list, spec, params: dict) -> list[int]:
        """The micro-batch counts the planner may choose for a graph with pipeline stages the user
        placed and no count set (else ``[1]``): the user's 1, then each divisor ``k`` of the batch
        (at most 4 per stage) that splits every input evenly on each rank, where the whole batch's
        trace says the micro-batches train alike (``auto_parallel.micro_batch_refusal``: the loss a
        mean over rows each row gives alone, the outputs such rows or means, no state written from
        the batch) and the trace on one of ``k`` micro-batches is that program on 1/k of the rows
        (``same_on_rows``). Why it kept 1 is ``_micro_refusal``; the outputs returned as the
        micro-batches' mean are ``_micro_averaged``."""
        from . import auto_parallel
        from .passes.stages import phases
        cfg = self.config
        self._micro_refusal, self._micro_averaged = None, frozenset()
        stages = pipeline.resolve_stages(self)
        if stages is None or cfg.grad_acc_steps_set or cfg.grad_acc_steps != 1:
            return [1]
        rows = [x for x in leaves if isinstance(x, Tensor)]
        n = min((x.shape[0] for x in rows if x.dim() > 0), default=0)
        ks = []
        for k in range(2, min(4 * len(stages.placements), n) + 1):
            try:
                if all(x.dim() > 0 and x.shape[0] % k == 0 for x in rows):
                    pipeline.micro_protos(leaves, k)
                    pipeline.batch_blocks(leaves, k)
                    ks.append(k)
            except HoloflowError:
                pass
        if not ks:
            self._micro_refusal = f"no count from 2 to {min(4 * len(stages.placements), n)} splits every input evenly"
            return [1]
        keep = {p: p._global.sbp for p in params.values() if p._global is not None}
        with auto_parallel._Override(keep):   # (a trace under ZeRO-3 re-lays the parameters)
            ir, _ = self._passed(leaves, spec)
            tags = auto_parallel.row_tags(ir, phases(ir))
            why, averaged = auto_parallel.micro_batch_refusal(ir, self._losses, tags)
            if why is not None:
                self._micro_refusal = why
                return [1]
            ok = [1]
            try:
                for k in ks:
                    cfg.grad_acc_steps = k
                    try:
                        micro_ir, _ = self._passed(leaves, spec)
                    except Exception:   # (build refuses that micro-batch: a shape fixed in it)
                        continue
                    if auto_parallel.same_on_rows(ir, micro_ir, k, tags):
                        ok.append(k)
            finally:
                cfg.grad_acc_steps = 1
        if len(ok) == 1:
            self._micro_refusal = f"build() on a micro-batch is no row-wise share of it on the whole batch (tried {ks})"
        self._micro_averaged = averaged
        return ok

    def _staged_stack(self, stages) -> tuple | str:
        """The stack whose blocks' cuts the planner may move: consecutive children of one
        ``ModuleList`` / ``Sequential``, of one class, each given its own stage (none inherited)
        in order along the stack, spanning the most stages; ``(blocks [(path, module)], their
        stage ids)``, or why there is none."""
        by: dict = {}
        for path, m in self._repeated_blocks():
            by.setdefault((path.rsplit(".", 1)[0], type(m)), []).append((path, m))
        best, why = None, "no stack of repeated blocks (a ModuleList or Sequential of one class) has a stage set " \
                          "on each of its blocks"
        for (parent, _), blocks in by.items():
            names = [name for name, _ in pipeline.graph_module_at(self, parent).named_children()]
            at = [names.index(path.rsplit(".", 1)[1]) for path, _ in blocks]
            inherited = any(path.startswith(a + ".") for path, _ in blocks for a in stages.by_path)
            if any(path not in stages.by_path for path, _ in blocks) or inherited:
                continue
            sids = [stages.by_path[path] for path, _ in blocks]
            if at != list(range(at[0], at[0] + len(at))) or sids != sorted(sids) \
                    or sorted(set(sids)) != list(range(sids[0], sids[-1] + 1)):
                why = f"the blocks of {parent!r} are on stages {sids}, not in order along consecutive blocks"
                continue
            if len(set(sids)) > 1 and (best is None or len(set(sids)) > len(set(best[1]))):
                best = (blocks, sids)
        if best is None and why.startswith("no stack"):
            return why
        return best if best is not None else why

    def _stage_cuts(self):
        """``config.enable_auto_parallel_stage_cuts``: where the stages' cuts fall in the staged
        stack (``_staged_stack``) as a planner variable (``auto_parallel.Setting`` of
        ``auto_parallel.Cuts``), or None (why: ``_cuts_refusal``). Setting cuts for a trace puts each
        moved block on its new stage and lays its parameters and buffers out on that placement as
        uninitialized shards (the parameters restored by the planner's override, the buffers and
        stages here when the user's cuts come back)."""
        from bisect import bisect_right
        from dataclasses import replace
        from ..distributed import world
        from ..distributed.sharding import local_shape
        from . import auto_parallel
        self._cuts_refusal = None
        if not self.config.auto_parallel_stage_cuts:
            return None
        stages = pipeline.resolve_stages(self)
        found = self._staged_stack(stages) if stages is not None else "the graph has no pipeline stages (set_stage)"
        if isinstance(found, str):
            self._cuts_refusal = found
            return None
        blocks, sids = found
        places = stages.placements
        if len({places[s].hierarchy for s in sids}) > 1:
            self._cuts_refusal = (f"the stack's stages have meshes of different shapes "
                                  f"({', '.join(str(places[s].hierarchy) for s in sorted(set(sids)))}), so a block's "
                                  f"layouts would not carry over")
            return None
        user = auto_parallel.Cuts([i for i in range(1, len(sids)) if sids[i] != sids[i - 1]], len(sids))
        rank = world.rank()
        held: dict = {}   # moved block index -> (its own stage setting, its buffers' (tensor, data, meta))

        def put(cuts) -> None:
            for i, (_, m) in enumerate(blocks):
                sid = sids[0] + bisect_right(cuts, i)
                if sid == sids[i]:
                    if i in held:
                        old, bufs = held.pop(i)
                        pipeline.swap_stage(m, old)
                        for t, data, g in bufs:
                            t._data, t._global = data, g
                    continue
                place = places[sid]
                was = pipeline.swap_stage(m, (sid, place))
                if i not in held:
                    held[i] = (was, [(b, b._data, b._global) for b in m.buffers() if b._global is not None])
                for t in (*m.parameters(), *m.buffers()):
                    g = t._global
                    if g is None or g.placement == place:
                        continue
                    shape = local_shape(g.shape, g.sbp, place, rank) if rank in place.flat_ranks else (0,)
                    t._data = torch.empty(shape, dtype=t._data.dtype, device=t._data.device)
                    t._global = replace(g, placement=place)
        self._cut_blocks = (blocks, sids, places)
        return auto_parallel.Setting("stage cuts", tuple(auto_parallel.cut_options(user)), put)

    def _apply_cuts(self, cuts) -> None:
        """The chosen cuts for good: each moved block on its new stage, its parameters, buffers and
        optimizer state moved to that placement (every rank in the same order), ``.grad`` dropped."""
        from bisect import bisect_right
        blocks, sids, places = self._cut_blocks
        state = [o.state for o, _ in self._optimizers]
        for i, (_, m) in enumerate(blocks):
            sid = sids[0] + bisect_right(cuts, i)
            if sid == sids[i]:
                continue
            place = places[sid]
            pipeline.swap_stage(m, (sid, place))
            for t in (*m.parameters(), *m.buffers()):
                if t._global is None:
                    continue
                for st in state:
                    for k, v in st.get(t, {}).items():
                        if isinstance(v, Tensor) and v._global is not None and v._global.placement != place:
                            st[t][k] = v.to_global(placement=place, sbp=list(v._global.sbp))
                moved = t.detach().to_global(placement=place, sbp=list(t._global.sbp))
                t._data, t._global = moved._data, moved._global
                t.grad = None

    def _trace(self, leaves: list, spec) -> tuple:
        """As the compile's, recording the losses ``backward()`` is called on (``_losses``: their
        values and whether a gradient was given) for the micro-batch planner."""
        self._losses = []
        return super()._trace(leaves, spec)

    def _backward_rule(self, scale, tracer=None, micro: int = 1):
        rule = super()._backward_rule(scale, tracer, micro)
        if tracer is None or not self.config.auto_parallel:
            return rule

        def recorded(tensors: list, grads: list, run) -> None:
            self._losses.append((tracer.value_of(tensors[0]) if len(tensors) == 1 else None,
                                 any(g is not None for g in grads)))
            rule(tensors, grads, run)
        return recorded

    def _compile(self, leaves: list, spec):
        """As the compile's; a batch that does not split into the micro-batches the planner chose
        (a last, smaller batch of an epoch) is compiled as the user's program, one micro-batch,
        where it would have been refused."""
        cfg = self.config
        m = cfg.grad_acc_steps
        if not cfg.grad_acc_steps_planned:
            return super()._compile(leaves, spec)
        try:
            pipeline.micro_protos(leaves, m)
            pipeline.batch_blocks(leaves, m)
            splits = True
        except HoloflowError:
            splits = False
        if splits:
            return super()._compile(leaves, spec)
        LOG.info(f"holoflow.nn.Graph {type(self).__name__}: this batch does not split into the {m} micro-batches "
                 f"auto-parallel chose; it runs as one")
        cfg.grad_acc_steps = 1
        try:
            return super()._compile(leaves, spec)
        finally:
            cfg.grad_acc_steps = m

    def _compile_pipeline(self, ir, cfg, log: list, stages, m: int, t0: float, mark: int):
        """As the compile's; micro-batches the planner chose keep the outputs one batch's (a mean
        output averaged over the micro-batches, the rows in order)."""
        c = super()._compile_pipeline(ir, cfg, log, stages, m, t0, mark)
        if self.config.grad_acc_steps_planned:
            c.one_batch, c.averaged = True, self._micro_averaged
        return c

    def _block_outputs(self, leaves: list, spec) -> dict:
        """The outputs of the stacks' blocks that are global tensors: one trace with recording
        hooks, each an ``auto_parallel.Activation`` at the layout the block gives it."""
        from .auto_parallel import Activation
        seen: dict = {}

        def record(path: str):
            def hook(mod, inp, out) -> None:
                seen.setdefault(path, out)
            return hook
        handles = [m.register_forward_hook(record(path)) for path, m in self._repeated_blocks()]
        try:
            self._passed(leaves, spec)
        finally:
            for h in handles:
                h.remove()
        return {p: Activation(p, t) for p, t in seen.items()
                if isinstance(t, Tensor) and t._global is not None and t.dim() > 0}

    def _passed(self, leaves: list, spec) -> tuple:
        """``build`` traced on ``leaves`` and passed as a compile passes it: (the logical graph,
        None), or for pipeline stages / micro-batches of global tensors (the logical graph traced
        on one micro-batch, (the stages' placements, micro-batches))."""
        from .passes.checkpointing import flagged_paths
        ir, _, stages, m, piped, mark = self._trace(leaves, spec)
        cfg = self.config.for_passes(flagged_paths(self))
        cfg.global_graph = is_global(ir)
        if piped or any(is_move(n) for n in ir.nodes):
            ir, placements = self._pipeline_logical(ir, cfg, [], mark, stages)
            return ir, (placements, m)
        return passes.run(ir, cfg, []), None

"""The per-rank plan of a pipelined graph and its runner (docs/architecture.md, "Pipeline stages
and schedules"): forward / backward (/ weight-gradient) tasks on ``compute``, send and receive
tasks per stage boundary on ``comm.*``, the update task; point-to-point transfers between stages.
Stages and micro-batches themselves are graph/pipeline.py."""
from __future__ import annotations

import datetime
import queue
import threading
import weakref
from collections import deque
from typing import Any

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError, UnsupportedError
from ..core.tensor import Tensor
from ..distributed.global_tensor import make_global
from ..distributed.sharding import local_shape, nd_str
from ..runtime import Plan, Runtime, TaskSpec
from ..runtime.timeline import write_merged
from .global_graph import localize
from ..ops.conversion import CLONE
from .ir import IRGraph, Node, Task, Value, _Gen, program, wire_tasks
from .optimizer import rank_sum
from .passes.stages import (check_stages, phases, rank_graph, split_weight_grads, split_weight_grads_within,
                            undo_clobbering, work)
from .pipeline import batch_blocks, pack, row_blocks, split_local, splits_rows


def _check_step_outputs(g: IRGraph, ph: dict, m: int) -> None:
    """Refuses an output computed once per step after backward (phase ``U``: clip_grad_norm_'s
    total norm, read from the micro-batches' summed gradients): micro-batches and stages run the
    forward and backward as iterations and return their values per micro-batch, and the update
    program exports nothing."""
    made = {v: n for n in g.nodes for v in n.outputs}
    for i, o in enumerate(g.outputs):
        n = made.get(o) if isinstance(o, Value) else None
        if n is not None and ph.get(id(n)) == "U":
            raise UnsupportedError(
                f"holoflow.nn.Graph: output {i} of build() (computed at {n.source or '?'} by {n.op!r}) is "
                f"computed after loss.backward() from the step's gradients, once per step; with "
                f"{'gradient accumulation (m=' + str(m) + ')' if m > 1 else 'pipeline stages'} the graph returns "
                f"values of the micro-batches' forward and backward only. Return the losses or activations, "
                f"and compute gradient statistics (clip_grad_norm_'s total norm) in a graph without micro-batches "
                f"or stages, or read them in an optimizer step hook")


# -- point to point between stage ranks ------------------------------------------------------------------

_MAIL: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()
P2P_TIMEOUT = 120.0


def _mailbox(comm: Any, key: tuple) -> queue.Queue:
    boxes = _MAIL.setdefault(comm, {})
    q = boxes.get(key)
    if q is None:
        q = boxes.setdefault(key, queue.Queue())
    return q


def p2p_send(comm: Any, t: torch.Tensor, src: int, dst: int, channel: int) -> None:
    """Sends ``t`` to rank ``dst`` on ``channel`` (simulated ranks: a queue; real worlds: a tagged
    torch.distributed send)."""
    if hasattr(comm, "_exchange"):       # simulated ranks share the process
        _mailbox(comm, (src, dst, channel)).put(t.clone())
        return
    work = dist.isend(t.contiguous(), dst, tag=channel)
    try:
        work.wait(datetime.timedelta(seconds=P2P_TIMEOUT))
    except Exception as e:
        raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {src} could not send to rank {dst} "
                            f"(channel {channel}) within {P2P_TIMEOUT}s: {e}") from e


def p2p_recv(comm: Any, shape: tuple, dtype: torch.dtype, device: Any, src: int, dst: int,
             channel: int) -> torch.Tensor:
    if hasattr(comm, "_exchange"):
        try:
            return _mailbox(comm, (src, dst, channel)).get(timeout=P2P_TIMEOUT)
        except queue.Empty:
            raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {dst} waited {P2P_TIMEOUT}s for rank {src} "
                                f"(channel {channel}); the sending stage did not run") from None
    buf = torch.empty(shape, dtype=dtype, device=device)
    work = dist.irecv(buf, src, tag=channel)
    try:
        work.wait(datetime.timedelta(seconds=P2P_TIMEOUT))
    except Exception as e:
        raise HoloflowError(f"holoflow.nn.Graph pipeline: rank {dst} waited {P2P_TIMEOUT}s for rank {src} "
                            f"(channel {channel}): {e}") from e
    return buf


# -- the per-rank plan and its runner ----------------------------------------------------------------------

def window(schedule: str, stage: int, p: int, m: int) -> int:
    """Micro-batches a stage may hold in flight (the forward task's register_num)."""
    if schedule == "gpipe":
        return m
    return max(1, min(m, p - stage))


class _Lowered:
    def __init__(self, tasks: list) -> None:
        self.tasks = tasks


class _Source:
    def __init__(self, source: str) -> None:
        self.source = source


class PipelineCompiled:
    """One rank's pipelined plan of a graph (what ``Graph._compile`` returns when stages or
    micro-batches are set on a global graph); the interface of ``lower.Compiled``."""

    written_inputs: tuple = ()   # inputs written by build are refused for pipelines (graph_compile.py)
    # micro-batches the auto-parallel planner chose: outputs keep one batch's shape, those in
    # ``averaged`` (means over the batch's rows) the micro-batches' mean (graph_auto_parallel.py)
    one_batch: bool = False
    averaged: frozenset = frozenset()

    def __init__(self, logical, placements: list, m: int, schedule: str, *, rank: int, comm: Any,
                 passes_log: list, compile_s: float, profile: bool = False, memory: str | None = None,
                 seed: int = 0) -> None:
        self.ir = self.logical = logical
        self.placements, self.m, self.schedule, self.memory = placements, m, schedule, memory
        self.p, self.rank, self.comm, self.seed = len(placements), rank, comm, seed
        self.passes_log, self.compile_s, self.profile = passes_log, compile_s, profile
        self.kind, self.iterations, self.peak_bytes = "actor", 0, 0
        self.stage = next((i for i, pl in enumerate(placements) if rank in pl.flat_ranks), None)
        self.zb_delay: int | None = None   # zb-h1: weight gradients this stage lets wait
        self.zb_bytes: tuple[int, int] | None = None   # zb-h1: per micro-batch, (F-to-B, B-to-W) bytes
        # zb-h1: the share of the weight gradients' estimated work (`stages.work`) that waits
        # (1.0; under memory="1f1b" what fits, the rest runs with the input gradients)
        self.zb_w_share: float | None = None
        self.mem = {"in_flight": 0, "peak_in_flight": 0, "bytes": 0, "peak_bytes": 0,
                    "w_waiting": 0, "peak_w_waiting": 0, "w_bytes": 0, "peak_w_bytes": 0}
        self.runtime, self._out_names, self._state_outs = None, {}, {}
        ph = phases(logical)
        check_stages(logical, placements, ph)
        _check_step_outputs(logical, ph, m)
        # a grad scaler's inf/nan count, summed over every stage's ranks (once per step by each)
        every = tuple(sorted({r for p in placements for r in p.flat_ranks}))
        self.rg = rank_graph(logical, placements, ph, rank, _UMoves(comm, rank), rank_sum(every, rank, comm))
        self.lowered, self.program = _Lowered([]), _Source("# this rank holds no pipeline stage\n")
        if self.rg is not None:
            self._build()

    # -- building ------------------------------------------------------------------------------------
    def _build(self) -> None:
        rg, g = self.rg, self.rg.graph
        ph = rg.phase
        prod_phase = {v: ph[id(n)] for n in g.nodes for v in n.outputs}
        early = set(g.feeds) | {v for v, p in prod_phase.items() if p != "U"}
        state = {v for v, _ in g.state}
        u_nodes = [n for n in g.nodes if ph[id(n)] == "U"]
        acc_sum = list(dict.fromkeys(v for n in u_nodes for v in n.value_inputs() if v in early and v not in state))
        # state written back from the forward (BatchNorm's running statistics) is written after
        # each micro-batch's forward, which the next one reads: m momentum updates, as eager
        # gradient accumulation (and OneFlow) gives; other written state keeps the last value
        f_upd = [(t, v) for t, v in g.updates if prod_phase.get(v) == "F" and v not in acc_sum]
        acc_last = [v for _, v in g.updates if v in early and v not in acc_sum and v not in {fv for _, fv in f_upd}]
        sends = [v for vs in rg.send.values() for v in vs]
        # an output that is state (``return self.w``) is no micro-batch's value: read live after
        # the step, as a graph without micro-batches reads it
        self._state_outs = {i: t for i, o in enumerate(self.logical.outputs) for v, t in g.state if o is v}
        outs = [o for o in g.outputs if isinstance(o, Value) and o not in state]
        exports = list(dict.fromkeys([*outs, *sends, *acc_sum, *acc_last, *(v for _, v in f_upd)]))
        loc = localize(g.with_(outputs=tuple(exports)), self.rank, self.comm, self.seed)
        lph = {id(ln): ph[id(n)] for n, ln in zip(g.nodes, loc.nodes)}
        L = dict(zip(g.feeds, loc.feeds))
        L.update(zip(exports, loc.outputs))
        fb = IRGraph(loc.feeds, loc.state, tuple(n for n in loc.nodes if lph[id(n)] != "U"),
                     tuple(L[v] for v in exports), ())
        tasks = [Task(name, "compute", [n for n in fb.nodes if lph[id(n)] == k]) for name, k in
                 (("fwd", "F"), ("bwd", "B"))]
        # each micro-batch's forward runs whole before its backward: no in-place forward write
        # over a buffer the backward still reads (passes ordered them otherwise)
        fwd_nodes = undo_clobbering(tasks[0].nodes, tasks[1].nodes)
        if any(a is not b for a, b in zip(fwd_nodes, tasks[0].nodes)):
            swap = {id(a): b for a, b in zip(tasks[0].nodes, fwd_nodes)}
            tasks[0].nodes = fwd_nodes
            lph.update({id(b): "F" for b in fwd_nodes})
            fb = fb.with_(nodes=tuple(swap.get(id(n), n) for n in fb.nodes))
        fb = _backward_reads_forward_state(fb, tasks, lph, {id(t) for t, _ in f_upd})
        wt = None
        if self.schedule == "zb-h1" and not acc_last:   # weight gradients split off the backward
            keep = {L[v] for v in [*outs, *sends]} | {v for n in fb.nodes if lph[id(n)] == "F" for v in n.outputs}
            if self.memory == "1f1b" and self.stage > 0:
                # at 1F1B's memory: a waiting W holds at most one micro-batch's activations
                loc_state = {v for v, _ in loc.state}
                first, later = split_weight_grads_within(tasks[1].nodes, keep, _act_bytes(tasks, loc_state),
                                                         loc_state)
                full = split_weight_grads(tasks[1].nodes, keep)[1]
                total = sum(work(n) for n in full)
                self.zb_w_share = sum(work(n) for n in later) / total if total else 1.0
            else:
                first, later = split_weight_grads(tasks[1].nodes, keep)
                self.zb_w_share = 1.0
            if later:   # ``first`` may be empty: the first stage sends no input gradient
                tasks[1].nodes = first
                wt = Task("wgrad", "compute", later)
                tasks.append(wt)
        tasks = [t for t in tasks if t.nodes]
        wire_tasks(tasks, fb, {L[v] for v in exports})
        gen = _Gen(fb, self.profile)
        gen.tasks = tasks
        prog = gen.build()
        ns = prog.load()
        name = prog.name
        sources = [prog.source]
        lock, fifo, mem = threading.Lock(), deque(), self.mem
        w = window(self.schedule, self.stage, self.p, self.m)
        specs = []
        by = {t.name.rstrip("_0123456789"): t for t in tasks}
        ft, bt = by.get("fwd"), by.get("bwd")
        if bt is None and wt is not None:   # a backward that only hands its inputs on to the weight gradients
            bt = Task("bwd", "compute", [])
        b_fn = ns[bt.name] if bt is not None and bt.nodes else (lambda *a: ())
        wneed = set(wt.inputs) if wt is not None else set()
        need = (set(bt.inputs) | wneed) if bt is not None else set()   # what backward / weight grads read
        saved = [i for i, v in enumerate(ft.outputs) if v in need] if ft else []
        kept = [i for i, v in enumerate(ft.inputs) if v in need] if ft else []
        saved_w = [i for i in saved if ft.outputs[i] in wneed]
        kept_w = [i for i in kept if ft.inputs[i] in wneed]

        link = ft is not None and bt is not None   # F -> B: the slot that bounds micro-batches in flight

        f_written = [(t, ft.outputs.index(L[v])) for t, v in f_upd] if ft else []

        def fwd(*args, _f=ns[ft.name] if ft else None):
            out = _f(*args)
            for t, i in f_written:
                t._data.copy_(out[i])
            # activation bytes this micro-batch keeps for backward: made here or received (or fed)
            nb = _nbytes([*(out[i] for i in saved), *(args[i] for i in kept)])
            nbw = _nbytes([*(out[i] for i in saved_w), *(args[i] for i in kept_w)])   # kept until W
            if link:
                with lock:
                    fifo.append((nb, nbw))
                    mem["in_flight"] += 1
                    mem["bytes"] += nb
                    mem["peak_in_flight"] = max(mem["peak_in_flight"], mem["in_flight"])
                    mem["peak_bytes"] = max(mem["peak_bytes"], mem["bytes"])
            return (*out, None) if link else out

        # zero bubble: the backward relays every input of the weight gradients it does not make
        # itself (forward values, received activations and gradients, feeds), so the forward's and
        # the receivers' slots come back when the backward acts, not when the deferred W does
        b_made = set(bt.outputs) if bt is not None else set()
        relay = [v for v in wt.inputs if v not in b_made] if wt is not None else []
        b_ins = list(bt.inputs) if bt is not None else []
        b_all = b_ins + [v for v in relay if v not in set(b_ins)]
        pos = {v: i for i, v in enumerate(b_all)}
        r_idx = [pos[v] for v in relay]
        n_b = len(b_ins)
        fvals = set(ft.outputs) | set(ft.inputs) if ft else set()
        w_in = [pos[v] for v in relay if v not in fvals]
        w_out = [i for i, v in enumerate(bt.outputs) if v in wneed] if wt is not None else []
        wfifo: deque = deque()
        # ZB-H1 at 1F1B's memory: the bytes a micro-batch holds from F to B, and from B to W
        self.zb_delay = None
        if wt is not None:
            act = sum(v.nbytes for v in [*(ft.outputs[i] for i in saved), *(ft.inputs[i] for i in kept)]) if ft else 0
            held = sum(v.nbytes for v in [*(ft.outputs[i] for i in saved_w), *(ft.inputs[i] for i in kept_w),
                                           *(b_all[i] for i in w_in), *(bt.outputs[i] for i in w_out)])
            self.zb_delay = zb_delay(self.stage, act, held) if self.memory == "1f1b" else None
            self.zb_bytes = (act, held)

        def bwd(*args, _f=b_fn):
            out = _f(*args[:n_b])
            with lock:
                mem["in_flight"] -= 1
                nb, nbw = fifo.popleft()
                mem["bytes"] -= nb - nbw
                if wt is not None:
                    extra = _nbytes([*(args[i] for i in w_in), *(out[i] for i in w_out)])
                    wfifo.append(nbw + extra)
                    mem["bytes"] += extra
                    mem["w_waiting"] += 1
                    mem["w_bytes"] += nbw + extra
                    mem["peak_w_waiting"] = max(mem["peak_w_waiting"], mem["w_waiting"])
                    mem["peak_w_bytes"] = max(mem["peak_w_bytes"], mem["w_bytes"])
                    mem["peak_bytes"] = max(mem["peak_bytes"], mem["bytes"])
            return (*out, *(args[i] for i in r_idx)) if relay else out
        if wt is not None:
            # stage s lets s + 1 micro-batches' weight gradients wait (the backward's register
            # count); the order of F, B and W is ZB-H1's (act_order), kept by turns below
            wfn = _wgrad_fn(ns[wt.name], self.m, len(wt.outputs), mem, lock, wfifo)
            specs.append(TaskSpec(wt.name, "compute", wfn,
                                  tuple(name(v) + ("@w" if v in relay else "") for v in wt.inputs),
                                  tuple(name(v) for v in wt.outputs), register_num=2, source=wt.source or None,
                                  meta={"nodes": len(wt.nodes), "phase": "W"}))
        token = (f"{ft.name}_done",) if link else ()
        brn = self.stage + 1 if wt is not None else 2
        for t, fn, rn, ins, outs in ((ft, fwd, w, (), token), (bt, bwd, brn, token, ())):
            if t is not None:
                vin = b_all if t is bt else t.inputs
                extra_out = tuple(name(v) + "@w" for v in relay) if t is bt else ()
                specs.append(TaskSpec(t.name, "compute", fn, tuple(name(v) for v in vin) + ins,
                                      tuple(name(v) for v in t.outputs) + extra_out + outs, register_num=rn,
                                      source=t.source or None,
                                      meta={"nodes": len(t.nodes), "phase": "F" if t is ft else "B"}))
        mine = self.placements[self.stage]
        for key, vals in rg.recv.items():
            peer = self.placements[key[1]].flat_ranks[mine.flat_ranks.index(self.rank)]
            lv = [L[v] for v in vals]
            specs.append(TaskSpec(f"recv_{key[0]}{key[1]}{key[2]}", f"comm.recv_{key[0]}",
                                  _recv_fn(self.comm, lv, peer, self.rank, _tag(key)), (),
                                  tuple(name(v) for v in lv), register_num=w + 1,
                                  meta={"phase": key[0], "peer": peer}))   # backward reads received activations
        for key, vals in rg.send.items():
            peer = self.placements[key[2]].flat_ranks[mine.flat_ranks.index(self.rank)]
            lv = [L[v] for v in vals]
            specs.append(TaskSpec(f"send_{key[0]}{key[1]}{key[2]}", f"comm.send_{key[0]}",
                                  _send_fn(self.comm, peer, self.rank, _tag(key)), tuple(name(v) for v in lv), (),
                                  meta={"phase": key[0], "peer": peer}))
        u_local = [n for n in loc.nodes if lph[id(n)] == "U"]
        u_updates = tuple((t, v) for t, v in loc.updates if v not in {L[fv] for _, fv in f_upd})
        if u_local or acc_sum or acc_last or u_updates:
            ins = tuple(L[v] for v in [*acc_sum, *acc_last])
            uprog = program(IRGraph(ins, loc.state, tuple(u_local), (), u_updates))
            sources.append(uprog.source)
            entry = uprog.load()["program"]
            w_made = {name(v) for v in wt.outputs} if wt is not None else set()
            owned = frozenset(i for i, v in enumerate(ins[:len(acc_sum)]) if name(v) in w_made)
            specs.append(TaskSpec("update", "update", _acc_fn(entry, self.m, len(acc_sum), owned, ins),
                                  tuple(name(v) for v in ins), (), meta={"phase": "U"}))
        self._feed_names = [name(loc.feeds[j]) for j in range(len(rg.feeds))]
        self._out_names = {i: name(L[self.logical.outputs[i]]) for i in rg.outputs if i not in self._state_outs}
        plan = Plan(tuple(specs), inputs=tuple(self._feed_names),
                    outputs=tuple(dict.fromkeys(self._out_names.values())),
                    input_register_num=max(2, self.m))
        self.lowered, self.program = _Lowered(specs), _Source("\n\n".join(sources))
        self.plan = plan
        self.runtime = Runtime(plan, trace=True)
        # a stage of several ranks (TP / DP inside it) may run collectives in its forward, backward
        # and weight-gradient acts: those acts run in one fixed order on all its ranks
        self.turns = None
        if len(mine.flat_ranks) > 1 or wt is not None:
            kinds = {"F": ft, "B": bt, "W": wt}
            seq = [kinds[k].name for k, _ in stage_order(self.schedule, self.stage, self.p, self.m, wt is not None,
                                                         self.zb_delay) if kinds[k] is not None]
            self.turns = _wire_turns(self.runtime, seq)

    # -- running ------------------------------------------------------------------------------------
    def feeds(self, leaves: list) -> list:
        return [x for x in leaves if isinstance(x, Tensor)]

    def run(self, leaves: list) -> list:
        m = self.m
        got: list = []
        blocks = batch_blocks(leaves, m) if m > 1 else None
        if blocks is not None:
            self._check_outputs(blocks)
        if self.runtime is not None:
            pieces = [split_local(leaves[i], m, blocks, i) for i in self.rg.feeds]
            feeds = [{n: p[k] for n, p in zip(self._feed_names, pieces)} for k in range(m)]
            tl = self.runtime.timeline
            if tl is not None and sum(len(v) for v in tl._per_stream.values()) > 50_000:
                tl.clear()
            got = self.runtime.run(feeds)
        self.iterations += 1
        res = []
        for i, o in enumerate(self.logical.outputs):
            if not isinstance(o, Value):
                res.append(o)
                continue
            mean = self.one_batch and i in self.averaged
            shape = tuple(o.shape) if m == 1 or mean else \
                ((m,) if not o.shape else (o.shape[0] * m,) + tuple(o.shape[1:]))
            if i in self._state_outs:
                t, shape = Tensor._make(self._state_outs[i]._data), tuple(o.shape)
            elif got and i in self._out_names:
                ps = [d[self._out_names[i]] for d in got]
                # rows put back where the batch's came from: a global output of a micro-batch's
                # length along dim 0 that is whole on every rank (others: pieces in order)
                batch = blocks is not None and o.placement is not None and bool(o.shape) and \
                    not splits_rows(o.sbp) and o.shape[0] in self._batch_rows()
                t = Tensor._make(ps[0] if m == 1 else torch.stack(ps).mean(0) if mean else
                                 pack(ps, not o.shape, blocks if batch else None))
            else:
                t = Tensor._make(torch.empty((0,), dtype=o.dtype, device=o.device))
            res.append(make_global(t, o.placement, o.sbp, torch.Size(shape)) if o.placement is not None else t)
        return res

    def _batch_rows(self) -> set:
        """Micro-batch lengths (dim 0) of the inputs split along dim 0."""
        return {v.shape[0] for v in self.logical.feeds if v.placement is not None and v.shape and splits_rows(v.sbp)}

    def _check_outputs(self, blocks: tuple) -> None:
        """Refuses, before anything runs, a non-scalar output split along dim 0 into other blocks
        of rows than the batch inputs (``blocks``, :func:`pipeline.batch_blocks`): each rank packs
        its shards of the micro-batches, which would put the output's rows out of order."""
        state = {v for v, _ in self.logical.state}   # (read live, not packed)
        for i, o in enumerate(self.logical.outputs):
            if not isinstance(o, Value) or not o.shape or o.placement is None or not splits_rows(o.sbp) \
                    or o in state:
                continue
            if row_blocks(tuple(o.shape), tuple(o.sbp), o.placement) != blocks:
                raise HoloflowError(
                    f"holoflow.nn.Graph: gradient accumulation (m={self.m}): output {i} (shape per micro-batch "
                    f"{tuple(o.shape)}, sbp {nd_str(o.sbp)} on {o.placement}) splits dim 0 into other blocks of "
                    f"rows than the batch inputs, so packing each rank's micro-batch shards would reorder its "
                    f"rows; return it with the batch inputs' dim-0 split or broadcast "
                    f"(out.to_global(sbp=...)) inside build()")

    def stream(self, feeds):
        for leaves in feeds:
            yield self.run(leaves)

    # -- what ran -----------------------------------------------------------------------------------
    def acts(self) -> list[dict]:
        """This rank's recorded acts with absolute times (perf_counter seconds), micro-batch ids."""
        if self.runtime is None or self.runtime.timeline is None:
            return []
        tl = self.runtime.timeline
        phase = {t.name: t.meta.get("phase", "") for t in self.plan.tasks}
        return [{"task": a.actor, "lane": a.stream, "phase": phase.get(a.actor, ""), "mb": a.iteration % self.m,
                 "step": a.iteration // self.m, "start": tl.t0 + a.start, "end": tl.t0 + a.end,
                 "rank": self.rank, "stage": self.stage} for a in tl.acts()]

    def write_trace(self, path: str) -> None:
        """Every rank's acts merged into one Perfetto trace (collective over the stages' ranks;
        the first of them writes ``path``)."""
        ranks = sorted({r for p in self.placements for r in p.flat_ranks})
        if self.rank not in ranks:   # a rank on no stage has nothing to add (and joins no gather)
            return
        parts = self.comm.all_gather_shapes(self.acts(), tuple(ranks)) if len(ranks) > 1 else [self.acts()]
        if self.rank == ranks[0]:
            write_merged(path, [a for part in parts for a in part])

    def profile_table(self) -> str:
        return self.runtime.trace_table() if self.runtime is not None else ""

    def close(self) -> None:
        if self.runtime is not None:
            self.runtime.close()


def act_order(w: int, m: int, wgrad: bool = False) -> list[tuple[str, int]]:
    """A stage's compute acts of one step in the order its schedule gives (window ``w``): ``w``
    forwards, then each backward (and its weight-gradient act) followed by the next forward —
    1F1B for ``w = p - stage``, GPipe for ``w = m``. The same list on every rank of the stage."""
    seq = [("F", k) for k in range(min(w, m))]
    for k in range(m):
        seq.append(("B", k))
        if wgrad:
            seq.append(("W", k))
        if k + w < m:
            seq.append(("F", k + w))
    return seq


def zb_delay(stage: int, act_bytes: int, w_bytes: int) -> int:
    """How many weight gradients stage ``stage`` lets wait in ZB-H1 so that it holds no more than
    1F1B's first stage, ``p`` micro-batches of activations: ``(p - s) * act + d * w <= p * act``,
    so ``d = floor(s * act / w)``, at most ``s`` (the paper's H1, reached when a micro-batch's
    weight-gradient inputs ``w`` are no larger than its activations ``act``: `_build` defers only
    the part of W that fits, so under ``memory="1f1b"`` this is ``s``)."""
    if w_bytes <= 0:
        return stage
    return min(stage, stage * act_bytes // w_bytes)


def stage_order(schedule: str, stage: int, p: int, m: int, wgrad: bool = False,
                delay: int | None = None) -> list[tuple[str, int]]:
    """The compute acts of ``stage`` in one step, in its schedule's order (``zb-h1`` with weight
    gradients split off: ``zb_h1_order`` with this stage's ``delay``; else ``act_order``)."""
    if schedule == "zb-h1" and wgrad:
        delays = [stage if delay is None else delay if s == stage else s for s in range(p)]
        return zb_h1_order(p, m, delays)[stage]
    return act_order(window(schedule, stage, p, m), m, wgrad)


def zb_h1_order(p: int, m: int, delays: list[int] | None = None) -> list[list[tuple[str, int]]]:
    """ZB-H1's act order on each of ``p`` stages (Qi et al. 2023, the handcrafted H1): stage ``i``
    runs 1F1B's warm-up (``p - 1 - i`` forwards), then per micro-batch F, B (input gradient) and —
    once more than ``i`` weight gradients wait — W; the W left at the end fill what would be the
    cool-down bubble. Every stage then holds at most ``p`` micro-batches between a forward and its
    weight gradient (1F1B's first stage holds ``p`` too): ``p - i`` between F and B (1F1B's
    window, their activations) and ``i`` more whose W waits (only W's inputs). With one time unit
    per F, B and W the bubble is (p-1)/(3m+p-1) of the step, a third of 1F1B's (p-1)/(m+p-1) for
    m >> p; on stage 0, which sends no input gradient, B only hands W its inputs and W runs right
    after it. Acts cannot be preempted, so the runtime keeps this order (``_Turns``) instead of
    starting a W in a gap that a B would arrive during.

    ``delays[i]`` (default ``i``) is how many weight gradients stage i lets wait: fewer keep its
    memory lower at the price of bubble (``zb_delay``)."""
    orders = []
    for i in range(p):
        d = i if delays is None else delays[i]
        warm = min(m, p - 1 - i)
        seq = [("F", k) for k in range(warm)]
        f, b, w = warm, 0, 0
        while b < m:
            if f < m:
                seq.append(("F", f))
                f += 1
            seq.append(("B", b))
            b += 1
            if b - w > d:
                seq.append(("W", w))
                w += 1
        seq += [("W", k) for k in range(w, m)]
        orders.append(seq)
    return orders


def simulate_schedule(orders: list[list[tuple[str, int]]], durations: list[dict],
                      latency: float = 0.0, per_act: dict | None = None) -> tuple[float, list[float]]:
    """One step of a pipeline schedule as an event simulation: stage ``s`` runs the acts of
    ``orders[s]`` (``(kind, micro-batch)``, kind ``F``, ``B`` or ``W``) one after another, each
    taking ``durations[s][kind]`` and starting when its stage is free and its inputs are there:
    ``F k`` after the previous stage's ``F k``, ``B k`` after the next stage's ``B k`` (the last
    stage's after its own ``F k``), ``W k`` after its stage's ``B k``; ``latency`` is added to
    each move between stages. Returns the makespan (from the first act's start at 0 to the last
    act's end) and each stage's idle fraction of it, ``1 - busy / makespan`` — what
    `runtime.timeline.bubble_fractions` measures on a trace. Raises ValueError if the orders
    deadlock (an act waits for one that its stage's order puts later). ``per_act`` maps
    ``(kind, stage, micro-batch)`` to that act's own duration (a replay of a measured step; the
    others take ``durations``)."""
    per_act = per_act or {}
    p = len(orders)
    done: dict[tuple[str, int, int], float] = {}
    pos, free = [0] * p, [0.0] * p
    while any(pos[s] < len(orders[s]) for s in range(p)):
        moved = False
        for s in range(p):
            while pos[s] < len(orders[s]):
                kind, k = orders[s][pos[s]]
                if kind == "F":
                    dep = done.get(("F", s - 1, k)) if s > 0 else 0.0
                    hop = latency if s > 0 else 0.0
                elif kind == "B":
                    dep = done.get(("B", s + 1, k)) if s < p - 1 else done.get(("F", s, k))
                    hop = latency if s < p - 1 else 0.0
                elif kind == "W":
                    dep, hop = done.get(("B", s, k)), 0.0
                else:
                    raise ValueError(f"simulate_schedule: unknown act kind {kind!r} (F, B or W)")
                if dep is None:
                    break
                free[s] = max(free[s], dep + hop) + float(per_act.get((kind, s, k), durations[s].get(kind, 0.0)))
                done[(kind, s, k)] = free[s]
                pos[s] += 1
                moved = True
        if not moved:
            stuck = {s: orders[s][pos[s]] for s in range(p) if pos[s] < len(orders[s])}
            raise ValueError(f"simulate_schedule: the orders deadlock at {stuck}")
    span = max(free)
    busy = [sum(float(per_act.get((kind, s, k), durations[s].get(kind, 0.0))) for kind, k in orders[s])
            for s in range(p)]
    return span, [1 - b / span if span > 0 else 0.0 for b in busy]


def ideal_bubbles(schedule: str, m: int, durations: list[dict], delays: list[int] | None = None,
                  latency: float = 0.0, per_act: dict | None = None) -> list[float]:
    """Each stage's bubble of ``schedule`` ("1f1b", "gpipe" or "zb-h1") for per-stage durations of
    one micro-batch's forward ``F``, input-gradient backward ``B`` and weight gradients ``W``
    (`simulate_schedule` of the orders the runtime keeps). 1F1B and GPipe run W inside the
    backward (one act of ``B + W``); ZB-H1 runs `zb_h1_order` (``delays``: weight gradients each
    stage lets wait, default ``s``). With F = B = W on every stage this is (p-1)/(m+p-1) for 1F1B
    and GPipe and (p-1)/(3m+p-1) for ZB-H1; with W = 0 ZB-H1's equals 1F1B's. ``latency`` and
    ``per_act``: as for `simulate_schedule`."""
    p = len(durations)
    if schedule == "zb-h1":
        return simulate_schedule(zb_h1_order(p, m, delays), durations, latency, per_act)[1]
    if schedule not in ("1f1b", "gpipe"):
        raise ValueError(f"ideal_bubbles: unknown schedule {schedule!r} (1f1b, gpipe or zb-h1)")
    fused = [{"F": d.get("F", 0.0), "B": d.get("B", 0.0) + d.get("W", 0.0)} for d in durations]
    orders = [act_order(window(schedule, s, p, m), m) for s in range(p)]
    return simulate_schedule(orders, fused, latency, per_act)[1]


class _Turns:
    """Whose turn it is among a stage's compute actors (``seq``: actor names of one step, repeated
    every step). An actor acts only on its turn; after its act the next one is tried."""

    def __init__(self, seq: list[str]) -> None:
        self.seq, self.i, self.actors = seq, 0, {}
        self.log: list[str] = []   # the acts in the order they ran (tests read it)

    def mine(self, name: str) -> bool:
        return self.seq[self.i % len(self.seq)] == name

    def advance(self, name: str) -> None:
        self.log.append(name)
        if len(self.log) > 10_000:
            del self.log[:5_000]
        self.i += 1
        nxt = self.actors.get(self.seq[self.i % len(self.seq)])
        if nxt is not None:   # its pieces may all be there already: nothing else would wake it
            w = nxt.worker
            msg = (lambda _a, _b, a=nxt: a.try_act(), None, None)
            if w.thread is threading.current_thread():
                w.local.append(msg)
            else:
                w.queue.put(msg)


def _wire_turns(rt: Any, seq: list[str]) -> _Turns:
    """Gates the named actors of ``rt`` to act in the order ``seq`` (cyclically)."""
    turns = _Turns(seq)
    for a in getattr(rt, "actors", ()):
        if a.name not in seq:
            continue
        turns.actors[a.name] = a
        ready, fn = a.ready, a.fn

        def gated_ready(_ready=ready, _name=a.name) -> bool:
            return turns.mine(_name) and _ready()

        def gated_fn(*args, _fn=fn, _name=a.name):
            out = _fn(*args)
            turns.advance(_name)
            return out
        a.ready, a.fn = gated_ready, gated_fn
    return turns


class _UMoves:
    """Kernels of the update program's moves between stages (``rank_graph``'s ``p2p``): blocking
    point-to-point sends and receives, in traced order on every rank."""

    def __init__(self, comm: Any, rank: int) -> None:
        self.comm, self.rank = comm, rank

    def send(self, peer: int, tag: int):
        def stage_send(x: torch.Tensor, **_attrs) -> torch.Tensor:
            p2p_send(self.comm, x, self.rank, peer, tag)
            return x
        return stage_send

    def recv(self, v: Value, peer: int, tag: int):
        shape = tuple(local_shape(v.shape, v.sbp, v.placement, self.rank))

        def stage_recv(**_attrs) -> torch.Tensor:
            return p2p_recv(self.comm, shape, v.dtype, v.device, peer, self.rank, tag)
        return stage_recv


def _tag(key: tuple) -> int:
    return (1 if key[0] == "F" else 2) * 10000 + key[1] * 100 + key[2]


def _recv_fn(comm: Any, vals: list, src: int, dst: int, tag: int):
    metas = [(tuple(v.shape), v.dtype, v.device) for v in vals]

    def recv() -> tuple:
        return tuple(p2p_recv(comm, s, d, dev, src, dst, tag) for s, d, dev in metas)
    return recv


def _send_fn(comm: Any, dst: int, src: int, tag: int):
    def send(*vals) -> tuple:
        for v in vals:
            p2p_send(comm, v, src, dst, tag)
        return ()
    return send


def _acc_fn(entry: Any, m: int, n_sum: int, owned: frozenset = frozenset(), like: tuple = ()):
    """The update actor: sums the first ``n_sum`` values over the step's micro-batches (keeps the
    last of the rest) and runs the update program after the last micro-batch.

    The sums live in tensors kept from step to step (``update.sums``, allocated with the plan from
    ``like``, the values' metas), as eager's ``.grad``: a step's first value of each is copied into
    them (``_into``), not cloned into a fresh gradient-sized tensor on the update thread every step.
    Indices in ``owned`` arrive once per step, already summed by their producer (the deferred
    weight gradients' ``_wgrad_fn``): taken as they are (no second copy) and dropped after the
    step. The update program may change the sums in place (unscaling, clipping); the next step
    overwrites them, and the runtime finishes a step's update before the next step's first act."""
    state: dict = {"k": 0, "got": [False] * n_sum}
    sums: list = [None if i in owned else _empty(v) for i, v in enumerate(like[:n_sum])] or [None] * n_sum

    def update(*vals) -> tuple:
        k = state["k"]
        state["k"] = (k + 1) % m
        got = state["got"]
        for i, v in enumerate(vals[:n_sum]):
            if v is None:        # nothing yet (a deferred weight gradient comes later)
                continue
            if got[i]:
                sums[i].add_(v)
            else:
                sums[i] = v if i in owned else _into(sums[i], v)
                got[i] = True
        if k == m - 1:
            entry(*(t if g else None for t, g in zip(sums, got)), *vals[n_sum:])
            state["got"] = [False] * n_sum
            for i in owned:   # the producer's: not kept past the step
                sums[i] = None
        return ()
    update.sums = sums   # for tests: the same tensors every step
    return update


def _empty(v: Value) -> torch.Tensor | None:
    """A tensor for the local value ``v`` (allocated when the plan is built, by the caller's thread,
    not by a runtime thread in the middle of a step), or None for a value of unknown shape."""
    if not all(isinstance(d, int) for d in v.shape):
        return None
    return torch.empty(tuple(v.shape), dtype=v.dtype, device=v.device)


def _into(buf: torch.Tensor | None, v: torch.Tensor) -> torch.Tensor:
    """``v`` copied into ``buf`` when it has ``v``'s shape, dtype and device (else a clone)."""
    if buf is not None and buf.shape == v.shape and buf.dtype == v.dtype and buf.device == v.device:
        return buf.copy_(v)
    return v.clone()


def _backward_reads_forward_state(fb: IRGraph, tasks: list, lph: dict, written: set) -> IRGraph:
    """State the forward writes back (``written``: ids of the tensors written after each
    micro-batch's forward, ``f_upd``: BatchNorm's running statistics, a parameter written in
    ``build()`` from no data) that the backward reads: the backward reads the value its own
    micro-batch's forward read, as eager's backward reads the value from before the write, not
    the live tensor the write-back has changed since. The forward takes a copy (handed over as any
    activation) and the backward's nodes read it. ``tasks``: the forward and backward tasks,
    changed in place; ``lph``: node phases, given the new nodes'. Returns ``fb`` with them."""
    fwd, bwd = tasks
    read = {v for n in bwd.nodes for v in n.value_inputs()}
    stale = [v for v, t in fb.state if id(t) in written and v in read]
    if not stale:
        return fb
    copies, made = {}, []
    for v in stale:
        at = next(n for n in bwd.nodes if v in n.value_inputs())
        c = Value(v.shape, v.dtype, v.device, f"{v.name}_fwd" if v.name else "")
        n = Node(CLONE.name, (v,), {"memory_format": torch.contiguous_format}, (c,), at.source, at.scope)
        lph[id(n)] = "F"
        copies[v] = c
        made.append(n)
    swap = {}
    for n in bwd.nodes:
        if any(v in copies for v in n.value_inputs()):
            m = n.with_(inputs=tuple(copies.get(x, x) if isinstance(x, Value) else x for x in n.inputs))
            lph[id(m)] = lph[id(n)]
            swap[id(n)] = m
    fwd.nodes = made + fwd.nodes
    bwd.nodes = [swap.get(id(n), n) for n in bwd.nodes]
    return fb.with_(nodes=tuple(made) + tuple(swap.get(id(n), n) for n in fb.nodes))


def _act_bytes(tasks: list, state: set) -> int:
    """Bytes a micro-batch holds from its forward (``tasks[0]``) to its backward (``tasks[1]``):
    the forward's results and inputs the backward reads."""
    f, b = tasks
    made = {v for n in f.nodes for v in n.outputs}
    f_in = {v for n in f.nodes for v in n.value_inputs() if v not in made and v not in state}
    read = {v for n in b.nodes for v in n.value_inputs()}
    return sum(v.nbytes for v in (made | f_in) & read)


def _nbytes(ts: list) -> int:
    return sum(t.numel() * t.element_size() for t in ts if isinstance(t, torch.Tensor))


def _wgrad_fn(fn: Any, m: int, n_out: int, mem: dict, lock: Any, sizes: deque):
    """Zero-bubble (ZB-H1) weight gradients of one micro-batch per act (deferred: the stage's act
    order puts them where it would idle); summed here and handed to the update task once, after
    the step's last micro-batch (None before), which takes the sums as they are.

    The sums are a new tensor each step (the first micro-batch's gradients cloned), unlike the
    update actor's: kept from step to step, they made glibc trim and re-fault this thread's heap
    around every weight-gradient act (GPT blocks d=256, T=64, first stage: ~13000 minor page
    faults per step instead of ~500-4500, each W ~2-3 ms longer; ``bench/pipeline.py`` faults)."""
    state: dict = {"k": 0, "sum": None}

    def wgrad(*args) -> tuple:
        k = state["k"]
        state["k"] = (k + 1) % m
        out = fn(*args)
        with lock:
            nb = sizes.popleft()
            mem["bytes"] -= nb
            mem["w_bytes"] -= nb
            mem["w_waiting"] -= 1
        s = state["sum"]
        state["sum"] = [o.clone() for o in out] if s is None else [a.add_(o) for a, o in zip(s, out)]
        if k != m - 1:
            return (None,) * n_out
        out, state["sum"] = state["sum"], None
        return tuple(out)
    return wgrad

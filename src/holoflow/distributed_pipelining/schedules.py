"""torch's pipeline schedules for eager stages: the order in which a rank runs its stages' forward
and backward passes over the micro-batches. Every order accumulates each parameter's gradient
over the micro-batches 0, 1, ... in turn, so the schedules give the same gradients; they differ in
how many micro-batches' activations a stage holds at once (GPipe: all of them; 1F1B: at most the
number of stages after it, plus one) and in how long a rank waits.

An order is a list of acts ``(kind, stage, micro-batch)``: ``F`` forward, ``B`` the whole
backward, and for zero-bubble schedules its two parts, ``I`` (the inputs' gradients, sent to the
previous stage at once) and ``W`` (the weight gradients, deferred into the rank's idle time).
The zero-bubble orders are torch's, computed per rank from stage indices by plain functions
(``interleaved_zero_bubble_order``, ``zbv_order``, ``dual_pipe_v_order``); a rank runs its list
one act after another, receives blocking and sends not, so an order is valid when every act's
input comes from an act earlier in its peer's list (``tests/dist/test_pipelining_zero_bubble.py``
replays every rank's list to check that and compares the lists with torch's)."""
from __future__ import annotations

from collections import defaultdict
from typing import Any, Callable

from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..ops.shape import cat
from .stage import PipelineStage

__all__ = ["PipelineScheduleSingle", "PipelineScheduleMulti", "ScheduleGPipe", "Schedule1F1B", "ScheduleLoopedBFS",
           "ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV"]


def _split(value: Any, n: int) -> list:
    """``value`` as ``n`` micro-batches: a tensor split along dim 0 (torch's ``tensor_split``),
    anything else the same for each."""
    if isinstance(value, Tensor):
        if value.dim() == 0 or value.shape[0] < n:
            raise ValueError(f"holoflow pipelining: a batch input of shape {tuple(value.shape)} does not split into "
                             f"{n} micro-batches along dim 0")
        return list(value.tensor_split(n, 0))
    return [value] * n


class _PipelineSchedule:
    def __init__(self, n_microbatches: int, loss_fn: Callable | None = None, args_chunk_spec: Any = None,
                 kwargs_chunk_spec: Any = None, output_merge_spec: Any = None, scale_grads: bool = True) -> None:
        if not isinstance(n_microbatches, int) or n_microbatches < 1:
            raise ValueError(f"holoflow pipelining: n_microbatches must be a positive int, got {n_microbatches!r}")
        for name, spec in (("args_chunk_spec", args_chunk_spec), ("kwargs_chunk_spec", kwargs_chunk_spec),
                           ("output_merge_spec", output_merge_spec)):
            if spec is not None:
                raise NotImplementedError(f"holoflow pipelining: {name} is not supported; inputs and targets are "
                                          f"split along dim 0 and the last stage's outputs concatenated along it")
        self._n_microbatches = n_microbatches
        self._loss_fn = loss_fn
        self.scale_grads = scale_grads

    @property
    def _stages(self) -> list:
        raise NotImplementedError

    def _order(self) -> list:
        """``("F" | "B" | "I" | "W", stage, micro-batch)`` in the order this rank runs them."""
        raise NotImplementedError

    def step(self, *args: Any, target: Any = None, losses: list | None = None, **kwargs: Any) -> Any:
        """One pass over the batch: the first stage's rank passes the inputs, the last stage's the
        ``target`` (and a ``losses`` list to receive each micro-batch's loss); returns the last
        stage's outputs, concatenated (None on the other ranks)."""
        n = self._n_microbatches
        stages = self._stages
        first = any(s.is_first for s in stages)
        last = any(s.is_last for s in stages)
        if first and not args and not kwargs:
            raise ValueError("holoflow pipelining: this rank runs the first stage; pass the batch to step(...)")
        if last and self._loss_fn is not None and target is None:
            raise ValueError("holoflow pipelining: this rank runs the last stage with a loss_fn; pass "
                             "step(..., target=...)")
        mb_args = list(zip(*[_split(a, n) for a in args])) if args else [()] * n
        mb_kwargs = [dict(zip(kwargs, vals)) for vals in zip(*[_split(v, n) for v in kwargs.values()])] \
            if kwargs else [{}] * n
        mb_targets = _split(target, n) if target is not None else [None] * n
        step_losses: dict = {}
        backward = self._loss_fn is not None
        try:
            for kind, stage, mb in self._order():
                if kind == "F":
                    out = stage.forward_one(mb, mb_args[mb] if stage.is_first else (),
                                            mb_kwargs[mb] if stage.is_first else {})
                    if stage.is_last and backward:
                        step_losses[mb] = self._loss_fn(out, mb_targets[mb])
                elif backward and kind == "W":
                    stage.backward_weight_one(mb)
                elif backward:
                    loss = step_losses.get(mb) if stage.is_last else None
                    (stage.backward_one if kind == "B" else stage.backward_input_one)(mb, loss)
        except BaseException:
            for stage in stages:   # (no waiting for sends a failed peer may never take)
                stage._clear()
            raise
        outputs = [stage._results for stage in stages if stage.is_last]
        for stage in stages:
            stage.finish()
        merged = None
        if outputs:
            with no_grad():
                merged = _merge([outputs[0][mb] for mb in range(n)])
        if backward and self.scale_grads:
            with no_grad():
                for stage in stages:
                    for p in stage.submod.parameters():
                        if p.grad is not None:
                            p.grad.div_(n)
        if losses is not None and last and backward:
            losses.extend(step_losses[mb].detach() for mb in range(n))
        return merged

    def eval(self, *args: Any, target: Any = None, losses: list | None = None, **kwargs: Any) -> Any:
        """Forward passes only (torch's eval): the losses are computed, nothing is differentiated."""
        with no_grad():
            return self.step(*args, target=target, losses=losses, **kwargs)


def _merge(outs: list) -> Any:
    first = outs[0]
    if isinstance(first, Tensor):
        return cat([o.detach() for o in outs], 0)
    if isinstance(first, (tuple, list)):
        return type(first)(_merge([o[i] for o in outs]) for i in range(len(first)))
    return outs


class PipelineScheduleSingle(_PipelineSchedule):
    """A schedule of one stage per rank (stage ``i`` on the group's rank ``i``)."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 **kwargs: Any) -> None:
        if not isinstance(stage, PipelineStage):
            raise TypeError(f"holoflow {type(self).__name__}: takes one PipelineStage, got {type(stage).__name__} "
                            f"(several stages per rank: ScheduleLoopedBFS)")
        if len(stage.group) != stage.num_stages:
            raise ValueError(f"holoflow {type(self).__name__}: {stage.num_stages} stages on {len(stage.group)} ranks; "
                             f"a single-stage schedule puts one stage on each rank (several per rank: "
                             f"ScheduleLoopedBFS)")
        super().__init__(n_microbatches, loss_fn, **kwargs)
        self._stage = stage

    @property
    def _stages(self) -> list:
        return [self._stage]


class ScheduleGPipe(PipelineScheduleSingle):
    """Every micro-batch's forward, then every backward."""

    def _order(self) -> list:
        n = self._n_microbatches
        return [("F", self._stage, m) for m in range(n)] + [("B", self._stage, m) for m in range(n)]


class Schedule1F1B(PipelineScheduleSingle):
    """One forward, one backward: after a warm-up of as many forwards as stages follow this one,
    each forward is followed by the oldest micro-batch's backward."""

    def __init__(self, stage: PipelineStage, n_microbatches: int, loss_fn: Callable | None = None,
                 **kwargs: Any) -> None:
        super().__init__(stage, n_microbatches, loss_fn, **kwargs)
        if n_microbatches < stage.num_stages:   # (torch's requirement)
            raise ValueError(f"holoflow Schedule1F1B: the number of micro-batches ({n_microbatches}) must be at "
                             f"least the number of stages ({stage.num_stages})")

    def _order(self) -> list:
        n, s = self._n_microbatches, self._stage
        warmup = min(s.num_stages - s.stage_index - 1, n)
        order = [("F", s, m) for m in range(warmup)]
        for i in range(n - warmup):
            order += [("F", s, warmup + i), ("B", s, i)]
        return order + [("B", s, m) for m in range(n - warmup, n)]


def _per_round(name: str, n: int, ranks: int) -> int:
    """The micro-batches of one round of an interleaved schedule (torch's flexible rounds: ``n``
    in ``max(1, n // ranks)`` rounds, which must divide it)."""
    rounds = max(1, n // ranks)
    if n % rounds:
        raise ValueError(f"holoflow {name}: the number of micro-batches ({n}) must be a multiple of the number "
                         f"of rounds ({rounds}), as torch's")
    return n // rounds


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank (stage ``i`` on the group's rank ``i % ranks``)."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"holoflow {type(self).__name__}: takes a non-empty list of PipelineStages")
        super().__init__(n_microbatches, loss_fn, **kwargs)
        self._multi = sorted(stages, key=lambda st: st.stage_index)
        mailbox: dict = {}   # (what one of these stages hands another: they are on this rank)
        for stage in self._multi:
            stage._local = mailbox
            stage.stage_index_to_group_rank = None   # (looped, unless a V schedule places them)

    @property
    def _stages(self) -> list:
        return self._multi


class ScheduleLoopedBFS(PipelineScheduleMulti):
    """Each local stage's forwards, stage by stage, then the backwards in reverse stage order."""

    def _order(self) -> list:
        n = self._n_microbatches
        return [("F", s, m) for s in self._multi for m in range(n)] + \
            [("B", s, m) for s in reversed(self._multi) for m in range(n)]


class ScheduleInterleaved1F1B(PipelineScheduleMulti):
    """Interleaved 1F1B (Megatron's, with torch's flexible rounds): the micro-batches go in rounds
    of ``n // max(1, n // ranks)``; within a round each local stage runs them in turn (depth
    first); after a warm-up of ``(local stages - 1) * round + 2 * (ranks - 1 - rank)`` forwards,
    forwards and backwards alternate, the backwards visiting the local stages in reverse."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        super().__init__(stages, n_microbatches, loss_fn, **kwargs)
        self._ranks = len(self._multi[0].group)
        self._per_round = _per_round(type(self).__name__, n_microbatches, self._ranks)

    def _order(self) -> list:
        v, n, per = len(self._multi), self._n_microbatches, self._per_round
        rank = self._multi[0].group.index(self._multi[0]._rank_of(self._multi[0].stage_index))
        total = v * n
        warmup = min((v - 1) * per + 2 * (self._ranks - 1 - rank), total)
        seen_f, seen_b = [0] * v, [0] * v

        def forward(k: int) -> tuple:
            j = (k // per) % v
            seen_f[j] += 1
            return ("F", self._multi[j], seen_f[j] - 1)

        def backward(k: int) -> tuple:
            j = v - 1 - (k // per) % v
            seen_b[j] += 1
            return ("B", self._multi[j], seen_b[j] - 1)
        order = [forward(k) for k in range(warmup)]
        for i in range(total - warmup):
            order += [forward(warmup + i), backward(i)]
        return order + [backward(k) for k in range(total - warmup, total)]


# -- zero bubble ------------------------------------------------------------------------------------
class _Order:
    """A rank's order being built: ``act(kind, stage)`` appends the stage's next micro-batch of
    that kind (``B``, the whole backward, counts as an ``I`` and a ``W``)."""

    def __init__(self) -> None:
        self.acts: list = []
        self.seen: dict = defaultdict(int)

    def count(self, kind: str, stage: int) -> int:
        return self.seen[kind, stage]

    def act(self, kind: str, stage: int) -> int:
        mb = self.seen["I" if kind == "B" else kind, stage]
        self.acts.append((kind, stage, mb))
        for k in ("I", "W") if kind == "B" else (kind,):
            self.seen[k, stage] += 1
        return mb


def interleaved_zero_bubble_order(rank: int, ranks: int, local_stages: int, n: int, per_round: int) -> list:
    """torch's ZB1P order (``ScheduleInterleavedZeroBubble``) of ``rank``, stages looped over the
    ranks: interleaved 1F1B with a warm-up one forward shorter per hop, each backward split into
    ``I`` and ``W``, the ``W`` trailing its ``I`` by ``rank`` backwards (the rank's idle time)."""
    total = local_stages * n
    warmup = min((local_stages - 1) * per_round + ranks - 1 - rank, total)

    def forward(k: int) -> int:
        return (k // per_round) % local_stages * ranks + rank

    def backward(j: int) -> int:
        return (local_stages - 1 - (j // per_round) % local_stages) * ranks + rank
    order = _Order()
    for k in range(warmup):
        order.act("F", forward(k))
    for j in range(total):
        if warmup + j < total:
            order.act("F", forward(warmup + j))
        order.act("I", backward(j))
        if j >= rank:
            order.act("W", backward(j - rank))
    for j in range(max(total - rank, 0), total):
        order.act("W", backward(j))
    return order.acts


def zbv_order(rank: int, ranks: int, n: int) -> list:
    """torch's ZB-V order (``ScheduleZBVZeroBubble``) of ``rank``, which holds stages ``rank`` and
    ``2 * ranks - 1 - rank``: built for at least ``2 * ranks - 1`` micro-batches, the acts of those
    past ``n`` dropped (torch's)."""
    first, second = rank, 2 * ranks - 1 - rank
    n_built = max(2 * ranks - 1, n)
    order = _Order()
    for _ in range(2 * (ranks - rank) - 1):
        order.act("F", first)
    for _ in range(rank):
        order.act("F", second)
        order.act("F", first)
    for _ in range(ranks - rank):
        for kind in "FIW":
            order.act(kind, second)
    while order.count("F", second) < order.count("F", first) or order.count("F", first) < n_built:
        if order.count("F", first) < n_built:
            order.act("F", first)
        for kind, stage in (("I", first), ("W", first), ("F", second), ("I", second), ("W", second)):
            order.act(kind, stage)
    for _ in range(rank):
        order.act("I", first)
        order.act("I", second)
    for _ in range(ranks - rank):
        order.act("I", first)
        order.act("W", first)
    for stage in (second, first):
        while order.count("W", stage) < order.count("I", stage):
            order.act("W", stage)
    return [a for a in order.acts if a[2] < n]


def dual_pipe_v_order(rank: int, ranks: int, n: int) -> list:
    """torch's DualPipeV order (``ScheduleDualPipeV``, DeepSeek's) of ``rank``, which holds stages
    ``rank`` and ``2 * ranks - 1 - rank``: the steady state pairs one stage's forward with the
    other's whole backward (torch overlaps the pair; here they run one after the other); the
    cool-down splits backwards into ``I`` and a ``W`` taken from a queue when a gap comes."""
    first, second = rank, 2 * ranks - 1 - rank
    order = _Order()
    waiting: list = []   # (stage, micro-batch) of each I whose W is still to come

    def act(kind: str, stage: int) -> None:
        mb = order.act(kind, stage)
        if kind == "I":
            waiting.append((stage, mb))

    def weight() -> None:
        if waiting:
            stage, mb = waiting.pop(0)
            order.acts.append(("W", stage, mb))

    for _ in range(2 * (ranks - rank - 1)):
        act("F", first)
    for _ in range(rank + 1):
        act("F", first)
        act("F", second)
    for _ in range(ranks - rank - 1):
        act("I", second)
        weight()
        act("F", second)
    for _ in range(n - 2 * ranks + rank + 1):
        act("F", first)
        act("B", second)
        act("F", second)
        act("B", first)
    for _ in range(ranks - rank - 1):
        act("B", second)
        act("F", second)
        act("B", first)
    split = False   # (the second half of the last backwards: I now, W in the gaps)
    for i in range(rank + 1):
        split = split or (i == (rank + 1) // 2 and rank % 2 == 1)
        act("I" if split else "B", second)
        split = split or (i == (rank + 1) // 2 and rank % 2 == 0)
        act("I" if split else "B", first)
    for _ in range(ranks - rank - 1):
        weight()
        act("I" if split else "B", first)
    for _ in range(rank + 1):
        weight()
    return order.acts


def v_stage_rank(stage: int, ranks: int) -> int:
    """The rank of ``stage`` in a V (torch's "v" style): down the ranks, then back up."""
    return stage % ranks if (stage // ranks) % 2 == 0 else ranks - 1 - stage % ranks


class _StageIndexSchedule(PipelineScheduleMulti):
    """A multi-stage schedule whose order is computed on stage indices (torch's runtime
    schedules); ``_rank_order()`` is this rank's order, checked to name only its own stages."""

    def _rank_order(self) -> list:
        raise NotImplementedError

    def _order(self) -> list:
        mine = {s.stage_index: s for s in self._multi}
        return [(kind, mine[i], mb) for kind, i, mb in self._rank_order()]


class ScheduleInterleavedZeroBubble(_StageIndexSchedule):
    """torch's interleaved zero-bubble schedule (ZB1P, https://arxiv.org/abs/2401.10241): stages
    looped over the ranks as for ScheduleInterleaved1F1B, each backward split into the input
    gradients sent at once and the weight gradients run later in the rank's idle time.
    ``backward_requires_autograd`` and ``defer_pp_recv`` (torch's: when receives are posted) are
    accepted and change no value."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        kwargs.pop("backward_requires_autograd", None)
        kwargs.pop("defer_pp_recv", None)
        super().__init__(stages, n_microbatches, loss_fn, **kwargs)
        self._ranks = len(self._multi[0].group)
        self._per_round = _per_round(type(self).__name__, n_microbatches, self._ranks)
        self._rank = self._multi[0].stage_index % self._ranks
        if any(s.stage_index % self._ranks != self._rank for s in self._multi):
            raise ValueError(f"holoflow ScheduleInterleavedZeroBubble: stages {[s.stage_index for s in self._multi]} "
                             f"are not one rank's: stage i runs on rank i % {self._ranks} (rank {self._rank}: "
                             f"stages {list(range(self._rank, self._multi[0].num_stages, self._ranks))})")

    def _rank_order(self) -> list:
        n = self._n_microbatches
        return interleaved_zero_bubble_order(self._rank, self._ranks, len(self._multi), n, self._per_round)


class _VSchedule(_StageIndexSchedule):
    """Two stages per rank in a V: rank ``r`` holds stages ``r`` and ``2 * ranks - 1 - r``."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        kwargs.pop("backward_requires_autograd", None)
        kwargs.pop("defer_pp_recv", None)
        super().__init__(stages, n_microbatches, loss_fn, **kwargs)
        name, ranks, total = type(self).__name__, len(self._multi[0].group), self._multi[0].num_stages
        if len(self._multi) != 2:
            raise ValueError(f"holoflow {name}: requires exactly 2 stages per rank (rank r holds stages r and "
                             f"2 * ranks - 1 - r of a V), but got {len(self._multi)}")
        if total != 2 * ranks:
            raise ValueError(f"holoflow {name}: {total} stages on {ranks} ranks; a V puts 2 stages on each rank, so "
                             f"num_stages must be {2 * ranks}")
        self._ranks, self._rank = ranks, v_stage_rank(self._multi[0].stage_index, ranks)
        if [s.stage_index for s in self._multi] != [self._rank, total - 1 - self._rank]:
            raise ValueError(f"holoflow {name}: stages {[s.stage_index for s in self._multi]} are not one rank's "
                             f"V: rank r holds stages r and {total - 1} - r (rank {self._rank}: stages "
                             f"{[self._rank, total - 1 - self._rank]})")
        placed = {i: v_stage_rank(i, ranks) for i in range(total)}
        for stage in self._multi:
            stage.stage_index_to_group_rank = placed


class ScheduleZBVZeroBubble(_VSchedule):
    """torch's ZB-V schedule (https://arxiv.org/abs/2401.10241, section 6): two stages per rank in
    a V, each backward split into input and weight gradients, the weight parts filling the idle
    time; zero bubble when a forward, an input and a weight part take equally long."""

    def _rank_order(self) -> list:
        return zbv_order(self._rank, self._ranks, self._n_microbatches)


class ScheduleDualPipeV(_VSchedule):
    """torch's DualPipeV schedule (DeepSeek's DualPipe on a V, https://arxiv.org/abs/2412.19437):
    two stages per rank in a V; at least as many micro-batches as stages."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        super().__init__(stages, n_microbatches, loss_fn, **kwargs)
        if n_microbatches < self._multi[0].num_stages:
            raise ValueError(f"holoflow ScheduleDualPipeV: requires at least as many micro-batches as stages, but "
                             f"got {n_microbatches} micro-batches and {self._multi[0].num_stages} stages")

    def _rank_order(self) -> list:
        return dual_pipe_v_order(self._rank, self._ranks, self._n_microbatches)

"""torch's pipeline schedules for eager stages: the order in which a rank runs its stages' forward
and backward passes over the micro-batches. Every order accumulates each parameter's gradient
over the micro-batches 0, 1, ... in turn, so the schedules give the same gradients; they differ in
how many micro-batches' activations a stage holds at once (GPipe: all of them; 1F1B: at most the
number of stages after it, plus one)."""
from __future__ import annotations

from typing import Any, Callable

from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..ops.shape import cat
from .stage import PipelineStage

__all__ = ["PipelineScheduleSingle", "PipelineScheduleMulti", "ScheduleGPipe", "Schedule1F1B", "ScheduleLoopedBFS",
           "ScheduleInterleaved1F1B"]


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
        """``("F" | "B", stage, micro-batch)`` in the order this rank runs them."""
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
                elif backward:
                    stage.backward_one(mb, step_losses.get(mb) if stage.is_last else None)
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


class PipelineScheduleMulti(_PipelineSchedule):
    """A schedule of several stages per rank (stage ``i`` on the group's rank ``i % ranks``)."""

    def __init__(self, stages: list, n_microbatches: int, loss_fn: Callable | None = None, **kwargs: Any) -> None:
        if not stages or not all(isinstance(s, PipelineStage) for s in stages):
            raise TypeError(f"holoflow {type(self).__name__}: takes a non-empty list of PipelineStages")
        super().__init__(n_microbatches, loss_fn, **kwargs)
        self._multi = sorted(stages, key=lambda st: st.stage_index)

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
        self._rounds = max(1, n_microbatches // self._ranks)
        if n_microbatches % self._rounds:
            raise ValueError(f"holoflow ScheduleInterleaved1F1B: the number of micro-batches ({n_microbatches}) must "
                             f"be a multiple of the number of rounds ({self._rounds}), as torch's")
        self._per_round = n_microbatches // self._rounds

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

"""ZeRO for graphs of global tensors, expressed as SBP (``config.enable_zero``).

A data-parallel parameter (broadcast on a 1-D placement, at least ``shard_min_size`` elements
and one row per rank) is *sharded* along dim 0 across the ranks:

- stage 1: its optimizer state is S(0) (global tensors of the parameter's shape holding this
  rank's rows, so a state_dict saves and loads them as one tensor): each rank keeps and updates
  only its rows, then the updated rows are all-gathered into the parameter;
- stage 2: also its gradient: the partial sums are reduce-scattered to S(0) (a P->S(0) boxing
  node) instead of all-reduced, so each rank receives just its rows.

- stage 3: also the parameter itself: it is re-laid out as S(0) in place when the graph first
  traces it (each rank keeps its rows between steps). Every op reading it inside the graph reads
  an all-gathered copy (a ``global_box`` S(0) -> B node tagged ``zero3``, recorded just before the
  op); ``passes/zero_regather.py`` gathers it again before its first use in backward, so the
  memory plan frees the forward copy after its last forward use. Its gradient, the partial sums
  of the gathered copy, is reduce-scattered to S(0); the optimizer's ordinary update then runs on
  the shards (parameter, gradient and state all S(0)).

Stages 1 and 2 run the optimizer's own update rule on the shard (views of the parameter's rows
and shard-sized state) and all-gather the updated rows: the parameter stays whole between steps.
See docs/architecture.md, "Global graphs".
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..core import grad_mode
from ..core.errors import ArgTypeError, UnsupportedError
from ..core.sbp import B, S
from ..core.tensor import Tensor
from ..distributed import world
from ..distributed.global_tensor import make_global
from ..distributed.sharding import local_ranges, shard_of
from .step_book import StepBook, booking


@dataclass(frozen=True)
class Zero:
    stage: int
    shard_min_size: int = 1024

    def __post_init__(self) -> None:
        for name in ("stage", "shard_min_size"):
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool):
                raise ArgTypeError(f"holoflow.nn.Graph: enable_zero({name}=...) takes an int, got {v!r} "
                                   f"(a {type(v).__name__})")
        if self.stage not in (1, 2, 3):
            raise UnsupportedError(f"holoflow.nn.Graph: ZeRO stage {self.stage} does not exist (stages 1, 2 "
                                   f"and 3 shard optimizer state, also gradients, also parameters)")

    def sharded(self, p: Tensor) -> bool:
        """Whether ZeRO shards parameter ``p``: data parallel (broadcast on a placement whose
        ranks lie along one mesh axis), large enough, and with at least one row per rank."""
        g = p._global
        if g is None or any(s != B for s in g.sbp) or len(_axes(g.placement)) != 1:
            return False
        return p.numel() >= self.shard_min_size and p.dim() >= 1 and p.shape[0] >= len(g.placement.flat_ranks)

    def grad_sbp(self, p: Tensor) -> tuple | None:
        """The SBP a sharded parameter's gradient is boxed to (stage 2: its rows, S(0))."""
        if not (self.stage >= 2 and self.sharded(p)):
            return None
        return row_sbp(p._global.placement)


ZERO3 = "zero3"   # the tag of a stage-3 parameter's gather nodes


def shard_parameter(p: Tensor, zero: Zero | None) -> bool:
    """Stage 3: whether ``p`` is (now) kept S(0): an eligible data-parallel parameter is re-laid
    out in place the first time a graph traces it (its rows only; no communication)."""
    if zero is None or zero.stage < 3:
        return False
    if p.__dict__.get("_zero3"):
        return True
    if not (p.requires_grad and p.is_leaf and zero.sharded(p)):
        return False
    g = p._global
    nd = row_sbp(g.placement)
    # this rank's rows of the whole tensor it holds: torch directly, not an op (a trace is running)
    p._data = shard_of(p._data, nd, g.placement, world.rank()).clone()
    p._global = replace(g, sbp=nd)
    p.__dict__["_zero3"] = True
    return True


def _axes(place) -> list[int]:
    """The mesh axes with more than one rank."""
    return [i for i, n in enumerate(place.hierarchy) if n > 1]


def _rows(p: Tensor, rank: int) -> tuple[int, int]:
    """(start, count) of the rows of sharded ``p`` that ``rank`` updates: its piece of ``p``'s
    rows laid out as ``row_sbp`` on ``p``'s placement (whose conventions say how an uneven
    count splits)."""
    g = p._global
    return local_ranges(p.shape, row_sbp(g.placement), g.placement, g.placement.coords(rank))[0]


def sharded_update(opt, group_index: int, params: list, zero: Zero, book: StepBook | None = None):
    """The update effect of one param group under ZeRO: the optimizer's rule on each sharded
    parameter's rows (shard-sized state), then the rows all-gathered back into the parameter;
    ``book`` (graph/step_book.py) books the step once per graph step."""
    group = opt.param_groups[group_index]
    ran = booking(book)
    rank, comm = world.rank(), world.comm()
    shards = [zero.sharded(p) for p in params]   # the program's: what every rank of a placement shards
    sharded = [s and rank in p._global.placement.flat_ranks for p, s in zip(params, shards)]   # this rank's
    rows = [_rows(p, rank) if s else None for p, s in zip(params, sharded)]
    views = [Tensor._make(p._data.narrow(0, *r)) if r else p for p, r in zip(params, rows)]

    def update(*grads):
        gs = []
        for g, r, s in zip(grads, rows, sharded):
            if s and zero.stage == 1:   # a whole (all-reduced) gradient: this rank's rows of it
                g = g.narrow(0, *r)
            gs.append(Tensor._make(g))
        states = []
        for p, v, r in zip(params, views, rows):   # keyed by the parameter (state_dict), sized by the shard
            st = opt.state[p]
            if not st:
                st.update(opt._init_state(v, group))
            elif r is not None:   # whole state of eager steps before: this rank's rows of it from now on
                for k, t in st.items():
                    if isinstance(t, Tensor) and t.dim() > 0 and t._data.shape[0] == p._data.shape[0] != r[1]:
                        st[k] = Tensor._make(t._data.narrow(0, *r).clone())
            states.append(st)
        prev, grad_mode.STATE.enabled = grad_mode.STATE.enabled, False
        try:
            opt._step_foreach(group, views, gs, states) if group.get("foreach") is not False \
                and hasattr(opt, "_step_foreach") else opt._step_ops(group, views, gs, states)
        finally:
            grad_mode.STATE.enabled = prev
        for p, st, r in zip(params, states, rows):
            if r is not None:
                _global_rows(p, st, r)
        ran()
        with world.acting_as(rank, comm):
            for p, v, s in zip(params, views, sharded):
                if s:
                    ranks = p._global.placement.flat_ranks
                    sizes = [_rows(p, r)[1] for r in ranks]
                    whole = comm.all_gather(v._data.contiguous(), tuple(ranks), 0, sizes)
                    if whole.data_ptr() != p._data.data_ptr():
                        p._data.copy_(whole)
    update.__name__ = f"{type(opt).__name__.lower()}_zero{zero.stage}_update"
    # what explain and the cost model list for this node: the updated rows of each sharded
    # parameter all-gathered, as the program has them on every rank (a rank planning or predicting
    # a pipeline costs the other stages' updates too: its own share would make its figures, and
    # so its plan, differ from theirs)
    update.zero_gathers = tuple((p._global.placement, row_sbp(p._global.placement), tuple(p.shape), p._data.dtype)
                                for p, s in zip(params, shards) if s)
    return update


def _global_rows(p: Tensor, st: dict, r: tuple[int, int]) -> None:
    """The shard-sized state of sharded parameter ``p`` (this rank's rows ``r``) made global
    ``S(0)`` with ``p``'s logical shape, in place, as OneFlow's ZeRO state is: what the rows are,
    so ``state_dict()`` / ``flow.save`` hand out (and load back) each rank's rows as the pieces of
    one tensor rather than a local tensor per rank that one file cannot hold."""
    g = p._global
    for v in st.values():
        if isinstance(v, Tensor) and v._global is None and v._data.dim() == p._data.dim() and \
                tuple(v._data.shape) == (r[1],) + tuple(p._data.shape[1:]):
            make_global(v, g.placement, row_sbp(g.placement), g.shape)


def row_sbp(place) -> tuple:
    """The layout of a sharded parameter's rows on ``place``: ``S(0)`` along its one mesh axis of
    more than one rank."""
    axis = _axes(place)[0]
    return tuple(S(0) if i == axis else B for i in range(place.ndim))


def state_bytes(opt) -> int:
    """Bytes of this rank's optimizer state tensors (what ZeRO shards)."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if isinstance(v, Tensor):
                total += v._data.numel() * v._data.element_size()
            elif isinstance(v, torch.Tensor):
                total += v.numel() * v.element_size()
    return total

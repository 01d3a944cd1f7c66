"""A pipeline stage: one rank's part of the model, and its transfers to the neighbouring stages.

Activations go forward as a small header (each tensor's dtype and shape, pickled) followed by the
tensors; gradients come back shaped as the activations went (zeros for an activation nothing
differentiated). Transfers are point-to-point (torch's isend/irecv), waited for with the
communication timeout, whose error names both ranks. Each transfer has its own tag (direction,
sending stage, micro-batch), so a receive takes its own message whatever order the peer sent
others in (two stages per rank send activations and gradients the same way); between two stages
of one rank (a V's turn) the tensors are handed over in a mailbox the schedule gives its stages.

The backward is one act (``backward_one``) or, for zero-bubble schedules, two, as torch's
``stage_backward_input`` / ``stage_backward_weight``: ``backward_input_one`` computes and sends the
inputs' gradients only (``autograd.grad``, keeping the graph), capturing the gradients that reach
the nodes where the paths towards the parameters leave those towards the inputs (the frontier,
``core.autograd.split_backward``); ``backward_weight_one`` later resumes the backward from there,
with the frontier's edges into the input part cut, and accumulates the parameters' gradients:
each node runs once over both parts, so the two cost one backward. On the first stage, which
sends nothing back, the input part is empty and the weight part is the whole backward (torch's)."""
from __future__ import annotations

import enum
import pickle
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..autograd import backward as run_backward
from ..autograd import grad as autograd_grad
from ..core.autograd import EdgeRoot, seed_grads, split_backward
from ..core.autograd import run_backward as engine_backward
from ..core.dispatch import accumulate_captured
from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..distributed import env
from ..nn.module import Module

__all__ = ["PipelineStage", "SplitPoint"]


class SplitPoint(enum.Enum):
    BEGINNING = 1
    END = 2


def _wait(work, what: str, peer: int) -> None:
    try:
        work.wait(timeout=env.comm_timeout())
    except Exception as e:
        raise RuntimeError(f"holoflow pipelining: rank {env.get_rank()} waiting for {what} rank {peer} failed "
                           f"(the peer failed, or did not come within the communication timeout: {e}); every "
                           f"stage's rank must run the same schedule with the same number of micro-batches") from e


def _send_tensors(tensors: list, dst: int, header: bool, tag: int) -> list:
    """Starts sending ``tensors`` (torch tensors) to global rank ``dst``; ``(work, buffer, dst)``
    for each transfer, to wait on (the buffers kept alive until then)."""
    bufs = []
    if header:
        meta = pickle.dumps([(str(t.dtype).split(".")[-1], tuple(t.shape)) for t in tensors])
        bufs += [torch.tensor([len(meta)], dtype=torch.int64), torch.frombuffer(bytearray(meta), dtype=torch.uint8)]
    bufs += [t.contiguous() for t in tensors]
    return [(dist.isend(b, dst, tag=tag), b, dst) for b in bufs]


def _recv_tensors(src: int, like: list | None, tag: int) -> list:
    """Receives tensors from global rank ``src``: shaped as ``like`` (dtype, shape) pairs, or as a
    header sent first says."""
    if like is None:
        size = torch.zeros(1, dtype=torch.int64)
        _wait(dist.irecv(size, src, tag=tag), "the activations' header from", src)
        raw = torch.zeros(int(size.item()), dtype=torch.uint8)
        _wait(dist.irecv(raw, src, tag=tag), "the activations' header from", src)
        like = pickle.loads(raw.numpy().tobytes())
    out = []
    for dtype, shape in like:
        buf = torch.empty(shape, dtype=getattr(torch, dtype))
        _wait(dist.irecv(buf, src, tag=tag), "a tensor from", src)
        out.append(buf)
    return out


class PipelineStage:
    """torch's ``PipelineStage(submodule, stage_index, num_stages, device)``: ``submodule`` runs as
    stage ``stage_index`` of ``num_stages``; with ``group`` (global ranks) stage ``i`` of a
    single-stage schedule is on ``group[i]``, of a looped one on ``group[i % len(group)]``, of a
    V-shaped one where the schedule's ``stage_index_to_group_rank`` says."""

    def __init__(self, submodule: Module, stage_index: int, num_stages: int, device: Any,
                 input_args: Any = None, output_args: Any = None, group: Sequence[int] | None = None,
                 dw_builder: Any = None) -> None:
        if not isinstance(submodule, Module):
            raise TypeError(f"holoflow PipelineStage: submodule must be an nn.Module, got {type(submodule).__name__}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"holoflow PipelineStage: stage_index {stage_index} is not in [0, {num_stages})")
        if dw_builder is not None:
            raise NotImplementedError("holoflow PipelineStage: dw_builder (a custom weight-gradient function) is not "
                                      "supported; leave it None: zero-bubble schedules split the backward themselves")
        self.submod = submodule
        self.stage_index, self.num_stages = stage_index, num_stages
        self.device = device
        self.group = tuple(range(env.get_world_size())) if group is None else tuple(group)
        self.stage_index_to_group_rank: dict | None = None   # (set by a schedule placing stages in a V)
        self._local: dict = {}   # tag -> tensors handed to a stage of this rank (the schedule shares one)
        self._clear()

    @property
    def submodule(self) -> Module:
        return self.submod

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def _rank_of(self, stage: int) -> int:
        placed = self.stage_index_to_group_rank
        return self.group[placed[stage] if placed is not None else stage % len(self.group)]

    def _clear(self) -> None:
        self._inputs: dict = {}    # micro-batch -> the inputs it ran on (leaves for received ones)
        self._outputs: dict = {}   # micro-batch -> its outputs (the loss's input on the last stage)
        self._results: dict = {}   # micro-batch -> the last stage's outputs, for the step's result
        self._sent: dict = {}      # micro-batch -> the (dtype, shape) of what went forward
        self._deferred: dict = {}  # micro-batch -> (outputs, their gradients, (region, frontier, reached) or None)
        self._works: list = []
        self._local.clear()

    # -- transfers -----------------------------------------------------------------------------
    def _tag(self, sender: int, mb: int, grads: bool) -> int:
        return 2 * (mb * self.num_stages + sender) + int(grads)

    def _send(self, datas: list, to_stage: int, mb: int, grads: bool) -> None:
        dst, tag = self._rank_of(to_stage), self._tag(self.stage_index, mb, grads)
        if dst == env.get_rank():
            self._local[tag] = [d.clone() for d in datas]
        else:
            self._works += _send_tensors(datas, dst, header=not grads, tag=tag)

    def _recv(self, from_stage: int, mb: int, like: list | None) -> list:
        src, tag = self._rank_of(from_stage), self._tag(from_stage, mb, like is not None)
        if src != env.get_rank():
            return _recv_tensors(src, like, tag)
        if tag not in self._local:
            raise RuntimeError(f"holoflow pipelining: stage {self.stage_index} needs micro-batch {mb}'s "
                               f"{'gradients' if like is not None else 'activations'} from stage {from_stage} of "
                               f"the same rank before that stage ran it; the schedule's order is invalid")
        return self._local.pop(tag)

    # -- forward -------------------------------------------------------------------------------
    def forward_one(self, mb: int, args: tuple, kwargs: dict) -> Any:
        """Runs micro-batch ``mb``: on the inputs given (first stage) or received, sending the
        outputs on (not the last stage)."""
        if self.is_first:
            inputs = list(args)
        else:
            got = self._recv(self.stage_index - 1, mb, None)
            inputs = [Tensor._make(t).requires_grad_() if t.is_floating_point() else Tensor._make(t) for t in got]
        self._inputs[mb] = inputs
        out = self.submod(*inputs, **kwargs)
        self._outputs[mb] = out
        if self.is_last:
            self._results[mb] = out
        if not self.is_last:
            outs = [out] if isinstance(out, Tensor) else list(out)
            if not all(isinstance(o, Tensor) for o in outs):
                raise TypeError(f"holoflow PipelineStage {self.stage_index}: its module must return a tensor or a "
                                f"tuple of tensors to send to the next stage, got {type(out).__name__}")
            datas = [o._data.detach() for o in outs]
            self._sent[mb] = [(str(d.dtype).split(".")[-1], tuple(d.shape)) for d in datas]
            self._send(datas, self.stage_index + 1, mb, grads=False)
        return out

    # -- backward ------------------------------------------------------------------------------
    def _seed(self, mb: int, loss: Tensor | None) -> tuple[list, list]:
        """What micro-batch ``mb``'s backward starts from: the loss (last stage), else the
        outputs that require grad and the gradients the next stage sends for them."""
        if self.is_last:
            return ([loss], [None]) if loss is not None and loss.requires_grad else ([], [])
        outs = self._outputs[mb]
        outs = [outs] if isinstance(outs, Tensor) else list(outs)
        grads = self._recv(self.stage_index + 1, mb, self._sent.pop(mb))
        pairs = [(o, Tensor._make(g)) for o, g in zip(outs, grads) if o.requires_grad]
        return [o for o, _ in pairs], [g for _, g in pairs]

    def _send_back(self, mb: int, grads: list) -> None:
        """Sends the inputs' gradients (torch tensors or None: zeros) to the previous stage."""
        with no_grad():
            back = [g if g is not None else torch.zeros_like(x._data) for x, g in zip(self._inputs[mb], grads)]
        self._send(back, self.stage_index - 1, mb, grads=True)

    def backward_one(self, mb: int, loss: Tensor | None) -> None:
        """Backpropagates micro-batch ``mb`` (from its loss on the last stage, else from the
        gradients the next stage sends) and sends its inputs' gradients back."""
        outs, grads = self._seed(mb, loss)
        if outs:
            run_backward(outs, grads)
        if not self.is_first:
            self._send_back(mb, [x.grad._data if x.grad is not None else None for x in self._inputs[mb]])
        self._inputs.pop(mb, None)
        self._outputs.pop(mb, None)

    def backward_input_one(self, mb: int, loss: Tensor | None) -> None:
        """The input part of micro-batch ``mb``'s backward (torch's ``I``): its inputs' gradients,
        sent back; the graph is kept for :meth:`backward_weight_one`, with the gradients reaching
        its frontier."""
        outs, grads = self._seed(mb, loss)
        if self.is_first or not outs:
            self._deferred[mb] = (outs, grads, None)
            return
        grads = seed_grads(outs, grads)
        inputs = self._inputs[mb]
        wanted = [x for x in inputs if x.requires_grad]
        params = [p for p in self.submod.parameters() if p.requires_grad]
        region, frontier = split_backward(outs, wanted, params)
        reached: dict = {}
        handles = [n.register_prehook(lambda gs, n=n: reached.__setitem__(n, list(gs)))
                   for n in frontier if n in region]
        try:
            got = iter(autograd_grad(outs, wanted, grads, retain_graph=True, allow_unused=True)
                       if wanted else [None] * len(wanted))
        finally:
            for h in handles:
                h.remove()
        for o, g in zip(outs, grads):   # (a frontier root outside the region: its seed)
            n = o.grad_fn
            if n is not None and n not in region and n in frontier:
                seeds = reached.setdefault(n, [None] * n.n_outputs)
                seeds[o._out_idx] = g if seeds[o._out_idx] is None else seeds[o._out_idx] + g
        self._deferred[mb] = (outs, grads, (region, frontier, reached))
        self._send_back(mb, [_data_of(next(got)) if x.requires_grad else None for x in inputs])

    def backward_weight_one(self, mb: int) -> None:
        """The weight part of micro-batch ``mb``'s backward (torch's ``W``): its parameters'
        gradients accumulated into their ``.grad``; the whole backward on the first stage."""
        if mb not in self._deferred:
            raise RuntimeError(f"holoflow PipelineStage {self.stage_index}: the weight gradients of micro-batch {mb} "
                               f"before its input gradients; a schedule runs backward_input_one({mb}) first")
        outs, grads, split = self._deferred.pop(mb)
        params = [p for p in self.submod.parameters() if p.requires_grad]
        if outs and split is None:
            run_backward(outs, grads)
        elif outs and params:
            _backward_from_frontier(*split, params)
        self._inputs.pop(mb, None)
        self._outputs.pop(mb, None)

    def finish(self) -> None:
        """Waits for this stage's sends to be taken, and forgets the step."""
        for work, _, dst in self._works:
            _wait(work, "its send to be received by", dst)
        self._clear()


def _backward_from_frontier(region: set, frontier: list, reached: dict, params: list) -> None:
    """The weight part of a split backward: from the gradients that reached each frontier node in
    the input part, with the frontier's edges into that part cut (and its hooks, which ran then,
    held back), the parameters' gradients accumulated into their ``.grad``."""
    roots, grads = [], []
    for n in frontier:
        for i, g in enumerate(reached.get(n, ())):
            if g is not None:
                roots.append(EdgeRoot(n, i))
                grads.append(g)
    if not roots:
        return
    kept = {n: (n.edges, n.hooks, n.retains) for n in frontier}
    for n in frontier:   # (its hooks ran when the input part reached it)
        n.edges = tuple(None if type(e) is tuple and e[0] in region else e for e in n.edges)
        n.hooks = n.retains = None
    try:
        got = engine_backward(roots, grads, False, False, capture=params, accumulate=False)
    finally:
        for n, (edges, hooks, retains) in kept.items():
            n.edges, n.hooks, n.retains = edges, hooks, retains
    accumulate_captured(params, got)


def _data_of(grad: Tensor | None) -> torch.Tensor | None:
    return None if grad is None else grad._data

"""A pipeline stage: one rank's part of the model, and its transfers to the neighbouring stages.

Activations go forward as a small header (each tensor's dtype and shape, pickled) followed by the
tensors; gradients come back shaped as the activations went (zeros for an activation nothing
differentiated). Transfers are point-to-point (torch's isend/irecv), waited for with the
communication timeout, whose error names both ranks."""
from __future__ import annotations

import enum
import pickle
from typing import Any, Sequence

import torch
import torch.distributed as dist

from ..autograd import backward as run_backward
from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..distributed import env
from ..nn.module import Module

__all__ = ["PipelineStage", "SplitPoint", "pipeline"]


class SplitPoint(enum.Enum):
    BEGINNING = 1
    END = 2


def pipeline(*args: Any, **kwargs: Any) -> None:
    raise NotImplementedError("holoflow.distributed.pipelining.pipeline (splitting a traced model at SplitPoints) is "
                              "not supported; give each rank its part of the model as a PipelineStage(submodule, "
                              "stage_index, num_stages, device)")


def _wait(work, what: str, peer: int) -> None:
    try:
        work.wait(timeout=env.comm_timeout())
    except Exception as e:
        raise RuntimeError(f"holoflow pipelining: rank {env.get_rank()} waiting for {what} rank {peer} failed "
                           f"(the peer failed, or did not come within the communication timeout: {e}); every "
                           f"stage's rank must run the same schedule with the same number of micro-batches") from e


def _send_tensors(tensors: list, dst: int, header: bool) -> list:
    """Starts sending ``tensors`` (torch tensors) to global rank ``dst``; ``(work, buffer, dst)``
    for each transfer, to wait on (the buffers kept alive until then)."""
    bufs = []
    if header:
        meta = pickle.dumps([(str(t.dtype).split(".")[-1], tuple(t.shape)) for t in tensors])
        bufs += [torch.tensor([len(meta)], dtype=torch.int64), torch.frombuffer(bytearray(meta), dtype=torch.uint8)]
    bufs += [t.contiguous() for t in tensors]
    return [(dist.isend(b, dst), b, dst) for b in bufs]


def _recv_tensors(src: int, like: list | None) -> list:
    """Receives tensors from global rank ``src``: shaped as ``like`` (dtype, shape) pairs, or as a
    header sent first says."""
    if like is None:
        size = torch.zeros(1, dtype=torch.int64)
        _wait(dist.irecv(size, src), "the activations' header from", src)
        raw = torch.zeros(int(size.item()), dtype=torch.uint8)
        _wait(dist.irecv(raw, src), "the activations' header from", src)
        like = pickle.loads(raw.numpy().tobytes())
    out = []
    for dtype, shape in like:
        buf = torch.empty(shape, dtype=getattr(torch, dtype))
        _wait(dist.irecv(buf, src), "a tensor from", src)
        out.append(buf)
    return out


class PipelineStage:
    """torch's ``PipelineStage(submodule, stage_index, num_stages, device)``: ``submodule`` runs as
    stage ``stage_index`` of ``num_stages``; with ``group`` (global ranks) stage ``i`` of a
    single-stage schedule is on ``group[i]``, of a looped one on ``group[i % len(group)]``."""

    def __init__(self, submodule: Module, stage_index: int, num_stages: int, device: Any,
                 input_args: Any = None, output_args: Any = None, group: Sequence[int] | None = None,
                 dw_builder: Any = None) -> None:
        if not isinstance(submodule, Module):
            raise TypeError(f"holoflow PipelineStage: submodule must be an nn.Module, got {type(submodule).__name__}")
        if not 0 <= stage_index < num_stages:
            raise ValueError(f"holoflow PipelineStage: stage_index {stage_index} is not in [0, {num_stages})")
        if dw_builder is not None:
            raise NotImplementedError("holoflow PipelineStage: dw_builder (zero-bubble weight gradients) is not "
                                      "supported")
        self.submod = submodule
        self.stage_index, self.num_stages = stage_index, num_stages
        self.device = device
        self.group = tuple(range(env.get_world_size())) if group is None else tuple(group)
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
        return self.group[stage % len(self.group)]

    def _clear(self) -> None:
        self._inputs: dict = {}    # micro-batch -> the inputs it ran on (leaves for received ones)
        self._outputs: dict = {}   # micro-batch -> its outputs (the loss's input on the last stage)
        self._results: dict = {}   # micro-batch -> the last stage's outputs, for the step's result
        self._sent: dict = {}      # micro-batch -> the (dtype, shape) of what went forward
        self._works: list = []

    # -- forward -------------------------------------------------------------------------------
    def forward_one(self, mb: int, args: tuple, kwargs: dict) -> Any:
        """Runs micro-batch ``mb``: on the inputs given (first stage) or received, sending the
        outputs on (not the last stage)."""
        if self.is_first:
            inputs = list(args)
        else:
            got = _recv_tensors(self._rank_of(self.stage_index - 1), None)
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
            self._works += _send_tensors(datas, self._rank_of(self.stage_index + 1), header=True)
        return out

    # -- backward ------------------------------------------------------------------------------
    def backward_one(self, mb: int, loss: Tensor | None) -> None:
        """Backpropagates micro-batch ``mb`` (from its loss on the last stage, else from the
        gradients the next stage sends) and sends its inputs' gradients back."""
        if self.is_last:
            if loss is not None and loss.requires_grad:
                run_backward([loss], [None])
        else:
            outs = self._outputs[mb]
            outs = [outs] if isinstance(outs, Tensor) else list(outs)
            grads = _recv_tensors(self._rank_of(self.stage_index + 1), self._sent.pop(mb))
            pairs = [(o, Tensor._make(g)) for o, g in zip(outs, grads) if o.requires_grad]
            if pairs:
                run_backward([o for o, _ in pairs], [g for _, g in pairs])
        if not self.is_first:
            with no_grad():
                back = [(x.grad._data if x.grad is not None else torch.zeros_like(x._data))
                        for x in self._inputs[mb]]
            self._works += _send_tensors(back, self._rank_of(self.stage_index - 1), header=False)
        self._inputs.pop(mb, None)
        self._outputs.pop(mb, None)

    def finish(self) -> None:
        """Waits for this stage's sends to be taken, and forgets the step."""
        for work, _, dst in self._works:
            _wait(work, "its send to be received by", dst)
        self._clear()

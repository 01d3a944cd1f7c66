"""torch's ``torch.distributed.nn.functional``: collectives on local tensors whose gradients flow
back through the matching collective (``all_gather``'s is a reduce-scatter of every rank's
gradient, ``all_reduce``'s an all-reduce, ``broadcast``'s a reduce to the source), as contrastive
losses use them to see every rank's embeddings. Out of place, as torch's: the inputs are left
alone. ``group`` is a group of ``torch.distributed.new_group`` (None: the world)."""
from __future__ import annotations

from typing import Sequence

from ..autograd.function import Function
from ..core.tensor import Tensor
from ..distributed import comm_api, env
from ..distributed.process_group import ReduceOp, get_process_group_ranks
from ..ops.creation import empty_like, zeros_like

__all__ = ["all_gather", "all_reduce", "broadcast", "reduce_scatter", "all_to_all", "all_to_all_single", "reduce"]


def _linear_op(op, fn: str, allowed=("sum", "avg")) -> str:
    """``op``'s name when its gradient is the same reduction of the gradients (SUM, AVG)."""
    name = comm_api._op(op)
    if name not in allowed:
        raise NotImplementedError(f"holoflow.distributed.nn.functional.{fn}: op {name} is not differentiable here; "
                                  f"use ReduceOp.SUM{' or AVG' if 'avg' in allowed else ''} (torch reduces the "
                                  f"gradients with the same op, the derivative only for those)")
    return name


class _AllGather(Function):
    @staticmethod
    def forward(ctx, group, tensor):
        ctx.group = group
        out = [empty_like(tensor) for _ in get_process_group_ranks(group)]
        comm_api.all_gather(out, tensor.detach().contiguous(), group)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        mine = empty_like(grads[0])
        comm_api.reduce_scatter(mine, [g.contiguous() for g in grads], ReduceOp.SUM, ctx.group)
        return None, mine


class _AllReduce(Function):
    @staticmethod
    def forward(ctx, op, group, tensor):
        ctx.op, ctx.group = op, group
        out = tensor.detach().clone()
        comm_api.all_reduce(out, op, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return None, None, _AllReduce.apply(ctx.op, ctx.group, grad)


class _Broadcast(Function):
    @staticmethod
    def forward(ctx, src, group, tensor):
        ctx.src, ctx.group = src, group
        out = tensor.detach().clone()
        comm_api.broadcast(out, src, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        total = _AllReduce.apply("sum", ctx.group, grad)
        return None, None, total if env.get_rank() == ctx.src else zeros_like(grad)


class _Reduce(Function):
    @staticmethod
    def forward(ctx, dst, group, tensor):
        ctx.dst = dst   # (the sum everywhere; only dst's is torch's contract)
        return _AllReduce.forward(ctx, "sum", group, tensor)

    @staticmethod
    def backward(ctx, grad):
        return None, None, _Broadcast.apply(ctx.dst, ctx.group, grad)


class _ReduceScatter(Function):
    @staticmethod
    def forward(ctx, group, output, *inputs):
        ctx.group = group
        out = empty_like(output)
        comm_api.reduce_scatter(out, [t.detach().contiguous() for t in inputs], ReduceOp.SUM, group)
        return out

    @staticmethod
    def backward(ctx, grad):
        return (None, None) + _AllGather.apply(ctx.group, grad)


class _AllToAll(Function):
    @staticmethod
    def forward(ctx, group, shapes, *inputs):
        ctx.group, ctx.in_shapes = group, [tuple(t.shape) for t in inputs]
        out = [inputs[0].new_empty(s) for s in shapes]
        comm_api.all_to_all(out, [t.detach().contiguous() for t in inputs], group)
        return tuple(out)

    @staticmethod
    def backward(ctx, *grads):
        return (None, None) + _AllToAll.apply(ctx.group, ctx.in_shapes, *[g.contiguous() for g in grads])


def all_gather(tensor: Tensor, group: Sequence[int] | None = None) -> tuple:
    """Every rank's ``tensor`` (a tuple in group order); the gradient of this rank's input is the
    sum over ranks of their gradients of its entry."""
    return _AllGather.apply(group, tensor)


def all_reduce(tensor: Tensor, op=ReduceOp.SUM, group: Sequence[int] | None = None) -> Tensor:
    """Every rank's ``tensor`` summed (or averaged), a new tensor; its gradient is reduced back the
    same way."""
    return _AllReduce.apply(_linear_op(op, "all_reduce"), group, tensor)


def broadcast(tensor: Tensor, src: int, group: Sequence[int] | None = None) -> Tensor:
    """Global rank ``src``'s ``tensor`` on every rank; ``src`` gets the sum of the gradients."""
    return _Broadcast.apply(src, group, tensor)


def reduce(tensor: Tensor, dst: int, op=ReduceOp.SUM, group: Sequence[int] | None = None) -> Tensor:
    """The sum of every rank's ``tensor``, defined on global rank ``dst`` (the others get it too);
    every rank's gradient is ``dst``'s, broadcast (torch's)."""
    _linear_op(op, "reduce", ("sum",))
    return _Reduce.apply(dst, group, tensor)


def reduce_scatter(output: Tensor, input_list: list, op=ReduceOp.SUM, group: Sequence[int] | None = None) -> Tensor:
    """This rank's entry of the sum over ranks of ``input_list`` (shaped like ``output``, which is
    left alone); the gradients of ``input_list`` are all-gathered."""
    _linear_op(op, "reduce_scatter", ("sum",))
    return _ReduceScatter.apply(group, output, *input_list)


def all_to_all(output_tensor_list: list, input_tensor_list: list, group: Sequence[int] | None = None) -> tuple:
    """Entry ``i`` of ``input_tensor_list`` goes to the group's rank ``i``; returns what arrives,
    shaped like ``output_tensor_list`` (left alone); gradients go back the same way."""
    return _AllToAll.apply(group, [tuple(t.shape) for t in output_tensor_list], *input_tensor_list)


def all_to_all_single(output: Tensor, input: Tensor, output_split_sizes: Sequence[int] | None = None,  # noqa: A002
                      input_split_sizes: Sequence[int] | None = None, group: Sequence[int] | None = None) -> Tensor:
    """:func:`all_to_all` of ``input``'s pieces along dim 0 (equal, or ``input_split_sizes``),
    concatenated into a tensor shaped like ``output``."""
    from ..ops.shape import cat
    n = len(get_process_group_ranks(group))
    ins = input.split(list(input_split_sizes) if input_split_sizes is not None else input.shape[0] // n, 0)
    outs = output.split(list(output_split_sizes) if output_split_sizes is not None else output.shape[0] // n, 0)
    return cat(list(all_to_all(list(outs), list(ins), group)), 0)

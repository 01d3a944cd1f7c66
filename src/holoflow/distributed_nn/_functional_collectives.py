"""torch's ``torch.distributed._functional_collectives`` (funcol; what mock_torch gives for it):
collectives that return new tensors and leave their inputs alone. torch's results are
``AsyncCollectiveTensor``s waited for at first use; holoflow's collectives have completed when
they return, so ``wait_tensor`` hands back what it gets. The ``*_autograd`` variants are
differentiable (their gradients are the matching collectives); the others are not.

``group`` is any of torch's spellings: a list of global ranks, a list of such lists (this rank's
is the one holding it), a process group (``torch.distributed.new_group``), a 1-D ``DeviceMesh``,
or ``(mesh, mesh_dim)``."""
from __future__ import annotations

from typing import Any, Sequence

from ..autograd.function import Function
from ..core.grad_mode import no_grad
from ..core.tensor import Tensor
from ..distributed import comm_api, env
from ..distributed.device_mesh import DeviceMesh
from ..ops.creation import empty_like
from ..ops.shape import cat
from . import functional as F

__all__ = ["all_reduce", "all_reduce_coalesced", "all_gather_tensor", "all_gather_tensor_autograd",
           "all_gather_into_tensor_coalesced", "reduce_scatter_tensor", "reduce_scatter_tensor_autograd",
           "reduce_scatter_tensor_coalesced", "all_to_all_single", "all_to_all_single_autograd", "broadcast",
           "permute_tensor", "wait_tensor", "AsyncCollectiveTensor"]

_OPS = {"sum": "sum", "avg": "avg", "product": "prod", "min": "min", "max": "max"}


def _ranks(group: Any) -> tuple:
    """The global ranks of ``group`` in torch's funcol spellings."""
    if isinstance(group, tuple) and len(group) == 2 and isinstance(group[0], DeviceMesh):
        return tuple(group[0].get_group(group[1]))
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ValueError(f"holoflow funcol: a {group.ndim}-D DeviceMesh names no single group; pass "
                             f"(mesh, mesh_dim)")
        return tuple(group.get_group())
    if group is None:
        return tuple(range(env.get_world_size()))
    ranks = list(group)
    if ranks and isinstance(ranks[0], (list, tuple)):
        me = env.get_rank()
        mine = [row for row in ranks if me in row]
        if len(mine) != 1:
            raise ValueError(f"holoflow funcol: rank {me} is in {len(mine)} of the groups {ranks}; it must be in one")
        return tuple(mine[0])
    return tuple(int(r) for r in ranks)


def _op(reduce_op: Any) -> str:
    name = str(getattr(reduce_op, "name", reduce_op)).lower().split(".")[-1]
    if name not in _OPS:
        raise ValueError(f"holoflow funcol: reduceOp {reduce_op!r} is not one of {sorted(_OPS)}")
    return _OPS[name]


def wait_tensor(tensor: Tensor) -> Tensor:
    """``tensor`` (holoflow's collectives have completed when they return)."""
    return tensor


class AsyncCollectiveTensor:
    """torch's wrapper of a collective's result in flight; holoflow's results are plain tensors
    (``isinstance`` is False for them), and making one hands back the tensor."""

    def __new__(cls, elem: Tensor) -> Tensor:   # type: ignore[misc]
        return elem


def all_reduce(self: Tensor, reduceOp: str, group: Any, tag: str = "") -> Tensor:  # noqa: N803 (torch's names)
    """Every rank's ``self`` reduced (sum, avg, product, min, max), a new tensor."""
    op = _op(reduceOp)
    with no_grad():
        out = self.detach().clone()
        comm_api.all_reduce(out, op, _ranks(group))
    return out


def all_reduce_coalesced(self: list, reduceOp: str, group: Any, tag: str = "") -> list:  # noqa: N803
    return [all_reduce(t, reduceOp, group) for t in self]


def all_gather_tensor(self: Tensor, gather_dim: int, group: Any, tag: str = "") -> Tensor:
    """Every rank's ``self`` concatenated along ``gather_dim``, in group order."""
    ranks = _ranks(group)
    with no_grad():
        parts = [empty_like(self) for _ in ranks]
        comm_api.all_gather(parts, self.detach().contiguous(), ranks)
        return cat(parts, gather_dim)


def all_gather_tensor_autograd(self: Tensor, gather_dim: int, group: Any, tag: str = "") -> Tensor:
    """:func:`all_gather_tensor` whose gradient is the reduce-scatter of the gradients."""
    return cat(list(F.all_gather(self, _ranks(group))), gather_dim)


def all_gather_into_tensor_coalesced(self: list, group: Any, tag: str = "") -> list:
    return [all_gather_tensor(t, 0, group) for t in self]


def _pieces(t: Tensor, dim: int, n: int, fn: str) -> list:
    if t.shape[dim] % n:
        raise ValueError(f"holoflow funcol.{fn}: dim {dim} of size {t.shape[dim]} does not split into {n} equal "
                         f"pieces (one per rank of the group)")
    return list(t.split(t.shape[dim] // n, dim))


def reduce_scatter_tensor(self: Tensor, reduceOp: str, scatter_dim: int, group: Any,  # noqa: N803
                          tag: str = "") -> Tensor:
    """This rank's piece (along ``scatter_dim``, in group order) of every rank's ``self``
    reduced."""
    ranks = _ranks(group)
    op = _op(reduceOp)
    with no_grad():
        pieces = [p.contiguous() for p in _pieces(self.detach(), scatter_dim, len(ranks), "reduce_scatter_tensor")]
        out = empty_like(pieces[0])
        if op in ("sum", "avg"):
            comm_api.reduce_scatter(out, pieces, "sum", ranks)
            return out / len(ranks) if op == "avg" else out
        whole = self.detach().clone()   # (max/min/product: reduced whole, then this rank's piece)
        comm_api.all_reduce(whole, op, ranks)
        return _pieces(whole, scatter_dim, len(ranks), "reduce_scatter_tensor")[ranks.index(env.get_rank())].clone()


def reduce_scatter_tensor_autograd(self: Tensor, reduceOp: str, scatter_dim: int, group: Any,  # noqa: N803
                                   tag: str = "") -> Tensor:
    """:func:`reduce_scatter_tensor` (sum) whose gradient is the all-gather of the gradients."""
    if _op(reduceOp) != "sum":
        raise NotImplementedError(f"holoflow funcol.reduce_scatter_tensor_autograd: reduceOp {reduceOp!r} is not "
                                  f"differentiable here; use 'sum'")
    ranks = _ranks(group)
    pieces = _pieces(self, scatter_dim, len(ranks), "reduce_scatter_tensor_autograd")
    return F.reduce_scatter(empty_like(pieces[0]), [p.contiguous() for p in pieces], group=ranks)


def reduce_scatter_tensor_coalesced(inputs: list, reduceOp: str, scatter_dim: list, group: Any,  # noqa: N803
                                    tag: str = "") -> list:
    return [reduce_scatter_tensor(t, reduceOp, d, group) for t, d in zip(inputs, scatter_dim)]


def _all_to_all_shape(self: Tensor, output_split_sizes) -> tuple:
    rows = sum(output_split_sizes) if output_split_sizes is not None else self.shape[0]
    return (rows, *self.shape[1:])


def all_to_all_single(self: Tensor, output_split_sizes: Sequence[int] | None,
                      input_split_sizes: Sequence[int] | None, group: Any, tag: str = "") -> Tensor:
    """Piece ``i`` (along dim 0) of every rank's ``self`` goes to the group's rank ``i``, stacked
    in rank order."""
    ranks = _ranks(group)
    with no_grad():
        out = self.new_empty(_all_to_all_shape(self, output_split_sizes))
        return F.all_to_all_single(out, self.detach(), output_split_sizes, input_split_sizes, ranks).detach()


def all_to_all_single_autograd(self: Tensor, output_split_sizes: Sequence[int] | None,
                               input_split_sizes: Sequence[int] | None, group: Any, tag: str = "") -> Tensor:
    """:func:`all_to_all_single` whose gradient goes back the same way."""
    ranks = _ranks(group)
    out = self.new_empty(_all_to_all_shape(self, output_split_sizes))
    return F.all_to_all_single(out, self, output_split_sizes, input_split_sizes, ranks)


def broadcast(self: Tensor, src: int, group: Any, tag: str = "") -> Tensor:
    """Global rank ``src``'s ``self`` on every rank, a new tensor."""
    with no_grad():
        out = self.detach().clone()
        comm_api.broadcast(out, src, _ranks(group))
    return out


class _Permute(Function):
    @staticmethod
    def forward(ctx, src_dst, ranks, tensor):
        ctx.src_dst, ctx.ranks = src_dst, ranks
        return _permute(tensor.detach(), src_dst, ranks)

    @staticmethod
    def backward(ctx, grad):
        back = [0] * len(ctx.src_dst)
        for s, d in enumerate(ctx.src_dst):
            back[d] = s
        return None, None, _permute(grad, back, ctx.ranks)


def _permute(t: Tensor, src_dst: list, ranks: tuple) -> Tensor:
    n = len(ranks)
    me = ranks.index(env.get_rank())
    sender = src_dst.index(me)
    outs = [empty_like(t) if i == sender else t.new_empty((0, *t.shape[1:])) for i in range(n)]
    ins = [t.contiguous() if i == src_dst[me] else t.new_empty((0, *t.shape[1:])) for i in range(n)]
    with no_grad():
        comm_api.all_to_all(outs, ins, ranks)
    return outs[sender]


def permute_tensor(self: Tensor, src_dst: list, group: Any, tag: str = "") -> Tensor:
    """Group rank ``i`` sends ``self`` to group rank ``src_dst[i]`` (a permutation); returns what
    this rank receives."""
    ranks = _ranks(group)
    if sorted(src_dst) != list(range(len(ranks))):
        raise ValueError(f"holoflow funcol.permute_tensor: src_dst {list(src_dst)} must be a permutation of "
                         f"0..{len(ranks) - 1}")
    return _Permute.apply(list(src_dst), ranks, self)

"""Products: matmul (mm, bmm, mv, dot, vdot), einsum (outer), addmm, baddbmm, addbmm, addmv, addr,
linear, cross; matrix functions: matrix_power, matrix_exp, slogdet/logdet, pinverse, cholesky,
cholesky_inverse, cholesky_solve (det/inverse/linalg.cholesky are ops/linalg_solve.py's).

One helper, :func:`einsum_signatures`, turns a subscript string into SBP signatures (one mesh
axis) for every op here; each op only says which subscripts its shapes mean. Every grad is an
einsum of the upstream gradient with the other operands, so double backward composes; the common
cases (linear, matmul without broadcasting) use dedicated mm ops instead, closed under
differentiation, as torch's backward does. The matrix functions' grads are ATen's formulas written
with holoflow ops (matrix_exp's is matrix_exp of a block matrix), so double backward composes;
their SBP splits the batch dims.
"""
from __future__ import annotations

import math
import warnings
from typing import NamedTuple, Sequence

import torch
import torch.nn.functional as F

from ..core import grad_mode, interpret
from ..core.dispatch import apply, apply_inplace
from ..core.errors import DTypeError, ShapeError, UnsupportedError, normalize_dim
from ..core.interpret import is_lazy
from ..core.registry import Meta, Op, alias, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor
from . import elementwise as E
from .creation import full_like
from .family import (broadcast_shapes, contraction_flops, elementwise_sbp, holomorphic, needs, reads_other,
                     reduce_grad)
from .layout import tril, triu
from . import linalg_solve  # (slogdet's gradient of a singular matrix: linalg_solve.INV_EX)
from .linalg_solve import INV, _square, det, inverse
from .linalg_solve import cholesky as _linalg_cholesky
from .shape import PERMUTE, cat

__all__ = ["matmul", "mm", "bmm", "einsum", "outer", "ger", "dot", "inner", "addmm", "baddbmm", "linear",
           "vecdot", "mv", "vdot", "addmv", "addr", "addbmm", "cross", "matrix_power", "matrix_exp", "slogdet",
           "logdet", "pinverse", "cholesky", "cholesky_inverse", "cholesky_solve"]

_LETTERS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"


# -- subscripts -> signatures -------------------------------------------------------------------

def einsum_signatures(ins: Sequence[str], out: str, shapes: Sequence[tuple],
                      addend: tuple | None = None, addend_first: bool = False) -> list:
    """Legal signatures of ``ins -> out`` for one mesh axis, as data.

    - all B -> B;
    - an index kept in the output, split in every operand that carries it -> S of the output
      (a batch index, or an index of one operand only; a size-1 broadcast carrier stays B);
    - a contracted index split in every operand that carries it -> P;
    - P in one operand, B elsewhere -> P (the op is linear in each operand).
    ``addend`` is the shape of a tensor added to the output (addmm's input, linear's bias): it is
    split like the output on kept indexes and must be P wherever the output is P.
    """
    size: dict[str, int] = {}
    for sub, shape in zip(ins, shapes):
        for c, d in zip(sub, shape):
            size[c] = d if d != 1 else size.get(c, 1)
    add_sub = out[len(out) - len(addend):] if addend is not None else ""

    def carrier(sub: str, shape: tuple, c: str):
        return S(sub.index(c)) if c in sub and shape[sub.index(c)] == size[c] else B

    def sig(ops: list, add, res):
        if addend is None:
            return (tuple(ops), (res,))
        return ((add, *ops) if addend_first else (*ops, add), (res,))

    n = len(ins)
    sigs = [sig([B] * n, B, B)]
    for c in dict.fromkeys("".join(ins)):
        if any(sub.count(c) > 1 for sub in ins):
            continue  # a diagonal: one tensor cannot be split on two axes at once
        ops = [carrier(sub, shape, c) for sub, shape in zip(ins, shapes)]
        if c in out:
            sigs.append(sig(ops, carrier(add_sub, addend, c) if addend is not None else B, S(out.index(c))))
        else:
            sigs.append(sig(ops, P, P))
    for i in range(n):
        sigs.append(sig([P if j == i else B for j in range(n)], P, P))
    return sigs


def parse_einsum(equation: str, shapes: Sequence[tuple]) -> tuple[list[str], str]:
    """The explicit form of ``equation``: ellipses spelled out with fresh letters, the implicit
    output (ellipsis dims, then letters seen once, sorted) made explicit."""
    eq = equation.replace(" ", "")
    lhs, arrow, rhs = eq.partition("->")
    ins = lhs.split(",")
    if len(ins) != len(shapes):
        raise ShapeError(f"holoflow.einsum: {equation!r} names {len(ins)} operands but {len(shapes)} were given")
    fresh = [c for c in _LETTERS if c not in eq]
    n_ell = max((len(s) - len(sub) + 3 for sub, s in zip(ins, shapes) if "..." in sub), default=0)
    ell = "".join(fresh[:n_ell])
    explicit = []
    for i, (sub, shape) in enumerate(zip(ins, shapes)):
        if "..." in sub:
            sub = sub.replace("...", ell[n_ell - (len(shape) - len(sub) + 3):])
        if len(sub) != len(shape) or not sub.isalpha() and sub:
            raise ShapeError(f"holoflow.einsum: operand {i} has shape {tuple(shape)} but subscripts "
                             f"{ins[i]!r} name {len(sub)} dims")
        explicit.append(sub)
    if arrow:
        out = rhs.replace("...", ell)
    else:
        seen = "".join(explicit)
        out = ell + "".join(sorted(c for c in set(seen) if seen.count(c) == 1 and c not in ell))
    return explicit, out


def _shapes(metas) -> list[tuple]:
    return [tuple(m.shape) for m in metas if isinstance(m, Meta)]


# -- einsum, and the gradient of one operand of any product --------------------------------------

def _const(factory, size, like: Tensor) -> Tensor:
    """``factory(size)`` (torch.eye / torch.ones) made directly with ``like``'s dtype and device
    (``like.device``: inside nn.Graph's trace ``like._data`` is meta, the constant must hold values)."""
    return Tensor._make(factory(size, dtype=like._data.dtype, device=like.device.torch))


def operand_grad(ins: Sequence[str], out: str, operands: Sequence[Tensor], dy: Tensor, i: int) -> Tensor:
    """d(einsum(ins -> out))/d operand i, contracted with ``dy``: an einsum of ``dy`` with the
    other operands; identity matrices restore a diagonal (a repeated index), a ones vector an
    index summed in operand i alone. Broadcast (size-1) dims are summed back by the caller."""
    fresh = iter(c for c in _LETTERS if c not in "".join(ins) + out)
    size = {c: d for sub, x in zip(ins, operands) for c, d in zip(sub, x.shape) if d != 1}
    target, subs, ops = "", [out] + [s for j, s in enumerate(ins) if j != i], \
        [dy] + [x for j, x in enumerate(operands) if j != i]
    for c, d in zip(ins[i], operands[i].shape):
        if c in target:
            f = next(fresh)
            subs.append(c + f)
            ops.append(_const(torch.eye, size.get(c, d), dy))
            c = f
        target += c
    missing = "".join(c for c in target if c not in "".join(subs))
    if missing:
        subs.append(missing)
        ops.append(_const(torch.ones, [size.get(c, operands[i].shape[target.index(c)]) for c in missing], dy))
    return apply(EINSUM, *ops, equation=",".join(subs) + "->" + target)


def _einsum_sbp(metas, attrs):
    ins, out = parse_einsum(attrs["equation"], _shapes(metas))
    return einsum_signatures(ins, out, _shapes(metas))


def _einsum_grad(c, dy):
    ins, out = parse_einsum(c.equation, [tuple(s) for s in c.shapes])
    return tuple(reduce_grad(operand_grad(ins, out, c.inputs, dy, i), c, i) if needs(c, i) else None
                 for i in range(len(ins)))


def _einsum_kernel(*ops, equation):
    """torch.einsum, never aliasing an operand (``ij->ji``, ``ii->i`` are views in torch)."""
    out = torch.einsum(equation, *ops)
    # by view bases, not storage pointers: fake tensors (enable_compile traces kernels) have none
    base = out._base
    if base is not None and any(x is base or x._base is base for x in ops):
        out = out.clone()
    return out


EINSUM = holomorphic(defop("einsum", _einsum_kernel, grad=_einsum_grad,
               save="inputs", sbp=_einsum_sbp, family="einsum"))


# -- matmul ---------------------------------------------------------------------------------------

def matmul_subscripts(sa: tuple, sb: tuple) -> tuple[list[str], str]:
    """torch.matmul's cases as einsum subscripts: 1-D operands are vectors, leading dims batch."""
    nb = max(len(sa) - 2, len(sb) - 2, 0)
    batch = _LETTERS[:nb]
    a = batch[nb - len(sa) + 2:] + "mk" if len(sa) > 1 else "k"
    b = batch[nb - len(sb) + 2:] + "kn" if len(sb) > 1 else "k"
    return [a, b], batch + ("m" if len(sa) > 1 else "") + ("n" if len(sb) > 1 else "")


def _same_dtype(name: str, *metas) -> torch.dtype:
    dts = {m.dtype for m in metas if isinstance(m, Meta)}
    if len(dts) > 1:
        shown = " and ".join(str(d).replace("torch.", "holoflow.") for d in dts)
        raise DTypeError(f"holoflow.{name}: operands have dtypes {shown}; they must match (cast one)")
    return dts.pop()


def matmul_shape(name: str, sa: tuple, sb: tuple) -> tuple:
    """The result shape of ``matmul(a, b)``, or a clear error naming both shapes."""
    if not sa or not sb:
        raise ShapeError(f"holoflow.{name}: both operands need at least 1 dim, got shapes {sa} and {sb}")
    ka, kb = sa[-1], sb[-2] if len(sb) > 1 else sb[0]
    if ka != kb:
        raise ShapeError(f"holoflow.{name}: shapes {sa} and {sb} cannot be multiplied: the contracted "
                         f"dims are {ka} and {kb}; they must match")
    try:
        batch = broadcast_shapes(name, [sa[:-2], sb[:-2]])
    except ShapeError:
        raise ShapeError(f"holoflow.{name}: shapes {sa} and {sb} cannot be multiplied: their batch dims "
                         f"{sa[:-2]} and {sb[:-2]} cannot be broadcast") from None
    return batch + sa[-2:-1] * (len(sa) > 1) + sb[-1:] * (len(sb) > 1)


def _matmul_shape(metas, attrs):
    a, b = metas
    dt = _same_dtype("matmul", a, b)
    return [Meta(matmul_shape("matmul", tuple(a.shape), tuple(b.shape)), dt, a.device)]


def _matmul_sbp(metas, attrs):
    shapes = _shapes(metas)
    return einsum_signatures(*matmul_subscripts(*shapes), shapes)


class _ShapeOnly:
    """An operand a gradient reads the shape of, not the values (it was not saved)."""

    __slots__ = ("shape",)

    def __init__(self, shape: tuple) -> None:
        self.shape = shape


def _matmul_grad(c, dy):
    sa, sb = (tuple(s) for s in c.shapes)
    a, b = c.inputs   # (each saved only where the other's gradient is wanted, as torch's)
    if len(sa) >= 2 and len(sb) >= 2 and sa[:-2] == sb[:-2]:  # mm / bmm, no broadcasting
        return (apply(MATMUL_GRAD_A, dy, b) if needs(c, 0) else None,
                apply(MATMUL_GRAD_B, a, dy) if needs(c, 1) else None)
    ins, out = matmul_subscripts(sa, sb)
    operands = [a if a is not None else _ShapeOnly(sa), b if b is not None else _ShapeOnly(sb)]
    return tuple(reduce_grad(operand_grad(ins, out, operands, dy, i), c, i) if needs(c, i) else None
                 for i in range(2))


def _matmul_add_to_output(shapes: tuple, beta, alpha):
    """``beta * r + alpha * (a @ b)`` as one ``addmm`` (2-D) or ``baddbmm`` (3-D) call; None for
    vectors or broadcast batch dims, which have no such kernel (graph/passes/fuse_add_to_output.py)."""
    if len(shapes) != 2 or None in shapes or len(shapes[0]) != len(shapes[1]):
        return None
    if len(shapes[0]) == 2:
        return lambda a, b, r: torch.addmm(r, a, b, beta=beta, alpha=alpha)
    if len(shapes[0]) == 3 and shapes[0][0] == shapes[1][0]:
        return lambda a, b, r: torch.baddbmm(r, a, b, beta=beta, alpha=alpha)
    return None


MATMUL = holomorphic(defop("matmul", torch.matmul, grad=_matmul_grad, save="inputs", saved_inputs=reads_other,
                           shape=_matmul_shape, sbp=_matmul_sbp, family="einsum",
                           add_to_output=_matmul_add_to_output))


# matmul's gradients for y = a @ b with equal batch dims (torch's mm/bmm backward), as their own
# ops, closed under differentiation with MATMUL: da = dy @ b^T, db = a^T @ dy.
def _mga_kernel(dy, b):
    return torch.matmul(dy, b.mT)


def _mgb_kernel(a, dy):
    return torch.matmul(a.mT, dy)


def _mga_grad(c, g):  # out = dy @ b^T, g has a's shape
    dy, b = c.inputs
    return (apply(MATMUL, g, b) if needs(c, 0) else None,
            apply(MATMUL_GRAD_B, g, dy) if needs(c, 1) else None)


def _mgb_grad(c, g):  # out = a^T @ dy, g has b's shape
    a, dy = c.inputs
    return (apply(MATMUL_GRAD_A, dy, g) if needs(c, 0) else None,
            apply(MATMUL, a, g) if needs(c, 1) else None)


def _mg_sbp(subs: tuple[str, str, str]):
    """The SBP rule of a matmul gradient whose operands/output are ``...<subs>`` over shared batch dims."""
    def sbp(metas, attrs):
        shapes = _shapes(metas)
        batch = _LETTERS[:len(shapes[0]) - 2]
        return einsum_signatures([batch + subs[0], batch + subs[1]], batch + subs[2], shapes)
    return sbp


# holomorphic (bilinear, unconjugated kernels): double backward of complex products conjugates as torch's
MATMUL_GRAD_A = holomorphic(defop("matmul_grad_a", _mga_kernel, grad=_mga_grad, save="inputs",
                                  sbp=_mg_sbp(("mn", "kn", "mk")), family="einsum"))
MATMUL_GRAD_B = holomorphic(defop("matmul_grad_b", _mgb_kernel, grad=_mgb_grad, save="inputs",
                                  sbp=_mg_sbp(("mk", "mn", "kn")), family="einsum"))


# -- addmm, baddbmm, addmv, addr, addbmm: beta * input + alpha * (a product of two operands) -----

def _product_shape(name: str, ins: list[str], out: str, sa: tuple, sb: tuple) -> tuple:
    """The result shape of ``ins -> out`` for operands of exactly these subscripts (no broadcasting
    between them; ``k`` is the contracted index, ``b`` the batch), or a clear error naming both shapes."""
    if len(sa) != len(ins[0]) or len(sb) != len(ins[1]):
        raise ShapeError(f"holoflow.{name}: expects a {len(ins[0])}-D and a {len(ins[1])}-D operand, got shapes "
                         f"{sa} and {sb}")
    size = dict(zip(ins[0], sa))
    for c, d in zip(ins[1], sb):
        if c in size and size[c] != d:
            if c != "k":
                raise ShapeError(f"holoflow.{name}: batch sizes of {sa} and {sb} differ")
            raise ShapeError(f"holoflow.{name}: shapes {sa} and {sb} cannot be multiplied: the contracted dims "
                             f"are {size[c]} and {d}; they must match")
        size[c] = d
    return tuple(size[c] for c in out)


class _Shape(NamedTuple):
    """An operand's shape, where its value isn't saved (operand_grad reads no more of it)."""
    shape: tuple


def _reads_other_operand(needs: tuple) -> tuple[int, ...]:
    """``saved_inputs`` of the addmm family: each operand's gradient reads the other one; the
    input's (``dy * beta``) reads none, so an in-place change of it after stays legal, as torch's."""
    return tuple(j for j, i in ((2, 1), (1, 2)) if needs[i])


def _addmm_family(name: str, ins: list[str], out: str):
    """``torch.<name>(input, a, b, *, beta, alpha)``: ``beta * input + alpha * einsum(ins -> out)``
    with ``input`` broadcast to the product's shape."""
    fn = getattr(torch, name)

    def kernel(i, a, b, beta, alpha):
        return fn(i, a, b, beta=beta, alpha=alpha)

    def inplace_kernel(i, a, b, beta, alpha):
        return getattr(i, name + "_")(a, b, beta=beta, alpha=alpha)

    def shape(metas, attrs):
        inp, a, b = metas
        dt = _same_dtype(name, inp, a, b)
        res = _product_shape(name, ins, out, tuple(a.shape), tuple(b.shape))
        if broadcast_shapes(name, [tuple(inp.shape), res]) != res:
            raise ShapeError(f"holoflow.{name}: input of shape {tuple(inp.shape)} does not broadcast "
                             f"to the product's shape {res}")
        return [Meta(res, dt, a.device)]

    def sbp(metas, attrs):
        inp, a, b = _shapes(metas)
        return einsum_signatures(ins, out, [a, b], addend=inp, addend_first=True)

    def grad(c, dy):
        # (an operand is saved only for the other's gradient, as torch's: its shape stands in)
        _, a, b = (x if x is not None else _Shape(c.shapes[k]) for k, x in enumerate(c.inputs))
        g_in = reduce_grad(dy * c.beta, c, 0) if needs(c, 0) else None
        g = [reduce_grad(operand_grad(ins, out, (a, b), dy, i) * c.alpha, c, i + 1) if needs(c, i + 1)
             else None for i in range(2)]
        return (g_in, *g)
    # holomorphic: complex operands take torch's conjugated gradients (dy @ b^H, a^H @ dy, conj(beta) dy)
    return holomorphic(defop(name, kernel, grad=grad, save="inputs", saved_inputs=_reads_other_operand,
                             shape=shape, sbp=sbp, family="einsum",
                             inplace_kernel=inplace_kernel,
                             flops=lambda i, o, attrs: contraction_flops(i[1:], o, attrs)))   # addend: no operand


ADDMM = _addmm_family("addmm", ["ik", "kj"], "ij")
BADDBMM = _addmm_family("baddbmm", ["bik", "bkj"], "bij")
ADDBMM = _addmm_family("addbmm", ["bik", "bkj"], "ij")
ADDMV = _addmm_family("addmv", ["ik", "k"], "i")
ADDR = _addmm_family("addr", ["i", "j"], "ij")


# -- linear: x @ w.T + b as one op ---------------------------------------------------------------

def linear_subscripts(sx: tuple, sw: tuple) -> tuple[list[str], str]:
    batch = _LETTERS[:max(len(sx) - 1, 0)]
    w = "nk" if len(sw) == 2 else "k"
    return [batch + "k", w], batch + ("n" if len(sw) == 2 else "")


def _linear_shape(metas, attrs):
    x, w, b = metas
    dt = _same_dtype("linear", x, w, b)
    sx, sw = tuple(x.shape), tuple(w.shape)
    if not sx or len(sw) not in (1, 2) or sx[-1] != sw[-1]:
        raise ShapeError(f"holoflow.linear: input {sx} and weight {sw} cannot be multiplied: the input's "
                         f"last dim must equal the weight's in_features (its last dim), and the weight "
                         f"must have 1 or 2 dims")
    res = sx[:-1] + sw[:1] * (len(sw) == 2)
    if isinstance(b, Meta) and broadcast_shapes("linear", [tuple(b.shape), res]) != res:
        raise ShapeError(f"holoflow.linear: bias of shape {tuple(b.shape)} does not broadcast to the "
                         f"output's shape {res}")
    return [Meta(res, dt, x.device)]


def _linear_sbp(metas, attrs):
    x, w, b = metas
    ins, out = linear_subscripts(tuple(x.shape), tuple(w.shape))
    bias = tuple(b.shape) if isinstance(b, Meta) else None
    return einsum_signatures(ins, out, [tuple(x.shape), tuple(w.shape)], addend=bias)


def _linear_grad(c, dy):
    x, w, _ = c.inputs   # (each saved only where the other's gradient is wanted, as torch's)
    if len(c.shapes[1]) == 2 and len(c.shapes[0]) >= 1:  # the common case: one mm per operand
        if _one_backward_op(c) and ((x is not None and w is not None) or (  # (local: one saved is enough)
                (x is not None or w is not None) and not any(t is not None and t._global is not None
                                                             for t in (dy, x, w)))):
            mask = c.needs_grad
            dx, dw, db = apply(LINEAR_BACKWARD, dy, x, w, output_mask=mask)
            return dx if mask[0] else None, dw if mask[1] else None, db if mask[2] else None
        return (apply(LINEAR_GRAD_INPUT, dy, w) if needs(c, 0) else None,
                apply(LINEAR_GRAD_WEIGHT, dy, x) if needs(c, 1) else None,
                reduce_grad(dy, c, 2) if needs(c, 2) else None)
    sx, sw = tuple(c.shapes[0]), tuple(c.shapes[1])
    ins, out = linear_subscripts(sx, sw)
    operands = (x if x is not None else _ShapeOnly(sx), w if w is not None else _ShapeOnly(sw))
    return (operand_grad(ins, out, operands, dy, 0) if needs(c, 0) else None,
            operand_grad(ins, out, operands, dy, 1) if needs(c, 1) else None,
            reduce_grad(dy, c, 2) if needs(c, 2) else None)


# linear's gradients as their own ops (torch's linear backward: one mm each), closed under
# differentiation: for y = x @ w.T, dx = dy @ w and dw = dy.T @ x over the flattened batch.
def _lgi_kernel(dy, w):
    return torch.matmul(dy, w)


def _rows(t: torch.Tensor) -> torch.Tensor:
    """``t`` as a matrix of its last dim's rows (``reshape(-1, n)``, which cannot infer the row
    count when ``n`` is 0: a Linear with no inputs or no outputs, as AdaptiveLogSoftmax makes)."""
    return t.reshape(math.prod(t.shape[:-1]), t.shape[-1])


def _lgw_kernel(dy, x):
    return torch.mm(_rows(dy).t(), _rows(x))


def _lgi_grad(c, g):  # out = dy @ w
    dy, w = c.inputs
    return (apply(LINEAR, g, w, None) if needs(c, 0) else None,
            apply(LINEAR_GRAD_WEIGHT, dy, g) if needs(c, 1) else None)


def _lgw_grad(c, g):  # out = dy.T @ x, g has the weight's shape (o, i)
    dy, x = c.inputs
    return (apply(LINEAR, x, g, None) if needs(c, 0) else None,
            apply(LINEAR_GRAD_INPUT, dy, g) if needs(c, 1) else None)


def _lg_subscripts(nd: int) -> str:
    return _LETTERS[:max(nd - 1, 0)]


def _lgi_sbp(metas, attrs):
    dy, w = metas
    b = _lg_subscripts(len(dy.shape))
    return einsum_signatures([b + "n", "nk"], b + "k", [tuple(dy.shape), tuple(w.shape)])


def _lgw_sbp(metas, attrs):
    dy, x = metas
    b = _lg_subscripts(len(dy.shape))
    return einsum_signatures([b + "n", b + "k"], "nk", [tuple(dy.shape), tuple(x.shape)])


LINEAR_GRAD_INPUT = holomorphic(defop("linear_grad_input", _lgi_kernel, grad=_lgi_grad, save="inputs",
                                      sbp=_lgi_sbp, family="einsum"))
LINEAR_GRAD_WEIGHT = holomorphic(defop("linear_grad_weight", _lgw_kernel, grad=_lgw_grad, save="inputs",
                                       sbp=_lgw_sbp, family="einsum"))


# Eager backward without create_graph runs linear's three gradients as one op (one dispatch
# instead of three, as torch's linear backward is one node). A trace keeps linear_grad_input /
# linear_grad_weight / sum_to_size as separate nodes: graph passes schedule them apart (zero-bubble
# pipelines defer the weight part, memory planning frees activations early); double backward
# keeps them too, since they are closed under differentiation and this op is not.
def _one_backward_op(c) -> bool:
    bias = c.shapes[2]
    return (not grad_mode.STATE.enabled and (bias is None or tuple(bias) == tuple(c.shapes[1][:1]))
            and not is_lazy())


def _zeros(shape, like: torch.Tensor) -> torch.Tensor:
    return torch.zeros((), dtype=like.dtype, device=like.device).expand(shape)


def _linear_bwd_kernel(dy, x, w, output_mask):
    """``(dy @ w, dy.T @ x, dy summed over the batch)`` on the flattened batch; an output the
    mask switches off is zeros (an expanded scalar). ``x`` (``w``) is None where only ``x``'s
    (``w``'s) gradient is wanted: linear saves what the wanted gradients read."""
    o = dy.shape[-1]
    dy2 = _rows(dy)
    dx = torch.matmul(dy, w) if output_mask[0] else \
        _zeros(dy.shape[:-1] + (w if w is not None else x).shape[-1:], dy)
    dw = torch.mm(dy2.t(), _rows(x)) if output_mask[1] else \
        _zeros((o, (x if x is not None else w).shape[-1]), dy)
    db = dy2.sum(0) if output_mask[2] else _zeros((o,), dy)
    return dx, dw, db


def _linear_bwd_sbp(metas, attrs):
    """Each output reads two of the inputs (dx: dy and w; dw: dy and x; db: dy), so a signature
    joins one of linear_grad_input's and one of linear_grad_weight's on dy's SBP."""
    dy, x, w = metas
    dx_sigs = _lgi_sbp((dy, w), attrs)
    dw_sigs = _lgw_sbp((dy, x), attrs)
    last = len(dy.shape) - 1
    sigs = []
    for (s_dy, s_w), (o_dx,) in dx_sigs:
        for (s_dy2, s_x), (o_dw,) in dw_sigs:
            if s_dy2 != s_dy:
                continue
            o_db = (S(0) if s_dy.axis == last else P) if isinstance(s_dy, S) else s_dy
            sigs.append(((s_dy, s_x, s_w), (o_dx, o_dw, o_db)))
    return list(dict.fromkeys(sigs))


def _linear_bwd_no_grad(c, *dys):
    raise UnsupportedError("holoflow.linear_backward: not differentiable; linear's double backward "
                           "runs linear_grad_input / linear_grad_weight instead (create_graph=True)")


LINEAR_BACKWARD = defop("linear_backward", _linear_bwd_kernel, grad=_linear_bwd_no_grad, sbp=_linear_bwd_sbp,
                        family="einsum", mask_split=True,   # (dy, x, w): the input and weight products
                        flops=lambda i, o, attrs: 4.0 * math.prod(i[0]) * i[2][-1])


def _linear_add_to_output(shapes: tuple, beta, alpha):
    """``beta * r + alpha * linear(x, w, bias)`` as ``addmm(r, x, w.t())`` on the flattened batch,
    then the bias added (the unfused order is ``(x @ w.T + bias) + r``: equal to rounding)."""
    if not shapes[0] or shapes[1] is None or len(shapes[1]) != 2:
        return None

    def linear_add(x, w, bias, r):
        out = torch.addmm(_rows(r), _rows(x), w.t(),
                          beta=beta, alpha=alpha).reshape(r.shape)
        return out if bias is None else out.add_(bias, alpha=alpha)
    return linear_add


LINEAR = holomorphic(defop("linear", F.linear, grad=_linear_grad, save="inputs", saved_inputs=reads_other,
                           shape=_linear_shape,
                           sbp=_linear_sbp, family="einsum", add_to_output=_linear_add_to_output))


# -- public functions ---------------------------------------------------------------------------

def matmul(input: Tensor, other: Tensor) -> Tensor:
    """Matrix product with torch's rules: 1-D operands are vectors, leading dims broadcast.

    >>> holoflow.matmul(holoflow.ones(2, 3), holoflow.ones(3)).tolist()
    [3.0, 3.0]
    """
    return apply(MATMUL, input, other)


def _need_dims(name: str, nd: int, *xs: Tensor) -> None:
    if any(x.dim() != nd for x in xs):
        shown = " and ".join(str(tuple(x.shape)) for x in xs)
        raise ShapeError(f"holoflow.{name}: expects {nd}-D operands, got shapes {shown}")


def mm(input: Tensor, mat2: Tensor) -> Tensor:
    """Product of two matrices (no broadcasting)."""
    _need_dims("mm", 2, input, mat2)
    matmul_shape("mm", tuple(input.shape), tuple(mat2.shape))
    return apply(MATMUL, input, mat2)


def bmm(input: Tensor, mat2: Tensor) -> Tensor:
    """Batched product of ``(b, n, k)`` and ``(b, k, m)`` (no broadcasting)."""
    _need_dims("bmm", 3, input, mat2)
    if input.shape[0] != mat2.shape[0]:
        raise ShapeError(f"holoflow.bmm: batch sizes of {tuple(input.shape)} and {tuple(mat2.shape)} differ")
    matmul_shape("bmm", tuple(input.shape), tuple(mat2.shape))
    return apply(MATMUL, input, mat2)


# matmul on vectors under torch's own names: autocast lists them apart (CPU casts none of them;
# CUDA runs mv in its low dtype and promotes dot and vdot), as the graph's AMP pass does
DOT, VDOT, MV = alias(MATMUL, "dot"), alias(MATMUL, "vdot"), alias(MATMUL, "mv")


def dot(input: Tensor, other: Tensor) -> Tensor:
    """Inner product of two 1-D tensors of equal length."""
    _need_dims("dot", 1, input, other)
    matmul_shape("dot", tuple(input.shape), tuple(other.shape))
    return apply(DOT, input, other)


def inner(input: Tensor, other: Tensor) -> Tensor:
    """Sum over the last dims of both (``a @ b.mT``-like for any dims)."""
    if input.dim() == 0 or other.dim() == 0:
        return input * other
    if input.shape[-1] != other.shape[-1]:
        raise ShapeError(f"holoflow.inner: the last dims of {tuple(input.shape)} and {tuple(other.shape)} differ")
    if input.dim() == other.dim() == 2:   # torch's tensordot: one mm (its summation order with inf/NaN)
        return matmul(input, other.mT)
    return apply(EINSUM, input, other, equation=_inner_eq(input.dim(), other.dim()))


def _inner_eq(na: int, nb: int) -> str:
    a, b = _LETTERS[:na - 1], _LETTERS[na - 1:na + nb - 2]
    return f"{a}z,{b}z->{a}{b}"


def _sublist_subscripts(op: int, sublist) -> str:
    """torch's sublist form: ints in [0, 52) name dims (0..25 -> A..Z, 26..51 -> a..z), ``...``
    an ellipsis."""
    out = []
    for s in sublist:
        if s is Ellipsis:
            out.append("...")
        elif isinstance(s, int) and 0 <= s < 52:
            out.append(chr(ord("A") + s) if s < 26 else chr(ord("a") + s - 26))
        else:
            raise ValueError(f"holoflow.einsum: subscript in subscript list of operand {op} is not within the "
                             f"valid range [0, 52), got {s!r}")
    return "".join(out)


def _sublist_equation(args: tuple) -> tuple[str, tuple]:
    """``einsum(a, [0, 1], b, [1, 2], [0, 2])`` -> ``("AB,BC->AC", (a, b))``."""
    n = len(args) // 2
    operands, subs = args[0:2 * n:2], args[1:2 * n:2]
    eq = ",".join(_sublist_subscripts(i, s) for i, s in enumerate(subs))
    if len(args) % 2:                                   # odd count: the output sublist closes the list
        eq += "->" + _sublist_subscripts(n, args[-1])
    return eq, tuple(operands)


def einsum(equation: str, *operands) -> Tensor:
    """Einstein summation, as ``torch.einsum`` (operands as arguments or one list, or torch's
    sublist form ``einsum(a, [0, 1], b, [1, 2], [0, 2])``).

    >>> holoflow.einsum("ij,jk->ik", a, b)   # matmul
    """
    if not isinstance(equation, str):
        equation, operands = _sublist_equation((equation,) + operands)
    if len(operands) == 1 and isinstance(operands[0], (list, tuple)):
        operands = tuple(operands[0])
    if len(operands) == 1 and isinstance(operands[0], Tensor):
        ins, out = parse_einsum(equation, [tuple(operands[0].shape)])
        if len(set(ins[0])) == len(ins[0]) and sorted(out) == sorted(ins[0]):
            # a permutation of one operand: torch's einsum returns a view (writes through it reach
            # the operand), not a copy
            return apply(PERMUTE, operands[0], dims=tuple(ins[0].index(c) for c in out))
    return _contract(EINSUM, equation, operands)


def _contract(op: Op, equation: str, operands: tuple) -> Tensor:
    ins, out = parse_einsum(equation, [tuple(x.shape) for x in operands])
    return apply(op, *operands, equation=",".join(ins) + "->" + out)


# bilinear's contraction, torch's ``_trilinear``: its own op for autocast (on no list: CPU runs it
# in its inputs' dtype; CUDA promotes bilinear's inputs first)
TRILINEAR = alias(EINSUM, "trilinear")


def trilinear(equation: str, *operands) -> Tensor:
    """``einsum(equation, *operands)`` as the op ``trilinear`` (nn.functional.bilinear's)."""
    return _contract(TRILINEAR, equation, operands)


def outer(input: Tensor, vec2: Tensor) -> Tensor:
    """Outer product of two 1-D tensors: a column times a row, as torch computes it (a product,
    so autocast casts nothing)."""
    _need_dims("outer", 1, input, vec2)
    return input.reshape(-1, 1) * vec2


ger = outer


def vecdot(x: Tensor, y: Tensor, *, dim: int = -1) -> Tensor:
    """Dot product over ``dim`` with broadcasting; complex ``x`` is conjugated, as torch's
    ``linalg.vecdot`` does (``sum(conj(x) * y)``)."""
    x, y = interpret.composite("linalg_vecdot", x, y)   # (autocast: a low-precision op, as matmul)
    return ((x.conj() if x.is_complex() else x) * y).sum(dim)


def addmm(input: Tensor, mat1: Tensor, mat2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * (mat1 @ mat2)``."""
    return apply(ADDMM, input, mat1, mat2, beta=beta, alpha=alpha)


def baddbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * bmm(batch1, batch2)``."""
    return apply(BADDBMM, input, batch1, batch2, beta=beta, alpha=alpha)


def addbmm(input: Tensor, batch1: Tensor, batch2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * sum_b(batch1[b] @ batch2[b])``."""
    return apply(ADDBMM, input, batch1, batch2, beta=beta, alpha=alpha)


def addmv(input: Tensor, mat: Tensor, vec: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * (mat @ vec)``."""
    return apply(ADDMV, input, mat, vec, beta=beta, alpha=alpha)


def addr(input: Tensor, vec1: Tensor, vec2: Tensor, *, beta=1, alpha=1) -> Tensor:
    """``beta * input + alpha * outer(vec1, vec2)``."""
    return apply(ADDR, input, vec1, vec2, beta=beta, alpha=alpha)


def _addmm_inplace(op):
    """``x.addmm_(a, b, *, beta, alpha)`` and its kin: the product written into ``x``."""
    def method(self: Tensor, a: Tensor, b: Tensor, *, beta=1, alpha=1) -> Tensor:
        return apply_inplace(op, self, a, b, beta=beta, alpha=alpha)
    method.__name__ = method.__qualname__ = op.name + "_"
    return method


def linear(input: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``input @ weight.T + bias`` (``torch.nn.functional.linear``), one op."""
    return apply(LINEAR, input, weight, bias)


def mv(input: Tensor, vec: Tensor) -> Tensor:
    """Product of a matrix and a vector (no broadcasting)."""
    if input.dim() != 2 or vec.dim() != 1:
        raise ShapeError(f"holoflow.mv: expects a 2-D matrix and a 1-D vector, got shapes {tuple(input.shape)} "
                         f"and {tuple(vec.shape)}")
    matmul_shape("mv", tuple(input.shape), tuple(vec.shape))
    return apply(MV, input, vec)


def _conj(x: Tensor) -> Tensor:
    return x.conj() if x.is_complex() else x


def _adjoint(x: Tensor) -> Tensor:
    """The conjugate transpose of the last two dims (the transpose of a real matrix)."""
    return _conj(x.mT)


def vdot(input: Tensor, other: Tensor) -> Tensor:
    """``sum(conj(input) * other)`` of two 1-D tensors of equal length."""
    _need_dims("vdot", 1, input, other)
    matmul_shape("vdot", tuple(input.shape), tuple(other.shape))
    return apply(VDOT, _conj(input), other)


# -- cross product ----------------------------------------------------------------------------------

def _cross_sbp(metas, attrs):
    """Elementwise signatures (with broadcasting) except a split of ``dim``; bilinear: P in one operand."""
    return [s for s in elementwise_sbp(("PB", "BP"))(metas, attrs) if s[1] != (S(attrs["dim"]),)]


def _cross_grad(c, dy):
    a, b = c.inputs
    return (reduce_grad(apply(CROSS, _conj(b), dy, dim=c.dim), c, 0) if needs(c, 0) else None,
            reduce_grad(apply(CROSS, dy, _conj(a), dim=c.dim), c, 1) if needs(c, 1) else None)


CROSS = defop("cross", lambda a, b, dim: torch.linalg.cross(a, b, dim=dim), grad=_cross_grad, save="inputs",
              saved_inputs=reads_other, sbp=_cross_sbp, family="einsum", flops=None)


def cross(input: Tensor, other: Tensor, dim: int | None = None) -> Tensor:
    """The cross product of 3-vectors along ``dim`` (other dims broadcast), as ``torch.cross``;
    without ``dim``, the first dim of size 3 (deprecated in torch, which warns)."""
    a, b = tuple(input.shape), tuple(other.shape)
    if len(a) != len(b):
        raise ShapeError(f"holoflow.cross: inputs must have the same number of dimensions, got shapes {a} and {b}")
    if dim is None:
        warnings.warn("holoflow.cross: cross without dim uses the first dim of size 3; pass dim explicitly "
                      "(torch.linalg.cross defaults to dim=-1)", UserWarning, stacklevel=2)
        dim = next((i for i, n in enumerate(a) if n == 3), None)
        if dim is None:
            raise ShapeError(f"holoflow.cross: no dimension of size 3 in input of shape {a}")
    d = normalize_dim("cross", dim, len(a))
    if not a or a[d] != 3 or b[d] != 3:
        raise ShapeError(f"holoflow.cross: inputs dimension {dim} must have length 3, got shapes {a} and {b}")
    return apply(CROSS, input, other, dim=d)


# -- matrix functions -------------------------------------------------------------------------------

def batch_sbp(n_out: int = 1, linear: tuple[int, ...] = ()):
    """Matrix functions of the last two dims: a batch axis of the result splits every operand that
    carries it at full size (a broadcast operand stays B); P passes through an input in ``linear``."""
    def rule(metas, attrs):
        shapes = _shapes(metas)
        batch = broadcast_shapes("batch", [s[:-2] for s in shapes])
        n = len(shapes)
        sigs = [((B,) * n, (B,) * n_out)]
        for k, size in enumerate(batch):
            axes = [k - len(batch) + len(s) - 2 for s in shapes]
            ins = tuple(S(a) if a >= 0 and s[a] == size else B for a, s in zip(axes, shapes))
            sigs.append((ins, (S(k),) * n_out))
        return sigs + [(tuple(P if j == i else B for j in range(n)), (P,) * n_out) for i in linear]
    return rule


def _matrix_exp_grad(c, dy):
    """ATen's: the upper right block of ``matrix_exp([[A^H, dy], [0, A^H]])``."""
    a = c.inputs[0]
    n = c.shapes[0][-1]
    ah = _adjoint(a)
    block = cat([cat([ah, dy], -1), cat([apply(E.ZEROS_LIKE, a), ah], -1)], -2)
    return (apply(MATRIX_EXP, block).narrow(-2, 0, n).narrow(-1, n, n),)


def _slogdet_grad(c, dsign, dlogabsdet):
    """``d logabsdet = dy * A^-T`` (the sign of a real matrix is locally constant)."""
    a = c.inputs[0]
    if a.is_complex():
        raise UnsupportedError("holoflow.slogdet: the gradient of complex inputs is not implemented")
    try:
        inv = apply(INV, a)
    except RuntimeError:   # singular: torch's backward does not raise, its gradient is inf / NaN
        inv = apply(linalg_solve.INV_EX, a, check_errors=False).inverse
    return (dlogabsdet.unsqueeze(-1).unsqueeze(-1) * inv.mT,)


def _pinverse_grad(c, dy):
    """ATen's ``pinv_backward``, in products of the smallest matrices."""
    a, p = c.inputs[0], c.out
    ph, gh = _adjoint(p), _adjoint(dy)
    m, n = c.shapes[0][-2:]
    if m <= n:
        k = gh @ p
        kph = k @ ph
        return (-_adjoint(p @ k) + kph - (a @ p) @ kph + (ph @ p) @ (gh - k @ a),)
    k = p @ gh
    phk = ph @ k
    return (-_adjoint(k @ p) + (gh - a @ k) @ p @ ph + phk - phk @ p @ a,)


def _cholesky_inverse_grad(c, dy):
    """ATen's: ``-(A^-1 (dy + dy^H) A^-1) L`` (``L (...)`` for an upper factor), with A^-1 the output."""
    low, inv = c.inputs[0], c.out
    common = inv @ (dy + _adjoint(dy)) @ inv
    return (-(low @ common) if c.upper else -(common @ low),)


def _cholesky_solve_grad(c, dy):
    """ATen's: ``db = cholesky_solve(dy, L)``; ``dL = -(db X^H + X db^H) L`` (``L (...)`` if upper)."""
    low, x = c.inputs[1], c.out
    gb = apply(CHOLESKY_SOLVE, dy, low, upper=c.upper)
    g_low = None
    if needs(c, 1):
        common = gb @ _adjoint(x)
        common = common + _adjoint(common)
        g_low = reduce_grad(-(low @ common) if c.upper else -(common @ low), c, 1)
    return (reduce_grad(gb, c, 0) if needs(c, 0) else None, g_low)


_LINALG = dict(family="linalg")
MATRIX_EXP = defop("matrix_exp", torch.linalg.matrix_exp, grad=_matrix_exp_grad, save="inputs",
                   sbp=batch_sbp(), **_LINALG)
SLOGDET = defop("slogdet", torch.linalg.slogdet, grad=_slogdet_grad, save="inputs", outputs=("sign", "logabsdet"),
                sbp=batch_sbp(n_out=2), **_LINALG)
PINVERSE = defop("pinverse", lambda a, rcond: torch.pinverse(a, rcond), grad=_pinverse_grad, save="both",
                 sbp=batch_sbp(), **_LINALG)
# (torch's pinv_backward reads the input and the pseudo-inverse only: the same rule for any
# tolerance, and for the eigendecomposition a Hermitian input takes)
LINALG_PINV = defop("linalg_pinv", lambda a, atol, rtol, hermitian: torch.linalg.pinv(a, atol=atol, rtol=rtol,
                                                                                     hermitian=hermitian),
                    grad=_pinverse_grad, save="both", sbp=batch_sbp(), **_LINALG)
CHOLESKY_INVERSE = defop("cholesky_inverse", lambda low, upper: torch.cholesky_inverse(low, upper),
                         grad=_cholesky_inverse_grad, save="both", sbp=batch_sbp(), **_LINALG)
CHOLESKY_SOLVE = defop("cholesky_solve", lambda b, low, upper: torch.cholesky_solve(b, low, upper),
                       grad=_cholesky_solve_grad, save="both", saved_inputs=(1,), sbp=batch_sbp(linear=(0,)),
                       **_LINALG)


def _square_any(name: str, A: Tensor) -> None:
    """Square matrices of any dtype (matrix_power takes integers)."""
    if A.dim() < 2 or A.shape[-1] != A.shape[-2]:
        raise ShapeError(f"holoflow.{name}: expected a tensor of square matrices (*, n, n), got shape "
                         f"{tuple(A.shape)}")


def matrix_power(input: Tensor, n: int) -> Tensor:
    """``input`` to the integer power ``n`` (negative: of its inverse), by repeated squaring as
    ATen does, as ``torch.matrix_power``."""
    _square_any("matrix_power", input)
    if n == 0:  # the identity (laid out like input), attached to its graph as torch's copy is: a zero gradient
        eye = tril(triu(full_like(input, 1)))
        return E.where(full_like(input, True, dtype=torch.bool), eye, input)
    a = input
    if n < 0:
        _square("matrix_power", input)
        a, n = apply(INV, input), -n
    if n == 1:
        return a.clone()
    if n == 3:
        return matmul(matmul(a, a), a)
    z = result = None
    while n > 0:
        n, bit = divmod(n, 2)
        z = a if z is None else matmul(z, z)
        if bit:
            result = z if result is None else matmul(result, z)
    return result


def matrix_exp(input: Tensor) -> Tensor:
    """The matrix exponential of each square matrix, as ``torch.matrix_exp``."""
    _square("matrix_exp", input)
    return apply(MATRIX_EXP, input)


def slogdet(input: Tensor):
    """``(sign, log|det|)`` of each square matrix, as ``torch.slogdet``: a namedtuple."""
    _square("slogdet", input)
    return apply(SLOGDET, input)


def logdet(input: Tensor) -> Tensor:
    """``log(det(A))``: NaN for a negative determinant, -inf for a singular matrix, as ``torch.logdet``."""
    _square("logdet", input)
    sign, logabsdet = slogdet(input)
    if input.is_complex():
        return sign.log() + logabsdet
    return E.where(sign == -1, float("nan"), logabsdet)


def pinverse(input: Tensor, rcond: float = 1e-15) -> Tensor:
    """The Moore-Penrose pseudo-inverse of each matrix (singular values below ``rcond`` times the
    largest count as zero), as ``torch.pinverse``."""
    if input.dim() < 2:
        raise ShapeError(f"holoflow.pinverse: expected a tensor of matrices (*, m, n), got shape {tuple(input.shape)}")
    return apply(PINVERSE, input, rcond=float(rcond))


def linalg_pinv(A: Tensor, atol: float | None, rtol: float | None, hermitian: bool) -> Tensor:
    """``torch.linalg.pinv`` with number tolerances (holoflow.linalg.pinv checks the arguments)."""
    return apply(LINALG_PINV, A, atol=atol, rtol=rtol, hermitian=hermitian)


def cholesky(input: Tensor, upper: bool = False) -> Tensor:
    """The Cholesky factor, as the deprecated ``torch.cholesky`` (``holoflow.linalg.cholesky``)."""
    return _linalg_cholesky(input, upper=upper)


def cholesky_inverse(input: Tensor, upper: bool = False) -> Tensor:
    """The inverse of ``A = L L^H`` from its Cholesky factor ``L`` (``U^H U`` if ``upper``); only the
    factor's triangle is read, as ``torch.cholesky_inverse``."""
    _square("cholesky_inverse", input)
    return apply(CHOLESKY_INVERSE, input, upper=bool(upper))


def cholesky_solve(input: Tensor, input2: Tensor, upper: bool = False) -> Tensor:
    """``X`` with ``A X = input`` for ``A = L L^H`` given its Cholesky factor ``input2`` (batch
    dims broadcast), as ``torch.cholesky_solve``."""
    _square("cholesky_solve", input2)
    if input.dim() < 2:
        raise ShapeError(f"holoflow.cholesky_solve: the right-hand side must have at least 2 dims (*, n, k), got "
                         f"shape {tuple(input.shape)}")
    return apply(CHOLESKY_SOLVE, input, input2, upper=bool(upper))


for _name in ("matmul", "mm", "bmm", "dot", "inner", "outer", "ger", "addmm", "baddbmm", "addbmm", "addmv", "addr",
              "mv", "vdot", "cross", "matrix_power", "matrix_exp", "slogdet", "logdet", "pinverse", "cholesky",
              "cholesky_inverse", "cholesky_solve"):
    setattr(Tensor, _name, globals()[_name])
Tensor.det = det            # declared in linalg_solve.py (linalg.det)
Tensor.inverse = inverse
for _op in (ADDMM, BADDBMM, ADDBMM, ADDMV, ADDR):
    setattr(Tensor, _op.name + "_", _addmm_inplace(_op))
Tensor.__matmul__ = matmul
Tensor.__rmatmul__ = lambda self, other: matmul(other, self)

"""Op families: shape and SBP rules derived once, shared by every member.

A family member is declared in one line; its rules come from here. SBP rules are written for
ONE mesh axis and returned as data: a list of ``(input_sbps, output_sbps)`` pairs.
"""
from __future__ import annotations

import functools
import math
from typing import Callable, Sequence

import torch

from ..core.dispatch import apply
from ..core.dtype import scalar_name, to_torch
from ..core.errors import DTypeError, ShapeError
from ..core.grad_mode import is_grad_enabled
from ..core.keys import cache_key
from ..core.registry import FAMILY_DEFAULTS, REGISTRY, Meta, Op, defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor

# what the members of a family share (graph passes ask these properties, core/registry.py):
# these families' kernels always allocate their outputs; elementwise ones also fuse and run in place
FAMILY_DEFAULTS.update({"elementwise": {"elementwise": True, "fresh": True}})
FAMILY_DEFAULTS.update({f: {"fresh": True} for f in ("softmax", "norm", "conv", "pool", "einsum", "loss",
                                                     "attention", "embedding", "reduction", "scan")})


def contraction_flops(ins: Sequence[tuple], outs: Sequence[tuple], attrs: dict) -> float:
    """Multiply-adds x 2 of a two-operand product (matmul, linear and their gradients): every
    index of ``a (x) b -> out`` appears in two of the three shapes except the batch dims, which
    appear in all three, so the product of every index size is sqrt(|a| |b| |out| / batch)."""
    a, b, out = (math.prod(s) for s in (ins[0], ins[1], outs[0]))
    both = len(ins[0]) > 2 and len(ins[1]) > 2 and len(outs[0]) > 2
    batch = math.prod(outs[0][:-2]) if both else 1
    return 2.0 * math.sqrt(a * b * out / max(batch, 1))


FAMILY_DEFAULTS["einsum"]["flops"] = contraction_flops


def tensor_metas(metas: Sequence) -> list[Meta]:
    return [m for m in metas if isinstance(m, Meta)]


def broadcast_shapes(op: str, shapes: Sequence[tuple]) -> tuple:
    """NumPy broadcasting; a clear error names the op and every shape."""
    nd = max((len(s) for s in shapes), default=0)
    out = []
    for axis in range(nd):
        size = 1
        for s in shapes:
            d = s[axis - nd + len(s)] if axis - nd + len(s) >= 0 else 1
            if d != 1:
                if size not in (1, d):
                    shown = " and ".join(str(tuple(x)) for x in shapes)
                    raise ShapeError(
                        f"holoflow.{op}: shapes {shown} cannot be broadcast: at dim {axis - nd} "
                        f"sizes {size} and {d} differ and neither is 1")
                size = d
        out.append(size)
    return tuple(out)


def elementwise_shape(name: str, kernel: Callable) -> Callable:
    """Broadcast shape rule (clear errors), with the result dtype from torch's promotion."""
    dtypes: dict = {}   # (input dtypes and ranks, constants, attrs) -> the result dtype

    def rule(metas, attrs):
        tens = tensor_metas(metas)
        shape = broadcast_shapes(name, [m.shape for m in tens])
        key = cache_key((tuple((m.dtype, len(m.shape)) if isinstance(m, Meta) else m for m in metas), attrs))
        dtype = dtypes.get(key) if key is not None else None
        if dtype is None:
            # dtype from tiny real tensors of the same rank (rank matters to promotion; a kernel
            # call costs more than the rest of a trace's op); meta tensors would do, but their
            # first use imports torch._dynamo (seconds)
            fake = [torch.ones((1,) * len(m.shape), dtype=m.dtype) if isinstance(m, Meta) else m
                    for m in metas]
            dtype = kernel(*fake, **attrs).dtype
            if key is not None:
                if len(dtypes) >= 4096:   # (constants of every value: keep it bounded)
                    dtypes.clear()
                dtypes[key] = dtype
        return [Meta(shape, dtype, tens[0].device if tens else torch.device("cpu"))]
    return rule


def like_first_input(metas, attrs):
    """A shape rule: the one output is shaped like the first input (for kernels with no meta
    version, or whose output shape would otherwise look data-dependent)."""
    return [metas[0]]


def elementwise_sbp(partial: Sequence[str] | Callable = ()) -> Callable:
    """Signatures of an elementwise op: every tensor input split on the same logical axis
    (broadcast where it is broadcast), or all broadcast; plus the partial-sum patterns in
    ``partial``, which hold because the op is linear there. A pattern has one letter per
    operand: P (partial), B (broadcast) or - (a Python scalar). So add's "PP" never applies to
    ``x + 1`` (not linear in x), while mul's "P-" covers ``x * 2``. ``partial`` may be a
    function of the attrs (div is linear only without rounding)."""
    def rule(metas, attrs):
        tens = tensor_metas(metas)
        n = len(tens)
        out_shape = broadcast_shapes("elementwise", [m.shape for m in tens])
        nd = len(out_shape)
        sigs = [((B,) * n, (B,))]
        for axis in range(nd):
            ins = []
            for m in tens:
                a = axis - nd + len(m.shape)
                ins.append(S(a) if a >= 0 and m.shape[a] == out_shape[axis] else B)
            sigs.append((tuple(ins), (S(axis),)))
        kinds = "".join("-" if not isinstance(m, Meta) else "T" for m in metas)
        for pat in (partial(attrs) if callable(partial) else partial):
            if len(pat) == len(kinds) and all((c == "-") == (k == "-") for c, k in zip(pat, kinds)):
                sigs.append((tuple(P if c == "P" else B for c in pat if c != "-"), (P,)))
        return sigs
    return rule


def reduce_grad(g: Tensor, ctx, i: int) -> Tensor:
    """Sums a broadcast gradient back to input ``i``'s shape and casts it to its dtype."""
    shape, dtype = ctx.shapes[i], ctx.dtypes[i]
    if g.shape != shape:
        g = apply(SUM_TO, g, shape=shape)
    if g._data.dtype != dtype and (dtype.is_floating_point or dtype.is_complex):   # (complex64 of a complex128 product)
        if g._data.is_complex() and not dtype.is_complex:   # a real input's gradient is the real part, as torch's
            g = apply(REGISTRY["real"], g)
        if g._data.dtype != dtype:
            g = apply(CAST, g, dtype=dtype)
    return g


def _expand_grad(ctx, dy):
    return (reduce_grad(dy, ctx, 0),)


def _sum_to_grad(ctx, dy):
    return (apply(EXPAND, dy, shape=ctx.shapes[0]),)


def _expand_sbp(metas, attrs):
    m = metas[0]
    shape = tuple(attrs["shape"])
    lead = len(shape) - len(m.shape)
    sigs = [((B,), (B,)), ((P,), (P,))]
    for a, d in enumerate(m.shape):
        if d == shape[lead + a] or shape[lead + a] == -1:
            sigs.append(((S(a),), (S(lead + a),)))
    return sigs


def _sum_to_sbp(metas, attrs):
    m = metas[0]
    shape = tuple(attrs["shape"])
    lead = len(m.shape) - len(shape)
    sigs = [((B,), (B,)), ((P,), (P,))]
    for a, d in enumerate(m.shape):
        kept = a >= lead and shape[a - lead] == d
        sigs.append(((S(a),), (S(a - lead),) if kept else (P,)))
    return sigs


def _shape_attr_local(attrs, metas, local_metas, in_sbps):
    """A shape attr follows its input's split: the split axis takes the shard's size."""
    shape = list(attrs["shape"])
    lead = len(shape) - len(metas[0].shape)
    for a, (g, l) in enumerate(zip(metas[0].shape, local_metas[0].shape)):
        if g != l and 0 <= a + lead < len(shape):
            shape[a + lead] = l
    return {**attrs, "shape": tuple(shape)}


def _sum_to_local(attrs, metas, local_metas, in_sbps):
    shape = list(attrs["shape"])
    lead = len(metas[0].shape) - len(shape)
    for a, (g, l) in enumerate(zip(metas[0].shape, local_metas[0].shape)):
        if a >= lead and g != l and shape[a - lead] == g:
            shape[a - lead] = l
    return {**attrs, "shape": tuple(shape)}


EXPAND = defop("expand", lambda x, shape: x.expand(shape), grad=_expand_grad, sbp=_expand_sbp,
               local_attrs=_shape_attr_local, family="broadcast", view=True)
def _sum_to_kernel(x: torch.Tensor, shape) -> torch.Tensor:
    lead = x.dim() - len(shape)
    if lead > 0 and all(s != 1 or x.shape[lead + i] == 1 for i, s in enumerate(shape)):
        # only leading dims go (a bias's gradient): a fresh tensor, where sum_to_size's is a view
        # of its keepdim sum (a leaf's .grad would then need a copy)
        return x.sum(tuple(range(lead)))
    return x.sum_to_size(shape)


SUM_TO = defop("sum_to_size", _sum_to_kernel, grad=_sum_to_grad,
               sbp=_sum_to_sbp, local_attrs=_sum_to_local, family="reduction", view=True)
def cast_sbp(metas, attrs):
    """A dtype conversion: elementwise; linear (partial sums stay partial) only where it keeps
    every value (:func:`_keeps_sums`): rounding pieces of a partial sum is not rounding the sum
    (truncated to an integer, and also narrowed to bfloat16, where pieces that cancel lose the
    sum's digits)."""
    sigs = elementwise_sbp()(metas, attrs)
    src, dst = metas[0].dtype, attrs.get("dtype")
    if dst is None or _keeps_sums(src, dst):
        sigs.append(((P,), (P,)))
    return sigs


def _is_inexact(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or dtype.is_complex


def _real(dtype: torch.dtype) -> torch.dtype:
    return dtype.to_real() if dtype.is_complex else dtype


def _keeps_sums(src: torch.dtype, dst: torch.dtype) -> bool:
    """Whether casting the pieces of a partial sum and summing equals casting the sum: the cast
    is exact on every value of ``src`` (a wider float; an integer a float holds exactly; the real
    part of a complex, which is linear), or wraps modulo 2**bits (integer to integer). Never
    from or to bool (a bool sum is an or)."""
    if src == dst:
        return True
    if torch.bool in (src, dst):
        return False
    if not _is_inexact(dst):
        return not _is_inexact(src)
    d = torch.finfo(_real(dst))
    if not _is_inexact(src):
        i = torch.iinfo(src)
        return max(i.max, -i.min) <= 2 / d.eps   # (a float holds integers up to 2**(mantissa bits + 1))
    s = torch.finfo(_real(src))
    return d.eps <= s.eps and d.max >= s.max and d.tiny <= s.tiny


CAST = defop("cast", lambda x, dtype: x.to(dtype),
             grad=lambda ctx, dy: (apply(CAST, dy, dtype=ctx.dtypes[0]),),
             sbp=cast_sbp, family="elementwise", view=True)


def empty_safe(kernel: Callable) -> Callable:
    """Wraps a pooling/resize-style kernel (tensor inputs laid out as (N, C, ...), outputs too)
    so that an empty shard — a batch or channel split smaller than the mesh — gives empty
    outputs of the right shape instead of aten's refusal of empty dims: the kernel runs with
    those dims at size 1 and the outputs are cut back to 0 there. No cost when it succeeds."""
    @functools.wraps(kernel)
    def k(*args, **attrs):
        try:
            return kernel(*args, **attrs)
        except RuntimeError:
            empty = {i for a in args if isinstance(a, torch.Tensor) for i, d in enumerate(a.shape[:2]) if d == 0}
            if not empty:
                raise
            grown = [a.new_zeros([1 if i in empty else d for i, d in enumerate(a.shape)])
                     if isinstance(a, torch.Tensor) and a.numel() == 0 else a for a in args]
            out = kernel(*grown, **attrs)

            def cut(o):
                if not isinstance(o, torch.Tensor):
                    return o
                for i in empty:
                    o = o.narrow(i, 0, 0) if o.dim() > i else o
                return o
            return cut(out) if isinstance(out, torch.Tensor) else type(out)(cut(o) for o in out)
    return k


def holomorphic(op: Op) -> Op:
    """Declares ``op``'s grad rule *naive holomorphic*: written as ``dy * f'(z)`` for real inputs
    (no conjugates). For complex tensors torch's convention is ``dy * conj(f'(z))``; the rule
    then runs as ``conj(rule(conj(dy)))``, which is that for any holomorphic ``f`` (and for
    each input of a multi-input op holomorphic in it). Real tensors run the rule itself."""
    rule = op.grad

    def grad(c, *dys):
        for d in dys:   # (a loop, not any(<genexpr>): this runs for every product's node)
            if isinstance(d, Tensor) and d._data.is_complex():
                break
        else:
            return rule(c, *dys)
        conj = REGISTRY["conj"]
        got = rule(c, *(apply(conj, d) if isinstance(d, Tensor) and d._data.is_complex() else d for d in dys))
        return tuple(apply(conj, g) if isinstance(g, Tensor) and g._data.is_complex() else g for g in got)
    op.grad = grad
    return op


def unary(name: str, kernel: Callable, grad: Callable | None = None, save: str = "",
          partial: Sequence[str] = (), **rules) -> Op:
    """Declares an elementwise unary op (with an in-place kernel if torch has one)."""
    return defop(name, kernel, grad=grad, save=save, family="elementwise",
                 shape=elementwise_shape(name, kernel), sbp=elementwise_sbp(partial),
                 inplace_kernel=getattr(torch.Tensor, name + "_", None), **rules)


def _wrapped(v, t: torch.Tensor, kernel_with: Callable) -> torch.Tensor:
    """A Python number beside tensor ``t`` as torch wraps it: at the dtype the two promote to (a
    bool stays a bool: torch refuses ``True - x`` as it refuses a bool tensor's), except an int
    beside an integer tensor, which keeps its value (the kernel casts it, as torch's wrapped
    number): -1 stays -1 where the op computes in floats (``1 / x``, zeta), and 300 wraps beside
    uint8 where it computes in uint8. An int64 0-d tensor promotes as the number beside a tensor
    with dims; beside a 0-d one it would not, so a number out of its dtype's range is made as the
    kernel (``kernel_with(zero)``, asked once) computes: int64 for floats, else cast (wrapped)."""
    if isinstance(v, bool):
        return torch.tensor(v, device=t.device)
    dt = torch.result_type(v, t)
    if not isinstance(v, int) or dt.is_floating_point or dt.is_complex or dt == torch.bool:
        return torch.tensor(v, dtype=dt, device=t.device)
    if t.dim():
        return torch.tensor(v, device=t.device)
    info = torch.iinfo(dt)
    if info.min <= v <= info.max:
        return torch.tensor(v, dtype=dt, device=t.device)
    got = kernel_with(torch.zeros((), dtype=dt, device=t.device)).dtype
    if got.is_floating_point or got.is_complex:
        return torch.tensor(v, device=t.device)
    return torch.tensor(v, device=t.device).to(dt)


def binary(name: str, kernel: Callable, grad: Callable | None = None, save: str = "",
           partial: Sequence[str] | Callable = (), tensors_only: bool = False, **rules) -> Op:
    """Declares an elementwise binary op with broadcasting and torch's type promotion; a Python
    scalar in first position (as in ``2 - x``), or anywhere for a ``tensors_only`` kernel such
    as ``torch.maximum``, is wrapped as a 0-d tensor of the result dtype (which promotes like a
    scalar and keeps the scalar's precision)."""
    commutative = rules.get("commutative", False)

    @functools.wraps(kernel)
    def k(a, b, **attrs):
        # a number first: a commutative op takes it second, as torch's own ``2 * x`` does (the
        # number stays a double); otherwise it becomes a 0-d tensor of the dtype torch computes in
        # (sub(2.7, float64) is float64's 2.7, not float32's 2.7 widened)
        if not isinstance(a, torch.Tensor):
            if not tensors_only and (commutative is True or (callable(commutative) and commutative(attrs))):
                return kernel(b, a, **attrs)
            a = _wrapped(a, b, lambda z: kernel(z, b, **attrs))
        elif tensors_only and not isinstance(b, torch.Tensor):
            b = _wrapped(b, a, lambda z: kernel(a, z, **attrs))
        return kernel(a, b, **attrs)

    def fast(a, b, **attrs):  # the common case, tensor first: no wrapper frame
        return kernel(a, b, **attrs) if isinstance(a, torch.Tensor) else k(a, b, **attrs)
    fast.__wrapped__ = kernel
    return defop(name, k if tensors_only else fast, grad=grad, save=save, family="elementwise",
                 shape=elementwise_shape(name, k), sbp=elementwise_sbp(partial),
                 inplace_kernel=rules.pop("inplace_kernel", getattr(torch.Tensor, name + "_", None)), **rules)


def reads_other(needs: tuple) -> tuple[int, ...]:
    """``saved_inputs`` of a product: the gradient of each input reads the other one only."""
    return tuple(j for j, i in ((1, 0), (0, 1)) if needs[i])


def reads_quotient(needs: tuple) -> tuple[int, ...]:
    """``saved_inputs`` of a quotient: both gradients read the divisor, the divisor's the dividend."""
    return (0, 1) if needs[1] else (1,)


def needs(ctx, i: int) -> bool:
    return ctx.edges[i] is not None


def differentiable_dtype(op: str, input: Tensor, dtype) -> torch.dtype | None:
    """``dtype`` as torch's; refused (torch's RuntimeError) where it is an integer or bool one and
    ``input`` requires grad: autograd records the op, and its result can't carry a gradient
    (``x.cumsum(0, dtype=int64)`` of an ``x`` requiring grad; under ``no_grad`` it computes)."""
    dt = to_torch(dtype) if dtype is not None else None
    if dt is not None and not (dt.is_floating_point or dt.is_complex) and isinstance(input, Tensor) and \
            input.requires_grad and is_grad_enabled():
        raise DTypeError(f"holoflow.{op}: autograd does not support dtype {scalar_name(dt)}: the input "
                         f"requires grad, and an integer result can't carry a gradient; pass a floating or complex "
                         f"dtype, detach() the input, or compute under holoflow.no_grad()")
    return dt


def refuse_complex_grad(op: str, *tensors) -> None:
    """torch's refusal (RuntimeError, at the call) of an op whose derivative is written for real
    tensors only, where autograd would record a complex result: grad mode on, a tensor among
    ``tensors`` requiring grad and one complex (``nan_to_num``, ``silu``, ``embedding``...)."""
    ts = [t for t in tensors if isinstance(t, Tensor)]
    if is_grad_enabled() and any(t.requires_grad for t in ts) and any(t.is_complex() for t in ts):
        raise RuntimeError(f"holoflow.{op} does not support automatic differentiation for outputs with complex "
                           f"dtype (as torch: its derivative is for real tensors); pass the real and imaginary "
                           f"parts apart, or detach() the inputs / compute under holoflow.no_grad()")

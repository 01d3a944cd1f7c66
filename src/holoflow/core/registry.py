"""The op registry: one declaration per op, holding everything the engines need.

An :class:`Op` is plain data. Engines (dispatch, autograd, boxing, graph passes) look ops up in
``REGISTRY`` and call their rules; none of them knows any particular op.

Rules, all optional except the kernel:

- ``kernel(*torch_inputs, **attrs)``: local compute on torch tensors.
- ``grad(ctx, *dys) -> tuple``: one gradient (or None) per positional input, written in holoflow
  ops so it runs eagerly, on global tensors and inside a trace. ``ctx`` exposes ``inputs``,
  ``out``/``outs`` (when saved), ``shapes``, ``dtypes``, ``needs_grad`` and the attrs by name.
- ``shape(metas, attrs) -> metas``: pure shape/dtype rule; raises a clear error for bad input.
  Without one, the kernel run on torch "meta" tensors is the rule (same code as eager).
- ``sbp(metas, attrs) -> list[(in_sbps, out_sbps)]``: legal signatures for ONE mesh axis.
- ``local_attrs(attrs, metas, local_metas, in_sbps) -> attrs``: attrs for a shard's kernel,
  e.g. a reshape's target shape on a split tensor.
"""
from __future__ import annotations

import inspect
from collections import namedtuple
from dataclasses import dataclass, field, fields
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Meta:
    """What graph mode and shape rules know of a tensor: shape, dtype, device."""

    shape: tuple
    dtype: torch.dtype
    device: torch.device = torch.device("cpu")

    @staticmethod
    def of(t: torch.Tensor) -> "Meta":
        return Meta(tuple(t.shape), t.dtype, t.device)

    def empty(self) -> torch.Tensor:
        return torch.empty(self.shape, dtype=self.dtype, device="meta")


@dataclass(eq=False)
class Op:
    name: str
    kernel: Callable
    grad: Callable | None = None
    shape: Callable | None = None
    sbp: Callable | None = None
    local_attrs: Callable | None = None
    save: str = ""                       # "", "inputs", "output" or "both": what grad reads
    # of those, the positions grad reads (None: all; for inputs also a function of the
    # needs_grad flags: mul's grad for a reads b). What is saved is version-checked in backward,
    # so an op saves exactly what torch's saves: an in-place change of anything else
    # (batch_norm's output, dropout's result, topk's values) must stay legal
    saved_inputs: tuple[int, ...] | Callable | None = None
    saved_outputs: tuple[int, ...] | None = None
    outputs: tuple[str, ...] | None = None  # field names of a multi-output op
    # the output gradients ``grad`` reads (None: all). An output that got no gradient reaches the
    # rule as zeros of its shape if the rule reads it, else as None (layer_norm ignores its mean's)
    grad_reads: tuple[int, ...] | None = None
    family: str = "other"
    random: bool = False                  # reads the RNG: replayed by seed, not by value
    differentiable: bool = True
    inplace_kernel: Callable | None = None
    # outputs may share input 0's storage (reshape, permute, slicing, split, ...): those that
    # do become views of it, with torch's in-place semantics (core/views.py)
    view: bool = False
    # a collective: in a graph its kernel also takes ``rank`` and ``comm`` (bound per rank when a
    # global graph is localized); one whose result is not needed at once is issued and waited
    # for at its first reader (graph/global_graph.py), overlapping compute
    collective: bool = False
    # what graph passes ask of an op (never its name). A family's members share defaults
    # (FAMILY_DEFAULTS, filled by ops/family.py); a declaration may override them.
    # elementwise: out[i] = f(in[i], ...) with broadcasting, on one device (fusible, in-place-able)
    elementwise: bool = False
    # fresh: outputs are always new buffers: never an input's memory, never the input itself
    # (a view, or ``x.to(x.dtype)`` returning x, is not fresh)
    fresh: bool = False
    # commutative: inputs 0 and 1 may be swapped with a bit-identical result; a function of
    # the attrs where that depends on them (add only with alpha == 1)
    commutative: bool | Callable = False
    # axpy: the op computes ``inputs[0] + alpha * inputs[1]`` (attr ``alpha``, default 1)
    axpy: bool = False
    # add_to_output(shapes, beta, alpha) -> kernel(*inputs, r) computing ``beta * r + alpha *
    # op(*inputs)`` in one call (addmm-style), or None for these input shapes (None: no tensor)
    add_to_output: Callable | None = None
    # mask_split: a backward computing (input gradient, weight gradients...) that attr
    # ``output_mask`` switches per output, so it can run as two nodes (zero-bubble pipelines
    # defer the weight part: graph/passes/stages.py)
    mask_split: bool = False
    # amp_keep: input positions that mixed precision never casts (a float32 logsumexp that a
    # low-precision backward reads with its low-precision inputs)
    amp_keep: tuple[int, ...] = ()
    # flops(in_shapes, out_shapes, attrs): floating-point operations of one call on these shapes
    # (the cost model, graph/auto_parallel.py); None: the op is bound by the bytes it moves
    flops: Callable | None = None
    # reduces(attrs): whether the node sums values across ranks (a boxing from partial sums).
    # Mixed precision reduces a gradient bound for the optimizer in the dtype it was traced with
    # (eager's autocast casts it back to the parameter's dtype before reducing it)
    reduces: Callable | None = None
    # averages: the result is the mean over the axes the op reduces (its split-to-partial
    # signature divides by the whole count), so the mean of a batch is the mean of its
    # micro-batches' means; the planner asks it before choosing micro-batches (graph/auto_parallel.py)
    averages: bool = False
    # opaque: torch.compile cannot trace the kernel (it runs torch's autograd, say); a function of
    # the device type where that depends on it. A graph compiled with ``enable_compile`` runs
    # such nodes in plain tasks of their own and compiles the runs between them
    opaque: bool | Callable = False
    # layout: Inductor chooses the memory layout of this op's operands and results (a convolution's
    # channels-last). A graph compiled with ``enable_compile`` holding one compiles its forward and
    # backward as two tasks, the activations passed between them in Inductor's layout
    layout: bool = False
    # inplace_zero_grad: written in place into a floating tensor while autograd records, the
    # (non-differentiable) op's result has zero gradients for its inputs, as torch's in-place
    # comparisons (``x.lt_(t)`` with t requiring grad: x requires grad, t's gradient is zeros)
    inplace_zero_grad: bool = False
    # grad_none(attrs): the grad rule gives no input a gradient with these attrs (torch's undefined
    # gradient: a norm of order 0), so a rank outside the placement, which never runs the rule,
    # records none either
    grad_none: Callable | None = None
    out_type: Any = field(default=None, repr=False)
    defaults: dict = field(default_factory=dict, repr=False)

    def __post_init__(self) -> None:
        self._saves = (self.save in ("inputs", "both"), self.save in ("output", "both"))
        if self.kernel is not None:
            self.defaults = _keyword_defaults(self.kernel)
        if self.outputs:
            self.out_type = namedtuple(f"{self.name}_return", self.outputs)
        if self.view:
            self.fresh = False

    def opaque_on(self, device_type: str) -> bool:
        """Whether torch.compile cannot trace this op's kernel on ``device_type``."""
        o = self.opaque
        return bool(o(device_type) if callable(o) else o)

    def swaps(self, attrs: dict) -> bool:
        """Whether inputs 0 and 1 may be swapped exactly under ``attrs``."""
        c = self.commutative
        return bool(c(attrs) if callable(c) else c)

    @property
    def saves_inputs(self) -> bool:
        return self.save in ("inputs", "both")

    @property
    def saves_output(self) -> bool:
        return self.save in ("output", "both")

    def to_save(self, inputs: tuple, outs: tuple, edges: tuple) -> tuple[tuple | None, tuple | None]:
        """What a grad node keeps of one application (``edges``: the node's, None where an input
        needs no gradient): ``(inputs, outs)``, each None when the op reads none of them,
        positions it does not read replaced by None."""
        saves_in, saves_out = self._saves
        return (self.saved_of(inputs, edges) if saves_in else None,
                self.outputs_of(outs) if saves_out else None)

    def saved_of(self, inputs: tuple, edges: tuple) -> tuple:
        """The inputs a grad node keeps (an op that saves inputs): those its rule reads, None
        elsewhere."""
        keep = self.saved_inputs
        if keep is None:
            return inputs
        if callable(keep):   # a function of which inputs need a gradient: a few patterns, remembered
            needs = tuple([e is not None for e in edges])
            known = self.__dict__.setdefault("_kept", {})
            keep = known.get(needs)
            if keep is None:
                keep = known[needs] = frozenset(self.saved_inputs(needs))
        return tuple([x if i in keep else None for i, x in enumerate(inputs)])

    def outputs_of(self, outs: tuple) -> tuple:
        """The outputs a grad node keeps (an op that saves outputs)."""
        keep = self.saved_outputs
        return outs if keep is None else tuple([x if i in keep else None for i, x in enumerate(outs)])

    def __repr__(self) -> str:
        return f"<op {self.name}>"


def _keyword_defaults(fn: Callable) -> dict:
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # builtins without a signature
        return {}
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


REGISTRY: dict[str, Op] = {}


#: family -> properties its members share (ops/family.py fills it before any op is declared)
FAMILY_DEFAULTS: dict[str, dict[str, Any]] = {}


def defop(name: str, kernel: Callable, **rules) -> Op:
    """Declares an op once (its family's defaults under its own rules); a second declaration
    under the same name is a bug."""
    if name in REGISTRY:
        raise ValueError(f"holoflow: op {name!r} is declared twice")
    rules = {**FAMILY_DEFAULTS.get(rules.get("family", "other"), {}), **rules}
    op = REGISTRY[name] = Op(name, kernel, **rules)
    return op


def alias(op: Op, name: str) -> Op:
    """``op`` declared again under ``name``: the same kernel and rules. For a torch function that
    is one kernel of holoflow's but its own op for autocast (``dot`` is ``matmul`` on vectors,
    and autocast's lists name them apart)."""
    rules = {f.name: getattr(op, f.name) for f in fields(op) if f.init and f.name not in ("name", "kernel")}
    return defop(name, op.kernel, **rules)


_META = torch.device("meta")


def meta_attrs(attrs: dict) -> dict:
    """``attrs`` with every device naming the meta device: a kernel run on meta tensors (a shape
    rule, a trace) cannot move them to a real one. ``device=None`` (a creation on the default
    device) names it too: run for real, a random creation's shape rule would draw from the
    default generator, and the graph's draws would then start one draw late."""
    if not any(isinstance(v, torch.device) or k == "device" and v is None for k, v in attrs.items()):
        return attrs
    return {k: (_META if isinstance(v, torch.device) or k == "device" and v is None else v) for k, v in attrs.items()}


def infer_metas(op: Op, inputs: tuple, attrs: dict) -> tuple[Meta, ...]:
    """The shape rule of ``op``: its own, or its kernel run on meta tensors."""
    metas = [Meta.of(x) if isinstance(x, torch.Tensor) else x for x in inputs]
    if op.shape is not None:
        return tuple(op.shape(metas, attrs))
    fake = [m.empty() if isinstance(m, Meta) else m for m in metas]
    out = op.kernel(*fake, **attrs)
    outs = (out,) if isinstance(out, torch.Tensor) else tuple(out)
    return tuple(Meta(tuple(o.shape), o.dtype) for o in outs)

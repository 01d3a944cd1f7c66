"""Mixed precision as an IR rewrite (``config.enable_amp(True, dtype=...)``).

The op lists are autocast's (``holoflow.amp.policy.POLICIES``, keyed by the device type of the
node's inputs), applied to forward and backward nodes alike by op name:

- ``LOWER`` ops (matmul, linear, einsum, conv...) get their floating inputs cast to
  ``config.amp_dtype``;
- ``FP32`` ops (losses, ...) get low-precision inputs cast to float32 (an explicit ``dtype`` attr
  wins, as in autocast);
- ``PROMOTE`` ops (cat, stack...) get their floating inputs cast to the widest among them;
- ``FP32_ATTR`` ops (CUDA's cross_entropy) keep their low-precision inputs and get
  ``dtype=float32``, the dtype of their result (amp/policy.py);
- ``NATIVE`` ops (CPU's recurrent layers) keep their inputs and get ``autocast=config.amp_dtype``:
  their kernels run under ``torch.autocast``;
- every other op runs in whatever dtype reaches it; its outputs' dtypes are inferred again
  (the op's shape rule or its kernel on meta tensors), and a changed output is a new Value.

Effect nodes (the optimizer update: parameter gradients) and state write-backs read their values
cast back to the dtype they had before the rewrite, so the update sees float32 gradients. A
backward reduction across ranks (an op that ``reduces``: data parallelism's gradient sums, ZeRO's
reduce-scatters, tensor parallelism's input-gradient sums) runs in the dtypes it was traced
with too: a float32 value's gradient is summed over the ranks in float32, as eager's autocast
sums it after its cast's backward (not in bfloat16, which would round the sum). Casts
are ``cast`` nodes in the scope and tags of the node that needs them, one per value and dtype.
"""
from __future__ import annotations

import functools

import torch

from ...amp.policy import FP32, FP32_ATTR, LOWER, NATIVE, POLICIES, PROMOTE
from ...core import dtype as _dtype
from ...core.registry import REGISTRY, infer_metas, meta_attrs
from ..ir import IRGraph, Node, Value
from . import register




class _Rewriter:
    """Walks the nodes once, keeping old -> new values and the casts made so far."""

    def __init__(self, low: torch.dtype) -> None:
        self.low = low
        self.env: dict[Value, Value] = {}
        self.casts: dict[tuple, Value] = {}
        self.nodes: list[Node] = []

    def cur(self, x):
        return self.env.get(x, x) if isinstance(x, Value) else x

    def cast(self, x: Value, dt: torch.dtype, at: Node) -> Value:
        if x.dtype == dt:
            return x
        key = (x, dt)
        if key not in self.casts:
            out = Value(x.shape, dt, x.device)
            self.nodes.append(Node("cast", (x,), {"dtype": dt}, (out,), at.source, at.scope, tags=at.tags))
            self.casts[key] = out
        return self.casts[key]

    def policy_inputs(self, n: Node, ins: list) -> list:
        vals = [x for x in ins if isinstance(x, Value)]
        if not vals:
            return ins
        kind = POLICIES.get(vals[0].device.type, POLICIES["cuda"]).get(_policy_name(n))
        if kind == LOWER:
            keep = REGISTRY[n.op].amp_keep
            return [self.cast(x, self.low, n) if _lowerable(x) and i not in keep else x for i, x in enumerate(ins)]
        if kind == FP32 and n.attrs.get("dtype") is None:  # an explicit output dtype wins
            return [self.cast(x, torch.float32, n) if _is_low(x) else x for x in ins]
        if kind == PROMOTE:
            floats = [x.dtype for x in vals if x.dtype.is_floating_point]
            if len(set(floats)) > 1:
                wide = functools.reduce(torch.promote_types, floats)
                return [self.cast(x, wide, n) if _is_float(x) else x for x in ins]
        return ins

    def policy_attrs(self, n: Node, ins: list) -> dict:
        """``n``'s attrs, with ``dtype=float32`` for an FP32_ATTR op reading low-precision values,
        and ``autocast`` for a NATIVE op."""
        policy = POLICIES.get(_device(n), POLICIES["cuda"]).get(_policy_name(n))
        if policy == NATIVE:
            return {**n.attrs, "autocast": self.low}
        if n.attrs.get("dtype") is not None or policy != FP32_ATTR:
            return n.attrs
        if any(_is_float(x) and x.dtype in (torch.bfloat16, torch.float16) for x in ins):
            return {**n.attrs, "dtype": torch.float32}
        return n.attrs

    def node(self, n: Node) -> None:
        ins = [self.cur(x) for x in n.inputs]
        if n.effect or n.kernel is not None or n.op not in REGISTRY or _gradient_sum(n):
            ins = [self.cast(x, o.dtype, n) if isinstance(x, Value) else x for x, o in zip(ins, n.inputs)]
            self.nodes.append(n.with_(inputs=tuple(ins)) if _changed(ins, n.inputs) else n)
            return
        ins = self.policy_inputs(n, ins)
        attrs = self.policy_attrs(n, ins)
        floats = {x.dtype for x in ins if _is_float(x)}
        if "bw" in n.tags and POLICIES.get(_device(n), POLICIES["cuda"]).get(_policy_name(n)) is None \
                and len(floats) > 1:
            # a backward op on no list that the rewrite left with mixed float dtypes (e.g. a bf16
            # gradient from a lowered matmul reaching layer_norm_backward with fp32 saved
            # inputs) runs in the dtypes it was traced with, as eager's cast backward would make
            # it. A forward op sees the dtypes eager autocast gives it (layer_norm of a bf16
            # activation with float32 weights: a bf16 result, as torch's)
            ins = [self.cast(x, o.dtype, n) if isinstance(x, Value) and isinstance(o, Value)
                   and x.dtype != o.dtype else x for x, o in zip(ins, n.inputs)]
        if not _changed(ins, n.inputs) and attrs is n.attrs:
            self.nodes.append(n)
            return
        metas = infer_metas(REGISTRY[n.op], tuple(
            torch.empty(x.shape, dtype=x.dtype, device="meta") if isinstance(x, Value) else x for x in ins),
            meta_attrs(attrs))   # (``to``'s device)
        outs = tuple(o if (tuple(m.shape), m.dtype) == (o.shape, o.dtype) else   # (a dtype keeps the layout)
                     Value(tuple(m.shape), m.dtype, o.device, o.name, placement=o.placement, sbp=o.sbp)
                     for o, m in zip(n.outputs, metas))
        self.env.update((o, w) for o, w in zip(n.outputs, outs) if o is not w)
        self.nodes.append(n.with_(inputs=tuple(ins), outputs=outs, attrs=attrs))


def _policy_name(n: Node) -> str:
    """The name ``n``'s autocast class is listed under: its op's, or the composite op's whose
    inputs it marks (attr ``amp_policy``: ops/loss.py AMP_BOUNDARY)."""
    return n.attrs.get("amp_policy", n.op)


def _gradient_sum(n: Node) -> bool:
    """A backward node that sums values across ranks."""
    reduces = REGISTRY[n.op].reduces
    return "bw" in n.tags and reduces is not None and reduces(n.attrs)


def _device(n: Node) -> str:
    vals = [x for x in n.inputs if isinstance(x, Value)]
    return vals[0].device.type if vals else "cpu"


def _changed(ins: list, old: tuple) -> bool:
    return any(a is not b for a, b in zip(ins, old))


def _is_float(x) -> bool:
    return isinstance(x, Value) and x.dtype.is_floating_point


def _lowerable(x) -> bool:
    return _is_float(x) and x.dtype != torch.float64  # float64 is never lowered, as in autocast


def _is_low(x) -> bool:
    return isinstance(x, Value) and x.dtype in (torch.float16, torch.bfloat16)


@register("amp", enabled=lambda cfg: bool(getattr(cfg, "amp", False)))
def amp(g: IRGraph, config) -> IRGraph:
    """Casts around allow-/deny-listed ops; see the module docstring."""
    r = _Rewriter(_dtype.to_torch(config.amp_dtype))
    for n in g.nodes:
        r.node(n)
    updates = []
    for t, v in g.updates:
        w = r.cur(v)
        if w.dtype != v.dtype:
            w = r.cast(w, v.dtype, Node("assign", (), {}, (), "state update"))
        updates.append((t, w))
    return g.with_(nodes=tuple(r.nodes), outputs=tuple(r.cur(o) for o in g.outputs), updates=tuple(updates))

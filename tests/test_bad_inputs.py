"""Bad inputs, table-driven: each case runs the same code on holoflow and on torch (the oracle).

An error case asserts that holoflow raises torch's exception class (``isinstance`` of it; a
torch-only class must exist under the same name) with a message naming the op and the offending
values (every needle, compared with brackets and quotes dropped, case-insensitive). A value case
(NaN/inf/empty inputs torch accepts) asserts the same values, dtype and shape as torch.
Cases whose fix belongs to another owner's file are strict xfails naming the owner.

``L`` is the library under test (``holoflow`` or ``torch``), ``F`` its ``nn.functional``, ``nn``
its ``nn``; ``T(...)`` is ``L.tensor(...)``.
"""
from __future__ import annotations

import math
import os
import re
import tempfile

import numpy as np
import pytest
import torch

import holoflow as flow
from harness import error_table_params


class Case:
    def __init__(self, id: str, code: str, *needles: str, exc: type | None = None, owner: str | None = None,
                 torch_code: str | None = None) -> None:
        self.id, self.code, self.needles, self.exc, self.owner = id, code, needles, exc, owner
        self.torch_code = torch_code  # when torch spells it differently


def E(id, code, *needles, **kw) -> Case:
    """An error case; the class comes from torch running ``code`` (or ``exc=``)."""
    return Case(id, code, *needles, **kw)


def V(id, code, **kw) -> Case:
    """A value case: holoflow's result equals torch's."""
    c = Case(id, code, **kw)
    c.value = True
    return c


def _ns(lib) -> dict:
    return {"L": lib, "F": lib.nn.functional, "nn": lib.nn, "T": lib.tensor, "math": math, "np": np,
            "_path": _write, "_truncated": _truncated, "_bad_header": _bad_header}


def _exec(code: str, lib):
    ns = _ns(lib)
    lines = code.rsplit("\n", 1) if "\n" in code else code.split(";")
    for stmt in lines[:-1]:
        exec(stmt.strip(), ns)
    return eval(lines[-1].strip(), ns)


def _norm(s: str) -> str:
    return re.sub(r"[\[\]()'\"`]|torch\.Size|holoflow\.Size", "", str(s)).lower()


def _to_torch(v):
    if isinstance(v, flow.Tensor):
        return v.to_torch()
    if isinstance(v, tuple) and hasattr(v, "_fields"):  # (values, indices) and the like
        return tuple(_to_torch(x) for x in v)
    if isinstance(v, (tuple, list)):
        return type(v)(_to_torch(x) for x in v)
    if hasattr(v, "values") and hasattr(v, "indices") and not isinstance(v, torch.Tensor):
        return (_to_torch(v.values), _to_torch(v.indices))
    return v


def _torch_like(v):
    if isinstance(v, tuple) and not isinstance(v, torch.Tensor):
        return tuple(v)
    return v


def _builtin_base(cls: type) -> type:
    for c in cls.__mro__:
        if c.__module__ == "builtins":
            return c
    return Exception


CASES: list[Case] = []
# ---- shapes -------------------------------------------------------------------------------
CASES += [
    E("add-broadcast", "L.ones(2, 3) + L.ones(4, 5)", "2, 3", "4, 5"),
    E("mul-broadcast", "L.mul(L.ones(3), L.ones(4))", "mul", "3", "4"),
    E("sub-inplace-broadcast", "x = L.ones(3); x.sub_(L.ones(2, 3))", "sub", "2, 3"),
    E("matmul-inner", "L.matmul(L.ones(2, 3), L.ones(4, 5))", "2, 3", "4, 5"),
    E("mm-1d", "L.mm(L.ones(3), L.ones(3, 2))", "mm", "3,"),
    E("bmm-batch", "L.bmm(L.ones(2, 3, 4), L.ones(3, 4, 5))", "bmm", "2", "3"),
    E("matmul-0d", "L.matmul(L.ones(()), L.ones(3))", "matmul"),
    E("dot-sizes", "L.dot(L.ones(3), L.ones(4))", "dot", "3", "4"),
    E("dot-2d", "L.dot(L.ones(2, 2), L.ones(2, 2))", "dot", "1"),
    E("outer-2d", "L.outer(L.ones(2, 2), L.ones(2))", "outer"),
    E("cat-shapes", "L.cat([L.ones(2, 3), L.ones(2, 4)], 0)", "cat", "3", "4"),
    E("cat-empty-list", "L.cat([])", "cat"),
    E("cat-dim", "L.cat([L.ones(2), L.ones(2)], 3)", "cat", "3"),
    E("stack-shapes", "L.stack([L.ones(2), L.ones(3)])", "stack", "2", "3"),
    E("stack-empty", "L.stack([])", "stack"),
    E("view-bad", "L.ones(2, 3).view(4, 2)", "4, 2", "6"),
    E("view-two-minus-one", "L.ones(2, 3).view(-1, -1)", "-1"),
    E("reshape-bad", "L.ones(2, 3).reshape(5)", "5", "6"),
    E("expand-bad", "L.ones(2, 3).expand(4, 3)", "expand", "4"),
    E("expand-fewer", "L.ones(2, 3).expand(3)", "expand"),
    E("permute-dims", "L.ones(2, 3).permute(0)", "permute"),
    E("permute-repeat", "L.ones(2, 3).permute(0, 0)", "permute"),
    E("transpose-dim", "L.ones(2, 3).transpose(0, 2)", "2"),
    E("squeeze-dim", "L.ones(2, 3).squeeze(3)", "3"),
    E("unsqueeze-dim", "L.ones(2, 3).unsqueeze(4)", "4"),
    E("flatten-dims", "L.ones(2, 3).flatten(1, 0)", "flatten"),
    E("narrow-range", "L.ones(4).narrow(0, 2, 5)", "narrow", "5"),
    E("split-zero", "L.ones(4).split(0)", "split"),
    E("chunk-zero", "L.ones(4).chunk(0)", "chunk", "0"),
    E("repeat-fewer", "L.ones(2, 3).repeat(2)", "repeat"),
    E("flip-dim", "L.ones(2).flip(1)", "1"),
    E("roll-dims", "L.roll(L.ones(2, 2), (1, 1), (0,))", "roll"),
    E("sum-dim", "L.ones(2, 3).sum(2)", "2"),
    E("mean-dim", "L.ones(2, 3).mean(-3)", "-3"),
    E("softmax-dim", "L.softmax(L.ones(2, 3), 2)", "2"),
    E("cumsum-dim", "L.cumsum(L.ones(3), 1)", "1"),
    E("argmax-dim", "L.ones(2).argmax(1)", "1"),
    E("topk-k", "L.topk(L.ones(3), 4)", "topk", "4"),
    E("topk-dim", "L.topk(L.ones(3), 1, dim=2)", "2"),
    E("sort-dim", "L.sort(L.ones(3), 1)", "1"),
    E("diag-3d", "L.diag(L.ones(2, 2, 2))", "diag", "2, 2, 2"),
    E("tril-1d", "L.tril(L.ones(3))", "tril"),
    E("einsum-equation", "L.einsum('ij,jk->ik', L.ones(2, 3), L.ones(4, 5))", "einsum"),
    E("einsum-operands", "L.einsum('ij,jk->ik', L.ones(2, 3))", "einsum"),
    E("masked-fill-shape", "L.ones(2, 3).masked_fill(L.ones(4, dtype=L.bool), 0.0)", "4"),
    E("where-shapes", "L.where(L.ones(2, dtype=L.bool), L.ones(3), L.ones(2))", "2", "3"),
    E("pad-too-long", "F.pad(L.ones(2, 2), (1, 1, 1, 1, 1, 1))", "pad"),
    E("linear-shapes", "F.linear(L.ones(2, 5), L.ones(3, 4))", "5", "4"),
    E("conv2d-channels", "F.conv2d(L.ones(1, 3, 8, 8), L.ones(4, 2, 3, 3))", "conv2d", "3", "2"),
    E("conv2d-rank", "F.conv2d(L.ones(8, 8), L.ones(4, 2, 3, 3))", "conv2d"),
    E("conv2d-kernel-big", "F.conv2d(L.ones(1, 1, 2, 2), L.ones(1, 1, 3, 3))", "convolution", "3 x 3"),
    E("conv1d-groups", "F.conv1d(L.ones(1, 4, 8), L.ones(2, 2, 3), groups=3)", "conv1d", "3"),
    E("conv2d-bool-stride", "F.conv2d(L.ones(1, 1, 4, 4), L.ones(1, 1, 3, 3), stride=True)", "conv2d", "stride"),
    E("max-pool-kernel", "F.max_pool2d(L.ones(1, 1, 2, 2), 3)", "pool", "3"),
    E("avg-pool-pad", "F.avg_pool2d(L.ones(1, 1, 4, 4), 2, padding=2)", "pad"),
    E("layer-norm-shape", "F.layer_norm(L.ones(2, 3), (4,))", "layer_norm", "4"),
    E("batch-norm-channels", "F.batch_norm(L.ones(2, 3), L.zeros(4), L.ones(4))", "batch_norm", "4", "3"),
    E("group-norm-groups", "F.group_norm(L.ones(2, 6, 4), 4)", "group_norm", "4", "6"),
    E("cross-entropy-batch", "F.cross_entropy(L.ones(3, 4), T([0, 1]))", "cross_entropy", "3", "2"),
    E("mse-shapes", "F.mse_loss(L.ones(2, 3), L.ones(4, 3))", "2", "4"),
    E("interpolate-rank", "F.interpolate(L.ones(4), scale_factor=2)", "interpolate"),
    E("interpolate-size-and-scale", "F.interpolate(L.ones(1, 1, 4), size=8, scale_factor=2)", "interpolate"),
    E("linear-module", "nn.Linear(3, 4)(L.ones(2, 5))", "5", "3"),
    E("conv-module", "nn.Conv2d(3, 8, 3)(L.ones(1, 4, 8, 8))", "conv2d", "3", "4"),
    E("embedding-2d-weight", "F.embedding(T([0]), L.ones(3))", "embedding"),
    E("sdpa-shapes", "F.scaled_dot_product_attention(L.ones(1, 2, 4), L.ones(1, 3, 5), L.ones(1, 3, 5))",
      "attention", "4", "5"),
    E("cosine-sim-shapes", "F.cosine_similarity(L.ones(2, 3), L.ones(2, 4))", "3", "4"),
]

# ---- dtypes -------------------------------------------------------------------------------
CASES += [
    E("bitwise-float", "L.bitwise_and(L.ones(2), L.ones(2))", "bitwise_and", "float"),
    E("mean-int", "L.ones(3, dtype=L.int64).mean()", "mean", "long"),
    E("std-int", "L.ones(3, dtype=L.int64).std()", "std", "int64"),
    E("softmax-int", "L.softmax(L.ones(3, dtype=L.int64), 0)", "softmax", "long"),
    E("add-inplace-int-float", "x = L.ones(3, dtype=L.int64); x.add_(L.ones(3) * 0.5)", "float", "long"),
    E("mul-inplace-int-float", "x = L.ones(3, dtype=L.int64); x.mul_(1.5)", "float", "long"),
    E("matmul-dtypes", "L.matmul(L.ones(2, 2), L.ones(2, 2, dtype=L.float64))", "float32", "float64"),
    E("embedding-float-index", "F.embedding(L.ones(2), L.ones(3, 4))", "embedding", "float"),
    E("index-select-float", "L.index_select(L.ones(3), 0, L.ones(1))", "index_select", "float"),
    E("gather-float-index", "L.gather(L.ones(3), 0, L.ones(1))", "gather", "float"),
    E("cross-entropy-float-target", "F.cross_entropy(L.ones(2, 3), T([0.0, 1.0, 2.0]))", "cross_entropy"),
    E("nll-int-input", "F.nll_loss(L.ones(2, 3, dtype=L.int64), T([0, 1]))", "nll_loss", "long"),
    E("requires-grad-int", "L.ones(2, dtype=L.int64).requires_grad_()", "int64"),
    E("randn-int", "L.randn(3, dtype=L.int64)", "randn", "long"),
    E("linspace-bool", "L.arange(0, 3, dtype=L.bool)", "bool"),
    E("lerp-int", "L.lerp(L.ones(2, dtype=L.int64), L.ones(2, dtype=L.int64), 0.5)", "lerp"),
    E("masked-fill-float-mask", "L.ones(2).masked_fill(L.ones(2), 0.0)", "masked_fill", "float"),
    E("where-float-cond", "L.where(L.ones(2), L.ones(2), L.zeros(2))", "where", "float"),
    E("sqrt-bool-out", "x = L.ones(2, dtype=L.bool); x.sqrt_()", "sqrt"),
    E("conv-dtypes", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2, dtype=L.float64))", "convolution", "float64"),
    E("linear-int", "F.linear(L.ones(2, 3, dtype=L.int64), L.ones(4, 3))", "linear"),
    E("one-hot-float", "F.one_hot(L.ones(2))", "one_hot", "float"),
    E("bernoulli-int", "L.bernoulli(L.ones(2, dtype=L.int64))", "bernoulli"),
    E("multinomial-int", "L.multinomial(L.ones(3, dtype=L.int64), 1)", "multinomial"),
]

# ---- indices out of range -----------------------------------------------------------------
CASES += [
    E("getitem-int", "L.ones(3)[5]", "5", "3"),
    E("getitem-neg", "L.ones(3)[-4]", "-4", "3"),
    E("getitem-dim1", "L.ones(2, 3)[:, 3]", "3"),
    E("getitem-too-many", "L.ones(3)[0, 0]", "index"),
    E("getitem-tensor-index", "L.ones(3)[T([0, 3])]", "3"),
    E("getitem-bool-shape", "L.ones(3)[T([True, False])]", "2", "3"),
    E("setitem-int", "x = L.ones(3); x.__setitem__(4, 1.0)", "4", "3"),
    E("index-select-range", "L.index_select(L.ones(3), 0, T([3]))", "index_select", "3"),
    E("gather-range", "L.gather(L.ones(3), 0, T([5]))", "gather", "5"),
    E("scatter-range", "L.zeros(3).scatter(0, T([4]), L.ones(1))", "scatter", "4"),
    E("scatter-add-range", "L.zeros(3).scatter_add(0, T([-1]), L.ones(1))", "scatter", "-1"),
    E("index-add-range", "L.zeros(3).index_add(0, T([3]), L.ones(1))", "index_add", "3"),
    E("embedding-range", "F.embedding(T([0, 7]), L.ones(4, 2))", "7"),
    E("embedding-neg", "F.embedding(T([-1]), L.ones(4, 2))", "-1"),
    E("nll-target-range", "F.nll_loss(L.zeros(2, 3), T([0, 3]))", "3"),
    E("cross-entropy-target-neg", "F.cross_entropy(L.zeros(2, 3), T([0, -5]))", "-5"),
    E("one-hot-neg", "F.one_hot(T([-1, 0]))", "one_hot"),
    E("one-hot-classes", "F.one_hot(T([3]), 2)", "one_hot"),
    E("index-put-range", "x = L.zeros(3); x[T([5])] = 1.0; None", "5", "3"),
    E("select-range", "L.ones(2, 3).select(1, 3)", "select", "3"),
    E("unbind-dim", "L.ones(2).unbind(1)", "1"),
    E("movedim-range", "L.ones(2).movedim(0, 2)", "2"),
    E("multinomial-too-many", "L.multinomial(L.ones(3), 4)", "multinomial", "4"),
]

# ---- NaN / inf: torch's errors and torch's values ------------------------------------------
CASES += [
    E("multinomial-nan", "L.multinomial(T([0.5, float('nan')]), 1)", "multinomial"),
    E("multinomial-neg", "L.multinomial(T([0.5, -1.0]), 1)", "multinomial"),
    E("multinomial-inf", "L.multinomial(T([1.0, float('inf')]), 1)", "multinomial"),
    E("bernoulli-p-range", "L.bernoulli(T([1.5]))", "bernoulli"),
    E("bce-input-range", "F.binary_cross_entropy(T([1.5]), T([1.0]))", "binary_cross_entropy"),
    E("bce-nan", "F.binary_cross_entropy(T([float('nan')]), T([1.0]))", "binary_cross_entropy"),
    E("arange-nan", "L.arange(0, float('nan'))", "arange"),
    E("arange-inf", "L.arange(0, float('inf'))", "arange"),
    E("linspace-neg-steps", "L.linspace(0, 1, -1)", "linspace", "-1"),
    E("randint-range", "L.randint(5, 3, (2,))", "randint", "5", "3"),
    E("arange-step-zero", "L.arange(0, 3, 0)", "arange"),
    E("arange-wrong-sign", "L.arange(0, 3, -1)", "arange"),
    E("normal-neg-std", "L.normal(T([0.0]), T([-1.0]))", "normal"),
    V("max-nan", "L.max(T([1.0, float('nan'), 3.0]))"),
    V("min-dim-nan", "L.min(T([[1.0, float('nan')], [2.0, 0.0]]), 1)"),
    V("argmax-nan", "L.argmax(T([1.0, float('nan'), 3.0]))"),
    V("sort-nan", "L.sort(T([3.0, float('nan'), 1.0, float('-inf')]))"),
    V("topk-nan", "L.topk(T([3.0, float('nan'), 1.0]), 2)"),
    V("softmax-inf", "L.softmax(T([1.0, float('inf')]), 0)"),
    V("softmax-all-neg-inf", "L.softmax(T([float('-inf'), float('-inf')]), 0)"),
    V("log-softmax-neg-inf", "L.log_softmax(T([0.0, float('-inf')]), 0)"),
    V("clamp-nan", "L.clamp(T([float('nan'), 5.0, -5.0]), -1, 1)"),
    V("clamp-nan-bound", "L.clamp(T([0.5]), min=float('nan'))"),
    V("nan-to-num", "L.nan_to_num(T([float('nan'), float('inf'), float('-inf')]))"),
    V("cumsum-inf", "L.cumsum(T([1.0, float('inf'), float('-inf')]), 0)"),
    V("maximum-nan", "L.maximum(T([1.0, float('nan')]), T([float('nan'), 2.0]))"),
    V("relu-nan", "F.relu(T([float('nan'), -1.0]))"),
    V("logsumexp-inf", "L.logsumexp(T([float('inf'), 1.0]), 0)"),
    V("logsumexp-neg-inf", "L.logsumexp(T([float('-inf'), float('-inf')]), 0)"),
    V("div-zero", "T([1.0, -1.0, 0.0]) / 0"),
    V("int-div-float-zero", "T([1, 2]) / 0"),
    V("sqrt-neg", "L.sqrt(T([-1.0]))"),
    V("log-zero", "L.log(T([0.0, -1.0]))"),
    V("sigmoid-inf", "L.sigmoid(T([float('inf'), float('-inf')]))"),
    V("tanh-inf", "L.tanh(T([float('inf'), float('-inf')]))"),
    V("mse-nan", "F.mse_loss(T([float('nan')]), T([1.0]))"),
    V("cross-entropy-inf", "F.cross_entropy(T([[float('inf'), 0.0]]), T([1]))"),
    V("isfinite", "L.isfinite(T([1.0, float('nan'), float('inf')]))"),
    V("norm-inf", "L.linalg.norm(T([1.0, float('inf')]))"),
    V("mean-nan", "L.mean(T([1.0, float('nan')]))"),
    V("var-inf", "L.var(T([1.0, float('inf')]))"),
    V("sign-nan", "L.sign(T([float('nan'), -0.0]))"),
    V("round-half", "L.round(T([0.5, 1.5, 2.5, -0.5]))"),
    V("eq-nan", "T([float('nan')]) == T([float('nan')])"),
    V("amax-nan", "L.amax(T([[1.0, float('nan')]]), 1)"),
]

# ---- empty --------------------------------------------------------------------------------
CASES += [
    E("max-empty", "L.max(L.ones(0))", "max"),
    E("min-empty", "L.ones(0).min()", "min"),
    E("argmax-empty", "L.argmax(L.ones(0))", "argmax"),
    E("amax-empty", "L.amax(L.ones(0, 3), 0)", "amax"),
    E("max-dim-empty", "L.max(L.ones(0, 3), 0)", "max"),
    E("topk-empty", "L.topk(L.ones(0), 1)", "topk"),
    E("item-empty", "L.ones(0).item()", "0"),
    E("multinomial-empty", "L.multinomial(L.ones(0), 1)", "multinomial"),
    E("linear-empty-mismatch", "F.linear(L.ones(0, 3), L.ones(2, 4))", "3", "4"),
    V("sum-empty", "L.ones(0).sum()"),
    V("prod-empty", "L.ones(0).prod()"),
    V("mean-empty", "L.ones(0).mean()"),
    V("std-empty", "L.ones(0).std()"),
    V("softmax-empty", "L.softmax(L.ones(0, 3), 1)"),
    V("matmul-empty-inner", "L.matmul(L.ones(2, 0), L.ones(0, 3))"),
    V("cat-with-empty", "L.cat([L.ones(2, 3), L.ones(0, 3)])"),
    V("cumsum-empty", "L.cumsum(L.ones(0), 0)"),
    V("sort-empty", "L.sort(L.ones(0))"),
    V("max-dim-empty-other", "L.max(L.ones(3, 0), 0)"),
    V("logsumexp-empty", "L.logsumexp(L.ones(0), 0)"),
    V("any-empty", "L.any(L.ones(0, dtype=L.bool))"),
    V("all-empty", "L.all(L.ones(0, dtype=L.bool))"),
    V("norm-empty", "L.linalg.norm(L.ones(0))"),
    V("conv-empty-batch", "F.conv1d(L.ones(0, 1, 4), L.ones(1, 1, 2))"),
    V("cross-entropy-empty", "F.cross_entropy(L.ones(0, 3), L.ones(0, dtype=L.int64))"),
]

# ---- huge sizes ---------------------------------------------------------------------------
CASES += [
    E("zeros-overflow", "L.zeros(2 ** 62, 4)", "2 ** 62".replace(" ** 62", "") and "4611686018427387904"),
    E("empty-overflow", "L.empty(2 ** 40, 2 ** 40)", "1099511627776"),
    E("ones-negative", "L.ones(-1)", "-1"),
    E("zeros-negative", "L.zeros(2, -3)", "-3"),
    E("randn-negative", "L.randn(-2)", "-2"),
    E("full-negative", "L.full((-1,), 1.0)", "-1"),
    E("view-negative", "L.ones(4).view(-2, 2)", "-2"),
    E("expand-negative", "L.ones(1).expand(-2)", "-2"),
    E("repeat-negative", "L.ones(2).repeat(-1)", "-1"),
    E("linear-negative", "nn.Linear(-1, 3)", "-1"),
    E("eye-negative", "L.eye(-1)", "-1"),
    E("arange-huge", "L.arange(0, 2 ** 62)", "arange"),
]

# ---- wrong argument types -----------------------------------------------------------------
CASES += [
    E("add-str", "L.ones(2) + 'a'", "str"),
    E("add-fn-str", "L.add(L.ones(2), 'a')", "add", "str"),
    E("matmul-int", "L.matmul(L.ones(2), 3)", "matmul", "int"),
    E("sum-dim-str", "L.ones(2).sum('a')", "sum", "a"),
    E("reshape-str", "L.ones(2).reshape('a')", "reshape", "str"),
    E("view-float", "L.ones(4).view(2.5)", "view", "float"),
    E("ones-str", "L.ones('a')", "ones", "str"),
    E("zeros-float", "L.zeros(2.5)", "zeros", "float"),
    E("cat-tensor", "L.cat(L.ones(2))", "cat", "tensor"),
    E("softmax-dim-float", "L.softmax(L.ones(2), 1.5)", "softmax", "float"),
    E("transpose-float", "L.ones(2, 2).transpose(0.5, 1)", "transpose", "float"),
    E("tensor-str-elem", "T([1, 'a'])", "str"),
    E("tensor-object", "T(object())", "object"),
    E("tensor-ragged", "T([[1, 2], [3]])", "2", "1"),
    E("to-bad-device", "L.ones(2).to('tpu')", "tpu"),
    E("to-bad-dtype", "L.ones(2).to('float77')", "float77"),
    E("linear-list-weight", "F.linear(L.ones(2, 2), [[1.0, 2.0]])", "linear", "list"),
    E("relu-list", "F.relu([1.0, -1.0])", "relu", "list"),
    E("conv-stride-str", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2), stride='a')", "conv1d", "str"),
    E("clamp-str", "L.clamp(L.ones(2), 'a')", "clamp", "str"),
    E("index-str", "L.ones(2)['a']", "str"),
    E("index-float", "L.ones(2)[1.5]", "float"),
    E("pow-str", "L.ones(2) ** 'a'", "str"),
    E("where-list", "L.where([True], L.ones(1), L.zeros(1))", "where", "list"),
    E("dropout-p", "F.dropout(L.ones(2), p=1.5)", "dropout", "1.5"),
    E("dropout-module-p", "nn.Dropout(-0.1)", "-0.1"),
    E("sgd-lr", "L.optim.SGD([L.ones(1, requires_grad=True)], lr=-1.0)", "-1.0"),
    E("adam-betas", "L.optim.Adam([L.ones(1, requires_grad=True)], betas=(1.5, 0.9))", "1.5"),
    E("adam-eps", "L.optim.Adam([L.ones(1, requires_grad=True)], eps=-1.0)", "-1.0"),
    E("sgd-momentum", "L.optim.SGD([L.ones(1, requires_grad=True)], lr=0.1, momentum=-0.5)", "-0.5"),
    E("optim-empty", "L.optim.SGD([], lr=0.1)", "empty"),
    E("optim-not-tensor", "L.optim.SGD([1.0], lr=0.1)", "float"),
    E("optim-tensor-not-iterable", "L.optim.SGD(L.ones(2, requires_grad=True), lr=0.1)", "tensor"),
    E("sequential-index", "nn.Sequential(nn.ReLU())[3]", "3"),
    E("modulelist-index", "nn.ModuleList([nn.ReLU()])[2]", "2"),
    E("module-missing-attr", "nn.Linear(2, 2).nonexistent", "nonexistent"),
    E("register-parameter-dot", "nn.Linear(2, 2).register_parameter('a.b', None)", "a.b"),
    E("register-parameter-not-param", "nn.Linear(2, 2).register_parameter('w', L.ones(1))", "w"),
    E("linear-str-features", "nn.Linear('a', 2)", "str"),
    E("manual-seed-str", "L.manual_seed('a')", "str"),
    E("device-bad", "L.device('npu7')", "npu7"),
    E("item-multi", "L.ones(2).item()", "2"),
    E("bool-multi", "bool(L.ones(2))", "ambiguous"),
    E("int-multi", "int(L.ones(2))", "2"),
    E("float-multi", "float(L.ones(3))", "3"),
    E("len-0d", "len(L.ones(()))", "0-d"),
    E("iter-0d", "iter(L.ones(()))", "0-d"),
]

# ---- misuse of autograd -------------------------------------------------------------------
CASES += [
    E("backward-nonscalar", "x = L.ones(2, requires_grad=True); (x * 2).backward()", "scalar"),
    E("backward-no-grad", "L.ones(2).sum().backward()", "does not require grad"),
    E("backward-twice", "x = L.ones(2, requires_grad=True); y = (x.exp()).sum(); y.backward(); y.backward()",
      "second time"),
    E("inplace-leaf", "x = L.ones(2, requires_grad=True); x.add_(1)", "leaf"),
    E("grad-unused", "x = L.ones(2, requires_grad=True); z = L.ones(2, requires_grad=True); "
      "L.autograd.grad((x * 2).sum(), [z])", "not used"),
    E("grad-outputs-shape", "x = L.ones(2, requires_grad=True); y = x * 2; y.backward(L.ones(3))", "3", "2"),
    E("numpy-requires-grad", "L.ones(2, requires_grad=True).numpy()", "numpy", "requires grad"),
    E("grad-assign-shape", "x = L.ones(2, requires_grad=True); x.grad = L.ones(3); None", "grad", "3"),
    E("grad-assign-dtype", "x = L.ones(2, requires_grad=True); x.grad = L.ones(2, dtype=L.float64); None", "grad", "float64"),
    E("requires-grad-nonleaf", "x = L.ones(2, requires_grad=True); (x * 2).requires_grad_(False)", "leaf"),
    E("autograd-grad-no-grad", "x = L.ones(2); L.autograd.grad(x.sum(), [x])", "does not require grad"),
    E("retain-grad-no-grad", "L.ones(2).retain_grad()", "retain_grad"),
    E("modified-saved", "x = L.ones(2, requires_grad=True); y = x * 1; z = y * y; y.add_(1); z.sum().backward()",
      "modified by an in-place operation", "version 1"),
]


# ---- more: found while probing (the RecursionError, raw TypeErrors, option values) ---------------
CASES += [
    E("tensor-self-referential-list", "l = []; l.append(l); T(l)", "list"),
    E("sum-dim-list-str", "L.ones(2).sum(['a'])", "sum", "a"),
    E("reshape-none", "L.ones(2).reshape(None)", "reshape", "NoneType"),
    E("view-dtype-str", "L.ones(2).view('float32')", "view", "str"),
    E("module-no-super-init", "class M(nn.Module):\n    def __init__(self):\n        self.lin = nn.Linear(2, 2)\n"
      "M()", "before Module.__init__"),
    V("eq-str", "L.ones(2) == 'a'"),
    E("unflatten-sizes", "L.ones(2, 3).unflatten(1, (2, 2))", "unflatten", "2, 2", "3"),
    E("index-fill-range", "L.ones(3).index_fill(0, T([3]), 1.0)", "index_fill", "3"),
    E("diagonal-same-dims", "L.ones(2, 2).diagonal(0, 0, 0)", "diagonal", "0"),
    E("new-zeros-negative", "L.ones(3).new_zeros(-1)", "-1"),
    E("matmul-vec", "L.ones(2, 2) @ L.ones(3)", "matmul", "2, 2", "3"),
    E("masked-select-shape", "L.ones(2).masked_select(L.ones(3, dtype=L.bool))", "masked_select", "3"),
    E("dropout-training-str", "F.dropout(L.ones(2), p=0.5, training='yes')", "dropout", "str"),
    E("avg-pool-zero-kernel", "F.avg_pool1d(L.ones(1, 1, 4), 0)", "pool", "0"),
    E("max-pool-zero-stride", "F.max_pool1d(L.ones(1, 1, 4), 2, stride=0)", "max_pool", "0"),
    E("conv-negative-padding", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2), padding=-1)", "convolution", "-1"),
    E("conv-zero-dilation", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2), dilation=0)", "convolution", "0"),
    E("conv-zero-stride", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2), stride=0)", "convolution", "0"),
    E("conv-padding-str", "F.conv1d(L.ones(1, 1, 4), L.ones(1, 1, 2), padding='bad')", "conv1d", "bad"),
    E("nll-reduction", "F.nll_loss(L.zeros(2, 3), T([0, 1]), reduction='avg')", "avg"),
    E("mse-reduction", "F.mse_loss(L.ones(2), L.ones(2), reduction='none2')", "none2"),
    E("label-smoothing-range", "F.cross_entropy(L.zeros(2, 3), T([0, 1]), label_smoothing=1.5)", "label_smoothing",
      "1.5"),
    E("kl-div-shapes", "F.kl_div(L.ones(2), L.ones(3))", "2", "3"),
    E("l1-shapes", "F.l1_loss(L.ones(2), L.ones(3))", "2", "3"),
    E("smooth-l1-beta", "F.smooth_l1_loss(L.ones(2), L.ones(2), beta=-1.0)", "smooth_l1_loss", "-1.0"),
    E("huber-delta", "F.huber_loss(L.ones(2), L.ones(2), delta=-1.0)", "huber_loss", "-1.0"),
    E("cosine-sim-dim", "F.cosine_similarity(L.ones(2, 3), L.ones(2, 3), dim=2)", "2"),
    E("normalize-dim", "F.normalize(L.ones(2, 3), p=2, dim=2)", "2"),
    E("sdpa-mask-shape", "F.scaled_dot_product_attention(L.ones(1, 2, 4), L.ones(1, 2, 4), L.ones(1, 2, 4), "
      "attn_mask=L.ones(3, 3))", "attention", "3"),
    E("cumsum-dim-str", "L.cumsum(L.ones(3), 'a')", "cumsum", "a"),
    E("cumprod-dim", "L.cumprod(L.ones(3), 2)", "2"),
    E("logsumexp-dim", "L.logsumexp(L.ones(3), 2)", "2"),
    E("einsum-repeated-sizes", "L.einsum('ii->i', L.ones(2, 3))", "einsum", "3", "2"),
    E("einsum-broadcast", "L.einsum('i,i->i', L.ones(2), L.ones(3))", "einsum", "3", "2"),
    E("norm-fro-one-dim", "L.linalg.norm(L.ones(2, 3), ord='fro', dim=0)", "norm", "fro"),
    E("vector-norm-ord-str", "L.linalg.vector_norm(L.ones(2), ord='x')", "vector_norm", "x"),
    E("scatter-src-dims", "L.scatter(L.zeros(3), 0, T([0]), L.ones(2, 2))", "scatter"),
    E("scatter-float-index", "L.zeros(3).scatter_(0, T([0.0]), 1.0)", "scatter", "float"),
    E("index-add-source-shape", "L.zeros(2, 3).index_add(1, T([0]), L.ones(3, 1))", "index_add", "3, 1"),
    E("clamp-complex", "L.ones(2, dtype=L.complex64).clamp(0, 1)", "clamp", "complex"),
    E("addmm-shapes", "L.addmm(L.ones(2, 2), L.ones(2, 3), L.ones(4, 2))", "addmm", "2, 3", "4, 2"),
    E("baddbmm-shapes", "L.baddbmm(L.ones(2, 2, 2), L.ones(2, 2, 3), L.ones(2, 4, 2))", "baddbmm", "2, 4, 2"),
    E("view-noncontiguous", "L.ones(2, 3).t().view(6)", "view", "6"),
    E("where-other-str", "L.where(L.ones(2, dtype=L.bool), L.ones(2), 'x')", "where", "x"),
    E("to-cuda-index", "L.ones(2).to(5)", "cuda"),
]

# ---- checkpoints --------------------------------------------------------------------------
def _write(data: bytes) -> str:
    fd, path = tempfile.mkstemp(suffix=".pt")
    with os.fdopen(fd, "wb") as f:
        f.write(data)
    return path


def _truncated() -> bytes:
    """A safetensors file cut in the middle of its data."""
    header = b'{"w":{"dtype":"F32","shape":[64],"data_offsets":[0,256]}}'
    return len(header).to_bytes(8, "little") + header + b"\0" * 100


def _bad_header() -> bytes:
    """A safetensors length prefix followed by a header that is not JSON."""
    header = b'{"w":{"dtype":"F32", oops'
    return len(header).to_bytes(8, "little") + header + b"\0" * 16


CASES += [
    E("load-garbage", "L.load(_path(b'not a checkpoint at all'))", "load", exc=Exception),
    E("load-missing", "L.load('/nonexistent/dir/ckpt.pt')", "/nonexistent/dir/ckpt.pt"),
    E("load-empty-file", "L.load(_path(b''))", "load", exc=Exception),
    E("load-truncated-safetensors", "L.load(_path(_truncated()))", "load", exc=Exception),
    E("load-bad-header", "L.load(_path(_bad_header()))", "header", exc=Exception),
    E("load-state-dict-missing", "m = nn.Linear(2, 2); m.load_state_dict({'weight': L.ones(2, 2)})",
      "bias"),
    E("load-state-dict-shape", "m = nn.Linear(2, 2); m.load_state_dict({'weight': L.ones(3, 2), 'bias': L.ones(2)})",
      "weight", "3, 2", "2, 2"),
    E("load-state-dict-unexpected",
      "m = nn.Linear(2, 2); m.load_state_dict({'weight': L.ones(2, 2), 'bias': L.ones(2), 'extra': L.ones(1)})",
      "extra"),
    E("optim-load-state-groups", "o = L.optim.SGD([L.ones(1, requires_grad=True)], lr=0.1); "
      "o.load_state_dict({'state': {}, 'param_groups': []})", "group"),
]

# ---- complex and extra math ops (ops/complex_ops.py, ops/special.py, ops/pointwise.py, ...) ---------------------------
CASES += [
    E("view_as_real-real", "L.view_as_real(L.ones(3))", "view_as_real"),
    E("view_as_complex-last-dim", "L.view_as_complex(L.ones(3, 3))", "view_as_complex", "2"),
    E("view_as_complex-stride", "L.view_as_complex(L.ones(2, 3).t())", "view_as_complex", "stride"),
    E("view_as_complex-int", "L.view_as_complex(L.ones(3, 2, dtype=L.int64))", "view_as_complex"),
    E("imag-real", "L.imag(L.ones(3))", "imag", "non-complex"),
    E("imag-prop-real", "L.ones(3).imag", "imag", "non-complex"),
    E("complex-dtypes", "L.complex(L.ones(3), L.ones(3, dtype=L.float64))", "complex", "float64"),
    E("complex-shapes", "L.complex(L.ones(3), L.ones(4))", "complex", "3", "4"),
    E("polar-int", "L.polar(L.ones(3, dtype=L.int64), L.ones(3, dtype=L.int64))", "polar"),
    E("diff-0d", "L.diff(L.tensor(1.0))", "diff", "one-dimensional"),
    E("diff-neg-n", "L.diff(L.ones(3), n=-1)", "diff", "non-negative"),
    E("diff-dim", "L.diff(L.ones(3), dim=2)", "diff", "2"),
    E("kron-type", "L.kron(L.ones(2), 3)", "kron"),
    E("tensordot-mismatch", "L.tensordot(L.ones(2, 3), L.ones(4, 5), dims=1)", "tensordot", "3", "4"),
    E("tensordot-neg", "L.tensordot(L.ones(2, 3), L.ones(3, 5), dims=-1)", "tensordot", "-1"),
    E("rot90-dims", "L.rot90(L.ones(2, 3), 1, (0, 1, 2))", "rot90", "3"),
    E("rot90-same", "L.rot90(L.ones(2, 3), 1, (0, 0))", "rot90", "different"),
    E("rot90-1d", "L.rot90(L.ones(3))", "rot90", "1"),
    E("diag_embed-same", "L.diag_embed(L.ones(3), 0, 0, 0)", "diag_embed"),
    E("block_diag-3d", "L.block_diag(L.ones(2, 2, 2))", "block_diag", "3"),
    E("cartesian_prod-2d", "L.cartesian_prod(L.ones(2, 2))", "cartesian_prod"),
    E("bucketize-2d", "L.bucketize(L.ones(3), L.ones(2, 2))", "bucketize", "1"),
    E("histc-int", "L.histc(L.ones(3, dtype=L.int64))", "histc"),
    E("histc-minmax", "L.histc(L.ones(3), 4, 2, 1)", "histc", "max"),
    E("histc-bins", "L.histc(L.ones(3), 0)", "histc", "bins"),
    E("polygamma-neg", "L.polygamma(-1, L.ones(3))", "polygamma"),
    E("lgamma-complex", "L.lgamma(L.ones(3, dtype=L.complex64))", "lgamma"),
    E("hypot-shapes", "L.hypot(L.ones(3), L.ones(4))", "hypot", "3", "4"),
    E("gcd-float", "L.gcd(L.ones(3), L.ones(3))", "gcd"),
    E("frexp-int", "L.frexp(L.ones(3, dtype=L.int64))", "frexp"),
    E("trapezoid-x-size", "L.trapezoid(L.ones(3, 4), L.ones(3))", "trapezoid", "3", "4"),
    E("vander-2d", "L.vander(L.ones(2, 2))", "vander"),
    E("vander-negN", "L.vander(L.ones(3), -1)", "vander", "-1"),
    E("cov-3d", "L.cov(L.ones(2, 2, 2))", "cov", "3"),
    E("corrcoef-3d", "L.corrcoef(L.ones(2, 2, 2))", "corrcoef", "3"),
    E("renorm-p", "L.renorm(L.ones(3, 3), 0, 0, 1.0)", "renorm"),
    E("renorm-maxnorm", "L.renorm(L.ones(3, 3), 2, 0, -1.0)", "renorm", "-1"),
    E("index_copy-index-dtype", "L.index_copy(L.ones(3, 3), 0, L.tensor([0.0]), L.ones(1, 3))", "index_copy"),
    E("index_copy-src-dtype", "L.index_copy(L.ones(3, 3), 0, L.tensor([0]), L.ones(1, 3, dtype=L.float64))", "index_copy", "float64"),
    E("index_copy-src-shape", "L.index_copy(L.ones(3, 3), 0, L.tensor([0]), L.ones(1, 4))", "index_copy"),
    E("masked_scatter-mask", "L.masked_scatter(L.ones(3), L.ones(3), L.ones(3))", "masked_scatter", "bool"),
    E("masked_scatter-too-few", "L.masked_scatter(L.ones(3), L.ones(3, dtype=L.bool), L.ones(2))", "masked_scatter"),
    E("scatter_reduce-reduce", "L.scatter_reduce(L.ones(3), 0, L.tensor([0]), L.ones(1), 'foo')", "scatter_reduce", "foo"),
    E("scatter_reduce-index", "L.scatter_reduce(L.ones(3), 0, L.tensor([0.0]), L.ones(1), 'sum')", "scatter_reduce"),
    E("scatter_reduce-oob", "L.scatter_reduce(L.ones(3), 0, L.tensor([5]), L.ones(1), 'sum')", "scatter_reduce"),
    E("unravel_index-float", "L.unravel_index(L.tensor([1.5]), (2, 3))", "unravel_index", "integer"),
    E("unravel_index-neg-shape", "L.unravel_index(L.tensor([1]), (2, -3))", "unravel_index", "-3"),
    E("isin-no-tensor", "L.isin(1, 2)", "isin"),
    E("copysign-shapes", "L.copysign(L.ones(3), L.ones(2))", "copysign", "3", "2"),
]

# ---- the runner ---------------------------------------------------------------------------
# fixes that belong to other owners' files (strict xfails: they start passing when fixed)
XFAIL: dict[str, str] = {}




def _run(code: str, lib):
    try:
        return _exec(code, lib), None
    except Exception as e:  # noqa: BLE001 - the case decides what is expected
        return None, e


@pytest.mark.parametrize("case", error_table_params(CASES, XFAIL))
def test_bad_input(case: Case):
    with np.errstate(all="ignore"):
        got, err = _run(case.code, flow)
        ref, ref_err = _run(case.torch_code or case.code, torch) if case.exc is None else (None, None)
    if getattr(case, "value", False):
        assert ref_err is None, f"torch raised on a value case: {ref_err!r}"
        assert err is None, f"holoflow raised {type(err).__name__}: {err}"
        got, ref = _to_torch(got), _torch_like(ref)
        torch.testing.assert_close(got, ref, equal_nan=True, rtol=1e-5, atol=1e-6)
        return
    expected = case.exc or type(ref_err)
    if case.exc is None:
        assert ref_err is not None, f"torch accepts this (returned {ref!r}); the case is wrong"
    assert err is not None, f"holoflow accepted it and returned {got!r}; torch raises {expected.__name__}: {ref_err}"
    assert not isinstance(err, RecursionError), f"RecursionError: {err}"
    assert isinstance(err, _builtin_base(expected)), \
        f"holoflow raised {type(err).__name__} ({err}); torch raises {expected.__name__} ({ref_err})"
    if _builtin_base(expected) is not expected:  # a torch-only class: holoflow has one of that name
        assert expected.__name__ in [k.__name__ for k in type(err).__mro__], \
            f"holoflow raised {type(err).__name__}; torch raises {expected.__name__}"
    msg = _norm(err)
    missing = [n for n in case.needles if _norm(n) not in msg]
    assert not missing, f"message lacks {missing}: {type(err).__name__}: {err}"


def test_enough_cases():
    ids = [c.id for c in CASES]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    assert len(ids) >= 150, len(ids)

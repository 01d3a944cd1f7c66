"""Differential fuzzing of the eager op library: short random programs (3-8 ops) of pointwise
ops, reductions, shape ops, products and ``nn.functional``, over leaves of every dtype torch
computes on the CPU (half, bfloat16, integers, bool, complex), of broadcasting, empty, size-1 and
0-d shapes, laid out contiguous, transposed, strided or expanded, with Python scalars on either
side, keyword and positional arguments, in-place methods and ``out=``. Each program is generated
by running it on torch (a step torch refuses is kept now and then: it ends the program), then
replayed on holoflow. Every step's results must agree (dtype, shape, values to the dtype's
tolerance, NaN where NaN), in-place methods must return their tensor; when torch raises, holoflow
must raise the same class; at the end every live tensor's value must agree and, where the
program's last tensor requires grad, the gradients of a weighted sum of it w.r.t. the leaves.

``out=``: compared as torch's (the tensor returned, its dtype, shape and values); a function that
refuses it with a ``TypeError`` naming ``out`` (holoflow took none before ops/out_arg.py) is
compared up to that step, so one never accepted silently.

Each seed is one program; ``_program(seed)`` lists its steps. A longer hunt:
``HOLOFLOW_FUZZ_FIRST=100000 HOLOFLOW_FUZZ_SEEDS=20000`` (from that seed on)."""
from __future__ import annotations

import operator
import os
import warnings
from dataclasses import dataclass

import numpy as np
import pytest
import torch

import holoflow as flow
from harness import raised

# seeds that found bugs (the focused tests at the end minimize them): 127 (var's gradient with no
# degree of freedom left), 132 (mse_loss of a bool input refused), 196 (split of a 0-d tensor:
# IndexError), 354 (diag of a matrix was a view), 522 (movedim of a 0-d tensor: IndexError), 4639
# (clamp(uint8, 0.5, tensor) cast 0.5 to uint8), 4784 (smooth_l1_loss(float16, 0-d float32) was float16),
# 6495 (cumprod(bfloat16, dtype=float64)'s gradient was float64), 7642 (addcdiv's complex64 input got a
# complex128 gradient), 8056 (einsum("ab->ba", y) was a copy, torch's a view),
# 424 (amin() of an empty tensor: IndexError, torch's RuntimeError), 4128 (cross_entropy with no
# class: ZeroDivisionError), 374 (lerp(int32, int32, 0-d float32) refused; torch's kernel promotes),
# 201569 (prod(complex, dtype=float64)'s gradient from the complex values, torch's from the real parts),
# 200539, 202706 (an in-place comparison with an operand requiring grad cut the history; torch: zeros),
# 210898, 215947 (in-place pow_/hypot_ gradients read the result in the target's dtype), 217040 (a complex
# alpha's gradient unconjugated), 219312, 224432 (copysign, baddbmm saved an input no gradient reads),
# 219668 (div with rounding: dy * 0 NaN), 225263 (a bool dim), 228420, 239658 (a number beside an
# integer tensor read in its dtype), 238498 (prod's 0-d gradient dtype), 248882 (a 0-d class target)
FOUND = (127, 132, 196, 354, 374, 424, 522, 4128, 4639, 4784, 6495, 7642, 8056, 201569, 200539, 202706,
         210898, 215947, 217040, 219312, 219668, 224432, 225263, 228420, 238498, 239658, 248882)
# found and left (strict xfails, so a fix shows): seed -> why
KNOWN: dict = {}
# CI runs these many programs and FOUND; HOLOFLOW_FUZZ_SEEDS=N runs N from HOLOFLOW_FUZZ_FIRST on
_FIRST = int(os.environ.get("HOLOFLOW_FUZZ_FIRST", 0))
SEEDS = sorted(set(range(_FIRST, _FIRST + int(os.environ.get("HOLOFLOW_FUZZ_SEEDS", 150)))) | set(FOUND))

DTYPES = ("float32", "float64", "float16", "bfloat16", "int64", "int32", "int8", "uint8", "bool", "complex64")
FLOATS = ("float32", "float64", "float16", "bfloat16")
SHAPES = ((), (1,), (0,), (3,), (4,), (2, 3), (3, 1), (1, 3), (2, 0), (3, 3), (2, 3, 4), (2, 1, 4), (1, 1))
LAYOUTS = ("contiguous", "contiguous", "transposed", "strided", "expanded")
SCALARS = (2, -1, 0, 3, 0.5, -1.5, 2.0, True, False, 1 + 2j)


# -- the arguments of a step: plain values, or references resolved per library -------------------

@dataclass(frozen=True)
class Ref:
    """The live tensor ``k`` of the program (leaves and results, in order)."""
    k: int


@dataclass(frozen=True)
class Leaf:
    """A new leaf: values drawn from ``seed``, laid out as ``layout`` (a view of a differentiable
    base where not contiguous)."""
    dtype: str
    shape: tuple
    layout: str
    seed: int


@dataclass(frozen=True)
class Idx:
    """An int64 index tensor."""
    values: tuple
    shape: tuple


@dataclass(frozen=True)
class Dt:
    """A dtype, named."""
    name: str


@dataclass(frozen=True)
class Out:
    """A new tensor for ``out=`` (zeros)."""
    dtype: str
    shape: tuple


def _values(dtype: str, shape: tuple, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if dtype == "uint8":
        return rng.integers(0, 8, shape)
    if dtype.startswith("int"):
        return rng.integers(-6, 7, shape)
    v = np.round(rng.standard_normal(shape) * 2, 2)
    return v + 1j * np.round(rng.standard_normal(shape), 2) if dtype == "complex64" else v


def _base_shape(shape: tuple, layout: str) -> tuple:
    """The shape of the tensor ``layout``'s view is taken of."""
    if layout == "transposed":
        return shape[::-1]
    if layout == "strided":
        return (2 * shape[0],) + shape[1:]
    if layout == "expanded":
        return (1,) + shape[1:]
    return shape


def _lay_out(x, shape: tuple, layout: str):
    if layout == "transposed":
        return x.permute(*reversed(range(len(shape))))
    if layout == "strided":
        return x[::2]
    if layout == "expanded":
        return x.expand(*shape)
    return x


def _make_leaf(lib, spec: Leaf, grad: bool, leaves: list):
    layout = spec.layout if len(spec.shape) >= 1 + (spec.layout == "transposed") else "contiguous"
    base = torch.tensor(_values(spec.dtype, _base_shape(spec.shape, layout), spec.seed),
                        dtype=getattr(torch, spec.dtype))
    x = base if lib is torch else flow.from_torch(base)
    if grad and (base.is_floating_point() or base.is_complex()):
        x.requires_grad_(True)
        leaves.append(x)
    return _lay_out(x, spec.shape, layout)


def _resolve(lib, a, pool: list, grad: bool, leaves: list):
    if isinstance(a, Ref):
        return pool[a.k]
    if isinstance(a, Leaf):
        return _make_leaf(lib, a, grad, leaves)
    if isinstance(a, Idx):
        return lib.tensor(np.array(a.values, dtype=np.int64).reshape(a.shape))
    if isinstance(a, Dt):
        return getattr(lib, a.name)
    if isinstance(a, Out):
        return lib.zeros(a.shape, dtype=getattr(lib, a.dtype))
    if isinstance(a, (tuple, list)):
        return type(a)(_resolve(lib, v, pool, grad, leaves) for v in a)
    if isinstance(a, dict):
        return {k: _resolve(lib, v, pool, grad, leaves) for k, v in a.items()}
    return a


# -- the ops: name -> (call form, drawer of (args, kwargs)) ------------------------------------------
# forms: "f" lib.name(*args), "m" args[0].name(*args[1:]), "F" lib.nn.functional.name, "op" operator.name

UNARY = ("abs", "neg", "sign", "exp", "log", "sqrt", "rsqrt", "sigmoid", "tanh", "sin", "cos", "floor", "ceil",
         "round", "trunc", "frac", "reciprocal", "log1p", "expm1", "square", "erf", "relu", "logical_not",
         "bitwise_not", "isnan", "isinf", "isfinite", "signbit", "sgn", "exp2", "log2", "deg2rad", "nan_to_num")
BINARY = ("add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "atan2",
          "maximum", "minimum", "fmax", "fmin", "eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or",
          "logical_xor", "bitwise_and", "bitwise_or", "bitwise_xor", "hypot", "copysign", "xlogy")
OPERATORS = ("add", "sub", "mul", "truediv", "floordiv", "mod", "pow", "and_", "or_", "xor", "eq", "ne", "lt",
             "le", "gt", "ge", "iadd", "isub", "imul", "itruediv")
# torch refuses a number second here (TypeError); holoflow takes one on purpose
# (tests/ops/test_scalar_first.py): a 0-d tensor instead
NUMBER_SECOND = ("maximum", "minimum", "atan2")
REDUCTIONS = ("sum", "mean", "prod", "amax", "amin", "max", "min", "argmax", "argmin", "std", "var",
              "logsumexp", "cumsum", "cumprod", "norm", "all", "any", "count_nonzero", "nansum")
DTYPE_ARG = ("sum", "mean", "prod", "cumsum", "cumprod", "nansum")


def _pick(rng, pool: list) -> Ref:
    """A live tensor, the newest ones more often (programs chain)."""
    n = len(pool)
    return Ref(n - 1 - min(int(rng.geometric(0.45)) - 1, n - 1))


def _leaf(rng, dtype: str | None = None, shape: tuple | None = None) -> Leaf:
    return Leaf(dtype or str(rng.choice(DTYPES)), SHAPES[int(rng.integers(len(SHAPES)))] if shape is None else shape,
                str(rng.choice(LAYOUTS)), int(rng.integers(1 << 30)))


def _scalar(rng):
    return SCALARS[int(rng.integers(len(SCALARS)))]


def _dtype_of(x) -> str:
    return str(x.dtype).split(".")[-1]


def _like(rng, x, pool: list):
    """A second operand for ``x``: a live tensor, a new leaf broadcasting with it (of its dtype
    mostly), or a Python scalar."""
    r = rng.random()
    if r < 0.25:
        return _scalar(rng)
    if r < 0.45:
        return _pick(rng, pool)
    shape = tuple(x.shape)
    shape = shape[int(rng.integers(0, len(shape) + 1)):] if rng.random() < 0.4 else shape
    shape = tuple(1 if rng.random() < 0.2 else s for s in shape)
    return _leaf(rng, _dtype_of(x) if rng.random() < 0.6 else None, shape)


def _dim(rng, x, extra: int = 0) -> int:
    nd = max(x.dim(), 1)
    return int(rng.integers(-nd, nd + extra))


def _dims(rng, x):
    """A reduction's ``dim``: an int, a tuple of distinct dims, or left out (None)."""
    r = rng.random()
    if r < 0.25 or x.dim() == 0:
        return None
    if r < 0.7:
        return _dim(rng, x)
    k = int(rng.integers(1, x.dim() + 1))
    return tuple(int(d) for d in rng.permutation(x.dim())[:k])


def _draw_unary(rng, ref, x, pool, name):
    return (ref,), {}


def _draw_binary(rng, ref, x, pool, name):
    kw = {}
    if name in ("add", "sub") and rng.random() < 0.3:
        kw["alpha"] = _scalar(rng)
    if name == "div" and rng.random() < 0.5:
        kw["rounding_mode"] = [None, "trunc", "floor"][int(rng.integers(3))]
    other = _like(rng, x, pool)
    if name in NUMBER_SECOND and not isinstance(other, (Ref, Leaf)):
        other = _leaf(rng, _dtype_of(x), ())
    first = ref
    return ((other, first) if rng.random() < 0.15 else (first, other)), kw


def _draw_where(rng, ref, x, pool, name):
    cond = _leaf(rng, "bool", tuple(x.shape)) if rng.random() < 0.8 else _pick(rng, pool)
    return (cond, ref, _like(rng, x, pool)), {}


def _draw_clamp(rng, ref, x, pool, name):
    lo = [None, _scalar(rng), _like(rng, x, pool)][int(rng.integers(3))]
    hi = [None, _scalar(rng), _like(rng, x, pool)][int(rng.integers(3))]
    if rng.random() < 0.5:
        return (ref,), {"min": lo, "max": hi}
    return (ref, lo, hi), {}


def _draw_lerp(rng, ref, x, pool, name):
    w = _scalar(rng) if rng.random() < 0.5 else _like(rng, x, pool)
    return (ref, _like(rng, x, pool), w), {}


def _draw_addc(rng, ref, x, pool, name):
    kw = {"value": _scalar(rng)} if rng.random() < 0.5 else {}
    return (ref, _like(rng, x, pool), _like(rng, x, pool)), kw


def _draw_reduction(rng, ref, x, pool, name):
    kw = {}
    dim = _dims(rng, x)
    if name in ("cumsum", "cumprod"):
        dim = _dim(rng, x)
    if name in ("argmax", "argmin", "max", "min") and isinstance(dim, tuple):
        dim = dim[0]
    if name in ("logsumexp", "std", "var", "norm", "count_nonzero") or dim is not None:
        kw["dim"] = dim
        if name not in ("cumsum", "cumprod", "count_nonzero") and rng.random() < 0.5:
            kw["keepdim"] = bool(rng.random() < 0.5)
    if name in ("max", "min") and dim is None and rng.random() < 0.3:
        return (ref, _like(rng, x, pool)), {}
    if name in DTYPE_ARG and rng.random() < 0.3:
        kw["dtype"] = Dt(str(rng.choice(("float64", "float32", "int64", "float16", "complex64"))))
    if name in ("std", "var") and rng.random() < 0.6:
        kw["correction"] = int(rng.integers(0, 3))
    if name == "norm" and rng.random() < 0.6:
        kw["p"] = [1, 2, 3, float("inf"), 0, "fro"][int(rng.integers(6))]
    if name in ("all", "any") and "dim" not in kw and x.dim() and rng.random() < 0.5:
        kw["dim"] = _dim(rng, x)
    if rng.random() < 0.3 and "dim" in kw:   # (positionally)
        return (ref, kw.pop("dim")), kw
    return (ref,), kw


def _shape_target(rng, shape: tuple) -> tuple:
    n = int(np.prod(shape)) if shape else 1
    options = [(-1,), shape[::-1], shape + (1,), (n,), (1, n), ((-1,) + shape[1:]) if shape else (1,)]
    if len(shape) >= 2:
        options.append((shape[0] * shape[1],) + shape[2:])
    return tuple(int(s) for s in options[int(rng.integers(len(options)))])


def _draw_reshape(rng, ref, x, pool, name):
    target = _shape_target(rng, tuple(x.shape))
    return ((ref, target) if rng.random() < 0.5 else (ref, *target)), {}


def _draw_permute(rng, ref, x, pool, name):
    return (ref, *[int(d) for d in rng.permutation(x.dim())]), {}


def _draw_two_dims(rng, ref, x, pool, name):
    return (ref, _dim(rng, x), _dim(rng, x)), {}


def _draw_expand(rng, ref, x, pool, name):
    shape = tuple(3 if s == 1 and rng.random() < 0.5 else (-1 if rng.random() < 0.2 else s) for s in x.shape)
    return (ref, *((2,) if rng.random() < 0.4 else ()), *shape), {}


def _draw_dim_arg(rng, ref, x, pool, name):
    extra = 1 if name == "unsqueeze" else 0
    if name == "squeeze" and rng.random() < 0.3:
        return (ref,), {}
    if name == "flatten":
        return (ref, _dim(rng, x), -1), {}
    return (ref, _dim(rng, x, extra)), {}


def _draw_cat(rng, ref, x, pool, name):
    n = int(rng.integers(1, 4))
    xs = [ref] + [_pick(rng, pool) if rng.random() < 0.3 else
                                 _leaf(rng, _dtype_of(x) if rng.random() < 0.7 else None, tuple(x.shape))
                                 for _ in range(n - 1)]
    return (xs,), {"dim": _dim(rng, x, 1 if name == "stack" else 0)}


def _draw_split(rng, ref, x, pool, name):
    d = _dim(rng, x)
    size = x.shape[d] if x.dim() else 1
    if name == "split" and rng.random() < 0.4 and size >= 1:
        cut = int(rng.integers(0, size + 1))
        return (ref, [cut, size - cut], d), {}
    return (ref, int(rng.integers(1, 4)), d), {}


def _draw_narrow(rng, ref, x, pool, name):
    d = _dim(rng, x)
    size = x.shape[d] if x.dim() else 1
    start = int(rng.integers(-size, size + 1)) if size else 0
    if name == "select":
        return (ref, d, int(rng.integers(-size, size)) if size else 0), {}
    return (ref, d, start, int(rng.integers(0, max(size - max(start, 0), 0) + 1))), {}


def _index_values(rng, high: int, shape: tuple) -> Idx:
    n = int(np.prod(shape)) if shape else 1
    return Idx(tuple(int(v) for v in rng.integers(-high if rng.random() < 0.2 else 0, max(high, 1), n)), shape)


def _draw_gather(rng, ref, x, pool, name):
    d = _dim(rng, x)
    high = x.shape[d] if x.dim() else 1
    if name == "index_select":
        return (ref, d, _index_values(rng, high, (int(rng.integers(0, 4)),))), {}
    if name == "take":
        return (ref, _index_values(rng, max(x.numel(), 1), (int(rng.integers(0, 4)),))), {}
    shape = tuple(int(rng.integers(0, s + 1)) for s in x.shape)
    return (ref, d, _index_values(rng, high, shape)), {}


def _draw_masked(rng, ref, x, pool, name):
    return (ref, _leaf(rng, "bool", tuple(x.shape))), {}


def _draw_flip(rng, ref, x, pool, name):
    dims = [int(d) for d in rng.permutation(x.dim())[:int(rng.integers(0, x.dim() + 1))]]
    if name == "roll":
        return (ref, [int(rng.integers(-3, 4)) for _ in dims] or int(rng.integers(-3, 4)),
                dims or None), {}
    return (ref, dims), {}


def _draw_repeat(rng, ref, x, pool, name):
    k = x.dim() + int(rng.integers(0, 2)) - (name == "tile" and rng.random() < 0.5)
    return (ref, [int(rng.integers(0, 3)) for _ in range(max(k, 0))]), {}


def _draw_tri(rng, ref, x, pool, name):
    return (ref, int(rng.integers(-2, 3))), {}


def _draw_matmul(rng, ref, x, pool, name):
    shape = tuple(x.shape)
    k = shape[-1] if shape else 1
    other = {"matmul": (k, 2), "mm": (k, 2), "bmm": shape[:1] + (k, 2), "outer": (3,)}[name]
    if name == "matmul" and rng.random() < 0.4:
        other = (k,) if rng.random() < 0.5 else (2, k, 3)
    return (ref, _leaf(rng, _dtype_of(x), other)), {}


def _draw_addmm(rng, ref, x, pool, name):
    kw = {"beta": _scalar(rng), "alpha": _scalar(rng)} if rng.random() < 0.4 else {}
    if name == "baddbmm":
        return (ref, _leaf(rng, _dtype_of(x), (2, 2, 3)), _leaf(rng, _dtype_of(x), (2, 3, 4))), kw
    return (ref, _leaf(rng, _dtype_of(x), (2, 3)), _leaf(rng, _dtype_of(x), (3, 4))), kw


def _draw_einsum(rng, ref, x, pool, name):
    nd = x.dim()
    letters = "abcd"[:nd]
    if rng.random() < 0.5:
        return (f"{letters}->{letters[::-1]}", ref), {}
    other = _leaf(rng, _dtype_of(x), tuple(x.shape[-1:]) + (2,))
    if nd == 0:
        return ("i,i->", ref, _leaf(rng, _dtype_of(x), ())), {}
    return (f"{letters}, {letters[-1]}z->{letters[:-1]}z", ref, other), {}


def _draw_softmax(rng, ref, x, pool, name):
    kw = {"dim": _dim(rng, x)}
    if rng.random() < 0.3:
        kw["dtype"] = Dt(str(rng.choice(("float64", "float32"))))
    return (ref,), kw


def _draw_activation(rng, ref, x, pool, name):
    kw = {"gelu": {"approximate": str(rng.choice(("none", "tanh")))}, "leaky_relu": {"negative_slope": 0.2},
          "elu": {"alpha": 0.7}}.get(name, {})
    return (ref,), kw if rng.random() < 0.5 else {}


def _draw_layer_norm(rng, ref, x, pool, name):
    k = int(rng.integers(0, x.dim() + 1))
    shape = tuple(x.shape[x.dim() - k:])
    kw = {"weight": _leaf(rng, _dtype_of(x), shape), "bias": _leaf(rng, _dtype_of(x), shape)} \
        if rng.random() < 0.5 else {}
    return (ref, shape), kw


def _draw_linear(rng, ref, x, pool, name):
    k = x.shape[-1] if x.dim() else 1
    bias = _leaf(rng, _dtype_of(x), (2,)) if rng.random() < 0.5 else None
    return (ref, _leaf(rng, _dtype_of(x), (2, k)), bias), {}


def _draw_embedding(rng, ref, x, pool, name):
    rows = x.shape[0] if x.dim() == 2 else 3
    weight = ref if x.dim() == 2 else _leaf(rng, "float32", (3, 2))
    return (_index_values(rng, rows, (int(rng.integers(0, 3)), 2)), weight), {}


def _draw_cross_entropy(rng, ref, x, pool, name):
    n, c = (x.shape[0], x.shape[1]) if x.dim() >= 2 else (3, 4)
    logits = ref if x.dim() >= 2 else _leaf(rng, "float32", (n, c))
    kw = {"reduction": str(rng.choice(("mean", "sum", "none")))}
    if rng.random() < 0.3:
        kw["label_smoothing"] = 0.1
    target = _index_values(rng, c, (n,) + tuple(x.shape[2:]))
    if rng.random() < 0.3:
        kw["ignore_index"] = int(target.values[0]) if target.values else 1
    if rng.random() < 0.2:   # (class probabilities)
        target = _leaf(rng, _dtype_of(x), tuple(x.shape))
    return (logits, target), kw


def _draw_loss(rng, ref, x, pool, name):
    kw = {"reduction": str(rng.choice(("mean", "sum", "none")))}
    if name == "smooth_l1_loss" and rng.random() < 0.5:
        kw["beta"] = 0.5
    target = _like(rng, x, pool)
    if not isinstance(target, (Ref, Leaf)):   # (torch's losses crash on a number: AttributeError, no .size())
        target = _leaf(rng, _dtype_of(x), ())
    return (ref, target), kw


def _draw_pad(rng, ref, x, pool, name):
    pad = [int(rng.integers(-1, 3)) for _ in range(2 * int(rng.integers(1, max(x.dim(), 1) + 1)))]
    return (ref, pad), ({"value": _scalar(rng)} if rng.random() < 0.4 else {})


def _draw_normalize(rng, ref, x, pool, name):
    return (ref,), {"p": [1, 2, 3][int(rng.integers(3))], "dim": _dim(rng, x)}


def _draw_dropout(rng, ref, x, pool, name):
    return (ref,), {"p": 0.0, "training": bool(rng.random() < 0.5)}


OPS: dict = {}
OPS.update({n: ("f", _draw_unary) for n in UNARY})
OPS.update({n: ("f", _draw_binary) for n in BINARY})
OPS.update({n: ("f", _draw_reduction) for n in REDUCTIONS})
OPS.update({
    "where": ("f", _draw_where), "clamp": ("f", _draw_clamp), "lerp": ("f", _draw_lerp),
    "addcmul": ("f", _draw_addc), "addcdiv": ("f", _draw_addc),
    "reshape": ("f", _draw_reshape), "view": ("m", _draw_reshape), "permute": ("f", _draw_permute),
    "transpose": ("f", _draw_two_dims), "movedim": ("f", _draw_two_dims), "expand": ("m", _draw_expand),
    "squeeze": ("f", _draw_dim_arg), "unsqueeze": ("f", _draw_dim_arg), "flatten": ("f", _draw_dim_arg),
    "cat": ("f", _draw_cat), "stack": ("f", _draw_cat), "split": ("f", _draw_split), "chunk": ("f", _draw_split),
    "narrow": ("f", _draw_narrow), "select": ("f", _draw_narrow), "gather": ("f", _draw_gather),
    "index_select": ("f", _draw_gather), "take": ("f", _draw_gather), "masked_select": ("f", _draw_masked),
    "flip": ("f", _draw_flip), "roll": ("f", _draw_flip), "repeat": ("m", _draw_repeat), "tile": ("f", _draw_repeat),
    "tril": ("f", _draw_tri), "triu": ("f", _draw_tri), "diag": ("f", _draw_tri),
    "matmul": ("f", _draw_matmul), "mm": ("f", _draw_matmul), "bmm": ("f", _draw_matmul),
    "outer": ("f", _draw_matmul), "addmm": ("f", _draw_addmm), "baddbmm": ("f", _draw_addmm),
    "einsum": ("f", _draw_einsum),
    "softmax": ("F", _draw_softmax), "log_softmax": ("F", _draw_softmax),
    "gelu": ("F", _draw_activation), "silu": ("F", _draw_activation), "leaky_relu": ("F", _draw_activation),
    "elu": ("F", _draw_activation), "layer_norm": ("F", _draw_layer_norm), "dropout": ("F", _draw_dropout),
    "linear": ("F", _draw_linear), "embedding": ("F", _draw_embedding),
    "cross_entropy": ("F", _draw_cross_entropy), "mse_loss": ("F", _draw_loss), "l1_loss": ("F", _draw_loss),
    "smooth_l1_loss": ("F", _draw_loss), "pad": ("F", _draw_pad), "normalize": ("F", _draw_normalize),
})
# the ops with a method and an in-place method of the same name (``x.add(y)``, ``x.add_(y)``)
INPLACE = set(UNARY) - {"isnan", "isinf", "isfinite", "signbit"} | {
    "add", "sub", "mul", "div", "true_divide", "floor_divide", "remainder", "fmod", "pow", "atan2", "clamp",
    "lerp", "addcmul", "addcdiv", "logical_and", "logical_or", "logical_xor", "bitwise_and", "bitwise_or",
    "bitwise_xor", "hypot", "copysign", "xlogy", "eq", "ne", "lt", "le", "gt", "ge", "tril", "triu"}
OUT_OPS = set(UNARY) | set(BINARY) | set(REDUCTIONS) - {"count_nonzero"} | {
    "where", "clamp", "lerp", "addcmul", "cat", "stack", "gather", "index_select", "take", "masked_select",
    "matmul", "mm", "bmm", "outer", "addmm", "baddbmm"}


# -- running a step --------------------------------------------------------------------------------

def _call(lib, form: str, name: str, args: tuple, kw: dict):
    if form == "op":
        return getattr(operator, name)(*args)
    if form == "m":
        return getattr(args[0], name)(*args[1:], **kw)
    if form == "F":
        return getattr(lib.nn.functional, name)(*args, **kw)
    return getattr(lib, name)(*args, **kw)


def _tensors(r) -> list:
    """The tensors of a step's result (a tensor, or a tuple of them: split, max with dim)."""
    if isinstance(r, (tuple, list)):
        return [t for t in r if isinstance(t, (torch.Tensor, flow.Tensor))]
    return [r] if isinstance(r, (torch.Tensor, flow.Tensor)) else []


def _run_step(lib, step: tuple, pool: list, grad: bool, leaves: list):
    """Runs one step; returns (its result's tensors, whether it returned its first argument,
    whether it returned its ``out=`` tensor)."""
    form, name, args, kw = step
    args, kw = _resolve(lib, args, pool, grad, leaves), _resolve(lib, kw, pool, grad, leaves)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        r = _call(lib, form, name, args, kw)
    inplace = name.endswith("_") or form == "op" and name.startswith("i")
    return _tensors(r), (inplace and r is args[0], "out" in kw and r is kw["out"])


# -- generating a program ------------------------------------------------------------------------

def _draw_form(rng, name: str, form: str, x, first: bool) -> tuple[str, str]:
    """The spelling of ``name``: the function, the method, the in-place method, an operator."""
    r = rng.random()
    # (torch's in-place logical ops bypass autograd: a tensor that requires grad keeps its history,
    # gradients flow through the constant written, a leaf's view is not refused; holoflow records
    # them with zero gradients, tests/ops/test_fuzz_ops_findings.py. The target: x, or a new leaf)
    torch_untracked = name.startswith("logical_") and (x.requires_grad or first)
    if form == "f" and name in INPLACE and r < 0.25 and not torch_untracked:
        return "m", name + "_"
    if form == "f" and r < 0.5 and name not in ("cat", "stack", "einsum", "where"):
        return "m", name
    return form, name


def _draw_operator(rng, ref, x, pool) -> tuple:
    name = str(rng.choice(OPERATORS))
    other = _like(rng, x, pool)
    first = ref
    if not name.startswith("i") and rng.random() < 0.3:
        return ("op", name, (other, first), {})
    return ("op", name, (first, other), {})


def _draw_step(rng, pool: list) -> tuple:
    ref = _pick(rng, pool)
    x = pool[ref.k]
    if rng.random() < 0.1:
        return _draw_operator(rng, ref, x, pool)
    names = list(OPS)
    name = names[int(rng.integers(len(names)))]
    form, drawer = OPS[name]
    args, kw = drawer(rng, ref, x, pool, name)
    first = args[0] if args else None   # (the target of an in-place method: a new leaf may require grad)
    first_grad = isinstance(first, Leaf) or isinstance(first, Ref) and pool[first.k].requires_grad
    form, name = _draw_form(rng, name, form, x, first_grad)
    return (form, name, args, kw)


def _with_out(rng, step: tuple, results: list) -> tuple:
    """``step`` with ``out=``: of the result's dtype and shape, of another dtype, or of another
    shape (torch resizes it)."""
    form, name, args, kw = step
    r = results[0]
    dtype, shape = _dtype_of(r), tuple(r.shape)
    choice = rng.random()
    if choice < 0.3:
        dtype = str(rng.choice(DTYPES))
    elif choice < 0.6:
        shape = (0,) if rng.random() < 0.5 else (7,)
    return (form, name, args, {**kw, "out": Out(dtype, shape)})


def _generate(seed: int) -> tuple[bool, list]:
    """The program of ``seed``: (whether float leaves require grad, its steps), chosen by running
    them on torch, so each is valid there, or the one error it raises ends the program."""
    rng = np.random.default_rng(seed)
    grad = bool(rng.random() < 0.5)
    leaves: list = []
    program = [("leaf", "", (_leaf(rng),), {}) for _ in range(int(rng.integers(1, 3)))]
    pool = [_make_leaf(torch, s[2][0], grad, leaves) for s in program]
    length = int(rng.integers(3, 9))
    while len(program) < length + 2:
        for _try in range(12):
            step = _draw_step(rng, pool)
            try:
                results, _ = _run_step(torch, step, pool, grad, leaves)
            except Exception:
                if rng.random() < 0.1:   # (now and then a refusal: it ends the program)
                    program.append(step)
                    return grad, program
                continue
            break
        else:
            return grad, program
        if step[0] == "f" and step[1] in OUT_OPS and len(results) == 1 and rng.random() < 0.08:
            step = _with_out(rng, step, results)
            try:
                results, _ = _run_step(torch, step, pool, grad, leaves)
            except Exception:
                program.append(step)
                return grad, program
        program.append(step)
        pool.extend(results)
    return grad, program


def _program(seed: int) -> str:
    grad, program = _generate(seed)
    return f"  grad={grad}\n" + "\n".join(f"  {s}" for s in program)


# -- replaying it ----------------------------------------------------------------------------------

def _run(lib, grad: bool, program: list) -> tuple:
    """(per step: (result tensors, flags)), the live tensors, the leaves, the error raised."""
    pool: list = []
    leaves: list = []
    trace = []
    for step in program:
        if step[0] == "leaf":
            pool.append(_make_leaf(lib, step[2][0], grad, leaves))
            continue
        try:
            results, flags = _run_step(lib, step, pool, grad, leaves)
        except Exception as e:   # noqa: BLE001 - the class is compared
            return trace, pool, leaves, e
        trace.append(([_plain(t).clone() for t in results], flags))   # (as they were: later steps write)
        pool.extend(results)
    return trace, pool, leaves, None


TOL = {"float64": (1e-9, 1e-9), "float32": (1e-4, 1e-5), "complex64": (1e-4, 1e-5), "float16": (1e-2, 1e-2),
       "bfloat16": (2e-2, 2e-2)}


def _plain(t) -> torch.Tensor:
    t = t.to_torch() if isinstance(t, flow.Tensor) else t
    return t.detach().resolve_conj().resolve_neg()


def _assert_same(got, want, what: str) -> None:
    g, w = _plain(got), _plain(want)
    assert (g.dtype, tuple(g.shape)) == (w.dtype, tuple(w.shape)), \
        f"{what}: {g.dtype} {tuple(g.shape)}, torch {w.dtype} {tuple(w.shape)}"
    rtol, atol = TOL.get(_dtype_of(w), (0, 0))
    torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, msg=lambda m: f"{what}: {m}")


def _scalar_of(lib, t, seed: int):
    """A weighted sum of ``t`` (complex: of its real and half its imaginary part)."""
    w = torch.tensor(np.random.default_rng(seed).standard_normal(tuple(t.shape)), dtype=torch.float64)
    w = w if lib is torch else flow.from_torch(w)
    r = t.real + 0.5 * t.imag if t.is_complex() else t
    return (r.double() * w).sum()


# backward passes torch refuses and holoflow computes: a derivative torch lacks (floor_divide's is
# zero almost everywhere; remainder's of a number by a tensor, ``2 % x``), a saved tensor written in
# place since (holoflow's in-place ops compute out of place: what its grad rules saved is
# unchanged), and torch's own inconsistencies (an integer operand of addcdiv_ given a float
# gradient, a complex gradient for a real input after a cast, clamp's backward for an input that
# its tensor bounds broadcast: "output with shape [1, 1] doesn't match the broadcast shape")
TORCH_ONLY_REFUSALS = ("derivative for aten::floor_divide", "derivative for aten::remainder",
                       "modified by an inplace operation", "can't be cast to the desired output type",
                       "isFloatingType(grad.scalar_type())", "INTERNAL ASSERT FAILED",
                       "doesn't match the broadcast shape")


def _grads(lib, pool: list, leaves: list, seed: int):
    """The leaves' gradients of a weighted sum of the last tensor that requires grad, or the
    error backward raised, or None (nothing requires grad)."""
    last = next((t for t in reversed(pool) if t.requires_grad), None)
    if last is None or not leaves:
        return None
    try:
        return lib.autograd.grad(_scalar_of(lib, last, seed), leaves, allow_unused=True)
    except Exception as e:   # noqa: BLE001 - compared
        return e


def _is_out_refusal(err: BaseException | None, program: list, steps_run: int) -> bool:
    """Whether holoflow refused an ``out=`` it doesn't take (a TypeError naming the argument)."""
    step = [s for s in program if s[0] != "leaf"][steps_run] if err is not None else None
    return step is not None and "out" in step[3] and isinstance(err, TypeError) and "out" in str(err)


def _steps_before(program: list, n: int) -> list:
    """``program``'s leaves and its first ``n`` steps."""
    ops = [i for i, s in enumerate(program) if s[0] != "leaf"]
    return program[:ops[n]] if n < len(ops) else program


def check_program(seed: int) -> None:
    grad, program = _generate(seed)
    want, t_pool, t_leaves, t_err = _run(torch, grad, program)
    got, f_pool, f_leaves, f_err = _run(flow, grad, program)
    where = f"seed {seed}, program:\n{_program(seed)}"
    if _is_out_refusal(f_err, program, len(got)):   # (compared up to there: torch's run again, as far)
        program = _steps_before(program, len(got))
        want, t_pool, t_leaves, t_err = _run(torch, grad, program)
        f_err = None
    steps = [s for s in program if s[0] != "leaf"]
    for i, ((g, gf), (w, wf)) in enumerate(zip(got, want)):
        assert len(g) == len(w), f"step {i} {steps[i][1]}: {len(g)} tensors, torch {len(w)}. {where}"
        assert gf == wf, f"step {i} {steps[i][1]}: returns its input / out= {gf}, torch {wf}. {where}"
        for j, (a, b) in enumerate(zip(g, w)):
            _assert_same(a, b, f"step {i} {steps[i][1]} result {j}. {where}")
    if t_err is not None:
        assert f_err is not None, \
            f"torch raised {type(t_err).__name__}: {t_err}; holoflow did not. {where}"
        assert isinstance(f_err, type(t_err)), \
            f"torch raised {type(t_err).__name__}: {t_err}; holoflow {type(f_err).__name__}: {f_err}. {where}"
        return
    assert f_err is None, f"holoflow raised {type(f_err).__name__}: {f_err}; torch did not. {where}"
    for k, (a, b) in enumerate(zip(f_pool, t_pool)):
        _assert_same(a, b, f"live tensor {k} at the end. {where}")
    theirs, ours = _grads(torch, t_pool, t_leaves, seed), _grads(flow, f_pool, f_leaves, seed)
    if isinstance(theirs, Exception) and any(m in str(theirs) for m in TORCH_ONLY_REFUSALS):
        return
    if isinstance(theirs, Exception):
        assert isinstance(ours, type(theirs)), f"backward: torch raised {theirs!r}; holoflow {ours!r}. {where}"
        return
    assert not isinstance(ours, Exception), f"backward: holoflow raised {ours!r}; torch did not. {where}"
    for k, (a, b) in enumerate(zip(ours or (), theirs or ())):
        assert (a is None) == (b is None), f"leaf {k}: grad {a} vs torch {b}. {where}"
        if b is not None:
            _assert_same(a, b, f"grad of leaf {k}. {where}")


@pytest.mark.parametrize("seed", [pytest.param(s, marks=pytest.mark.xfail(strict=True, reason=KNOWN[s]))
                                  if s in KNOWN else s for s in SEEDS])
def test_random_op_program_agrees_with_torch(seed):
    check_program(seed)


# -- the findings, minimized -----------------------------------------------------------------------

def _both(fn) -> tuple:
    """``fn(torch)`` and ``fn(holoflow)``, the latter as torch tensors."""
    got = fn(flow)
    return fn(torch), (got.to_torch() if isinstance(got, flow.Tensor) else got)


def test_diag_of_a_matrix_is_a_copy():
    """seed 354: ``diag(m)`` was ``m.diagonal()``'s view, so a later ``m.square_()`` changed it."""
    def run(lib):
        m = lib.arange(6.0).reshape(2, 3)
        d = lib.diag(m, 1)
        m.square_()
        return d
    want, got = _both(run)
    assert torch.equal(got, want)


def test_clamp_with_a_number_beside_a_tensor_bound_promotes_as_a_number():
    """seed 4639: ``clamp(uint8, 0.5, tensor)`` cast 0.5 to uint8 (0): uint8 values, torch's are float32."""
    def run(lib):
        x = lib.tensor([1, 5, 9], dtype=lib.uint8)
        return lib.clamp(x, 0.5, lib.tensor(4, dtype=lib.uint8))
    want, got = _both(run)
    assert got.dtype == want.dtype and torch.equal(got, want)


@pytest.mark.parametrize("op", ["var", "std"])
def test_var_gradient_with_no_degree_of_freedom_left(op):
    """seed 127: over every element with ``correction >= numel``, torch's gradient is NaN where
    x is its mean, else inf; holoflow's was ``2 / dof`` times the deviation (finite)."""
    def run(lib):
        x = lib.tensor([1.0, 1.0, 3.0], dtype=lib.float64, requires_grad=True)
        getattr(x, op)(correction=4).backward()
        y = lib.tensor(2.0, requires_grad=True)
        getattr(y, op)(0, correction=2).backward()
        return lib.cat([x.grad, y.grad.reshape(1)])
    want, got = _both(run)
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.parametrize("call", ["split", "narrow", "select"])
def test_pieces_of_a_0d_tensor_raise_as_torch(call):
    """seed 196: ``split``/``narrow``/``select`` of a 0-d tensor raised a bare IndexError (tuple index)."""
    args = {"split": (1,), "narrow": (0, 0, 1), "select": (0, 0)}[call]
    want = raised(lambda: getattr(torch.tensor(1.0), call)(*args))
    with pytest.raises(type(want), match=f"holoflow.{call}"):
        getattr(flow.tensor(1.0), call)(*args)



def test_movedim_of_a_0d_tensor():
    """seed 522: ``movedim(-1, 0)`` of a 0-d tensor raised a bare IndexError (list assignment)."""
    want, got = _both(lambda lib: lib.tensor(2.0).movedim(-1, 0) * 3)
    assert torch.equal(got, want)


@pytest.mark.parametrize("name", ["l1_loss", "mse_loss", "smooth_l1_loss"])
def test_pointwise_losses_promote_a_0d_target_as_torch(name):
    """seed 4784: ``smooth_l1_loss(float16, 0-d float32)`` was float16 (``input - target`` promotes
    a 0-d tensor as a number); torch broadcasts the pair first: float32. seed 132: ``mse_loss`` of
    a bool input refused the bool subtraction; torch's kernel promotes it first."""
    def run(lib):
        f = getattr(lib.nn.functional, name)
        x = lib.tensor([1.0, 2.5, -1.0], dtype=lib.float16)
        a = f(x, lib.tensor(0.5, dtype=lib.float32), reduction="none")
        b = f(lib.tensor([1, 3], dtype=lib.int8), lib.tensor(2, dtype=lib.int32), reduction="none") \
            if name == "l1_loss" else f(lib.tensor([True, False]), lib.tensor([0.5, 2.0], dtype=lib.float16))
        return a, b
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")   # (torch warns that the shapes differ)
        want, got = run(torch), [t.to_torch() for t in run(flow)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


def test_einsum_permuting_one_operand_is_a_view():
    """seeds 1257, 8056: ``einsum("ab->ba", y)`` was a copy; torch's is a view of ``y``, so a write
    into it reaches ``y`` (and ``einsum("->", s)`` of a 0-d ``s`` is ``s``'s alias)."""
    def run(lib):
        y = lib.arange(6.0).reshape(2, 3)
        lib.einsum("ab->ba", y).mul_(2)
        s = lib.tensor(2.0)
        lib.einsum("->", s).add_(1)
        return lib.cat([y.reshape(-1), s.reshape(1)])
    want, got = _both(run)
    assert torch.equal(got, want)


def test_gradients_come_back_in_the_input_dtype():
    """seed 6495: ``cumprod(bfloat16, dtype=float64)``'s input gradient was float64; seed 7642:
    ``addcdiv(complex64, float64, complex64)``'s was complex128 (torch casts every gradient to its
    input's dtype)."""
    def run(lib):
        x = lib.tensor([1.5, 2.0, 3.0], dtype=lib.bfloat16, requires_grad=True)
        lib.cumprod(x, 0, dtype=lib.float64).sum().backward()
        z = lib.tensor([1 + 1j, 2j], dtype=lib.complex64, requires_grad=True)
        t = lib.tensor([1.0, 2.0], dtype=lib.float64)
        lib.addcdiv(z, t, lib.tensor([2 + 1j, 1j], dtype=lib.complex64)).real.sum().backward()
        return x.grad, z.grad
    want, got = run(torch), [g.to_torch() for g in run(flow)]
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.filterwarnings("ignore:Casting complex values to real")
def test_prod_with_a_dtype_differentiates_the_cast_input():
    """seed 201569: ``prod(z, dtype=float64)`` of a complex z multiplies the real parts (torch's
    kernel casts first), and torch's gradient is of that product; holoflow's rule read the complex
    values (silently: 0.3-0.1j where torch's 0.1). ``cumprod(z, dtype=float64)``: torch's rule
    reads z's complex values with its complex convention (conjugates); holoflow's skipped them for
    the real gradient (the conjugate of torch's, silently)."""
    def run(lib):
        z = lib.tensor([[0.3 + 0.7j, 0.1 - 0.2j, 1 + 1j]], dtype=lib.complex64, requires_grad=True)
        (z.prod(dtype=lib.float64) + z.prod(1, dtype=lib.float64).sum()).backward()
        w = lib.tensor([[0.3 + 0.7j, 0.1 - 0.2j, 1 + 1j]], dtype=lib.complex64, requires_grad=True)
        w.cumprod(1, dtype=lib.float64).sum().backward()
        return lib.cat([z.grad, w.grad])
    want, got = run(torch), run(flow).to_torch()
    assert got.dtype == want.dtype
    torch.testing.assert_close(got, want)


@pytest.mark.parametrize("name", ["amax", "amin"])
def test_extremes_of_every_dim_of_an_empty_tensor_raise_as_torch(name):
    """seeds 424, 3354: ``amin()`` of an empty tensor raised IndexError (the kernel's, for a
    listed empty dim); torch's default over every dim is a RuntimeError."""
    want = raised(lambda: getattr(torch.zeros(6, 0), name)())
    assert type(want) is RuntimeError
    with pytest.raises(RuntimeError, match=f"holoflow.{name}") as got:
        getattr(flow.zeros(6, 0), name)()
    assert not isinstance(got.value, IndexError)


@pytest.mark.parametrize("reduction", ["sum", "mean", "none"])
def test_cross_entropy_with_no_class_and_every_target_ignored(reduction):
    """seed 4128: ``cross_entropy`` of an (N, 0) input whose targets are all ``ignore_index``
    raised ZeroDivisionError with label smoothing (torch: NaN), and its backward an index error."""
    def run(lib):
        x = lib.zeros(2, 0, requires_grad=True)
        loss = lib.nn.functional.cross_entropy(x, lib.tensor([0, 0]), reduction=reduction, label_smoothing=0.1,
                                               ignore_index=0)
        loss.sum().backward()
        return loss.detach(), x.grad
    want, got = run(torch), [t.to_torch() for t in run(flow)]
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, equal_nan=True)


def test_lerp_of_integer_tensors_with_a_0d_float_weight_promotes_as_torch():
    """seed 374: ``lerp(int32, int32, 0-d float32 weight)`` was refused up front; torch's kernel
    promotes it (float32), and refuses a number weight itself (NotImplementedError, kept)."""
    def run(lib):
        a = lib.tensor([1, 2, 3], dtype=lib.int32)
        return lib.lerp(a, a * 3, lib.tensor(0.5))
    want, got = _both(run)
    assert got.dtype == want.dtype and torch.equal(got, want)
    with pytest.raises(NotImplementedError, match="holoflow.lerp"):
        flow.lerp(flow.tensor([1, 2]), flow.tensor([3, 4]), 0.5)


@pytest.mark.parametrize("case", ["self", "other", "both", "number"])
@pytest.mark.parametrize("name", ["eq_", "ne_", "lt_", "le_", "gt_", "ge_"])
def test_in_place_comparisons_record_zero_gradients_as_torch(name, case):
    """``x.lt_(t)`` with t requiring grad: torch records the comparison with zero gradients, so x
    requires grad afterwards and t's gradient is zeros; holoflow cut the history (x needing no
    grad: a later backward through it raised). The commonest gradient divergence the op fuzzer
    had left (seeds 200539, 201637, 201808, 202706, 204547 among 5000)."""
    def run(lib):
        a = lib.tensor([1.0, 2.0, 3.0], requires_grad=case in ("self", "both", "number"))
        t = lib.tensor([2.0, 2.0, 2.0], requires_grad=case in ("other", "both"))
        x = a * 1
        y = getattr(x, name)(2.0 if case == "number" else t)
        flags = (y is x, y.requires_grad, y.is_leaf)
        (y * lib.tensor([1.0, 2.0, 3.0])).sum().backward()
        return flags, y.detach(), a.grad, t.grad
    want, got = run(torch), run(flow)
    assert got[0] == want[0]
    assert torch.equal(got[1].to_torch(), want[1])
    for g, w in zip(got[2:], want[2:]):
        assert (g is None) == (w is None)
        if w is not None:
            assert torch.equal(g.to_torch(), w)


@pytest.mark.parametrize("base_requires_grad", [True, False])
def test_in_place_comparisons_into_views_record_zero_gradients_as_torch(base_requires_grad):
    """The combination: ``b[1:3].lt_(t)`` (t requiring grad) rebases b's history with zero
    gradients for t and the view's old values; into overlapping ``unfold`` windows the values are
    torch's kernel's."""
    def run(lib):
        a = lib.tensor([1.0, 2.0, 3.0, 4.0], requires_grad=base_requires_grad)
        t = lib.tensor([2.0, 2.0], requires_grad=True)
        b = a * 1
        b[1:3].lt_(t)
        (b * lib.tensor([1.0, 2.0, 3.0, 4.0])).sum().backward()
        u = (a * 1).unfold(0, 2, 1)
        u.ge_(lib.tensor([2.5, 2.5]))
        return b.detach(), b.requires_grad, a.grad, t.grad, u.detach().flatten(), u.requires_grad
    want, got = run(torch), run(flow)
    for g, w in zip(got, want):
        if isinstance(w, torch.Tensor) or isinstance(g, flow.Tensor):
            assert torch.equal(g.to_torch(), w)
        else:
            assert g == w

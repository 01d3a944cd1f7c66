"""torch names that scripts use around the model: global switches, ``compile``, ``_assert``,
the legacy typed-tensor constructors (``torch.LongTensor([...])``), memory formats, and the
``is_xpu``-style device queries. Switches that steer torch's kernels (matmul precision,
deterministic algorithms, thread counts) are torch's own, since holoflow's kernels are torch's.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import types
from typing import Any, Callable

import torch

from .ops import out_arg
from .core import dtype as _dtype
from .core.tensor import Tensor
from .ops.creation import empty, tensor
from .ops.elementwise import ABS, LE, MUL, SUB
from .core.dispatch import apply
from .nn import functional as F
from .ops.activation import prelu

__all__ = ["set_float32_matmul_precision", "get_float32_matmul_precision", "use_deterministic_algorithms",
           "are_deterministic_algorithms_enabled", "set_num_threads", "get_num_threads",
           "set_num_interop_threads", "get_num_interop_threads", "compile", "_assert",
           "channels_last", "channels_last_3d", "contiguous_format", "preserve_format", "memory_format",
           "FloatTensor", "DoubleTensor", "HalfTensor", "BFloat16Tensor", "LongTensor", "IntTensor",
           "ShortTensor", "CharTensor", "ByteTensor", "BoolTensor", "allclose", "isclose", "numel",
           "is_floating_point", "is_complex", "is_nonzero", "is_same_size", "result_type", "can_cast",
           "broadcast_shapes", "broadcast_tensors", "meshgrid", "ravel", "detach", "set_printoptions",
           "e", "pi", "inf", "nan", "newaxis", "Size", "layout", "strided", "OutOfMemoryError",
           "AcceleratorError"]

set_float32_matmul_precision = torch.set_float32_matmul_precision
get_float32_matmul_precision = torch.get_float32_matmul_precision
use_deterministic_algorithms = torch.use_deterministic_algorithms
are_deterministic_algorithms_enabled = torch.are_deterministic_algorithms_enabled
set_num_threads, get_num_threads = torch.set_num_threads, torch.get_num_threads
set_num_interop_threads, get_num_interop_threads = torch.set_num_interop_threads, torch.get_num_interop_threads
channels_last, channels_last_3d = torch.channels_last, torch.channels_last_3d
# torch's constants and the types tensors' attributes return (holoflow tensors are dense: strided)
e, pi, inf, nan, newaxis = math.e, math.pi, math.inf, math.nan, None
Size, layout, strided = torch.Size, torch.layout, torch.strided
# torch's error classes holoflow raises as they are (a kernel's out-of-memory or device failure)
OutOfMemoryError, AcceleratorError = torch.OutOfMemoryError, torch.AcceleratorError
contiguous_format, preserve_format, memory_format = torch.contiguous_format, torch.preserve_format, torch.memory_format


def compile(model: Callable | None = None, *, fullgraph: bool = False, dynamic: bool | None = None,
            backend: Any = "inductor", mode: str | None = None, options: dict | None = None,
            disable: bool = False) -> Any:  # noqa: A001 - torch's name
    """``torch.compile``: the module or function traced per input signature into holoflow's graph
    IR, forward and backward, and run as lowered plans (graph/compile_module.py): the same numbers
    as eager, less time. ``backend="inductor"`` (torch's default) runs each plan's tasks through
    Inductor; any other backend runs the plans' direct kernel calls. What cannot be traced runs
    eagerly with a warning (``fullgraph=True``: raises instead). Works bare (``compile(model)``), as
    ``@compile`` and as ``@compile(mode=...)``; ``disable=True`` returns ``model`` itself. For a
    whole training step (optimizer, data parallelism, pipelines) use ``holoflow.nn.Graph``."""
    from .graph.compile_module import compile as compile_
    return compile_(model, fullgraph=fullgraph, dynamic=dynamic, backend=backend, mode=mode, options=options,
                    disable=disable)


def _assert(condition: Any, message: str) -> None:
    """``torch._assert``: raises AssertionError(message) unless ``condition`` holds."""
    if not bool(condition):
        raise AssertionError(message)


class _TypedTensorMeta(type):
    """``isinstance(x, LongTensor)``: a CPU tensor of that dtype, as torch's legacy types."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, Tensor) and obj.dtype is cls._dtype and not obj.is_cuda


def _typed(name: str, dt: _dtype.dtype) -> type:
    def new(cls, *args, device=None):
        if len(args) == 1 and not isinstance(args[0], int):
            src = args[0]
            if isinstance(src, torch.Size):
                return empty(*src, dtype=dt, device=device)
            return tensor(src, dtype=dt, device=device)
        if not all(isinstance(a, int) for a in args):
            raise TypeError(f"holoflow.{name}(): expected a sequence of data or integer sizes, got "
                            f"{tuple(type(a).__name__ for a in args)}")
        return empty(*(args or (0,)), dtype=dt, device=device)
    new.__doc__ = f"``{name}(data)`` copies data as {dt}; ``{name}(*sizes)`` is uninitialized."
    return _TypedTensorMeta(name, (), {"__new__": new, "_dtype": dt, "dtype": dt, "__doc__": new.__doc__})


FloatTensor = _typed("FloatTensor", _dtype.float32)
DoubleTensor = _typed("DoubleTensor", _dtype.float64)
HalfTensor = _typed("HalfTensor", _dtype.float16)
BFloat16Tensor = _typed("BFloat16Tensor", _dtype.bfloat16)
LongTensor = _typed("LongTensor", _dtype.int64)
IntTensor = _typed("IntTensor", _dtype.int32)
ShortTensor = _typed("ShortTensor", _dtype.int16)
CharTensor = _typed("CharTensor", _dtype.int8)
ByteTensor = _typed("ByteTensor", _dtype.uint8)
BoolTensor = _typed("BoolTensor", _dtype.bool)


def _device_query(kind: str) -> property:
    return property(lambda self: self._data.device.type == kind, doc=f"Whether the tensor is on {kind}.")


for _kind in ("xpu", "mps", "meta"):
    if not hasattr(Tensor, f"is_{_kind}"):
        setattr(Tensor, f"is_{_kind}", _device_query(_kind))
for _flag in ("is_sparse", "is_quantized", "is_mkldnn", "is_nested"):
    if not hasattr(Tensor, _flag):
        setattr(Tensor, _flag, property(lambda self: False, doc="Always False in holoflow."))


def _type(self: Tensor, dtype: Any = None, non_blocking: bool = False, **kwargs: Any) -> Any:
    """``x.type()``: torch's type string (``holoflow.FloatTensor``; ``torch.FloatTensor`` under
    mock_torch); ``x.type(t)`` casts to a dtype, a type string or a legacy type (``LongTensor``)."""
    if dtype is None:
        return _dtype.type_name(self._data)
    if isinstance(dtype, str):
        dtype = _dtype.from_type_name(dtype)
    elif isinstance(dtype, _TypedTensorMeta):
        dtype = dtype._dtype
    return self.to(dtype)


Tensor.type = _type  # replaces ops/conversion.py's type_ (whose string was holoflow.Float32Tensor)


# -- tensor helpers scripts call as torch.X: predicates, dtype rules, broadcasting, meshgrid ----
can_cast, set_printoptions = torch.can_cast, torch.set_printoptions


def _data(x: Any) -> Any:
    return x._data if isinstance(x, Tensor) else x


def allclose(input: Tensor, other: Tensor, rtol: float = 1e-05, atol: float = 1e-08,
             equal_nan: bool = False) -> bool:
    """``|input - other| <= atol + rtol * |other|`` everywhere (a Python bool), as torch."""
    return bool(torch.allclose(_data(input), _data(other), rtol=rtol, atol=atol, equal_nan=equal_nan))


def isclose(input: Tensor, other: Any, rtol: float = 1e-05, atol: float = 1e-08,
            equal_nan: bool = False) -> Tensor:
    """Elementwise closeness (a bool tensor, not differentiable)."""
    if equal_nan or not (isinstance(input, Tensor) and isinstance(other, Tensor)):
        return Tensor._make(torch.isclose(_data(input), _data(other), rtol=rtol, atol=atol, equal_nan=equal_nan))
    diff = apply(ABS, apply(SUB, input, other))
    return apply(LE, diff, apply(MUL, apply(ABS, other), rtol) + atol)


def numel(input: Tensor) -> int:
    return input.numel()


def is_floating_point(input: Tensor) -> bool:
    return input.is_floating_point()


def is_complex(input: Tensor) -> bool:
    return input.is_complex()


def is_nonzero(input: Tensor) -> bool:
    """Whether the one-element ``input`` is non-zero, as ``torch.is_nonzero``."""
    try:
        return bool(torch.is_nonzero(_data(input)))
    except RuntimeError as e:
        raise RuntimeError(f"holoflow.is_nonzero(shape {tuple(input.shape)}): {e}") from e


def is_same_size(input: Tensor, other: Tensor) -> bool:
    return tuple(input.shape) == tuple(other.shape)


def result_type(tensor1: Any, tensor2: Any) -> _dtype.dtype:
    """The dtype torch's type promotion gives ``tensor1 op tensor2``."""
    return _dtype.from_torch(torch.result_type(_data(tensor1), _data(tensor2)))


def broadcast_shapes(*shapes: Any) -> torch.Size:
    return torch.broadcast_shapes(*shapes)


def broadcast_tensors(*tensors: Tensor) -> tuple[Tensor, ...]:
    """Each tensor expanded to the common shape (views; gradients sum back)."""
    shape = torch.broadcast_shapes(*[tuple(t.shape) for t in tensors])
    return tuple(t.expand(shape) for t in tensors)


def meshgrid(*tensors: Any, indexing: str | None = None) -> tuple[Tensor, ...]:
    """Coordinate grids from 1-d tensors (``indexing='ij'`` by default, as torch; or ``'xy'``)."""
    if len(tensors) == 1 and isinstance(tensors[0], (list, tuple)):
        tensors = tuple(tensors[0])
    if indexing not in (None, "ij", "xy"):
        raise ValueError(f"holoflow.meshgrid: indexing must be 'ij' or 'xy', got {indexing!r}")
    ts = list(tensors)
    swap = indexing == "xy" and len(ts) >= 2
    if swap:
        ts[0], ts[1] = ts[1], ts[0]
    shape = [t.numel() for t in ts]
    grids = []
    for i, t in enumerate(ts):
        view = [1] * len(ts)
        view[i] = -1
        grids.append(t.reshape(view).expand(shape))
    if swap:   # 'xy': the first two grids come back in the caller's order
        grids[0], grids[1] = grids[1], grids[0]
    return tuple(grids)


def ravel(input: Tensor) -> Tensor:
    return input.reshape(-1)


def detach(input: Tensor) -> Tensor:
    return input.detach()


for _name in ("allclose", "isclose", "is_nonzero", "is_same_size", "ravel"):
    setattr(Tensor, _name, globals()[_name])
Tensor.prelu = prelu


# -- torch's top-level in-place functions: ``torch.abs_(t)`` is ``t.abs_()`` ------------------------
_INPLACE_METHODS = (
    "abs_ acos_ acosh_ asin_ asinh_ atan_ atanh_ arccos_ arccosh_ arcsin_ arcsinh_ arctan_ arctanh_ ceil_ clamp_ "
    "clamp_max_ clamp_min_ clip_ cos_ cosh_ deg2rad_ rad2deg_ erf_ erfc_ exp_ exp2_ expm1_ fix_ floor_ frac_ gcd_ "
    "lcm_ i0_ ldexp_ log_ log10_ log1p_ log2_ logit_ nan_to_num_ neg_ negative_ reciprocal_ round_ rsqrt_ "
    "sigmoid_ sin_ sinc_ sinh_ sqrt_ square_ tan_ tanh_ trunc_ xlogy_ zero_ fill_ index_put_ detach_").split()


def _inplace_function(name: str) -> Callable[..., Tensor]:
    def fn(input: Tensor, *args: Any, **kwargs: Any) -> Tensor:
        if not isinstance(input, Tensor):
            raise TypeError(f"holoflow.{name}(): argument 'input' must be a Tensor, not {type(input).__name__}")
        return getattr(input, name)(*args, **kwargs)
    fn.__name__ = fn.__qualname__ = name
    fn.__doc__ = f"``input.{name}(...)``, as ``torch.{name}``."
    return fn


for _name in _INPLACE_METHODS:
    if hasattr(Tensor, _name):
        globals()[_name] = _inplace_function(_name)
        __all__.append(_name)


def dropout_(input: Tensor, p: float, train: bool) -> Tensor:
    """In-place dropout, as ``torch.dropout_``."""
    return F.dropout(input, p, train, inplace=True)


def alpha_dropout_(input: Tensor, p: float, train: bool) -> Tensor:
    """In-place alpha dropout, as ``torch.alpha_dropout_``."""
    return F.alpha_dropout(input, p, train, inplace=True)


def feature_alpha_dropout_(input: Tensor, p: float, train: bool) -> Tensor:
    """In-place feature alpha dropout, as ``torch.feature_alpha_dropout_``."""
    return F.feature_alpha_dropout(input, p, train, inplace=True)


def selu_(input: Tensor) -> Tensor:
    """In-place SELU, as ``torch.selu_``."""
    return F.selu(input, inplace=True)


def celu_(input: Tensor, alpha: float = 1.0) -> Tensor:
    """In-place CELU, as ``torch.celu_``."""
    return F.celu(input, alpha, inplace=True)


__all__ += ["dropout_", "alpha_dropout_", "feature_alpha_dropout_", "selu_", "celu_"]


# -- torch's argument handling ------------------------------------------------------------------------
# torch's argument parser takes NumPy's names for two parameters of every function and method that
# has them (``axis`` for ``dim``, ``keepdims`` for ``keepdim``: ``x.sum(axis=1, keepdims=True)``),
# and refuses an argument of the wrong type with a TypeError naming it. holoflow's functions are
# Python: an argument of the wrong type fails somewhere inside (an AttributeError on ``.dim()``).
# ``torch_arguments`` gives them both: the names, and on the error path only (no cost otherwise)
# torch's TypeError for the first argument whose type contradicts its annotation.
_NUMPY_NAMES = (("axis", "dim"), ("keepdims", "keepdim"))
_CHECKED = {"Tensor": (Tensor, "Tensor"), "int": (int, "int"), "bool": (bool, "bool"),
            "Tensor | None": ((Tensor, type(None)), "Tensor"), "int | None": ((int, type(None)), "int")}


def torch_arguments(fn: Callable, name: str | None = None, check_types: bool = True, twin: Any = None) -> Callable:
    """``fn`` with torch's argument handling (above), and ``out=`` where its torch ``twin`` takes
    it (ops/out_arg.py); ``fn`` itself when there is nothing to add (no ``dim``/``keepdim``, no
    annotated Tensor, int or bool parameter, no ``out=``, or no signature).
    ``check_types=False``: the NumPy names only (a method: ``self`` is a tensor, and its hot ones,
    ``view``, ``transpose``..., keep their one frame)."""
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        return fn
    params = sig.parameters
    renames = tuple((numpy, ours) for numpy, ours in _NUMPY_NAMES if ours in params and numpy not in params)
    checked = {p.name: _CHECKED[p.annotation] for p in params.values()
               if check_types and isinstance(p.annotation, str) and p.annotation in _CHECKED and p.name != "self"
               and p.kind != p.VAR_KEYWORD}
    outs = "out" not in params and twin is not None and out_arg.takes_out(twin, name or fn.__name__)
    takes_dtype = "dtype" in params
    if not renames and not checked and not outs:
        return fn
    label = f"holoflow.{name or fn.__name__}()"

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        out, took = None, False
        if kwargs:
            for numpy, ours in renames:
                if numpy in kwargs:
                    if ours in kwargs:
                        raise TypeError(f"{label} got both {ours!r} and its NumPy name {numpy!r}")
                    kwargs[ours] = kwargs.pop(numpy)
            if outs:
                out = kwargs.pop("out", None)
                if out is not None:
                    took = out_arg.check_out(label, twin, out, args, kwargs)
                    if takes_dtype and isinstance(took, torch.dtype) and isinstance(out, Tensor) and \
                            took != out._data.dtype and kwargs.get("dtype") is None and \
                            not out_arg.records(args, kwargs):   # (else refused as the result records)
                        kwargs["dtype"] = _dtype.from_torch(out._data.dtype)   # (computed in out's dtype)
        try:
            result = fn(*args, **kwargs)
            return result if out is None else out_arg.write_out(label, result, out, took is not None)
        except Exception as e:
            # torch checks types before anything else: a non-tensor where a Tensor goes is its
            # TypeError whatever failed (a TypeError of holoflow's own already says so); a
            # number's type only where the failure is a type's (an AttributeError or a plain
            # TypeError: manual_seed("a") is torch's ValueError too)
            if isinstance(e, TypeError) and str(e).startswith("holoflow"):
                raise
            wrong = _wrongly_typed(sig, checked, args, kwargs, numbers=isinstance(e, (AttributeError, TypeError)))
            if wrong is None:
                raise
            raise TypeError(f"{label}: {wrong}") from e
    return wrapper


def _torch_module(name: str) -> Any:
    """torch's module for holoflow's ``name`` (``holoflow.linalg``: ``torch.linalg``), or None."""
    try:
        return importlib.import_module("torch" + name[len("holoflow"):])
    except ImportError:
        return None


def _wrongly_typed(sig: inspect.Signature, checked: dict, args: tuple, kwargs: dict,
                   numbers: bool = True) -> str | None:
    """The first argument whose type its annotation refuses, described as torch's parser does
    (``numbers``: int and bool annotations count too; the elements of ``*tensors: Tensor``)."""
    try:
        bound = sig.bind(*args, **kwargs)
    except TypeError:
        return None
    for position, (pname, value) in enumerate(bound.arguments.items(), start=1):
        if pname not in checked:
            continue
        types_, expected = checked[pname]
        if expected != "Tensor" and not numbers:
            continue
        if sig.parameters[pname].kind == inspect.Parameter.VAR_POSITIONAL:
            bad = [v for v in value if not isinstance(v, types_)]
            if bad:
                return f"expected {expected} as each of the {pname!r}, but got {type(bad[0]).__name__}"
        elif not isinstance(value, types_):
            return f"argument {pname!r} (position {position}) must be {expected}, not {type(value).__name__}"
    return None


# metadata methods model code calls per step (``B, T, C = x.size()``): no frame added for a
# NumPy name nobody passes them
_HOT_METADATA = frozenset({"size", "stride"})


def install_torch_arguments(namespace: dict, tensor: type, *owners: Any) -> None:
    """Gives torch's argument handling to the functions of ``namespace`` (holoflow's top level)
    and of each owner (``holoflow.linalg``, ``nn.functional``...), and NumPy's names to the
    methods of ``tensor``: called once, when every function and method is defined. A function
    reachable under several names gets one wrapper (``holoflow.vmap is holoflow.func.vmap``)."""
    done: dict = {}

    def wrapped(name: str, fn: Any, check_types: bool = True, twins: Any = None) -> Any:
        if not isinstance(fn, types.FunctionType) or name.startswith("_"):
            return fn
        twin = getattr(twins, name, None)
        if twin is not None and not out_arg.takes_out(twin, name):
            twin = None   # (one wrapper per function and handling: holoflow.vmap is holoflow.func.vmap)
        key = (fn, check_types, twin is not None)
        if key not in done:
            done[key] = torch_arguments(fn, name, check_types, twin)
        return done[key]
    for name, fn in list(namespace.items()):
        namespace[name] = wrapped(name, fn, twins=torch)
    for owner, check_types in [(tensor, False)] + [(o, True) for o in owners]:
        # (torch's module of the same name: its functions tell which take out=)
        twins = None if owner is tensor else _torch_module(owner.__name__)
        for name, fn in list(vars(owner).items()):
            if owner is tensor and name in _HOT_METADATA:
                continue
            new = wrapped(name, fn, check_types, twins)
            if new is not fn:
                setattr(owner, name, new)

"""torch's ``torch._foreach_*`` functions (private in torch, yet what EMA helpers, optimizers and
training loops call on parameter lists): one holoflow op per tensor of the list, so autograd,
global tensors and traces see ordinary ops.

The arguments follow torch's overloads: a list (or tuple) gives one value per tensor, a number
or a single tensor is the same for every tensor; ``addcmul``/``addcdiv`` also take a 1-D tensor
of one value per tensor. The in-place forms (trailing ``_``) write each tensor and return the
list they were given, as torch's.
"""
from __future__ import annotations

from numbers import Number
from typing import Any, Callable

from .core.tensor import Tensor
from .ops.reduction import vector_norm

_UNARY = ("abs", "acos", "asin", "atan", "ceil", "cos", "cosh", "erf", "erfc", "exp", "expm1", "floor", "frac",
          "lgamma", "log", "log10", "log1p", "log2", "neg", "reciprocal", "round", "rsqrt", "sigmoid", "sign", "sin",
          "sinh", "sqrt", "tan", "tanh", "trunc")
_BINARY = ("add", "sub", "mul", "div", "pow", "clamp_min", "clamp_max", "maximum", "minimum")
_TERNARY = ("lerp", "addcmul", "addcdiv")
_NO_INPLACE_METHOD = {"maximum", "minimum"}   # (torch has no Tensor.maximum_: the result is copied in)


def _tensors(value: Any, who: str, what: str = "self") -> list:
    if not isinstance(value, (list, tuple)) or not all(isinstance(t, Tensor) for t in value):
        raise TypeError(f"holoflow.{who}(): argument '{what}' must be a list or tuple of tensors, got "
                        f"{type(value).__name__}")
    return list(value)


def _per_tensor(value: Any, n: int, who: str, per_value_tensor: bool = False) -> list:
    """``value`` for each of ``n`` tensors: a list's elements, else the value itself ``n`` times
    (a 1-D tensor's elements where the overload takes one scalar per tensor)."""
    if isinstance(value, (list, tuple)):
        if len(value) != n:
            raise RuntimeError(f"holoflow.{who}: Tensor lists must have the same number of tensors, got {n} and "
                               f"{len(value)}")
        return list(value)
    if per_value_tensor and isinstance(value, Tensor):
        if value.dim() != 1 or value.numel() != n:
            raise RuntimeError(f"holoflow.{who}: Expected length of scalars to match input of length {n} but got "
                               f"{value.numel()} instead")
        return [v.item() for v in value.detach().cpu()]
    return [value] * n


def _foreach(name: str, inplace: bool, body: Callable) -> Callable:
    who = f"_foreach_{name}{'_' if inplace else ''}"

    def fn(self: Any, *args: Any, **kwargs: Any) -> list:
        tensors = _tensors(self, who)
        if not tensors:
            raise RuntimeError(f"holoflow.{who}: Tensor list must have at least one tensor.")
        out = body(who, tensors, *args, **kwargs)
        return self if inplace else out
    fn.__name__ = fn.__qualname__ = who
    fn.__doc__ = f"``torch.{who}``: {name} of each tensor of the list" + (", in place." if inplace else ".")
    return fn


def _method(name: str, inplace: bool) -> Callable:
    """The per-tensor body of an elementwise foreach op: ``t.<name>(...)`` / ``t.<name>_(...)``."""
    copied = inplace and name in _NO_INPLACE_METHOD
    attr = name + ("_" if inplace and not copied else "")
    per_value_tensor = name in ("addcmul", "addcdiv")

    def body(who: str, tensors: list, *args: Any, **kwargs: Any) -> list:
        n = len(tensors)
        if per_value_tensor and "scalars" in kwargs:   # (torch's ScalarList / Tensor overloads' keyword)
            kwargs["value"] = kwargs.pop("scalars")
        if per_value_tensor and len(args) == 3:        # (the value as the third positional argument)
            args, kwargs = args[:2], {**kwargs, "value": args[2]}
        cols = [_per_tensor(a, n, who) for a in args]
        kw = {k: _per_tensor(v, n, who, per_value_tensor and k == "value") for k, v in kwargs.items()}
        out = []
        for i, t in enumerate(tensors):
            r = getattr(t, attr)(*(c[i] for c in cols), **{k: v[i] for k, v in kw.items()})
            out.append(t.copy_(r) if copied else r)
        return out
    return body


def _foreach_pow(self: Any, exponent: Any) -> list:
    """``torch._foreach_pow``: each tensor to a power (a number, one per tensor, or tensors), or a
    number to each tensor's power (``_foreach_pow(2.0, exponents)``)."""
    if isinstance(self, Number):
        exponents = _tensors(exponent, "_foreach_pow", "exponent")
        return [self ** e for e in exponents]
    return _foreach("pow", False, _method("pow", False))(self, exponent)


def _norm_body(who: str, tensors: list, ord: float = 2, dtype: Any = None) -> list:
    return [vector_norm(t, ord, dtype=dtype) for t in tensors]


def _powsum_body(who: str, tensors: list, ord: float = 2, dtype: Any = None) -> list:
    """sum(|t| ** ord) per tensor (a norm without its root; ``ord`` inf sums infinities, as torch's)."""
    return [(t if dtype is None else t.to(dtype)).abs().pow(ord).sum() for t in tensors]


_SPECIAL = {
    "norm": (False, _norm_body),
    "powsum": (False, _powsum_body),
    "max": (False, lambda who, tensors: [t.max() for t in tensors]),
    "clone": (False, lambda who, tensors: [t.clone() for t in tensors]),
    "mm": (False, lambda who, tensors, mat2: [t.mm(m) for t, m in zip(tensors, _per_tensor(
        _tensors(mat2, who, "mat2"), len(tensors), who))]),
    "zero_": (True, lambda who, tensors: [t.zero_() for t in tensors]),
    "copy_": (True, lambda who, tensors, src, non_blocking=False: [t.copy_(s, non_blocking=non_blocking) for t, s in
                                                                   zip(tensors, _per_tensor(_tensors(src, who, "src"),
                                                                                            len(tensors), who))]),
}

__all__: list[str] = []
for _name in _UNARY + _BINARY + _TERNARY:
    for _inplace in (False, True):
        _fn = _foreach(_name, _inplace, _method(_name, _inplace))
        if (_name, _inplace) != ("pow", False):
            globals()[_fn.__name__] = _fn
            __all__.append(_fn.__name__)
__all__.append("_foreach_pow")
for _name, (_inplace, _body) in _SPECIAL.items():
    _fn = _foreach(_name.rstrip("_"), _inplace, _body)
    globals()[_fn.__name__] = _fn
    __all__.append(_fn.__name__)

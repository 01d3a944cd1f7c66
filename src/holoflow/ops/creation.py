"""Tensor creation: ``tensor, zeros, ones, full, arange, rand, randn, ...`` and ``*_like``.

Every function takes ``dtype, device, requires_grad`` like torch, and ``placement, sbp`` for a
global tensor (built by the placement's interpreter: the global view, distributed layer).
"""
from __future__ import annotations



import dataclasses

import numpy as np
import torch

from ..core import device as _device
from ..core import dtype as _dtype
from ..core import generators
from ..core.dispatch import apply
from ..core.errors import ArgTypeError, ArgValueError, UnsupportedError, int_sizes
from ..core import interpret
from ..core.interpret import is_lazy
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor, _as_torch, _flat
from . import out_arg
from .family import elementwise_sbp, refuse_complex_grad

# -- creation inside a graph trace: recorded as ops (eager calls torch directly) --------------
def _no_input_sbp(metas, attrs):
    return [((), (B,))]


def _like_sbp(metas, attrs):
    """``zeros_like(x)``: laid out like ``x`` (a constant is never partial: P gives B)."""
    return [((B,), (B,)), ((P,), (B,))] + [((S(a),), (S(a),)) for a in range(len(metas[0].shape))]


_CREATE: dict = {}


def _create_op(name: str, fn):
    op = _CREATE.get(name)
    if op is None:
        op = _CREATE[name] = defop(f"create_{name}", fn, differentiable=False,
                                   sbp=_like_sbp if name.endswith("_like") else _no_input_sbp,
                                   random=name.startswith("rand") or name == "normal", family="creation")
    return op


def _traced(name: str, fn, *args, placement=None, sbp=None, **attrs) -> Tensor | None:
    """Under a graph trace, records the creation as an op (global with ``placement``/``sbp`` or
    inside ``global_mode``); otherwise None (run it eagerly)."""
    if not is_lazy():
        return None
    t = apply(_create_op(name, fn), *args, **attrs)
    placement, sbp = _where(placement, sbp, name)
    return t if placement is None else interpret.current().globalize(t, placement, sbp)


LOCAL = object()   # placement=LOCAL: a local tensor whatever global_mode says (Tensor.new_*)


def _where(placement, sbp, op: str = "tensor") -> tuple:
    """The placement and SBP a creation op uses: its arguments, else a ``global_mode`` scope's."""
    if placement is LOCAL:
        return None, None
    if placement is None and sbp is None:
        return interpret.current().creation_default() or (None, None)
    if placement is None or sbp is None:
        raise ArgValueError(f"holoflow.{op}: a global tensor needs both placement= and sbp=; got "
                            f"placement={placement!r}, sbp={sbp!r} (pass both, or neither for a local tensor)")
    return placement, sbp


def _sizes(size, op: str = "tensor creation") -> tuple:
    if len(size) == 1 and isinstance(size[0], (tuple, list, torch.Size)):
        size = tuple(size[0])
    return int_sizes(op, size, allow_negative=False)  # torch's TypeError/RuntimeError


def _torch_call(op: str, fn, *args, **kwargs) -> torch.Tensor:
    """``fn(*args, **kwargs)`` with torch's failure re-raised in torch's class, naming ``op`` and
    what it was given."""
    try:
        return fn(*args, **kwargs)
    except (RuntimeError, ValueError, TypeError) as e:
        if str(e).startswith("holoflow"):
            raise
        given = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if k != "generator"])
        cls = type(e) if type(e) in (RuntimeError, NotImplementedError, ValueError, TypeError) else RuntimeError
        raise cls(f"holoflow.{op}({given}): {str(e).splitlines()[0]}") from e


def _finish(data: torch.Tensor, requires_grad: bool = False, placement=None, sbp=None,
            op: str = "tensor") -> Tensor:
    t = Tensor._make(data)
    placement, sbp = _where(placement, sbp, op)
    if placement is not None:
        t = interpret.current().globalize(t, placement, sbp)
    if requires_grad:
        t.requires_grad_(True)
    return t


def _kw(dtype, device) -> dict:
    return {"dtype": _dtype.to_torch(dtype), "device": _device.to_torch(device)}


def _check_options(op: str, layout=None, out=None) -> None:
    """torch's ``layout=`` (only ``strided``: holoflow tensors are dense) and ``out=`` (refused
    where a factory doesn't take it: ``normal`` of tensors, ``range``) of a factory."""
    if layout is not None and layout is not torch.strided:
        raise NotImplementedError(f"holoflow.{op}: layout={layout} is not supported; holoflow tensors are strided "
                                  f"(pass layout=holoflow.strided or leave it out)")
    if out is not None:
        raise TypeError(f"holoflow.{op}: out= is not supported; assign the returned tensor")


def _number(x):
    """A 0-d tensor argument torch reads as a number (``arange(t)``, ``randint(t, ...)``)."""
    return x.item() if isinstance(x, Tensor) else x


def _create(op: str, fn, *args, requires_grad: bool = False, placement=None, sbp=None, layout=None, out=None,
            pin_memory: bool = False, **params) -> Tensor:
    """``fn(*args, **params)`` as a new tensor: under a graph trace a recorded op (a node of the
    program, so a compiled call makes it anew, from its tensor arguments' current values), else
    torch's call (its errors re-raised naming ``op``); global with ``placement``/``sbp`` or inside
    ``global_mode``; written into ``out`` when given, as torch's ``out=``)."""
    if out is not None:   # (requires_grad: out requires grad then, a leaf, as torch's)
        made = _into(op, out, params, lambda **p: _create(op, fn, *args, placement=placement, sbp=sbp,
                                                          layout=layout, pin_memory=pin_memory, **p))
        return made.requires_grad_(True) if requires_grad else made
    _check_options(op, layout)
    t = _traced(op, fn, *args, placement=placement, sbp=sbp, **params)
    if t is None:
        data = _torch_call(op, fn, *[a._data if isinstance(a, Tensor) else a for a in args], **params)
        if pin_memory:
            data = _torch_call(op, torch.Tensor.pin_memory, data)
        t = _finish(data, False, placement, sbp, op)
    return t.requires_grad_(True) if requires_grad else t


def _into(op: str, out, params: dict, make) -> Tensor:
    """A factory's ``out=``: the tensor made in out's dtype and on its device (unless given:
    torch refuses a dtype other than out's), written into ``out`` (resized), ``out`` returned."""
    if not isinstance(out, Tensor):
        raise TypeError(f"holoflow.{op}(): argument 'out' must be Tensor, not {type(out).__name__}")
    dt = params.get("dtype")
    if dt is not None and dt != out._data.dtype:
        raise RuntimeError(f"holoflow.{op}(): dtype {_dtype.scalar_name(dt)} does not match the dtype of out= "
                           f"({_dtype.scalar_name(out._data.dtype)}); leave dtype out, or pass an out of that dtype")
    made = make(**{**params, "dtype": out._data.dtype, "device": params.get("device") or out._data.device})
    return out_arg.write_out(f"holoflow.{op}()", made, out, True)


def _tensor_kernel(data, dtype=None, device=None) -> torch.Tensor:
    """``torch.tensor(data)``: a copy (of a tensor: detached) in ``dtype`` on ``device``."""
    out = _as_torch(data, dtype, device)
    return out.clone() if isinstance(data, (Tensor, torch.Tensor)) else out


def tensor(data, dtype=None, device=None, requires_grad: bool = False, placement=None,
           sbp=None, pin_memory: bool = False) -> Tensor:
    """Copies ``data`` (lists, numbers, numpy arrays, tensors) into a new tensor."""
    if is_lazy():   # a node of the trace (its data an attr, or the lazy tensor it copies)
        if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in _flat(data)):
            placement, sbp = _where(placement, sbp, "tensor")
            t = _of_elements(data, _dtype.to_torch(dtype), _device.to_torch(device), placement)
            if placement is not None and tuple(t.sbp) != tuple(sbp):
                t = t.to_global(sbp=sbp)
            return t.requires_grad_(True) if requires_grad else t
        return _create("tensor", _tensor_kernel, data, requires_grad=requires_grad, placement=placement, sbp=sbp,
                       **_kw(dtype, device))
    data = _tensor_kernel(data, _dtype.to_torch(dtype), _device.to_torch(device))
    if pin_memory:
        data = _torch_call("tensor", torch.Tensor.pin_memory, data)
    return _finish(data, requires_grad, placement, sbp)


def _of_elements(data, dtype: torch.dtype | None, device, place=None) -> Tensor:
    """``tensor([x.sum(), 2.0, ...])`` inside a trace, where the elements have no values yet: the
    one-element tensors and numbers stacked by ops (detached, as torch reads values), in the
    dtype torch infers when none is given (each tensor's own, a number's default, promoted);
    with a placement, a broadcast global tensor of the whole values (a global element's too)."""
    from .shape import stack
    if dtype is None:
        dtype = torch.tensor(False).dtype
        for x in _flat(data):
            own = _dtype.to_torch(x.dtype) if isinstance(x, Tensor) else torch.tensor(x).dtype
            dtype = torch.promote_types(dtype, own)
    whole = None if place is None else (B,) * len(place.hierarchy)

    def build(x) -> Tensor:
        if isinstance(x, (list, tuple)):
            return stack([build(e) for e in x]) if len(x) else _create("tensor", _tensor_kernel, [], dtype=dtype,
                                                                          device=device, placement=place, sbp=whole)
        if not isinstance(x, Tensor):
            return _create("tensor", _tensor_kernel, x, dtype=dtype, device=device, placement=place, sbp=whole)
        if x.numel() != 1:
            raise ValueError(f"holoflow.tensor: only one element tensors can be converted to Python scalars "
                             f"(an element of shape {tuple(x.shape)})")
        x = x.detach()
        if x.is_global and place is None:
            raise UnsupportedError(
                f"holoflow.tensor: inside nn.Graph's build(), an element is a global tensor (sbp "
                f"{tuple(x.sbp)} on {x.placement}), whose value eager reads into a local tensor; a graph's one "
                f"program keeps it global: pass placement= and sbp= (holoflow.tensor([...], placement=P, "
                f"sbp=holoflow.sbp.broadcast)), or compute with tensor ops (holoflow.stack)")
        if place is not None:
            x = x.to_global(placement=place, sbp=whole)
        return x.reshape(()).to(dtype=dtype, device=device)
    return build(data)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like :func:`tensor`, but shares memory with a numpy array or tensor when it can."""
    if isinstance(data, Tensor):   # itself, or a differentiable conversion of it (torch's ``to``)
        return data.to(dtype=_dtype.to_torch(dtype) or data.dtype, device=_device.to_torch(device) or data.device)
    if isinstance(data, np.ndarray):
        return Tensor._make(torch.as_tensor(data, dtype=_dtype.to_torch(dtype), device=_device.to_torch(device)))
    if is_lazy() and not isinstance(data, torch.Tensor):   # nothing to share: a copy, as tensor()
        return tensor(data, dtype, device, placement=LOCAL, sbp=LOCAL)
    return Tensor._make(_as_torch(data, _dtype.to_torch(dtype), _device.to_torch(device)))


def from_numpy(a: np.ndarray) -> Tensor:
    """A tensor sharing memory with the numpy array ``a``."""
    return Tensor._make(torch.from_numpy(a))


def from_torch(t: torch.Tensor) -> Tensor:
    """A holoflow tensor sharing storage with the torch tensor ``t`` (autograd not carried)."""
    if type(t) is not torch.Tensor and not isinstance(t, torch.Tensor):
        hint = " (it is a holoflow tensor already)" if isinstance(t, Tensor) else ""
        raise TypeError(f"holoflow.from_torch: expected a torch.Tensor, got {type(t).__module__}."
                        f"{type(t).__name__}{hint}")
    return Tensor._make(t.detach())


def from_dlpack(ext) -> Tensor:
    return Tensor._make(torch.from_dlpack(ext))


def _size_arg(size: tuple, kw_size, op: str) -> tuple:
    """The sizes of ``zeros(2, 3)``, ``zeros((2, 3))`` or ``zeros(size=(2, 3))``."""
    if kw_size is not None:
        if size:
            raise TypeError(f"holoflow.{op}: got the size both positionally and as size=")
        size = (kw_size,)
    return _sizes(size, op)


def _filled(fn):
    def make(*size, dtype=None, device=None, requires_grad=False, placement=None, sbp=None,
             out=None, layout=None, pin_memory=False, **kw):
        shape = _size_arg(size, kw.pop("size", None), fn.__name__)
        if kw:
            raise TypeError(f"holoflow.{fn.__name__}: unexpected keyword arguments {sorted(kw)}")
        return _create(fn.__name__, fn, size=shape, requires_grad=requires_grad, placement=placement, sbp=sbp,
                       layout=layout, out=out, pin_memory=pin_memory, **_kw(dtype, device))
    make.__name__ = fn.__name__
    make.__doc__ = f"A new tensor of the given size, as ``torch.{fn.__name__}``."
    return make


zeros = _filled(torch.zeros)
ones = _filled(torch.ones)
empty = _filled(torch.empty)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False, placement=None,
         sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """A tensor of ``size`` filled with ``fill_value`` (a number or a 0-d tensor), as ``torch.full``."""
    return _create("full", torch.full, size=_sizes((size,), "full"), fill_value=_number(fill_value),
                   requires_grad=requires_grad, placement=placement, sbp=sbp, out=out, layout=layout,
                   pin_memory=pin_memory, **_kw(dtype, device))


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False,
           placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """``start, start + step, ...`` below ``end`` (numbers or 0-d tensors), as ``torch.arange``."""
    if end is None:
        start, end = 0, start
    return _create("arange", torch.arange, start=_number(start), end=_number(end), step=_number(step),
                   requires_grad=requires_grad, placement=placement, sbp=sbp, out=out, layout=layout,
                   pin_memory=pin_memory, **_kw(dtype, device))


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad=False,
             placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """``steps`` evenly spaced values from ``start`` to ``end`` (numbers or 0-d tensors), as
    ``torch.linspace``."""
    return _create("linspace", torch.linspace, start, end, steps, requires_grad=requires_grad, placement=placement,
                   sbp=sbp, out=out, layout=layout, pin_memory=pin_memory, **_kw(dtype, device))


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None, requires_grad=False,
             placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """``base ** linspace(start, end, steps)``, as ``torch.logspace``."""
    return _create("logspace", torch.logspace, start, end, steps, base, requires_grad=requires_grad,
                   placement=placement, sbp=sbp, out=out, layout=layout, pin_memory=pin_memory,
                   **_kw(dtype, device))


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False,
        placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """The ``n x m`` identity matrix, as ``torch.eye``."""
    return _create("eye", torch.eye, n, n if m is None else m, requires_grad=requires_grad, placement=placement,
                   sbp=sbp, out=out, layout=layout, pin_memory=pin_memory, **_kw(dtype, device))


def _factory(op: str, fn, *args, dtype=None, device=None, requires_grad: bool = False, **params) -> Tensor:
    """``fn(*args, **params)`` with torch's ``dtype``/``device`` as a new tensor (global inside
    ``global_mode``; a node under a graph trace; torch's errors re-raised naming ``op``)."""
    return _create(op, fn, *args, requires_grad=requires_grad, **params, **_kw(dtype, device))


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    """The (2, N) coordinates of the lower triangle of a ``row x col`` matrix, as torch."""
    return _factory("tril_indices", torch.tril_indices, row, col, offset, dtype=dtype or _dtype.int64, device=device,
                    layout=layout)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    """The (2, N) coordinates of the upper triangle of a ``row x col`` matrix, as torch."""
    return _factory("triu_indices", torch.triu_indices, row, col, offset, dtype=dtype or _dtype.int64, device=device,
                    layout=layout)


def scalar_tensor(s, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:
    """A 0-d tensor holding the number ``s`` (default dtype: torch's default float)."""
    return _factory("scalar_tensor", torch.scalar_tensor, _number(s), dtype=dtype, device=device,
                    requires_grad=requires_grad, layout=layout, pin_memory=pin_memory)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor with the given sizes and strides, as ``torch.empty_strided``."""
    return _factory("empty_strided", torch.empty_strided, tuple(size), tuple(stride), dtype=dtype, device=device,
                    requires_grad=requires_grad, layout=layout, pin_memory=pin_memory)


def asarray(obj, *, dtype=None, device=None, copy: bool | None = None, requires_grad: bool | None = None) -> Tensor:
    """``obj`` as a tensor, sharing memory (a tensor: itself) unless a copy or conversion is
    needed, as ``torch.asarray``."""
    if isinstance(obj, Tensor):
        out = obj.to(dtype=_dtype.to_torch(dtype) or obj.dtype, device=_device.to_torch(device) or obj.device)
        if copy and out is obj:
            out = obj.clone()
        return out if requires_grad is None or out.requires_grad == requires_grad else \
            out.detach().requires_grad_(requires_grad)
    if is_lazy() and not isinstance(obj, (np.ndarray, torch.Tensor)):   # nothing to share: a node
        return tensor(obj, dtype, device, bool(requires_grad), LOCAL, LOCAL)
    data = _torch_call("asarray", torch.asarray, obj, dtype=_dtype.to_torch(dtype), device=_device.to_torch(device),
                       copy=copy)
    return _finish(data, bool(requires_grad), LOCAL, LOCAL)


def _window(name: str):
    fn = getattr(torch, name)

    def make(window_length: int, *args, dtype=None, layout=None, device=None, pin_memory: bool = False,
             requires_grad: bool = False, **params) -> Tensor:
        return _factory(name, fn, window_length, *args, dtype=dtype, device=device, requires_grad=requires_grad,
                        layout=layout, pin_memory=pin_memory, **params)
    make.__name__ = name
    make.__doc__ = f"The window of ``torch.{name}`` (same arguments, dtype and values)."
    return make


hann_window, hamming_window, blackman_window, bartlett_window, kaiser_window = (
    _window(n) for n in ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"))


def _draws_from(generator, device) -> torch.Generator | None:
    """The generator a creation on ``device`` draws from: the caller's, else (eager, on a
    simulated rank) the rank's own, else None: torch's default (core/generators.py)."""
    return generators.for_kernel(generator, _device.to_torch(device) or torch.get_default_device())


def _draw(op: str, fn, *args, generator=None, device=None, **params) -> Tensor:
    """:func:`_create` of a random tensor: a generator given is an attr of the traced node
    (drawn from at run time: the trace's shape inference, which runs the kernel, puts its state
    back)."""
    g = _draws_from(generator, device)
    device = _device.to_torch(device)
    if g is None or not is_lazy():
        return _create(op, fn, *args, **({} if g is None else {"generator": g}), device=device, **params)
    state = g.get_state()
    try:
        return _create(op, fn, *args, generator=g, device=device, **params)
    finally:
        g.set_state(state)


def _random(fn):
    def make(*size, generator=None, dtype=None, device=None, requires_grad=False, placement=None, sbp=None,
             out=None, layout=None, pin_memory: bool = False, **kw):
        shape = _size_arg(size, kw.pop("size", None), fn.__name__)
        if kw:
            raise TypeError(f"holoflow.{fn.__name__}: unexpected keyword arguments {sorted(kw)}")
        return _draw(fn.__name__, fn, size=shape, generator=generator, dtype=_dtype.to_torch(dtype), device=device,
                     requires_grad=requires_grad, placement=placement, sbp=sbp, out=out, layout=layout,
                     pin_memory=pin_memory)
    make.__name__ = fn.__name__
    make.__doc__ = (f"Random tensor, as ``torch.{fn.__name__}``; a global one holds the same "
                    f"logical values as the single-process call with the same seed.")
    return make


rand = _random(torch.rand)
randn = _random(torch.randn)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None, requires_grad: bool = False,
            placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """Integers drawn uniformly from ``[low, high)`` (``randint(high, size)``: from 0; the bounds
    numbers or 0-d tensors), as ``torch.randint``."""
    if size is None and isinstance(high, (tuple, list, torch.Size)):   # randint(high, size)
        low, high, size = 0, low, high
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("holoflow.randint: size= is required, e.g. randint(0, 10, (3,))")
    return _draw("randint", torch.randint, low=_number(low), high=_number(high), size=_sizes((size,), "randint"),
                 generator=generator, dtype=_dtype.to_torch(dtype or (None if out is not None else _dtype.int64)),
                 device=device,
                 requires_grad=requires_grad, placement=placement, sbp=sbp, out=out, layout=layout,
                 pin_memory=pin_memory)


def randperm(n: int, *, generator=None, dtype=None, device=None, requires_grad: bool = False, placement=None,
             sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """A random permutation of ``0 .. n - 1`` (``n`` a number or a 0-d tensor), as ``torch.randperm``."""
    return _draw("randperm", torch.randperm, n=_number(n), generator=generator,
                 dtype=_dtype.to_torch(dtype or _dtype.int64), device=device, requires_grad=requires_grad,
                 placement=placement, sbp=sbp, out=out, layout=layout, pin_memory=pin_memory)


def _zero_grads(c, dy):
    """torch's gradient of ``normal(mean, std)`` in its tensor arguments: zeros of their shapes."""
    zero = zeros_like(dy)
    return tuple(zero.sum_to_size(c.shapes[i]) if need else None for i, need in enumerate(c.needs_grad))


NORMAL = defop("normal", lambda mean, std, generator=None: torch.normal(mean, std, generator=generator),
               grad=_zero_grads, sbp=elementwise_sbp(), random=True, family="random")


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None, requires_grad=False,
           placement=None, sbp=None, out=None, layout=None, pin_memory: bool = False) -> Tensor:
    """Samples N(mean, std); ``mean``/``std`` may be tensors (then ``size`` comes from them, and
    the result is differentiable in them with torch's zero gradient)."""
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        _check_options("normal", layout, out)
        given = {"size": size, "dtype": dtype, "device": device, "placement": placement, "sbp": sbp}
        extra = sorted(k for k, v in given.items() if v is not None) + (["requires_grad"] if requires_grad else [])
        if extra or pin_memory:
            raise TypeError(f"holoflow.normal: with a tensor mean or std the result takes their shape, dtype and "
                            f"device; got {extra or ['pin_memory']} too (leave them out, or pass numbers)")
        refuse_complex_grad("normal", mean, std)
        like = mean if isinstance(mean, Tensor) else std
        g = generators.for_op(generator, like)
        return apply(NORMAL, mean, std, **({} if g is None else {"generator": g}))
    if size is None:
        raise TypeError("holoflow.normal: size= is required when mean and std are numbers")
    return _draw("normal", torch.normal, mean=float(mean), std=float(std), size=_sizes((size,), "normal"),
                 generator=generator, dtype=_dtype.to_torch(dtype), device=device, requires_grad=requires_grad,
                 placement=placement, sbp=sbp, out=out, layout=layout, pin_memory=pin_memory)


def _rand_like(x, *, generator=None, **kw):
    return torch.empty_like(x, **kw).uniform_(generator=generator)


def _randn_like(x, *, generator=None, **kw):
    return torch.empty_like(x, **kw).normal_(generator=generator)


def _randint_like(x, *bounds, low=None, high=None, generator=None, **kw):
    if low is not None or high is not None:
        bounds = (0 if low is None else low, *bounds) if high is None else (0 if low is None else low, high)
    if not 1 <= len(bounds) <= 2:
        raise TypeError(f"holoflow.randint_like: expected high (and optionally low), got {bounds}")
    low, high = (0, bounds[0]) if len(bounds) == 1 else bounds
    return torch.empty_like(x, **kw).random_(low, high, generator=generator)


# torch draws ``rand_like`` as ``empty_like(x).uniform_()`` (and so on): the same numbers, with a
# generator a global input's shards draw from (distributed/rng.py)
_RANDOM_LIKE = {"rand_like": _rand_like, "randn_like": _randn_like, "randint_like": _randint_like}


def _like(fn_name: str):
    fn = _RANDOM_LIKE.get(fn_name) or getattr(torch, fn_name)

    def make(input: Tensor, *args, dtype=None, device=None, requires_grad=False,
             memory_format=None, layout=None, pin_memory: bool = False, **kwargs):
        _check_options(fn_name, layout)
        kw = _kw(dtype, device)
        kw = {k: v for k, v in kw.items() if v is not None}
        if memory_format is not None:
            kw["memory_format"] = memory_format
        args = tuple(_number(a) for a in args)   # (full_like's value, randint_like's bounds: 0-d tensors too)
        kwargs = {k: _number(v) if k in ("fill_value", "low", "high") else v for k, v in kwargs.items()}
        if kwargs.get("generator") is not None:
            kwargs["generator"] = getattr(kwargs["generator"], "torch", kwargs["generator"])
        t = _traced(fn_name, fn, input, *args, **kw, **kwargs)
        if t is not None:
            return t.requires_grad_(True) if requires_grad else t
        if fn_name in _RANDOM_LIKE and input._global is None and kwargs.get("generator") is None:
            g = _draws_from(None, kw.get("device") or input._data.device)   # (a global one's: rng.py)
            kwargs = kwargs if g is None else {**kwargs, "generator": g}
        if input._global is not None and fn_name in _RANDOM_LIKE:   # each shard its own draws
            t = apply(_create_op(fn_name, fn), input, *args, **kw, **kwargs)
            return t.requires_grad_(True) if requires_grad else t
        data = _torch_call(fn_name, fn, input._data, *args, **kw, **kwargs)
        out = Tensor._make(data)   # like its input: local, or global below (never global_mode's)
        if requires_grad:
            out.requires_grad_(True)
        if input._global is not None:  # a constant is never partial: P becomes B
            sbp = tuple(B if s == P else s for s in input._global.sbp)
            out._global = dataclasses.replace(input._global, sbp=sbp, grad_sbp=None, strides=None)
        return out
    make.__name__ = fn_name
    make.__doc__ = f"As ``torch.{fn_name}``: shape (and dtype, device) of ``input``."
    return make


zeros_like, ones_like, empty_like, full_like = (_like(n) for n in ("zeros_like", "ones_like",
                                                                   "empty_like", "full_like"))
rand_like, randn_like, randint_like = (_like(n) for n in ("rand_like", "randn_like", "randint_like"))


def _new(fn):
    def method(self: Tensor, *size, dtype=None, device=None, requires_grad=False, layout=None,
               pin_memory: bool = False, **kw):
        kw = {"dtype": dtype or self.dtype, "device": device or self.device, **kw}   # (size=)
        # a new local tensor, even inside global_mode
        return fn(*size, requires_grad=requires_grad, placement=LOCAL, sbp=LOCAL, layout=layout,
                  pin_memory=pin_memory, **kw)
    return method


def _new_full(self: Tensor, size, fill_value, *, dtype=None, device=None, requires_grad=False, layout=None,
              pin_memory: bool = False):
    return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                requires_grad=requires_grad, placement=LOCAL, sbp=LOCAL, layout=layout, pin_memory=pin_memory)


def _new_tensor(self: Tensor, data, *, dtype=None, device=None, requires_grad=False):
    return tensor(data, dtype=dtype or self.dtype, device=device or self.device,
                  requires_grad=requires_grad, placement=LOCAL, sbp=LOCAL)


Tensor.new_zeros = _new(zeros)
Tensor.new_ones = _new(ones)
Tensor.new_empty = _new(empty)
Tensor.new_full = _new_full
Tensor.new_tensor = _new_tensor


def manual_seed(seed: int):
    """Seeds every RNG holoflow's kernels use (CPU and CUDA)."""
    if isinstance(seed, (str, bytes)) or not hasattr(seed, "__index__") and not isinstance(seed, float):
        raise ArgTypeError(f"holoflow.manual_seed: the seed must be an int, got {seed!r} of type "
                           f"{type(seed).__name__}")   # torch: ValueError (int('a')); also a TypeError
    return generators.manual_seed(seed)


# the default CPU generator these read and write is a simulated rank's own on its thread
def seed() -> int:
    return generators.seed()


def initial_seed() -> int:
    return generators.cpu().initial_seed()


def get_rng_state() -> Tensor:
    return Tensor._make(generators.cpu().get_state())


def set_rng_state(state: Tensor) -> None:
    generators.cpu().set_state(state._data if isinstance(state, Tensor) else state)


class Generator:
    """A random generator, as ``torch.Generator``."""

    def __init__(self, device="cpu") -> None:
        self.torch = torch.Generator(device=_device.to_torch(device))

    def manual_seed(self, seed: int) -> "Generator":
        self.torch.manual_seed(seed)
        return self

    def seed(self) -> int:
        return self.torch.seed()

    def initial_seed(self) -> int:
        return self.torch.initial_seed()

    def get_state(self) -> Tensor:
        return Tensor._make(self.torch.get_state())

    def set_state(self, state) -> None:
        self.torch.set_state(state._data if isinstance(state, Tensor) else state)



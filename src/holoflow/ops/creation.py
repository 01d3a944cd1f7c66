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
from ..core.errors import ArgTypeError, ArgValueError, int_sizes
from ..core import interpret
from ..core.interpret import is_lazy
from ..core.registry import defop
from ..core.sbp import B, P, S
from ..core.tensor import Tensor, _as_torch

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
    except (RuntimeError, ValueError) as e:
        given = ", ".join([repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items() if k != "generator"])
        cls = type(e) if type(e) in (RuntimeError, NotImplementedError, ValueError) else RuntimeError
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


def tensor(data, dtype=None, device=None, requires_grad: bool = False, placement=None,
           sbp=None, pin_memory: bool = False) -> Tensor:
    """Copies ``data`` (lists, numbers, numpy arrays, tensors) into a new tensor."""
    return _finish(_as_torch(data, _dtype.to_torch(dtype), _device.to_torch(device)).clone()
                   if isinstance(data, (Tensor, torch.Tensor)) else
                   _as_torch(data, _dtype.to_torch(dtype), _device.to_torch(device)),
                   requires_grad, placement, sbp)


def as_tensor(data, dtype=None, device=None) -> Tensor:
    """Like :func:`tensor`, but shares memory with a numpy array or tensor when it can."""
    if isinstance(data, Tensor) and dtype is None and device is None:
        return data
    if isinstance(data, np.ndarray):
        return Tensor._make(torch.as_tensor(data, dtype=_dtype.to_torch(dtype), device=_device.to_torch(device)))
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


def _filled(fn):
    def make(*size, dtype=None, device=None, requires_grad=False, placement=None, sbp=None,
             out=None, layout=None, pin_memory=False):
        t = _traced(fn.__name__, fn, size=_sizes(size, fn.__name__), placement=placement, sbp=sbp,
                    **_kw(dtype, device))
        if t is not None:
            return t
        return _finish(fn(_sizes(size, fn.__name__), **_kw(dtype, device)), requires_grad, placement, sbp,
                       fn.__name__)
    make.__name__ = fn.__name__
    make.__doc__ = f"A new tensor of the given size, as ``torch.{fn.__name__}``."
    return make


zeros = _filled(torch.zeros)
ones = _filled(torch.ones)
empty = _filled(torch.empty)


def full(size, fill_value, *, dtype=None, device=None, requires_grad=False, placement=None,
         sbp=None) -> Tensor:
    if isinstance(fill_value, Tensor):
        fill_value = fill_value.item()
    t = _traced("full", torch.full, size=_sizes((size,)), fill_value=fill_value, placement=placement, sbp=sbp,
                **_kw(dtype, device))
    if t is not None:
        return t
    return _finish(torch.full(_sizes((size,)), fill_value, **_kw(dtype, device)), requires_grad,
                   placement, sbp, "full")


def arange(start, end=None, step=1, *, dtype=None, device=None, requires_grad=False,
           placement=None, sbp=None) -> Tensor:
    if end is None:
        start, end = 0, start
    t = _traced("arange", torch.arange, start=start, end=end, step=step, placement=placement, sbp=sbp,
                **_kw(dtype, device))
    if t is not None:
        return t
    data = _torch_call("arange", torch.arange, start, end, step, **_kw(dtype, device))
    return _finish(data, requires_grad, placement, sbp, "arange")


def linspace(start, end, steps: int, *, dtype=None, device=None, requires_grad=False,
             placement=None, sbp=None) -> Tensor:
    return _finish(_torch_call("linspace", torch.linspace, start, end, steps, **_kw(dtype, device)), requires_grad,
                   placement, sbp, "linspace")


def logspace(start, end, steps: int, base: float = 10.0, *, dtype=None, device=None) -> Tensor:
    return Tensor._make(torch.logspace(start, end, steps, base, **_kw(dtype, device)))


def eye(n: int, m: int | None = None, *, dtype=None, device=None, requires_grad=False,
        placement=None, sbp=None) -> Tensor:
    return _finish(torch.eye(n, n if m is None else m, **_kw(dtype, device)), requires_grad,
                   placement, sbp, "eye")


def _factory(op: str, fn, *args, dtype=None, device=None, requires_grad: bool = False, **params) -> Tensor:
    """``fn(*args, **params)`` with torch's ``dtype``/``device`` as a new tensor (global inside
    ``global_mode``, like ``linspace``; torch's errors re-raised naming ``op``)."""
    return _finish(_torch_call(op, fn, *args, **params, **_kw(dtype, device)), requires_grad)


def tril_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    """The (2, N) coordinates of the lower triangle of a ``row x col`` matrix, as torch."""
    return _factory("tril_indices", torch.tril_indices, row, col, offset, dtype=dtype or _dtype.int64, device=device)


def triu_indices(row: int, col: int, offset: int = 0, *, dtype=None, device=None, layout=None) -> Tensor:
    """The (2, N) coordinates of the upper triangle of a ``row x col`` matrix, as torch."""
    return _factory("triu_indices", torch.triu_indices, row, col, offset, dtype=dtype or _dtype.int64, device=device)


def scalar_tensor(s, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:
    """A 0-d tensor holding the number ``s`` (default dtype: torch's default float)."""
    if isinstance(s, Tensor):
        s = s.item()
    return _factory("scalar_tensor", torch.scalar_tensor, s, dtype=dtype, device=device, requires_grad=requires_grad)


def empty_strided(size, stride, *, dtype=None, device=None, requires_grad: bool = False, layout=None,
                  pin_memory: bool = False) -> Tensor:
    """An uninitialised tensor with the given sizes and strides, as ``torch.empty_strided``."""
    return _factory("empty_strided", torch.empty_strided, tuple(size), tuple(stride), dtype=dtype, device=device,
                    requires_grad=requires_grad)


def asarray(obj, *, dtype=None, device=None, copy: bool | None = None, requires_grad: bool | None = None) -> Tensor:
    """``obj`` as a tensor, sharing memory (a tensor: itself) unless a copy or conversion is
    needed, as ``torch.asarray``."""
    if isinstance(obj, Tensor):
        out = obj.to(dtype=_dtype.to_torch(dtype) or obj.dtype, device=_device.to_torch(device) or obj.device)
        if copy and out is obj:
            out = obj.clone()
        return out if requires_grad is None or out.requires_grad == requires_grad else \
            out.detach().requires_grad_(requires_grad)
    data = _torch_call("asarray", torch.asarray, obj, dtype=_dtype.to_torch(dtype), device=_device.to_torch(device),
                       copy=copy)
    return _finish(data, bool(requires_grad), LOCAL, LOCAL)


def _window(name: str):
    fn = getattr(torch, name)

    def make(window_length: int, *args, dtype=None, layout=None, device=None, pin_memory: bool = False,
             requires_grad: bool = False, **params) -> Tensor:
        return _factory(name, fn, window_length, *args, dtype=dtype, device=device, requires_grad=requires_grad,
                        **params)
    make.__name__ = name
    make.__doc__ = f"The window of ``torch.{name}`` (same arguments, dtype and values)."
    return make


hann_window, hamming_window, blackman_window, bartlett_window, kaiser_window = (
    _window(n) for n in ("hann_window", "hamming_window", "blackman_window", "bartlett_window", "kaiser_window"))


def _traced_draw(name: str, fn, g, **attrs) -> Tensor | None:
    """``_traced`` for a random creation: a generator given is an attr (drawn from at run time,
    not during the trace's shape inference, which runs the kernel)."""
    if g is None:
        return _traced(name, fn, **attrs)
    state = g.get_state()
    try:
        return _traced(name, fn, generator=g, **attrs)
    finally:
        g.set_state(state)


def _draws_from(generator, device) -> torch.Generator | None:
    """The generator a creation on ``device`` draws from: the caller's, else (eager, on a
    simulated rank) the rank's own, else None: torch's default (core/generators.py)."""
    return generators.for_kernel(generator, _device.to_torch(device) or torch.get_default_device())


def _random(fn):
    def make(*size, generator=None, dtype=None, device=None, requires_grad=False,
             placement=None, sbp=None):
        g = _draws_from(generator, device)
        t = _traced_draw(fn.__name__, fn, g, size=_sizes(size, fn.__name__), placement=placement, sbp=sbp,
                         **_kw(dtype, device))
        if t is not None:
            return t
        return _finish(_torch_call(fn.__name__, fn, _sizes(size, fn.__name__), generator=g, **_kw(dtype, device)),
                       requires_grad, placement, sbp, fn.__name__)
    make.__name__ = fn.__name__
    make.__doc__ = (f"Random tensor, as ``torch.{fn.__name__}``; a global one holds the same "
                    f"logical values as the single-process call with the same seed.")
    return make


rand = _random(torch.rand)
randn = _random(torch.randn)


def randint(low, high=None, size=None, *, generator=None, dtype=None, device=None,
            placement=None, sbp=None) -> Tensor:
    if high is None:
        low, high = 0, low
    if size is None:
        raise TypeError("holoflow.randint: size= is required, e.g. randint(0, 10, (3,))")
    g = _draws_from(generator, device)
    kw = _kw(dtype or _dtype.int64, device)
    t = _traced_draw("randint", torch.randint, g, low=low, high=high, size=_sizes((size,), "randint"),
                     placement=placement, sbp=sbp, **kw)
    if t is not None:   # under a graph trace: a draw per call, not a constant
        return t
    return _finish(_torch_call("randint", torch.randint, low, high, _sizes((size,), "randint"), generator=g, **kw),
                   False, placement, sbp, "randint")


def randperm(n: int, *, generator=None, dtype=None, device=None, placement=None, sbp=None) -> Tensor:
    g = _draws_from(generator, device)
    t = _traced_draw("randperm", torch.randperm, g, n=n, placement=placement, sbp=sbp,
                     **_kw(dtype or _dtype.int64, device))
    if t is not None:
        return t
    return _finish(torch.randperm(n, generator=g, **_kw(dtype or _dtype.int64, device)), False,
                   placement, sbp, "randperm")


def normal(mean=0.0, std=1.0, size=None, *, generator=None, dtype=None, device=None,
           requires_grad=False) -> Tensor:
    """Samples N(mean, std); ``mean``/``std`` may be tensors (then ``size`` comes from them)."""
    if isinstance(mean, Tensor) or isinstance(std, Tensor):
        m = mean._data if isinstance(mean, Tensor) else mean
        s = std._data if isinstance(std, Tensor) else std
        g = _draws_from(generator, (m if isinstance(mean, Tensor) else s).device)
        return Tensor._make(torch.normal(m, s, generator=g))
    g = _draws_from(generator, device)
    if size is None:
        raise TypeError("holoflow.normal: size= is required when mean and std are numbers")
    t = _traced_draw("normal", torch.normal, g, mean=float(mean), std=float(std), size=_sizes((size,)),
                     **_kw(dtype, device))
    if t is not None:
        return t
    return _finish(torch.normal(mean, std, _sizes((size,)), generator=g, **_kw(dtype, device)),
                   requires_grad)


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
             memory_format=None, **kwargs):
        kw = _kw(dtype, device)
        kw = {k: v for k, v in kw.items() if v is not None}
        t = _traced(fn_name, fn, input, *args, **kw, **kwargs)
        if t is not None:
            return t
        if fn_name in _RANDOM_LIKE and input._global is None and kwargs.get("generator") is None:
            g = _draws_from(None, kw.get("device") or input._data.device)   # (a global one's: rng.py)
            kwargs = kwargs if g is None else {**kwargs, "generator": g}
        if input._global is not None and fn_name in _RANDOM_LIKE:   # each shard its own draws
            t = apply(_create_op(fn_name, fn), input, *args, **kw, **kwargs)
            return t.requires_grad_(True) if requires_grad else t
        data = fn(input._data, *args, **kw, **kwargs)
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
    def method(self: Tensor, *size, dtype=None, device=None, requires_grad=False):
        kw = {"dtype": dtype or self.dtype, "device": device or self.device}
        # a new local tensor, even inside global_mode
        return fn(*size, requires_grad=requires_grad, placement=LOCAL, sbp=LOCAL, **kw)
    return method


def _new_full(self: Tensor, size, fill_value, *, dtype=None, device=None, requires_grad=False):
    return full(size, fill_value, dtype=dtype or self.dtype, device=device or self.device,
                requires_grad=requires_grad, placement=LOCAL, sbp=LOCAL)


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



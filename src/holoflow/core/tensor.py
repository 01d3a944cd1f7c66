"""``holoflow.Tensor``: a torch tensor as storage, holoflow's own autograd and global view.

The Tensor never subclasses ``torch.Tensor``. Math methods and operators are attached by the ops
layer (``holoflow/ops/methods.py``) from the op registry; this file holds what is not an op.
"""
from __future__ import annotations

import sys
from typing import Any, Callable

import numpy as np
import torch

from . import device as _device
from . import dtype as _dtype
from . import grad_mode, interpret
from .errors import UnsupportedError, check_grad_assignment

_OWN = object()   # (Tensor.grad_dtype not set: the tensor's own dtype)


class Tensor:
    """A multi-dimensional array with autograd, like ``torch.Tensor``.

    ``Tensor(data)`` copies ``data`` as float (torch's legacy constructor); ``Tensor(2, 3)`` is
    an uninitialised 2x3 float tensor. Prefer :func:`holoflow.tensor` and friends.
    """

    __slots__ = ("_data", "_rg", "_grad", "_grad_fn", "_out_idx", "_hooks", "_global",
                 "__weakref__", "__dict__")
    _view = None  # a view's ViewInfo (core/views.py), set in the instance dict of views only

    def __init__(self, *args, **kwargs) -> None:
        dev = _device.to_torch(kwargs.pop("device", None))
        if kwargs:
            raise TypeError(f"holoflow.Tensor(): unexpected arguments {sorted(kwargs)}")
        if len(args) == 1 and not isinstance(args[0], int):
            data = _as_torch(args[0], torch.get_default_dtype(), dev)
        else:
            data = torch.empty(args, device=dev)
        _init(self, data)

    @classmethod
    def _make(cls, data: torch.Tensor, grad_fn=None, out_idx: int = 0) -> "Tensor":
        t = object.__new__(cls)
        t._data, t._rg, t._grad, t._grad_fn = data, grad_fn is not None, None, grad_fn
        t._out_idx, t._hooks, t._global = out_idx, None, None
        if grad_mode.INFERENCE_MADE[0]:
            mark_inference(t)
        return t

    @property
    def grad_fn(self) -> Any:
        """The node that computed this tensor (None for a leaf). A view whose storage was written
        since its node was made (through another view of its base, the base itself, or under
        ``no_grad``) gets it re-derived from the base's history first, as torch's getter
        regenerates it; torch's errors for the views it cannot re-derive (a no_grad view, one of
        several outputs) are raised here too."""
        vi = self._view
        if vi is not None:   # (what dispatch.refresh and views.check_multi_output look at, inlined)
            st, b, v = vi.stamp, vi.base, self._data._version
            if (b._grad_fn is not st[0] or b._out_idx != st[1] or st[2] is not None or v != vi.at or
                    (vi.version is not None and v != vi.version)) and id(self) not in _REDERIVING:
                _rederive(self)
        return self._grad_fn

    @grad_fn.setter
    def grad_fn(self, node: Any) -> None:
        self._grad_fn = node

    # -- metadata --------------------------------------------------------------------------
    @property
    def shape(self) -> torch.Size:
        return self._global.shape if self._global is not None else self._data.shape

    def size(self, dim: int | None = None):
        return self.shape if dim is None else self.shape[dim]

    def dim(self) -> int:
        return len(self.shape)

    ndim = property(dim)
    ndimension = dim

    def numel(self) -> int:
        n = 1
        for s in self.shape:
            n *= s
        return n

    nelement = numel

    def element_size(self) -> int:
        return self._data.element_size()

    @property
    def dtype(self) -> _dtype.dtype:
        return _dtype._FROM_TORCH[self._data.dtype]

    @property
    def device(self) -> _device.device:
        d = self._data.device
        if d.type == "meta" and "_v" in self.__dict__:  # a lazy tensor of a graph trace
            d = self.__dict__["_v"].device
        return _device.from_torch(d)

    @property
    def is_cuda(self) -> bool:
        return self._data.is_cuda

    @property
    def is_cpu(self) -> bool:
        return self.device.type == "cpu"

    def get_device(self) -> int:
        """The CUDA device index; -1 on the CPU, as torch."""
        d = self.device
        return -1 if d.type in ("cpu", "meta") else (d.index or 0)

    def is_signed(self) -> bool:
        return self._data.is_signed()

    def is_conj(self) -> bool:
        """Always False: holoflow conjugates eagerly (no lazy conjugate views)."""
        return False

    def is_neg(self) -> bool:
        """Always False: holoflow negates eagerly (no lazy negative views)."""
        return False

    def resolve_conj(self) -> "Tensor":
        return self

    def resolve_neg(self) -> "Tensor":
        return self

    # -- memory: pinned and shared storage (the storage torch tensor's) ------------------------
    def pin_memory(self, device=None) -> "Tensor":
        """A copy in page-locked host memory (this tensor if it already is one)."""
        if self._data.is_pinned():
            return self
        if self._global is not None:
            raise UnsupportedError(f"holoflow.pin_memory: pins local tensors; this one is global (shape "
                                   f"{tuple(self.shape)}, sbp {self._global.sbp}): pin this rank's shard, "
                                   f"x.to_local().pin_memory()")
        if self._rg:
            raise UnsupportedError("holoflow.pin_memory: pins local tensors that don't require grad (torch's "
                                   "result would carry the gradient back); pin the data first, or .detach()")
        try:
            data = self._data.pin_memory() if device is None else self._data.pin_memory(device)
        except RuntimeError as e:
            raise RuntimeError(f"holoflow.pin_memory: {str(e).splitlines()[0]}") from e
        return Tensor._make(data)

    def is_pinned(self, device=None) -> bool:
        return self._data.is_pinned()

    def share_memory_(self) -> "Tensor":
        """Moves the storage to shared memory (views of it follow), as torch."""
        self._data.share_memory_()
        return self

    def is_shared(self) -> bool:
        return self._data.is_shared()

    def is_floating_point(self) -> bool:
        return self._data.is_floating_point()

    def is_complex(self) -> bool:
        return self._data.is_complex()

    def is_contiguous(self, memory_format=torch.contiguous_format) -> bool:
        return self._data.is_contiguous(memory_format=memory_format)

    def stride(self, dim: int | None = None):
        return self._data.stride() if dim is None else self._data.stride(dim)

    def data_ptr(self) -> int:
        return self._data.data_ptr()

    @property
    def _version(self) -> int:
        return self._data._version

    # -- global view (filled by the distributed layer) ---------------------------------------
    @property
    def is_global(self) -> bool:
        return self._global is not None

    @property
    def is_local(self) -> bool:
        return self._global is None

    @property
    def placement(self):
        if self._global is None:
            raise RuntimeError("holoflow: .placement of a local tensor; call .to_global(placement, sbp) first")
        return self._global.placement

    @property
    def sbp(self):
        if self._global is None:
            raise RuntimeError("holoflow: .sbp of a local tensor; call .to_global(placement, sbp) first")
        return self._global.sbp

    # -- autograd --------------------------------------------------------------------------
    @property
    def requires_grad(self) -> bool:
        if grad_mode.STATE.no_hook_levels and _unwrapped_false(self):
            return False   # (inside vmap or forward mode, as code outside holoflow sees it)
        return self._requires_grad

    @property
    def _requires_grad(self) -> bool:
        """Whether autograd records this tensor's uses: ``requires_grad`` as holoflow's own code
        reads it, inside holoflow.func's transforms too."""
        vi = self._view
        if self._global is not None and "_copy_of" in self.__dict__:   # a boxed copy standing for a view
            return _copy_requires_grad(self)
        if vi is not None:   # a view follows its base (dispatch.follows_base)
            base = vi.base
            if base._global is not None and "_copy_of" in base.__dict__ and \
                    not vi.nograd and _copy_requires_grad(base) and not base._rg:
                return True   # (of a copy whose history is refused: the flag follows its source's)
            # (as torch's: a read that re-derives nothing, so a view read before its base's
            # detach_() keeps no history it would not have had unread)
            return self._rg or vi.base._rg
        return self._rg

    @requires_grad.setter
    def requires_grad(self, value: bool) -> None:
        if value and not (self._data.is_floating_point() or self._data.is_complex()):
            raise RuntimeError(f"holoflow: only tensors of floating point or complex dtype can "
                               f"require gradients; this one is {self.dtype}")
        if value and grad_mode.INFERENCE_MADE[0] and not grad_mode.STATE.inference and is_inference_tensor(self):
            raise RuntimeError("holoflow: Setting requires_grad=True on inference tensor outside InferenceMode is "
                               "not allowed (torch's rule: an inference tensor has no autograd history to keep); "
                               "clone() it outside inference mode first")
        if not value and self.grad_fn is not None:
            raise RuntimeError("holoflow: requires_grad can only be turned off on leaf tensors; "
                               "use .detach() for a non-leaf")
        self._rg = bool(value)

    def requires_grad_(self, requires_grad: bool = True) -> "Tensor":
        if not isinstance(requires_grad, bool):   # (torch's argument parser: a bool, not 1 or None)
            raise TypeError(f"requires_grad_(): argument 'requires_grad' (position 1) must be bool, not "
                            f"{type(requires_grad).__name__}")
        state = grad_mode.STATE
        if state.level > 0 and not _library_caller() and not state.plain_levels.issuperset(state.starts):
            refuse_requires_grad_in_transform("requires_grad_()")   # (linearize's run is plain autograd's)
        if not requires_grad and self._rg and self.__dict__.get("_wrapped_at") in state.plain_levels:
            raise RuntimeError("holoflow.func.linearize: requires_grad_(False) on an input of the function is "
                               "unsupported: holoflow's linearize differentiates its record with respect to it "
                               "(torch's traces forward-mode duals); detach() it instead")
        self.requires_grad = requires_grad
        return self

    @property
    def grad(self) -> "Tensor | None":
        """The gradient accumulated by backward (leaves, and non-leaves after ``retain_grad``)."""
        return self._grad

    @grad.setter
    def grad(self, value: "Tensor | None") -> None:
        if value is not None and value._data.device.type != "meta":   # (a trace's values are symbolic)
            check_grad_assignment(self, value)
        self._grad = value

    @property
    def grad_dtype(self) -> Any:
        """The dtype the engine gives this leaf's ``.grad`` (torch 2.13's ``grad_dtype``): its own
        dtype by default; set to another dtype, incoming gradients are cast to it; set to None,
        any dtype is accepted as is (and may be assigned to ``.grad``)."""
        self._check_leaf_for_grad_dtype()
        d = self.__dict__.get("_grad_dtype", _OWN)
        if d is _OWN:
            return self.dtype
        return None if d is None else _dtype.from_torch(d)

    @grad_dtype.setter
    def grad_dtype(self, value: Any) -> None:
        self._check_leaf_for_grad_dtype("set")
        self.__dict__["_grad_dtype"] = None if value is None else _dtype.to_torch(value)

    def _check_leaf_for_grad_dtype(self, how: str = "accessed") -> None:
        if self.grad_fn is not None:
            raise RuntimeError(f"holoflow: grad_dtype can only be {how} on leaf tensors.")

    @property
    def is_leaf(self) -> bool:
        return self.grad_fn is None   # (a view's re-derived first, as torch's getter regenerates it)

    @property
    def data(self) -> "Tensor":
        """The values without history, as torch's ``.data``: unlike ``detach()``, in-place writes
        through it are not seen by autograd's checks (its own version counter)."""
        t = self.detach()
        t._data = self._data.data
        return t

    @data.setter
    def data(self, value: "Tensor") -> None:
        self._data = value._data if isinstance(value, Tensor) else value
        if isinstance(value, Tensor):
            self._global = value._global

    def detach(self) -> "Tensor":
        c = self.__dict__.get("_copy_of")
        reads = None   # the copy standing for a view whose storage this aliases (global tensors)
        if self._global is not None:   # a copy standing for a view, or a view of one (aliasing
            from .dispatch import fresh_copy   # its storage): its source's current values
            fresh_copy(self)
            vi = self._view
            reads = vi.base if vi is not None and "_copy_of" in vi.base.__dict__ else \
                self.__dict__.get("_reads_copy")
            if reads is not None:
                fresh_copy(reads)
        if self._view is not None and "_v" in self.__dict__:   # a traced view: its value after its
            from .dispatch import refresh_value                 # base's writes (eager's shares storage)
            refresh_value(self)
        t = Tensor._make(self._data.detach())
        t._global = self._global
        if c is not None:   # and stands for the view of the detached source: writes reach its storage
            from .views import CopyOf
            t.__dict__["_copy_of"] = CopyOf(c.source.detach(), c.chain, c.version, detached=True,
                                              held=c.held)
        elif reads is not None:   # it aliases that copy's storage: a read re-derives the copy first
            t.__dict__["_reads_copy"] = reads
        if "_v" in self.__dict__:  # a lazy tensor of a graph trace: same value, no history
            t.__dict__["_v"] = self.__dict__["_v"]
        if interpret.is_lazy():   # inside build(): an alias of this tensor, as eager's shares its
            t.__dict__["_detached_from"] = self   # storage (views.detached_from)
        return t

    def detach_(self) -> "Tensor":
        """Cuts this tensor from its history in place (torch refuses it on a view)."""
        c = self.__dict__.get("_copy_of")
        if self._view is not None or (c is not None and not c.detached):   # (a boxed copy stands for a view)
            raise RuntimeError("holoflow.detach_: can't detach a view in place; use detach() instead (a view "
                               "shares its base's history)")
        self.grad_fn, self._rg, self._out_idx = None, False, 0
        return self

    def backward(self, gradient: "Tensor | None" = None, retain_graph: bool | None = None,
                 create_graph: bool = False, inputs=None) -> None:
        """Computes gradients of this tensor w.r.t. graph leaves, like ``torch.Tensor.backward``."""
        retain = create_graph if retain_graph is None else retain_graph
        ins = None
        if inputs is not None:   # (tensors, or GradientEdges: core/autograd.as_roots)
            from .autograd import as_roots
            ins = as_roots(inputs if isinstance(inputs, (Tensor, tuple, list)) else list(inputs))
        interpret.current().backward([self], [gradient], retain, create_graph, ins)

    def register_hook(self, hook: Callable) -> Any:
        """Calls ``hook(grad)`` when this tensor's gradient is computed; it may return a new one.
        The hook belongs to the tensor's history as it is now: after an in-place write it sees
        the gradient of the value before the write (torch's rule)."""
        self._current_history()
        if not self.requires_grad:   # (a view requires grad through its base, history or not)
            raise RuntimeError("holoflow: cannot register a hook on a tensor that doesn't require grad")
        meta = self._global
        if meta is not None:   # the hook sees (and may return) the global gradient, not a shard
            user = hook

            def hook(g):
                r = user(meta.grad_view(g))
                return None if r is None else meta.grad_local(r)
            hook.__wrapped__ = user
        state = grad_mode.STATE
        level = state.level
        while level in state.plain_levels or \
                level in state.vmap_samples and not _batched(self, state.vmap_samples[level]):
            level -= 1   # (unbatched inside a vmap, or in linearize's plain run: the code's around it)
        if level in state.no_hook_levels:
            raise RuntimeError("holoflow: cannot register a hook on a tensor inside vmap or a forward-mode transform "
                               "(jvp, jacfwd): as torch.func's tensors there, it doesn't require grad; "
                               "register it outside, or inside a grad transform within it")
        if level:   # (inside a holoflow.func transform: it fires in that transform's backward alone)
            hook = _LevelHook(hook, level)
        if self.grad_fn is None:
            if self._hooks is None:
                self._hooks = []
            self._hooks.append(hook)
            hooks = self._hooks
        else:
            self.grad_fn.register_output_hook(self._out_idx, hook)
            hooks = self.grad_fn.hooks[self._out_idx]
        return _RemovableHandle(hooks, hook)

    def register_post_accumulate_grad_hook(self, hook: Callable) -> Any:
        """Calls ``hook(tensor)`` after a backward pass accumulated into this leaf's ``.grad``."""
        if self.grad_fn is not None:
            raise RuntimeError("holoflow: post-accumulate-grad hooks are for leaf tensors only")
        if not self._rg:
            raise RuntimeError("holoflow: cannot register a hook on a tensor that doesn't require grad")
        hooks = self.__dict__.setdefault("_post_acc_hooks", [])
        hooks.append(hook)
        return _RemovableHandle(hooks, hook)

    def _current_history(self) -> None:
        """A view whose base was written since takes its re-derived history first (what torch's
        ``grad_fn`` of such a view returns), so a hook registered now goes there."""
        if self._view is not None:
            from .dispatch import refresh
            refresh(self)

    @property
    def retains_grad(self) -> bool:
        """Whether this non-leaf tensor keeps its ``.grad`` (``retain_grad()`` was called)."""
        node = self.grad_fn
        return node is not None and node.retains is not None and self._out_idx in node.retains

    def retain_grad(self) -> None:
        """Keeps ``.grad`` of a non-leaf tensor after backward (after its other hooks ran)."""
        if not self.requires_grad:
            raise RuntimeError("holoflow.retain_grad: can't retain_grad on a tensor that has requires_grad=False")
        if grad_mode.STATE.level > 0:   # (torch.func refuses it under every transform)
            raise RuntimeError("holoflow: retain_grad() inside a function being transformed by holoflow.func (grad, "
                               "vjp, jvp, jacrev, jacfwd, hessian, vmap) is unsupported, as torch.func's; use the "
                               "transforms for gradients, or call retain_grad() outside the function")
        node = self._grad_fn
        if node is None and self._global is None and "_v" not in self.__dict__:
            return   # a leaf, as torch asks it (by the history as stored: a view with none yet is one)
        if node is not None and node.retains is not None and self._out_idx in node.retains:
            return   # (retained already: nothing re-derived, as torch's)
        self._current_history()
        if self.grad_fn is None:
            return
        import weakref
        ref = weakref.ref(self)

        meta = self._global

        def keep(g):
            t = ref()
            if t is not None:
                if meta is not None:   # a global tensor's gradient, as the global tensor it is
                    g = meta.grad_view(g)
                # (a copy, as torch's: the gradient flowing on, or a leaf's, may share g's
                # storage; under create_graph it keeps its history, as torch's clone does)
                t.grad = g.clone(memory_format=torch.contiguous_format) if t.grad is None else t.grad + g
        node = self.grad_fn
        if node.retains is None:
            node.retains = {}
        node.retains[self._out_idx] = keep

    # -- conversion to Python / numpy --------------------------------------------------------
    def _no_value_in_build(self, what: str) -> None:
        """Inside ``build()``: the error of :meth:`_no_value_in_trace` naming ``what`` (a Python
        conversion that reads the value through ``item()``, which reports the rest)."""
        if "_v" in self.__dict__ or interpret.is_lazy():
            self._no_value_in_trace(what)

    def _no_value_in_trace(self, what: str) -> None:
        """Inside ``build()`` a value read would be frozen into the graph at trace time: a
        buffer's or parameter's value is the one it had then (silently stale on later calls)."""
        if "_v" in self.__dict__ or interpret.is_lazy():
            raise RuntimeError(f"holoflow.nn.Graph: {what} reads a value, but inside build() tensors "
                               f"are symbolic (a buffer's value would be frozen at trace time); compute "
                               f"with tensor ops, or return the tensor from build() and read it outside")
        if self._data.device.type == "meta":
            raise RuntimeError(f"holoflow: {what} cannot read a meta tensor (shape {tuple(self.shape)}, "
                               f"{self.dtype}): it has no data; move it to a real device first")

    def item(self):
        self._no_value_in_trace(".item()")
        if self.numel() != 1:
            raise RuntimeError(f"holoflow: item() needs a tensor with one element, this one has "
                               f"shape {tuple(self.shape)}")
        return self._local_full().item()

    def tolist(self):
        self._no_value_in_trace(".tolist()")
        return self._local_full().tolist()

    def numpy(self) -> np.ndarray:
        self._no_value_in_trace(".numpy()")
        if self._rg:
            raise RuntimeError("holoflow: can't call numpy() on a tensor that requires grad; "
                               "use tensor.detach().numpy()")
        return self._local_full().cpu().numpy()

    def __array__(self, dtype=None, copy=None):
        a = self._local_full().detach().cpu().numpy()
        return a.astype(dtype) if dtype is not None else a

    def _local_full(self) -> torch.Tensor:
        """The whole logical tensor as a torch tensor (a global one is gathered)."""
        if self._global is None:
            return self._data
        return self._global.full(self)

    def to_torch(self) -> torch.Tensor:
        """This tensor's values as a plain ``torch.Tensor`` (no autograd link)."""
        return self._local_full().detach()

    def __dlpack__(self, *args, **kwargs):
        return self._local_full().detach().__dlpack__(*args, **kwargs)

    def __dlpack_device__(self):
        return self._data.__dlpack_device__()

    def __len__(self) -> int:
        if not self.shape:
            raise TypeError("holoflow: len() of a 0-d tensor")
        return self.shape[0]

    def __iter__(self):
        if not self.shape:
            raise TypeError("holoflow: iteration over a 0-d tensor")
        return iter(self.unbind(0))

    def __contains__(self, element) -> bool:
        """``element in tensor``: whether some element equals it, as torch's (a number or tensor)."""
        if not isinstance(element, (Tensor, int, float, complex, bool)):
            raise RuntimeError(f"holoflow: Tensor.__contains__ only supports a Tensor or a number, but got "
                               f"{type(element).__name__}")
        return bool((self == element).any())

    def __bool__(self) -> bool:
        self._no_value_in_build("bool() (Python control flow such as `if tensor:` or `if x.sum() > 0:`)")
        if self.numel() != 1:
            raise RuntimeError(f"holoflow: the truth value of a tensor with {self.numel()} elements "
                               f"is ambiguous; use .any() or .all()")
        return bool(self.item())

    def __float__(self) -> float:
        self._one_element("float")
        self._no_value_in_build("float()")
        return float(self.item())

    def __int__(self) -> int:
        self._one_element("int")
        self._no_value_in_build("int()")
        return int(self.item())

    def _one_element(self, what: str) -> None:
        if self.numel() != 1:   # torch's class for a Python conversion: ValueError
            raise ValueError(f"holoflow: only one-element tensors can be converted to Python scalars by "
                             f"{what}(); this one has {self.numel()} elements (shape {tuple(self.shape)})")

    def __index__(self) -> int:
        if self._data.is_floating_point() or self.numel() != 1:
            raise TypeError("holoflow: only integer tensors of a single element can be used as an index")
        return int(self.item())

    def __complex__(self) -> complex:
        return complex(self.item())

    __hash__ = object.__hash__

    def __repr__(self) -> str:
        if self._global is not None:
            return self._global.repr(self)
        return _repr_with(repr(self._data.detach()), self)

    def __format__(self, spec: str) -> str:
        if self.dim() == 0:
            return self.item().__format__(spec)
        return object.__format__(self, spec)

    def __reduce_ex__(self, protocol):
        return (_rebuild, (self._local_full().detach().cpu(), self._rg))

    def __deepcopy__(self, memo):
        if not self.is_leaf:   # (as torch: a copy would drop the history, or keep a node not its own)
            raise RuntimeError("Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                               "protocol at the moment. If you were attempting to deepcopy a module, this may be "
                               "because of a holoflow.nn.utils.weight_norm usage")
        t = Tensor._make(self._data.clone())
        t._rg, t._global = self._rg, self._global
        if self.grad is not None:
            t.grad = self.grad.__deepcopy__(memo)
        memo[id(self)] = t
        return t


def _copy_requires_grad(t: Tensor) -> bool:
    """``requires_grad`` of a :class:`CopyOf` view (``t``), as torch's view: re-derived from its
    source when that changed since (``dispatch.fresh_copy``); a piece of a multi-output op whose
    history may not be re-derived then still follows its source's flag, as torch's does."""
    from .dispatch import fresh_copy
    c = t.__dict__["_copy_of"]
    fresh_copy(t)
    if t._rg:
        return True
    src = c.source
    return src._data._version != c.version and src.requires_grad


# views whose grad_fn is being re-derived: dispatch.refresh reads the node they have meanwhile
_REDERIVING: set[int] = set()


def _rederive(v: Tensor) -> None:
    """``v``'s history re-derived from its base's if the storage was written since (what the
    ``grad_fn`` getter shows); a traced view's too, as eager's (its value with it)."""
    from .dispatch import refresh
    from .views import check_multi_output
    key = id(v)
    _REDERIVING.add(key)
    try:
        if v._view.version is not None:
            check_multi_output(v)
        refresh(v)
    finally:
        _REDERIVING.discard(key)


def _init(t: Tensor, data: torch.Tensor) -> None:
    t._data, t._rg, t._grad, t._grad_fn = data, False, None, None
    t._out_idx, t._hooks, t._global = 0, None, None
    if grad_mode.INFERENCE_MADE[0]:
        mark_inference(t)


def mark_inference(t: Tensor) -> None:
    """``t``, just made, is an inference tensor if inference mode is on (what torch's
    ``inference_mode`` allocates is; core/_fast.c's ``mark_inference`` is the C path's)."""
    state = grad_mode.STATE
    if state.inference and not state.enabled:
        t.__dict__["_inference"] = True


def is_inference_tensor(t: Tensor) -> bool:
    """Whether ``t`` was made in inference mode: a view by its base's making, as torch's (a view
    of a normal tensor taken there is normal, of an inference tensor an inference tensor)."""
    vi = t._view
    return bool((vi.base if vi is not None else t).__dict__.get("_inference"))


def refuse_inference_saved(what: str) -> None:
    raise RuntimeError(f"holoflow.{what}: Inference tensors cannot be saved for backward. Please do not use "
                       f"Tensors created in inference mode in computation tracked by autograd. To work around "
                       f"this, you can make a clone to get a normal tensor and use it in autograd, or use "
                       f"`holoflow.no_grad()` instead of `holoflow.inference_mode()`.")


def _rebuild(data: torch.Tensor, requires_grad: bool) -> Tensor:
    t = Tensor._make(data)
    t._rg = requires_grad
    return t


def _repr_with(text: str, t: Tensor) -> str:
    text = text.replace("dtype=torch.", "dtype=holoflow.")
    try:
        fn = t.grad_fn
    except RuntimeError:   # a view whose history torch cannot re-derive: torch prints it so
        return text[:-1] + ", grad_fn=<Invalid>)"
    if fn is not None:
        return text[:-1] + f", grad_fn={fn.name()})"
    if t._rg:
        return text[:-1] + ", requires_grad=True)"
    return text


def _as_torch(data, dtype: torch.dtype | None, dev: torch.device | None) -> torch.Tensor:
    """Converts Python data, numpy arrays, torch tensors and holoflow Tensors to torch."""
    if isinstance(data, Tensor):
        return data._local_full().detach().to(device=dev, dtype=dtype)
    if isinstance(data, torch.Tensor):
        return data.detach().to(device=dev, dtype=dtype)
    try:
        if isinstance(data, (list, tuple)) and any(isinstance(x, Tensor) for x in _flat(data)):
            data = _unwrap_nested(data)
    except RecursionError:
        raise ValueError("holoflow.tensor: too many dimensions: the data nests deeper than any tensor "
                         "(a list that contains itself?)") from None
    try:
        return torch.tensor(data, dtype=dtype, device=dev)
    except (TypeError, ValueError, RuntimeError) as e:
        raise type(e)(f"holoflow.tensor: cannot build a tensor from {type(data).__name__}: {e}") from e


def _flat(xs):
    for x in xs:
        if isinstance(x, (list, tuple)):
            yield from _flat(x)
        else:
            yield x


def _unwrap_nested(x):
    """Nested lists with holoflow Tensors in them, for ``torch.tensor``: each Tensor as the torch
    tensor it holds, so torch infers the dtype from its dtype (a float64 element gives float64)
    and refuses one of more than one element, as torch's own."""
    if isinstance(x, Tensor):
        return x._local_full().detach()
    if isinstance(x, (list, tuple)):
        return [_unwrap_nested(v) for v in x]
    return x


def refuse_requires_grad_in_transform(who: str) -> None:
    """torch.func's refusal of ``requires_grad_()`` inside a function it transforms (its wrapped
    tensors' gradients are the transforms' business); ``autograd.functional`` calls it there."""
    raise RuntimeError(f"holoflow: {who} inside a function being transformed by holoflow.func (grad, vjp, "
                       f"jvp, jacrev, jacfwd, hessian, vmap, linearize) is unsupported, as torch.func's "
                       f"requires_grad_() there: differentiate with the transforms themselves, or call it "
                       f"outside the transformed function")


def _library_caller(depth: int = 2) -> bool:
    """Whether the code ``depth`` frames up (the caller of the method asking) is holoflow's own:
    torch.func's wrapped tensors answer Python code, while torch's kernels and autograd read the
    tensors under the wrappers; holoflow's library code is the counterpart of those kernels."""
    name = sys._getframe(depth).f_globals.get("__name__", "")
    return name.startswith("holoflow.") and not name.startswith("holoflow.examples")


def _unwrapped_false(t: Tensor) -> bool:
    """Whether code outside holoflow is told ``t`` doesn't require grad (``wrapped_without_grad``):
    holoflow's own code reads what autograd records."""
    return not _library_caller(3) and wrapped_without_grad(t)


def wrapped_without_grad(t: Tensor) -> bool:
    """Whether torch.func would tell ``t`` doesn't require grad though autograd records
    it: inside a vmap or a forward-mode transform (jvp, jacfwd, linearize) torch.func hands the
    function tensors wrapped at that level, which don't require grad there (a BatchedTensor, a
    forward-mode wrapper), as every result computed at that level; a tensor made outside (a
    parameter the function closes over) answers for itself, as does what a reverse transform
    inside records (its inputs require grad). A tensor belongs to the innermost transform that
    handed it to its function (``_wrapped_at``) or that began before its grad node was recorded
    (core/node._at_level). Library code doing what torch's own Python code does asks this."""
    state = grad_mode.STATE
    for s in (t, t._view.base) if t._view is not None else (t,):
        level = s.__dict__.get("_wrapped_at")
        if level not in state.starts:
            node = s._grad_fn
            if node is None:
                continue
            level = state.level
            while level > 0 and state.starts.get(level, node.seq + 1) > node.seq:
                level -= 1
        if level in state.plain_levels:   # (linearize: what requires grad outside it)
            return not reaches_outside(t, level)
        return level in state.no_hook_levels
    return False   # (a leaf answers for itself: torch.func doesn't wrap what it didn't make)


def reaches_outside(t: Tensor, depth: int, skip: Callable | None = None) -> bool:
    """Whether ``t``'s history reaches a leaf recorded outside the transform at level ``depth``:
    any but the fresh inputs of that transform and of those inside it (``_func_level``), not
    through the grad nodes ``skip`` names. A leaf is its own history: one recorded outside (a
    tensor an enclosing transform handed in, returned as it is) reaches outside."""
    if t.grad_fn is None:
        return t._rg and t.__dict__.get("_func_level", 0) < depth
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen or (skip is not None and skip(node)):
            continue
        seen.add(id(node))
        for e in node.edges:
            if type(e) is tuple:
                stack.append(e[0])
            elif e is not None and e.__dict__.get("_func_level", 0) < depth:
                return True
    return False


def _batched(t: Tensor, samples: set) -> bool:
    """Whether ``t``'s history reaches a vmap's sample (a grad node of ``samples``, by id)."""
    seen, stack = set(), [t.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        if id(node) in samples:
            return True
        seen.add(id(node))
        stack += [e[0] for e in node.edges if type(e) is tuple]
    return False


class _LevelHook:
    """A tensor or node hook registered inside a holoflow.func transform, ``level`` deep: the
    engine runs it in backward passes of that level only (``grad_mode.STATE.level``)."""

    __slots__ = ("hook", "transform_level")

    def __init__(self, hook: Callable, level: int) -> None:
        self.hook, self.transform_level = hook, level

    def __call__(self, *args):
        return self.hook(*args)

    @property
    def __name__(self) -> str:   # (named in the engine's checks of what a hook returned)
        return getattr(self.hook, "__name__", type(self.hook).__name__)


class _RemovableHandle:
    def __init__(self, hooks: list, hook: Callable) -> None:
        self._hooks, self._hook = hooks, hook

    def remove(self) -> None:
        if self._hook in self._hooks:
            self._hooks.remove(self._hook)


def clear_grads(tensors, set_to_none: bool = True) -> None:
    """``zero_grad`` of modules and optimizers: drop each ``.grad``, or zero it in place."""
    for p in tensors:
        if p.grad is None:
            continue
        if set_to_none:
            p.grad = None
        else:
            p.grad = p.grad.detach()
            p.grad._data.zero_()


def is_tensor(x) -> bool:
    return isinstance(x, Tensor)



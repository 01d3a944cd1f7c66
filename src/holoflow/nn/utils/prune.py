"""``holoflow.nn.utils.prune``: torch.nn.utils.prune's API on holoflow modules.

Pruning ``module.<name>`` keeps the parameter as ``<name>_orig`` and a 0/1 buffer ``<name>_mask``;
``module.<name>`` becomes their product, recomputed before every forward by the pruning method
itself (registered as a forward pre-hook). Pruning the same tensor again narrows the mask: the
methods gather in a :class:`PruningContainer` and each new one only chooses among the entries the
mask still keeps. :func:`remove` makes the pruning permanent (the product becomes the parameter).

Random masks draw as torch's do (``rand_like`` / ``rand`` from the default generator, ranked by
``topk`` / ``kthvalue``), so a seeded script prunes the same entries under either library.
"""
from __future__ import annotations

import numbers
from abc import ABC, abstractmethod
from collections.abc import Iterable

from ...ops.creation import ones_like, rand, rand_like, zeros_like
from ...ops.order_stats import kthvalue
from ...ops.reduction import norm as _norm
from ...ops.sorting import topk as _topk
from .convert import parameters_to_vector

__all__ = ["BasePruningMethod", "PruningContainer", "Identity", "RandomUnstructured", "L1Unstructured",
           "RandomStructured", "LnStructured", "CustomFromMask", "identity", "random_unstructured",
           "l1_unstructured", "random_structured", "ln_structured", "global_unstructured", "custom_from_mask",
           "remove", "is_pruned"]


def _hooks_on(module, name: str) -> list:
    """``(key, method)`` of the pruning pre-hooks of ``module`` acting on ``name``."""
    return [(k, h) for k, h in module._forward_pre_hooks.items()
            if isinstance(h, BasePruningMethod) and h._tensor_name == name]


class BasePruningMethod(ABC):
    """A way of choosing a mask; subclasses define ``compute_mask`` and ``PRUNING_TYPE``
    (``"unstructured"``: single entries, ``"structured"``: whole slices along ``dim``, ``"global"``)."""

    _tensor_name: str | None = None

    def __call__(self, module, inputs) -> None:   # the forward pre-hook
        setattr(module, self._tensor_name, self.apply_mask(module))

    @abstractmethod
    def compute_mask(self, t, default_mask):
        """The new mask of ``t``, given the entries ``default_mask`` still keeps."""

    def apply_mask(self, module):
        """``<name>_orig`` times ``<name>_mask``: what ``module.<name>`` holds."""
        if self._tensor_name is None:
            raise AssertionError(f"Module {module} has to be pruned")
        orig = getattr(module, self._tensor_name + "_orig")
        return getattr(module, self._tensor_name + "_mask").to(dtype=orig.dtype) * orig

    @classmethod
    def apply(cls, module, name, *args, importance_scores=None, **kwargs):
        """Prunes ``module.<name>`` with a new ``cls(*args, **kwargs)``, ranked by
        ``importance_scores`` (default: the tensor itself); returns the method now hooked on it (a
        container when the tensor was pruned before)."""
        earlier = _hooks_on(module, name)
        if len(earlier) > 1:
            raise AssertionError(f"Avoid adding multiple pruning hooks to the same tensor {name} of module "
                                 f"{module}. Use a PruningContainer.")
        method = cls(*args, **kwargs)
        method._tensor_name = name
        first = not earlier
        if earlier:
            key, old = earlier[0]
            del module._forward_pre_hooks[key]
            if not isinstance(old, PruningContainer):
                old = PruningContainer(old)
            old.add_pruning_method(method)
            method = old
        tensor = getattr(module, name)
        if importance_scores is not None and importance_scores.shape != tensor.shape:
            raise AssertionError(f"importance_scores should have the same shape as parameter {name} of {module}, "
                                 f"got {importance_scores.shape} vs {tensor.shape}")
        scores = tensor if importance_scores is None else importance_scores
        if first:   # the parameter moves to <name>_orig; the mask starts full
            module.register_parameter(name + "_orig", tensor)
            del module._parameters[name]
            kept = ones_like(tensor)
        else:
            kept = getattr(module, name + "_mask").detach().clone()
        try:
            module.register_buffer(name + "_mask", method.compute_mask(scores, default_mask=kept))
            setattr(module, name, method.apply_mask(module))
            module.register_forward_pre_hook(method)
        except Exception:
            if first:   # leave the module as it was
                module.register_parameter(name, module._parameters.pop(name + "_orig"))
            raise
        return method

    def prune(self, t, default_mask=None, importance_scores=None):
        """``t`` times the mask this method computes for it (no module involved)."""
        if importance_scores is not None and importance_scores.shape != t.shape:
            raise AssertionError(f"importance_scores should have the same shape as tensor t, got "
                                 f"{importance_scores.shape} vs {t.shape}")
        kept = ones_like(t) if default_mask is None else default_mask
        return t * self.compute_mask(t if importance_scores is None else importance_scores, default_mask=kept)

    def remove(self, module) -> None:
        """Makes the pruning permanent: ``<name>`` is a parameter again, holding the product."""
        name = self._tensor_name
        if name is None:
            raise AssertionError(f"Module {module} has to be pruned before pruning can be removed")
        pruned = self.apply_mask(module)
        if hasattr(module, name):
            delattr(module, name)
        param = module._parameters.pop(name + "_orig")
        param.data = pruned.data
        del module._buffers[name + "_mask"]
        setattr(module, name, param)


class PruningContainer(BasePruningMethod):
    """The methods applied to one tensor in turn; its mask is the last method's choice among
    the entries the earlier ones kept."""

    def __init__(self, *methods) -> None:
        self._pruning_methods: tuple = ()
        if len(methods) == 1:
            self._tensor_name = methods[0]._tensor_name
        for m in methods:
            self.add_pruning_method(m)

    def add_pruning_method(self, method) -> None:
        if method is not None and not isinstance(method, BasePruningMethod):
            raise TypeError(f"{type(method)} is not a BasePruningMethod subclass")
        if method is not None and method._tensor_name != self._tensor_name:
            raise ValueError(f"Can only add pruning methods acting on the parameter named '{self._tensor_name}' "
                             f"to PruningContainer {self}. Found '{method._tensor_name}'")
        self._pruning_methods += (method,)

    def __len__(self) -> int:
        return len(self._pruning_methods)

    def __iter__(self):
        return iter(self._pruning_methods)

    def __getitem__(self, idx):
        return self._pruning_methods[idx]

    def compute_mask(self, t, default_mask):
        last = self._pruning_methods[-1]
        mask = default_mask.to(dtype=t.dtype)
        nd = t.dim()
        if last.PRUNING_TYPE == "unstructured":   # among the entries still kept
            where = mask == 1
        elif last.PRUNING_TYPE == "structured":    # among the slices along dim with any entry kept
            if not hasattr(last, "dim"):
                raise AttributeError('Pruning methods of PRUNING_TYPE "structured" need to have the attribute '
                                     '`dim` defined.')
            dim = last.dim + nd if last.dim < 0 else last.dim
            if dim < 0:
                raise IndexError(f"Index is out of bounds for tensor with dimensions {nd}")
            index = [slice(None)] * nd
            index[dim] = mask.sum(dim=[d for d in range(nd) if d != dim]) != 0
            where = tuple(index)
        elif last.PRUNING_TYPE == "global":
            where = (slice(None),) * nd
        else:
            raise ValueError(f"Unrecognized PRUNING_TYPE {last.PRUNING_TYPE}")
        mask[where] = last.compute_mask(t[where], default_mask=mask[where]).to(dtype=mask.dtype)
        return mask


class Identity(BasePruningMethod):
    """Prunes nothing (the mask is all ones)."""

    PRUNING_TYPE = "unstructured"

    def compute_mask(self, t, default_mask):
        return default_mask

    @classmethod
    def apply(cls, module, name):
        return super().apply(module, name)


class _Unstructured(BasePruningMethod):
    """Prunes ``amount`` single entries (a count, or a fraction of them): those ``_scores`` ranks first."""

    PRUNING_TYPE = "unstructured"

    def __init__(self, amount) -> None:
        _check_amount(amount)
        self.amount = amount

    def _scores(self, t) -> tuple:
        """(scores, largest): the entries pruned are those of the largest (or smallest) scores."""
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        k = _count(self.amount, t.nelement())
        mask = default_mask.clone()
        if k:
            scores, largest = self._scores(t)
            mask.view(-1)[_topk(scores.view(-1), k=k, largest=largest).indices] = 0
        return mask


class RandomUnstructured(_Unstructured):
    """Prunes entries chosen at random."""

    def _scores(self, t) -> tuple:
        return rand_like(t), True

    @classmethod
    def apply(cls, module, name, amount):
        return super().apply(module, name, amount=amount)


class L1Unstructured(_Unstructured):
    """Prunes the entries of smallest magnitude."""

    def _scores(self, t) -> tuple:
        return t.abs(), False

    @classmethod
    def apply(cls, module, name, amount, importance_scores=None):
        return super().apply(module, name, amount=amount, importance_scores=importance_scores)


class _Structured(BasePruningMethod):
    """Prunes ``amount`` whole slices along ``dim``: the mask keeps the slices ``_keep`` picks."""

    PRUNING_TYPE = "structured"

    def __init__(self, amount, dim: int = -1) -> None:
        _check_amount(amount)
        self.amount, self.dim = amount, dim

    def _keep(self, t, size: int, k: int):
        """The slices to keep (a boolean mask or indices along ``dim``) when ``k`` of ``size`` go."""
        raise NotImplementedError

    def compute_mask(self, t, default_mask):
        if t.dim() <= 1:
            raise ValueError(f"Structured pruning can only be applied to multidimensional tensors. Found tensor of "
                             f"shape {t.shape} with {t.dim()} dims")
        if self.dim >= t.dim():
            raise IndexError(f"Invalid index {self.dim} for tensor of size {t.shape}")
        size = t.shape[self.dim]
        k = _count(self.amount, size)
        if not k:
            return default_mask
        index = [slice(None)] * t.dim()
        index[self.dim] = self._keep(t, size, k)
        mask = zeros_like(t)
        mask[tuple(index)] = 1
        mask *= default_mask.to(dtype=mask.dtype)
        return mask


class RandomStructured(_Structured):
    """Prunes slices along ``dim`` chosen at random."""

    def _keep(self, t, size: int, k: int):
        draw = rand(size)
        return draw > kthvalue(draw, k=k).values

    @classmethod
    def apply(cls, module, name, amount, dim=-1):
        return super().apply(module, name, amount=amount, dim=dim)


class LnStructured(_Structured):
    """Prunes the slices along ``dim`` of smallest L``n`` norm."""

    def __init__(self, amount, n, dim: int = -1) -> None:
        super().__init__(amount, dim)
        self.n = n

    def _keep(self, t, size: int, k: int):
        others = [d for d in range(t.dim()) if d != self.dim % t.dim()]
        return _topk(_norm(t, p=self.n, dim=others), k=size - k, largest=True).indices

    @classmethod
    def apply(cls, module, name, amount, n, dim, importance_scores=None):
        return super().apply(module, name, amount=amount, n=n, dim=dim, importance_scores=importance_scores)


class CustomFromMask(BasePruningMethod):
    """Prunes where a given mask is 0."""

    PRUNING_TYPE = "global"

    def __init__(self, mask) -> None:
        self.mask = mask

    def compute_mask(self, t, default_mask):
        if default_mask.shape != self.mask.shape:
            raise AssertionError(f"default_mask shape {default_mask.shape} must match self.mask shape "
                                 f"{self.mask.shape}")
        return default_mask * self.mask.to(dtype=default_mask.dtype)

    @classmethod
    def apply(cls, module, name, mask):
        return super().apply(module, name, mask=mask)


def identity(module, name):
    Identity.apply(module, name)
    return module


def random_unstructured(module, name, amount):
    RandomUnstructured.apply(module, name, amount)
    return module


def l1_unstructured(module, name, amount, importance_scores=None):
    L1Unstructured.apply(module, name, amount=amount, importance_scores=importance_scores)
    return module


def random_structured(module, name, amount, dim):
    RandomStructured.apply(module, name, amount, dim)
    return module


def ln_structured(module, name, amount, n, dim, importance_scores=None):
    LnStructured.apply(module, name, amount, n, dim, importance_scores=importance_scores)
    return module


def custom_from_mask(module, name, mask):
    CustomFromMask.apply(module, name, mask)
    return module


def global_unstructured(parameters, pruning_method, importance_scores=None, **kwargs) -> None:
    """Prunes ``(module, name)`` tensors together: ``pruning_method`` (unstructured) ranks all
    their entries as one vector; each tensor then takes its part of the mask."""
    if not isinstance(parameters, Iterable):
        raise TypeError("global_unstructured(): parameters is not an Iterable")
    importance_scores = {} if importance_scores is None else importance_scores
    if not isinstance(importance_scores, dict):
        raise TypeError("global_unstructured(): importance_scores must be of type dict")
    parameters = list(parameters)
    scores = parameters_to_vector([importance_scores.get((m, n), getattr(m, n)) for m, n in parameters])
    kept = parameters_to_vector([getattr(m, n + "_mask", ones_like(getattr(m, n))) for m, n in parameters])
    method = pruning_method(**kwargs)
    if method.PRUNING_TYPE != "unstructured":
        raise TypeError(f'Only "unstructured" PRUNING_TYPE supported for the `pruning_method`. Found method '
                        f"{pruning_method} of type {method.PRUNING_TYPE}")
    method._tensor_name = "temp"
    container = PruningContainer()
    container._tensor_name = "temp"
    container.add_pruning_method(method)
    mask = container.compute_mask(scores, kept)
    start = 0
    for m, n in parameters:
        p = getattr(m, n)
        custom_from_mask(m, n, mask=mask[start:start + p.numel()].view_as(p))
        start += p.numel()


def remove(module, name):
    """Makes the pruning of ``module.<name>`` permanent (see :meth:`BasePruningMethod.remove`)."""
    for key, method in _hooks_on(module, name):
        method.remove(module)
        del module._forward_pre_hooks[key]
        return module
    raise ValueError(f"Parameter '{name}' of module {module} has to be pruned before pruning can be removed")


def is_pruned(module) -> bool:
    """Whether any submodule of ``module`` has a pruning hook."""
    return any(isinstance(h, BasePruningMethod) for m in module.modules() for h in m._forward_pre_hooks.values())


def _check_amount(amount) -> None:
    """torch's rule: a count (a non-negative int) or a fraction in [0, 1]."""
    if not isinstance(amount, numbers.Real):
        raise TypeError(f"Invalid type for amount: {amount}. Must be int or float.")
    whole = isinstance(amount, numbers.Integral)
    if (whole and amount < 0) or (not whole and not 0.0 <= float(amount) <= 1.0):
        raise ValueError(f"amount={amount} should either be a float in the range [0, 1] or a non-negative integer")


def _count(amount, size: int) -> int:
    """How many of ``size`` entries (or slices) ``amount`` prunes."""
    if isinstance(amount, numbers.Integral):
        if amount > size:
            raise ValueError(f"amount={amount} should be smaller than the number of parameters to prune={size}")
        return amount
    return round(amount * size)

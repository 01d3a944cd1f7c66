"""``nn.Parameter`` and ``nn.Buffer``: tensors a Module registers by assignment."""
from __future__ import annotations

import torch

from ..core.tensor import Tensor, _init


def _storage(data) -> tuple[torch.Tensor, object]:
    if data is None:
        return torch.empty(0), None
    if isinstance(data, Tensor):
        return data._data.detach(), data._global
    if isinstance(data, torch.Tensor):
        return data.detach(), None
    raise TypeError(f"holoflow.nn.Parameter: data must be a Tensor, got {type(data).__name__}")


class Parameter(Tensor):
    """A Tensor that a Module treats as a parameter, like ``torch.nn.Parameter``.

    ``Parameter(t)`` shares ``t``'s storage (no copy) and is a leaf::

        w = nn.Parameter(flow.randn(3, 4))
    """

    def __init__(self, data: Tensor | None = None, requires_grad: bool = True) -> None:
        storage, glob = _storage(data)
        _init(self, storage)
        self._global = glob
        self.requires_grad = requires_grad

    def __repr__(self) -> str:
        return "Parameter containing:\n" + super().__repr__()

    def __deepcopy__(self, memo) -> "Parameter":
        """A new parameter with a copy of the data and no ``.grad``, as torch's: a deep-copied
        model (a target network, a copy to fine-tune) starts with no gradients."""
        if id(self) in memo:
            return memo[id(self)]
        p = type(self)(Tensor._make(self._data.clone()), self.requires_grad)
        p._global = self._global
        p.__dict__.update(self.__dict__)
        memo[id(self)] = p
        return p

    def __reduce_ex__(self, protocol):
        return (_rebuild_parameter, (type(self), self._local_full().detach().cpu(), self.requires_grad,
                                     dict(self.__dict__)))


def _rebuild_parameter(cls, data: torch.Tensor, requires_grad: bool, state: dict) -> Parameter:
    p = cls(Tensor._make(data), requires_grad)
    p.__dict__.update(state)
    return p


class Buffer(Tensor):
    """Marks a tensor to be registered as a buffer on assignment, like ``torch.nn.Buffer``.

    ``module.stats = nn.Buffer(flow.zeros(3), persistent=False)``. The module stores a plain
    Tensor sharing the storage.
    """

    def __init__(self, data: Tensor | None = None, *, persistent: bool = True) -> None:
        storage, glob = _storage(data)
        _init(self, storage)
        self._global = glob
        self.persistent = persistent

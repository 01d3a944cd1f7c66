"""``GradScaler``: dynamic loss scaling for float16 training, with torch.amp.GradScaler's behaviour.

The loss is multiplied by ``scale`` before backward so small float16 gradients don't flush to
zero; ``unscale_`` divides the gradients back (once per optimizer per iteration) and records
whether any is inf/nan; ``step`` skips the optimizer step when one was; ``update`` halves the
scale after a skipped step and doubles it after ``growth_interval`` clean steps in a row::

    scaler = flow.amp.GradScaler("cpu")
    with flow.autocast("cpu"):
        loss = model(x, y)
    scaler.scale(loss).backward()
    scaler.step(opt)
    scaler.update()
"""
from __future__ import annotations

import math
import warnings
from enum import Enum
from typing import Any

import torch

from ..core import grad_mode
from ..core.sbp import B, P
from ..core.tensor import Tensor
from ..ops.creation import full, zeros


class _Stage(Enum):
    READY = 0
    UNSCALED = 1
    STEPPED = 2


def _fresh_state() -> dict[str, Any]:
    return {"stage": _Stage.READY, "found_inf_per_device": {}}


class GradScaler:
    """Scales the loss, unscales gradients, skips steps with inf/nan gradients, adapts the scale.

    Same arguments and semantics as ``torch.amp.GradScaler``; ``enabled=False`` makes every
    method a pass-through (``scale`` returns its input, ``step`` just steps).
    """

    def __init__(self, device: str = "cuda", init_scale: float = 2.0 ** 16, growth_factor: float = 2.0,
                 backoff_factor: float = 0.5, growth_interval: int = 2000, enabled: bool = True) -> None:
        self._device = str(device)
        if enabled and self._device.startswith("cuda") and not torch.cuda.is_available():
            warnings.warn("holoflow.amp.GradScaler is enabled, but CUDA is not available; disabling.",
                          stacklevel=2)
            enabled = False
        self._enabled = enabled
        if growth_factor <= 1.0:
            raise ValueError("holoflow.amp.GradScaler: growth_factor should be > 1")
        if not 0.0 < backoff_factor < 1.0:
            raise ValueError("holoflow.amp.GradScaler: backoff_factor should be in (0, 1)")
        if not (isinstance(growth_interval, int) and growth_interval > 0):
            raise ValueError("holoflow.amp.GradScaler: growth_interval should be a positive integer")
        self._init_scale, self._growth_factor = float(init_scale), float(growth_factor)
        self._backoff_factor, self._growth_interval = float(backoff_factor), growth_interval
        self._init_growth_tracker = 0
        self._scale: Tensor | None = None
        self._growth_tracker: int | None = None
        self._per_optimizer_states: dict[int, dict[str, Any]] = {}

    # -- scaling ---------------------------------------------------------------------------
    def scale(self, outputs):
        """Multiplies a tensor (or a list/tuple of tensors, nested) by the current scale."""
        if not self._enabled:
            return outputs
        if isinstance(outputs, Tensor):
            if self._scale is None:
                self._lazy_init(outputs.device)
            return outputs * self._scale.to(outputs.device)
        if isinstance(outputs, (list, tuple)):
            return type(outputs)(self.scale(o) for o in outputs)
        raise ValueError("holoflow.amp.GradScaler.scale: outputs must be a Tensor or an iterable of Tensors")

    def _lazy_init(self, dev) -> None:
        self._scale = full((), self._init_scale, dtype=torch.float32, device=dev)
        self._growth_tracker = self._init_growth_tracker

    def _check_scale(self, fn: str) -> None:
        if self._scale is None:
            raise RuntimeError(f"holoflow.amp.GradScaler.{fn}: the scale is not initialised; call "
                               f"scaler.scale(loss) earlier in the iteration")

    # -- unscaling ---------------------------------------------------------------------------
    def unscale_(self, optimizer) -> None:
        """Divides ``optimizer``'s gradients by the scale in place and records inf/nan in them.

        Call it at most once per optimizer between ``update()`` calls (e.g. before clipping)."""
        if not self._enabled:
            return
        self._check_scale("unscale_")
        state = self._state(optimizer)
        if state["stage"] is _Stage.UNSCALED:
            raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("unscale_() is being called after step().")
        inv_scale = self._scale.double().reciprocal().float()
        state["found_inf_per_device"] = self._unscale_grads(optimizer, inv_scale)
        state["stage"] = _Stage.UNSCALED

    def _unscale_grads(self, optimizer, inv_scale: Tensor) -> dict[str, Tensor]:
        """Divides every gradient by the scale and counts, per device, the gradients holding an
        inf/nan. A global gradient (FSDP's, a DTensor's) is checked on each rank's shard and the
        counts of one placement summed over its ranks in one all-reduce: every rank skips the
        same steps."""
        found: dict[str, Tensor] = {}
        shards: dict = {}   # placement -> [device, shards holding an inf/nan on this rank]
        placed: dict = {}   # placement -> inv_scale broadcast on it
        with grad_mode.no_grad():
            for group in optimizer.param_groups:
                for p in group["params"]:
                    g = p.grad
                    if g is None:
                        continue
                    if g.dtype.torch == torch.float16:
                        raise ValueError("Attempting to unscale FP16 gradients.")
                    if not g.is_contiguous():  # e.g. an expanded grad of sum(): densify before mul_
                        p.grad = g = g.contiguous()
                    dev = str(g.device)
                    if dev not in found:
                        found[dev] = zeros((), dtype=torch.float32, device=g.device)
                    meta = g._global
                    if meta is None:
                        if not bool(g.isfinite().all()):
                            found[dev] = found[dev] + 1.0
                        g.mul_(inv_scale.to(g.device))
                        continue
                    place = meta.placement
                    seen = shards.setdefault(place, [dev, 0])
                    seen[1] += not bool(torch.isfinite(g._data).all())
                    if place not in placed:
                        placed[place] = inv_scale.to(g.device).to_global(placement=place, sbp=[B] * place.ndim)
                    g.mul_(placed[place])
            for place, (dev, bad) in shards.items():
                mine = full((), float(bad), dtype=torch.float32, device=self._scale.device)
                total = mine.to_global(placement=place, sbp=[P] * place.ndim).to_global(sbp=[B] * place.ndim)
                found[dev] = found[dev] + total.to_local().to(found[dev].device)
        if not found:  # no gradients at all still records a (clean) check, as torch does
            found[str(self._scale.device)] = zeros((), dtype=torch.float32, device=self._scale.device)
        return found

    def _state(self, optimizer) -> dict[str, Any]:
        return self._per_optimizer_states.setdefault(id(optimizer), _fresh_state())

    # -- stepping ----------------------------------------------------------------------------
    def step(self, optimizer, *args, **kwargs):
        """Unscales (if not done yet) and calls ``optimizer.step()`` unless a gradient was inf/nan;
        returns what ``step`` returned, or None when skipped."""
        if not self._enabled:
            return optimizer.step(*args, **kwargs)
        if "closure" in kwargs:
            raise RuntimeError("Closure use is not currently supported if GradScaler is enabled.")
        self._check_scale("step")
        state = self._state(optimizer)
        if state["stage"] is _Stage.STEPPED:
            raise RuntimeError("step() has already been called since the last update().")
        if state["stage"] is _Stage.READY:
            self.unscale_(optimizer)
        if not state["found_inf_per_device"]:
            raise RuntimeError("No inf checks were recorded for this optimizer.")
        retval = None
        if not sum(float(v) for v in state["found_inf_per_device"].values()):
            retval = optimizer.step(*args, **kwargs)
        state["stage"] = _Stage.STEPPED
        return retval

    def update(self, new_scale: float | Tensor | None = None) -> None:
        """Adapts the scale after an iteration (or sets it to ``new_scale``)."""
        if not self._enabled:
            return
        self._check_scale("update")
        if new_scale is not None:
            if isinstance(new_scale, Tensor):
                if new_scale.numel() != 1 or new_scale.requires_grad:
                    raise ValueError("new_scale should be a float or a 1-element Tensor with requires_grad=False.")
                new_scale = float(new_scale)
            self._set_scale(float(new_scale))
        else:
            found = [v for s in self._per_optimizer_states.values() for v in s["found_inf_per_device"].values()]
            if not found:
                raise RuntimeError("No inf checks were recorded prior to update.")
            self._update_scale(sum(float(v) for v in found) > 0)
        self._per_optimizer_states = {}

    def _update_scale(self, found_inf: bool) -> None:
        # torch's _amp_update_scale_: back off on inf; grow after growth_interval clean steps
        scale = float(self._scale)
        if found_inf:
            self._set_scale(scale * self._backoff_factor)
            self._growth_tracker = 0
            return
        successful = self._growth_tracker + 1
        if successful == self._growth_interval:
            grown = float(torch.tensor(scale * self._growth_factor, dtype=torch.float32))
            if math.isfinite(grown):
                self._set_scale(grown)
            self._growth_tracker = 0
        else:
            self._growth_tracker = successful

    def _set_scale(self, value: float) -> None:
        self._scale = full((), value, dtype=torch.float32, device=self._scale.device)

    # -- accessors ---------------------------------------------------------------------------
    def get_scale(self) -> float:
        """The current scale as a Python float (1.0 when disabled)."""
        if not self._enabled:
            return 1.0
        return self._init_scale if self._scale is None else float(self._scale)

    def get_growth_factor(self) -> float:
        return self._growth_factor

    def set_growth_factor(self, new_factor: float) -> None:
        self._growth_factor = float(new_factor)

    def get_backoff_factor(self) -> float:
        return self._backoff_factor

    def set_backoff_factor(self, new_factor: float) -> None:
        self._backoff_factor = float(new_factor)

    def get_growth_interval(self) -> int:
        return self._growth_interval

    def set_growth_interval(self, new_interval: int) -> None:
        self._growth_interval = int(new_interval)

    def _get_growth_tracker(self) -> int:
        if not self._enabled:
            return 0
        return self._init_growth_tracker if self._growth_tracker is None else self._growth_tracker

    def is_enabled(self) -> bool:
        return self._enabled

    # -- checkpointing -------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """torch's keys: ``scale``, ``growth_factor``, ``backoff_factor``, ``growth_interval``,
        ``_growth_tracker`` (empty when disabled)."""
        if not self._enabled:
            return {}
        return {"scale": self.get_scale(), "growth_factor": self._growth_factor,
                "backoff_factor": self._backoff_factor, "growth_interval": self._growth_interval,
                "_growth_tracker": self._get_growth_tracker()}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Restores what :meth:`state_dict` returned (also a torch GradScaler's state dict)."""
        if not self._enabled:
            return
        if len(state_dict) == 0:
            raise RuntimeError("The source state dict is empty, possibly because it was saved "
                               "from a disabled instance of GradScaler.")
        self._init_scale = float(state_dict["scale"])
        if self._scale is not None:
            self._set_scale(self._init_scale)
        self._growth_factor = float(state_dict["growth_factor"])
        self._backoff_factor = float(state_dict["backoff_factor"])
        self._growth_interval = int(state_dict["growth_interval"])
        self._init_growth_tracker = int(state_dict["_growth_tracker"])
        if self._growth_tracker is not None:
            self._growth_tracker = self._init_growth_tracker

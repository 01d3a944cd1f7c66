"""``holoflow.dtensor.parallel``: torch's tensor-parallel styles (``torch.distributed.tensor.parallel``)
on holoflow's global tensors.

``parallelize_module(model, mesh, {"w1": ColwiseParallel(), "w2": RowwiseParallel()})`` lays out
the named submodules' parameters as torch does (colwise: the Linear's weight and bias ``Shard(0)``,
an Embedding's weight ``Shard(1)``; rowwise: weight ``Shard(1)``, bias replicated, an Embedding's
weight ``Shard(0)``) and converts inputs and outputs at the module boundary with hooks; the
layers themselves then run as holoflow's global ops (the SBP each op chooses is torch's for these
layouts: colwise output ``Shard(-1)``, rowwise output ``Partial``).
"""
from __future__ import annotations

import contextlib
import warnings
from fnmatch import fnmatch
from functools import partial
from typing import Any, Iterator

from ..core import interpret
from ..core.errors import UnsupportedError
from ..core.sbp import B
from ..distributed.device_mesh import DeviceMesh, _check_mesh
from ..distributed.dtensor import DTensor, implicit_replication
from ..distributed.placement_types import Placement, Replicate, Shard
from ..nn.module import Module
from ..nn.modules.linear import Linear
from ..nn.modules.sparse import Embedding
from ..nn.parameter import Parameter
from . import distribute_module, distribute_parameter

__all__ = ["ParallelStyle", "ColwiseParallel", "RowwiseParallel", "SequenceParallel", "PrepareModuleInput",
           "PrepareModuleOutput", "PrepareModuleInputOutput", "parallelize_module", "loss_parallel"]


class _ReplicatedLosses(interpret.Interpreter):
    """Inside ``loss_parallel()``: the loss an op of the loss family returns (its first output)
    is made a replica, as torch's loss is ``Replicate()`` there (partial sums are all-reduced,
    per-sample losses gathered): every rank's ``to_local()`` is the loss."""

    def bind(self, op, inputs: tuple, attrs: dict):
        out = self.parent.bind(op, inputs, attrs)
        if op.family != "loss":
            return out
        if isinstance(out, tuple):
            items = [_replicated(out[0]), *out[1:]]
            return type(out)(*items) if hasattr(out, "_fields") else type(out)(items)
        return _replicated(out)


def _replicated(x: Any) -> Any:
    g = getattr(x, "_global", None)
    if g is None or all(s == B for s in g.sbp):
        return x
    return x.to_global(placement=g.placement, sbp=[B] * len(g.sbp))


@contextlib.contextmanager
def loss_parallel() -> Iterator[None]:
    """torch's ``loss_parallel()``: ``cross_entropy`` / ``nll_loss`` of logits sharded on the
    class dim (a colwise head with ``use_local_output=False``) against plain labels; the loss is a
    replicated DTensor and ``loss.backward()`` runs inside the block too. holoflow's global
    cross-entropy takes any layout; the labels are taken as every rank's replica."""
    with implicit_replication(), interpret.pushed(_ReplicatedLosses()):
        yield


class ParallelStyle:
    """How one module is parallelized (its ``_apply(module, mesh)``)."""

    src_data_rank: int | None = 0

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        raise NotImplementedError


def _as_dtensor(x, mesh: DeviceMesh, layouts: tuple):
    return x if isinstance(x, DTensor) else DTensor.from_local(x, mesh, layouts, run_check=False)


def _prepare_input(input_layouts, desired, mod, inputs, mesh):
    x = _as_dtensor(inputs[0], mesh, input_layouts)
    if input_layouts != desired:
        x = x.redistribute(placements=desired)
    return x


def _local(x: DTensor, style: str) -> Any:
    """``x.to_local()`` for the next layer (``use_local_output=True``), outside nn.Graph only."""
    if interpret.is_lazy():
        raise UnsupportedError(
            f"holoflow {style}: use_local_output=True hands the next layer this rank's shard of a DTensor "
            f"(shape {tuple(x.shape)}, {x.placements}); inside nn.Graph's build() values are logical, one "
            f"program for every rank. Construct the style with use_local_output=False: layers then pass "
            f"DTensors, whose shapes are logical as in torch (head counts and views must be the whole "
            f"model's, not a rank's)")
    return x.to_local()


def _prepare_output(output_layouts, use_local_output, style, mod, outputs, mesh):
    if outputs.placements != output_layouts:
        outputs = outputs.redistribute(placements=output_layouts)
    return _local(outputs, style) if use_local_output else outputs


def _shard_params(module: Module, mesh: DeviceMesh, placements: dict, src_data_rank) -> None:
    """Each named parameter of ``module`` distributed with its placement."""
    for name, param in list(module.named_parameters(recurse=False)):
        if param is None or name not in placements:
            continue
        distribute_parameter(param, mesh, [placements[name]], src_data_rank)


class _LayerStyle(ParallelStyle):
    """A style for nn.Linear and nn.Embedding: a layout of their parameters and conversions of
    their input and output at the boundary."""

    def _layouts(self, module: Module) -> tuple[dict, tuple] | None:
        """``(placement per parameter name, desired input layouts)`` for ``module``, or None."""
        raise NotImplementedError

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        got = self._layouts(module)
        if got is None:
            raise NotImplementedError(f"holoflow {type(self).__name__} supports nn.Linear and nn.Embedding, got "
                                      f"{type(module).__name__}")
        layout, desired = got
        return distribute_module(
            module, device_mesh,
            lambda name, mod, mesh: _shard_params(mod, mesh, layout, self.src_data_rank) if mod is module else None,
            partial(_prepare_input, self.input_layouts, desired),
            partial(_prepare_output, self.output_layouts, self.use_local_output, type(self).__name__))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(input_layouts={self.input_layouts}, output_layouts={self.output_layouts}, "
                f"use_local_output={self.use_local_output})")


class ColwiseParallel(_LayerStyle):
    """A Linear's output features (an Embedding's embedding dim) split across the mesh: input
    replicated, output ``Shard(-1)`` (a local tensor unless ``use_local_output=False``)."""

    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = True) -> None:
        self.input_layouts = (input_layouts or Replicate(),)
        self.output_layouts = (output_layouts or Shard(-1),)
        self.desired_input_layouts = (Replicate(),)
        self.use_local_output = use_local_output

    def _layouts(self, module: Module) -> tuple[dict, tuple] | None:
        if isinstance(module, Linear):
            return {"weight": Shard(0), "bias": Shard(0)}, self.desired_input_layouts
        if isinstance(module, Embedding):
            return {"weight": Shard(1)}, self.desired_input_layouts
        return None


class RowwiseParallel(_LayerStyle):
    """A Linear's input features split across the mesh (input ``Shard(-1)``; an Embedding's rows,
    input replicated): the partial sums become the output layout (replicated by default: an
    all-reduce)."""

    def __init__(self, *, input_layouts: Placement | None = None, output_layouts: Placement | None = None,
                 use_local_output: bool = True) -> None:
        self.input_layouts = (input_layouts or Shard(-1),)
        self.output_layouts = (output_layouts or Replicate(),)
        self.use_local_output = use_local_output

    def _layouts(self, module: Module) -> tuple[dict, tuple] | None:
        if isinstance(module, Linear):
            return {"weight": Shard(1), "bias": Replicate()}, (Shard(-1),)
        if isinstance(module, Embedding):
            return {"weight": Shard(0)}, (Replicate(),)
        return None


class SequenceParallel(ParallelStyle):
    """A module that works on each position alone (LayerNorm, Dropout, ...) run on the sequence
    shards: parameters replicated, input and output ``Shard(sequence_dim)``."""

    def __init__(self, *, sequence_dim: int = 1, use_local_output: bool = False) -> None:
        self.sequence_sharding = (Shard(sequence_dim),)
        self.use_local_output = use_local_output

    def _replicate(self, name: str, module: Module, mesh: DeviceMesh) -> None:
        for key, p in list(module.named_parameters(recurse=False)):
            if p is not None and p._global is None:
                module.register_parameter(key, Parameter(DTensor.from_local(p, mesh, [Replicate()], run_check=False),
                                                         requires_grad=p.requires_grad))

    def _prepare_input(self, mod, inputs, mesh):
        x = inputs[0]
        if isinstance(x, DTensor):
            return x if x.placements == self.sequence_sharding else x.redistribute(placements=self.sequence_sharding)
        if not hasattr(x, "_data"):
            raise ValueError(f"holoflow SequenceParallel: expected the input of {type(mod).__name__} to be a Tensor, "
                             f"got {type(x).__name__}")
        return DTensor.from_local(x, mesh, self.sequence_sharding, run_check=False)

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        return distribute_module(module, device_mesh, self._replicate, self._prepare_input,
                                 lambda mod, out, mesh: _local(out, "SequenceParallel") if self.use_local_output
                                 else out)

    def __repr__(self) -> str:
        return (f"SequenceParallel(sequence_dim={self.sequence_sharding[0].dim}, "
                f"use_local_output={self.use_local_output})")


def _one_or_tuple(layouts) -> tuple | None:
    if layouts is None:
        return None
    return tuple(layouts) if isinstance(layouts, (tuple, list)) else (layouts,)


def _convert(x, layout, desired, mesh: DeviceMesh, use_local: bool, what: str):
    if layout is None:
        return x
    if isinstance(x, DTensor):
        if x.placements != (layout,):
            raise ValueError(f"holoflow {what}: the DTensor's placements {x.placements} differ from the declared "
                             f"layout ({layout},)")
    elif hasattr(x, "_data"):
        x = DTensor.from_local(x, mesh, (layout,), run_check=False)
    else:
        return x
    if desired is not None and layout != desired:
        x = x.redistribute(placements=(desired,))
    return _local(x, what) if use_local else x


class PrepareModuleInput(ParallelStyle):
    """Converts a module's inputs: positional input ``i`` from ``input_layouts[i]`` (None: left
    alone) to ``desired_input_layouts[i]``; keyword inputs likewise."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_output: bool = False) -> None:
        self.input_layouts = _one_or_tuple(input_layouts)
        self.desired_input_layouts = _one_or_tuple(desired_input_layouts)
        self.input_kwarg_layouts = input_kwarg_layouts or {}
        self.desired_input_kwarg_layouts = desired_input_kwarg_layouts or {}
        self.use_local_output = use_local_output
        if self.input_layouts is not None and (self.desired_input_layouts is None or
                                               len(self.input_layouts) != len(self.desired_input_layouts)):
            raise ValueError("holoflow PrepareModuleInput: input_layouts and desired_input_layouts must have the "
                             "same length")

    def _inputs(self, mod, inputs: tuple, mesh: DeviceMesh) -> tuple:
        if self.input_layouts is None:
            return inputs
        if len(inputs) != len(self.input_layouts):
            raise ValueError(f"holoflow PrepareModuleInput: {type(mod).__name__} got {len(inputs)} positional "
                             f"input(s) but input_layouts has {len(self.input_layouts)}")
        return tuple(_convert(x, lay, want, mesh, self.use_local_output, "PrepareModuleInput")
                     for x, lay, want in zip(inputs, self.input_layouts, self.desired_input_layouts))

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        if self.input_kwarg_layouts:
            def hook(mod, args, kwargs):
                kwargs = {k: _convert(v, self.input_kwarg_layouts.get(k), self.desired_input_kwarg_layouts.get(k),
                                      device_mesh, self.use_local_output, "PrepareModuleInput")
                          for k, v in kwargs.items()}
                return self._inputs(mod, args, device_mesh), kwargs
            module.register_forward_pre_hook(hook, with_kwargs=True)
        else:
            module.register_forward_pre_hook(lambda mod, args: self._inputs(mod, args, device_mesh))
        return module


class PrepareModuleOutput(ParallelStyle):
    """Converts a module's outputs from ``output_layouts`` to ``desired_output_layouts``."""

    def __init__(self, *, output_layouts, desired_output_layouts, use_local_output: bool = True) -> None:
        self.output_layouts = _one_or_tuple(output_layouts)
        self.desired_output_layouts = _one_or_tuple(desired_output_layouts)
        self.use_local_output = use_local_output
        if len(self.output_layouts) != len(self.desired_output_layouts):
            raise ValueError("holoflow PrepareModuleOutput: output_layouts and desired_output_layouts must have the "
                             "same length")

    def _outputs(self, outputs: Any, mesh: DeviceMesh):
        single = not isinstance(outputs, tuple)
        outs = (outputs,) if single else outputs
        if len(outs) != len(self.output_layouts):
            raise ValueError(f"holoflow PrepareModuleOutput: got {len(outs)} output(s) but output_layouts has "
                             f"{len(self.output_layouts)}")
        got = tuple(_convert(x, lay, want, mesh, self.use_local_output, "PrepareModuleOutput")
                    for x, lay, want in zip(outs, self.output_layouts, self.desired_output_layouts))
        return got[0] if single else got

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        module.register_forward_hook(lambda mod, inputs, outputs: self._outputs(outputs, device_mesh))
        return module


class PrepareModuleInputOutput(ParallelStyle):
    """:class:`PrepareModuleInput` and :class:`PrepareModuleOutput` on one module."""

    def __init__(self, *, input_layouts=None, desired_input_layouts=None, input_kwarg_layouts=None,
                 desired_input_kwarg_layouts=None, use_local_input: bool = False, output_layouts=None,
                 desired_output_layouts=None, use_local_output: bool = True) -> None:
        self.prepare_module_input = PrepareModuleInput(
            input_layouts=input_layouts, desired_input_layouts=desired_input_layouts,
            input_kwarg_layouts=input_kwarg_layouts, desired_input_kwarg_layouts=desired_input_kwarg_layouts,
            use_local_output=use_local_input)
        self.prepare_module_output = PrepareModuleOutput(
            output_layouts=output_layouts, desired_output_layouts=desired_output_layouts,
            use_local_output=use_local_output)

    def _apply(self, module: Module, device_mesh: DeviceMesh) -> Module:
        self.prepare_module_input._apply(module, device_mesh)
        self.prepare_module_output._apply(module, device_mesh)
        return module


def parallelize_module(module: Module, device_mesh: DeviceMesh | None = None,
                       parallelize_plan: ParallelStyle | dict | None = None, *,
                       src_data_rank: int | None = 0) -> Module:
    """Applies ``parallelize_plan`` (a style, or submodule paths to styles; a path's parts may be
    ``fnmatch`` patterns: ``"layers.*.attn.wq"``) on a 1-D mesh, as torch's."""
    mesh = _check_mesh(device_mesh, "parallelize_module")
    if parallelize_plan is None:
        warnings.warn("No parallelize_plan is provided and auto-parallel is not supported at the moment, so this "
                      "parallelize_module call will do nothing.", stacklevel=2)
        return module
    if mesh.ndim != 1:
        raise ValueError(f"holoflow.parallelize_module: takes a 1-D mesh; slice this {mesh.ndim}-D one first "
                         f"(mesh['tp'])")
    if isinstance(parallelize_plan, ParallelStyle):
        parallelize_plan.src_data_rank = src_data_rank
        return parallelize_plan._apply(module, mesh)
    if not isinstance(parallelize_plan, dict):
        raise TypeError(f"holoflow.parallelize_module: expected a ParallelStyle or a dict of them, got "
                        f"{type(parallelize_plan).__name__}")
    for path, style in parallelize_plan.items():
        if path == "":
            parallelize_module(module, mesh, style, src_data_rank=src_data_rank)
            continue
        token, _, rest = path.partition(".")
        matched = [sub for name, sub in module.named_children() if fnmatch(name, token)]
        if not matched:
            warnings.warn(f"Parallelize plan key '{path}' could not be resolved: no submodule matching token "
                          f"'{token}' in module {type(module).__name__}, skipping this plan entry.", stacklevel=2)
            continue
        for sub in matched:
            parallelize_module(sub, mesh, {rest: style} if rest else style, src_data_rank=src_data_rank)
    return module

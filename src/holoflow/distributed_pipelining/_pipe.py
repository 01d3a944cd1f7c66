"""torch's tracer frontend of ``torch.distributed.pipelining``: ``pipeline(module, mb_args, ...)``
traces ``module.forward`` once on a micro-batch with nn.Graph's tracer, cuts the IR's list of
nodes where ``split_spec`` or ``pipe_split()`` says, and returns a :class:`Pipe` whose stage
modules replay their nodes eagerly (docs/architecture.md, "Pipeline stages and schedules").

Each stage module holds the parameters and buffers its nodes read (the same tensor objects as
the original module's, under their qualified names, so ``state_dict`` keys are the original's;
a parameter read in several stages is copied per stage, as torch's ``replicated_params``). Stage
``0`` takes the module's own arguments; a later stage takes, in order of definition, every value
computed before it and read at or after it, and a stage that is not the last returns those for
the next one: a skip connection crossing several stages is relayed through the stages between,
since a :class:`PipelineStage` talks only to its neighbours (torch's stages send it to the
reading stage directly). The last stage returns the module's output.

As torch's stages, a stage is the trace replayed: shapes are the micro-batch's, Python control
flow is frozen as traced, and a module called twice is cut at each call; ``detach()`` and
``no_grad`` regions, which leave no node in the IR, are kept by detaching each input an op read
without grad when traced. Control flow on tensor values raises torch's RuntimeError."""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..core.device import to_torch
from ..core.dispatch import apply
from ..core.tensor import Tensor
from ..graph.ir import IRGraph, Node, Value
from ..graph.pytree import flatten, unflatten
from ..graph.trace import Tracer
from ..nn.module import Module
from ..nn.parameter import Parameter
from .stage import PipelineStage, SplitPoint

__all__ = ["Pipe", "PipeInfo", "build_stage", "pipe_split", "pipeline"]


class _TENSOR:
    """Marks a tensor leaf of the traced inputs (the others are constants of the program); a
    class, so a deep-copied stage still finds it."""


_SUBMOD = "submod_pp_{}"   # torch's names of the stage modules in ``split_gm``
_TRACING: list = []        # the tracers of pipeline() calls in progress (pipe_split marks the innermost)


def pipe_split() -> None:
    """Marks a stage boundary inside ``forward``: the ops after it start a new stage when
    :func:`pipeline` traces the module; a no-op when the module runs eagerly (torch's).

    >>> def forward(self, x):
    ...     x = self.first(x)
    ...     pipe_split()
    ...     return self.second(x)
    """
    if _TRACING:
        _TRACING[-1].cut()


# -- tracing ---------------------------------------------------------------------------------------

class _SplitTracer(Tracer):
    """nn.Graph's tracer, also noting where stages are cut (node counts) and, per node, its op and
    whether each tensor input required grad as the op read it: the IR has no node for
    ``detach()`` or a ``no_grad`` region, which the eager replay must keep. (An op's own outputs
    do not say it: the tracer records an in-place write's ``view_scatter`` under no_grad and links
    its history aside.)"""

    def __init__(self, names: dict[int, str]) -> None:
        super().__init__(names)
        self.cuts: list[int] = []
        self.steps: dict[int, tuple] = {}   # id(node) -> (op, its tensor inputs' requires_grad)

    def cut(self) -> None:
        self.cuts.append(len(self.nodes))

    def _record(self, op, inputs: tuple, attrs: dict, glob: tuple | None = None):
        if glob is not None:
            raise NotImplementedError(f"holoflow pipeline(): op {op.name} reads global tensors (DTensors); trace "
                                      f"the module with local parameters and inputs, then distribute the stages")
        needs = tuple(isinstance(x, Tensor) and x.requires_grad for x in inputs)
        res = super()._record(op, inputs, attrs, glob)
        self.steps[id(self.nodes[-1])] = (op, needs)
        return res

    def effect(self, op: str, inputs: tuple, attrs: dict, kernel: Any) -> None:
        raise NotImplementedError(f"holoflow pipeline(): the module's forward runs {op} (an optimizer step); "
                                  f"step the stages' optimizers after the schedule instead")


def _submodule(module: Module, qualname: str) -> Module:
    """The submodule at ``qualname``, with torch's AttributeErrors for a path that leads nowhere."""
    atoms = qualname.split(".")
    m = module
    for i, atom in enumerate(atoms[:-1]):
        m = m._modules.get(atom)
        if m is None:
            raise AttributeError(f"Specified target {qualname} referenced nonexistent module "
                                 f"{'.'.join(atoms[:i + 1])}")
    last = m._modules.get(atoms[-1])
    if last is None:
        raise AttributeError(f"'{type(m).__name__}' object has no attribute '{atoms[-1]}' (split_spec key "
                             f"{qualname!r}: a split point is a submodule's path, one of "
                             f"{[n for n, _ in module.named_modules() if n][:8]}...)")
    return last


def _split_hooks(module: Module, split_spec: dict, tracer: _SplitTracer) -> list:
    """Forward (pre-)hooks cutting a stage before (``BEGINNING``) or after (``END``) each call of
    the modules ``split_spec`` names (torch wraps their forwards with ``pipe_split()``)."""
    targets = [(_submodule(module, qualname), qualname, point) for qualname, point in split_spec.items()]
    for _, qualname, point in targets:
        if point not in (SplitPoint.BEGINNING, SplitPoint.END):
            raise ValueError(f"Unknown split point type: {point!r} for {qualname!r}; use SplitPoint.BEGINNING "
                             f"or SplitPoint.END")
    return [m.register_forward_pre_hook(lambda *_: tracer.cut()) if point == SplitPoint.BEGINNING
            else m.register_forward_hook(lambda *_: tracer.cut()) for m, _, point in targets]


def _state_names(module: Module) -> dict[int, str]:
    """Qualified names of the tensors ``module`` holds: parameters, buffers, then tensor
    attributes (torch's lifted constants)."""
    names: dict[int, str] = {}
    for n, t in list(module.named_parameters()) + list(module.named_buffers()):
        names.setdefault(id(t), n)
    for prefix, m in module.named_modules():
        for k, v in m.__dict__.items():
            if isinstance(v, Tensor):
                names.setdefault(id(v), f"{prefix}.{k}" if prefix else k)
    return names


def _traced_call(tracer: _SplitTracer, module: Module, leaves: list, spec: Any) -> tuple[IRGraph, tuple]:
    """The IR of ``module`` called on lazy stand-ins of ``leaves``, and whether each output
    requires grad."""
    lazy = [tracer.feed(x, f"input{i}") if isinstance(x, Tensor) else x for i, x in enumerate(leaves)]
    for x, t in zip(leaves, lazy):
        if isinstance(x, Tensor) and x.requires_grad:
            t.requires_grad_()
    args, kwargs = unflatten(lazy, spec)
    out_leaves, out_spec = flatten(module(*args, **kwargs))
    written = [i for i, t in enumerate(lazy) if isinstance(t, Tensor) and t.__dict__.get("_v") not in tracer.feeds]
    if written:
        raise NotImplementedError(f"holoflow pipeline(): the module's forward writes its input(s) {written} in "
                                  f"place, which the stages would not pass back to the caller; write a copy")
    return tracer.graph(tuple(out_leaves), out_spec), tuple(isinstance(o, Tensor) and o.requires_grad
                                                            for o in out_leaves)


def _trace(module: Module, mb_args: tuple, mb_kwargs: dict, split_spec: dict | None) -> tuple:
    """``(ir, cuts, steps, outputs' requires_grad, input spec, input leaves)`` of one traced call
    of ``module`` (the tensor leaves as ``_TENSOR``: the others are constants of the program)."""
    leaves, spec = flatten((tuple(mb_args), dict(mb_kwargs)))
    tracer = _SplitTracer(_state_names(module))
    tracer.device_type = next((x._data.device.type for x in leaves if isinstance(x, Tensor)), "cpu")
    handles = _split_hooks(module, split_spec or {}, tracer)
    _TRACING.append(tracer)
    try:
        with tracer:
            ir, out_grads = _traced_call(tracer, module, leaves, spec)
    except (NotImplementedError, AttributeError, ValueError):
        raise
    except Exception as e:   # (torch's class and words for what its export cannot capture)
        raise RuntimeError(f"holoflow pipeline(): it seems that we cannot capture your model as a full graph "
                           f"({type(e).__name__}: {e}). Typical reasons are data-dependent control flow or "
                           f"output shapes; split the model by hand into PipelineStage(submodule, stage_index, "
                           f"num_stages, device), or compute those values with tensor ops") from e
    finally:
        _TRACING.pop()
        for h in handles:
            h.remove()
    traced = tuple(_TENSOR if isinstance(x, Tensor) else x for x in leaves)
    return ir, tracer.cuts, tracer.steps, out_grads, spec, traced


# -- splitting -------------------------------------------------------------------------------------

@dataclass(frozen=True)
class _Step:
    """One node to replay: its op, and whether each tensor input required grad when traced."""
    node: Node
    op: Any
    needs: tuple


@dataclass(frozen=True)
class _Program:
    """What one stage runs: its inputs (the feeds for stage 0), the parameters and buffers it
    holds (``held``: those it reads or writes; ``state``: the values it reads from them), the
    other tensors it reads (constants), its steps, its write-backs and its outputs."""
    inputs: tuple        # Values
    held: tuple          # qualified names
    state: tuple         # (Value, qualified name)
    constants: tuple     # (Value, tensor)
    steps: tuple         # _Step
    updates: tuple       # (qualified name or None, tensor, Value): state written back after the steps
    outputs: tuple       # Values or constants
    out_grads: tuple     # whether each output requires grad (the last stage's, as traced; the others' all do)
    last: bool = False   # the last stage returns its outputs in the module's structure, the others a tuple
    out_spec: Any = None

    def __deepcopy__(self, memo: dict) -> "_Program":
        return self   # (immutable: a copied stage runs the same program on its own copies of the state)


def _parts(ir: IRGraph, cuts: Iterable[int]) -> list[tuple]:
    """The node list cut at ``cuts``; empty parts (a cut before the first op, two cuts with no op
    between) are dropped."""
    n = len(ir.nodes)
    bounds = sorted({c for c in cuts if 0 < c < n})
    return [ir.nodes[a:b] for a, b in zip([0] + bounds, bounds + [n])]


def _carried(ir: IRGraph, parts: list) -> list[tuple]:
    """Per boundary after stage ``i``: the values defined up to it and read after it (by a later
    stage or as the module's output), in order of definition. (A write-back is done by the stage
    computing its value.)"""
    later: set = {v for v in ir.outputs if isinstance(v, Value)}
    reads_after: list[set] = []
    for part in reversed(parts):
        reads_after.insert(0, set(later))
        later |= {v for node in part for v in node.value_inputs()}
    defined, out = list(ir.feeds), []
    for part, after in zip(parts, reads_after):
        defined += [v for node in part for v in node.outputs]
        out.append(tuple(v for v in defined if v in after))
    return out


def _program(ir: IRGraph, part: tuple, inputs: tuple, outputs: tuple, steps: dict, held: dict[int, str],
             out_grads: tuple | None) -> _Program:
    """The program of the stage running ``part``; ``out_grads`` is None but for the last stage."""
    state_of = dict(ir.state)
    made = {v for node in part for v in node.outputs}
    updates = tuple((held.get(id(t)), t, v) for t, v in ir.updates if v in made)
    reads = [v for node in part for v in node.value_inputs()] + [v for v in outputs if isinstance(v, Value)]
    read_state = list(dict.fromkeys(v for v in reads if v in state_of))
    state = tuple((v, held[id(state_of[v])]) for v in read_state if id(state_of[v]) in held)
    names = list(dict.fromkeys([n for _, n in state] + [n for n, _, _ in updates if n is not None]))
    return _Program(inputs, tuple(names), state,
                    tuple((v, state_of[v]) for v in read_state if id(state_of[v]) not in held),
                    tuple(_Step(node, *steps[id(node)]) for node in part), updates, tuple(outputs),
                    out_grads or (True,) * len(outputs), out_grads is not None, ir.out_spec)


def _programs(ir: IRGraph, parts: list, steps: dict, out_grads: tuple, held: dict[int, str]) -> list[_Program]:
    """One program per part: stage 0 takes the feeds, stage ``i`` what stage ``i - 1`` carries."""
    carried = _carried(ir, parts)
    last = len(parts) - 1
    return [_program(ir, part, ir.feeds if i == 0 else carried[i - 1], ir.outputs if i == last else carried[i],
                     steps, held, out_grads if i == last else None)
            for i, part in enumerate(parts)]


# -- the stage modules -----------------------------------------------------------------------------

def _detached(t: Any, requires_grad: bool) -> Any:
    """``t`` cut from autograd where the traced value did not require grad (a ``detach()``, a
    ``no_grad`` region, an input that required none)."""
    return t.detach() if not requires_grad and isinstance(t, Tensor) and t.requires_grad else t


def _on(device: torch.device | None, attrs: dict) -> dict:
    """The node's attributes with every device (and a ``device=None`` default) set to the
    stage's, as torch's ``build_stage`` moves the devices burned in by the trace."""
    if device is None:
        return attrs
    return {k: device if isinstance(v, torch.device) or (k == "device" and v is None) else v
            for k, v in attrs.items()}


def _replay(steps: tuple, env: dict, device: torch.device | None) -> None:
    """Runs ``steps`` eagerly with holoflow's ops (autograd records them), values into ``env``."""
    for step in steps:
        node = step.node
        args = [_detached(env[x], rg) if isinstance(x, Value) else x for x, rg in zip(node.inputs, step.needs)]
        res = apply(step.op, *args, **_on(device, node.attrs))
        env.update(zip(node.outputs, (res,) if isinstance(res, Tensor) else tuple(res)))


class _StageModule(Module):
    """One stage of a traced module: the parameters and buffers its ops read, held under their
    qualified names in plain submodules, and its ops, replayed on every call."""

    def __init__(self, program: _Program, index: int, feeds: tuple) -> None:
        super().__init__()
        object.__setattr__(self, "_program", program)
        object.__setattr__(self, "_index", index)
        object.__setattr__(self, "_feeds", feeds)   # (input spec, traced leaves): stage 0 checks its call
        object.__setattr__(self, "_device", None)   # set by build_stage: the device the ops create on
        object.__setattr__(self, "_constants", dict(program.constants))

    def _parent(self, qualname: str) -> tuple[Module, str]:
        """The module holding ``qualname``'s tensor (plain submodules made along the path) and its name."""
        *path, name = qualname.split(".")
        m: Module = self
        for atom in path:
            if atom not in m._modules:
                m.add_module(atom, Module())
            m = m._modules[atom]
        return m, name

    def _tensor(self, qualname: str) -> Tensor:
        *path, name = qualname.split(".")
        m: Module = self
        for atom in path:
            m = m._modules[atom]
        return m._parameters[name] if name in m._parameters else m._buffers[name]

    def _move(self, device: Any) -> None:
        """The stage's state and constants moved to ``device``, and its ops creating tensors there."""
        self.to(device)
        object.__setattr__(self, "_device", to_torch(device))
        object.__setattr__(self, "_constants", {v: t.to(device) for v, t in self._constants.items()})

    def _inputs(self, args: tuple, kwargs: dict) -> list:
        inputs = self._program.inputs
        if self._index > 0:
            if kwargs or len(args) != len(inputs):
                raise TypeError(f"holoflow pipeline stage {self._index}: takes the {len(inputs)} values the "
                                f"previous stage returns, got {len(args)} positional and {len(kwargs)} keyword "
                                f"arguments")
            return list(args)
        spec, traced = self._feeds
        leaves, got = flatten((tuple(args), dict(kwargs)))
        if got != spec:
            raise TypeError(f"holoflow pipeline stage 0: its arguments must be structured as the traced "
                            f"micro-batch's (mb_args, mb_kwargs): {spec}, got {got}")
        for i, (x, t) in enumerate(zip(leaves, traced)):
            if (t is _TENSOR) != isinstance(x, Tensor) or t is not _TENSOR and x != t:
                raise ValueError(f"holoflow pipeline stage 0: input leaf {i} is {x!r}, but "
                                 f"{'a tensor' if t is _TENSOR else repr(t)} was traced; non-tensor inputs are "
                                 f"constants of the traced program")
        return [x for x in leaves if isinstance(x, Tensor)]

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        program = self._program
        env: dict = dict(zip(program.inputs, self._inputs(args, kwargs)))
        env.update((v, self._tensor(n)) for v, n in program.state)
        env.update(self._constants)
        _replay(program.steps, env, self._device)
        for name, t, v in program.updates:   # (a copy: the value may view the tensor it is written into)
            (t if name is None else self._tensor(name))._data.copy_(env[v]._data.clone())
        outs = [_detached(env[v], rg) if isinstance(v, Value) else v
                for v, rg in zip(program.outputs, program.out_grads)]
        return unflatten(outs, program.out_spec) if program.last else tuple(outs)

    def extra_repr(self) -> str:
        p = self._program
        return f"stage={self._index}, inputs={len(p.inputs)}, ops={len(p.steps)}, outputs={len(p.outputs)}"


def _stage_modules(module: Module, programs: list, feeds: tuple) -> tuple[list, list]:
    """The stage modules, and torch's ``replicated_params``: per parameter held by several
    stages, ``{stage module name: qualified name}`` (each stage holds its own copy, as torch's).
    A stage's buffers are all persistent: torch's stage modules hold a non-persistent buffer (a
    causal mask) as a persistent one, in their ``state_dict``."""
    state = dict(list(module.named_parameters()) + list(module.named_buffers()))
    order = {n: k for k, n in enumerate(module.state_dict(keep_vars=True))}
    users: dict[str, list[int]] = {}
    for i, p in enumerate(programs):
        for n in p.held:
            users.setdefault(n, []).append(i)
    replicated = [n for n, us in users.items() if len(us) > 1 and isinstance(state[n], Parameter)]
    stages = []
    for i, p in enumerate(programs):
        stage = _StageModule(p, i, feeds)
        for n in p.held:   # the submodules first, in the order the ops read them (torch's order)
            stage._parent(n)
        for n in sorted(p.held, key=lambda n: order.get(n, len(order))):
            m, name = stage._parent(n)
            t = copy.deepcopy(state[n]) if n in replicated else state[n]
            if isinstance(t, Parameter):
                m.register_parameter(name, t)
            else:
                m.register_buffer(name, t)
        stages.append(stage)
    return stages, [{_SUBMOD.format(i): n for i in users[n]} for n in replicated]


class _SplitModule(Module):
    """torch's ``pipe.split_gm``: the stage modules as children ``submod_pp_0``, ``submod_pp_1``...;
    calling it runs them in turn."""

    def __init__(self, stages: list) -> None:
        super().__init__()
        for i, s in enumerate(stages):
            self.add_module(_SUBMOD.format(i), s)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        stages = list(self._modules.values())
        out = stages[0](*args, **kwargs)
        for s in stages[1:]:
            out = s(*out)
        return out


@dataclass(frozen=True)
class PipeInfo:
    """torch's ``pipe.info()``: what :func:`build_stage` needs of a pipe (``graph``: torch's fx
    graph; holoflow's split module)."""
    graph: Any
    num_stages: int
    has_loss_and_backward: bool = False


def build_stage(stage_module: Module, stage_index: int, pipe_info: PipeInfo, device: Any,
                group: Any = None) -> PipelineStage:
    """torch's module-level ``build_stage``: a :class:`PipelineStage` of ``stage_module`` (a
    pipe's stage module, moved to ``device``) as stage ``stage_index`` of ``pipe_info``'s."""
    if isinstance(stage_module, _StageModule):
        stage_module._move(device)
    else:
        stage_module.to(device)
    return PipelineStage(stage_module, stage_index, pipe_info.num_stages, device, group=group)


class Pipe(Module):
    """A module split into pipeline stages by :func:`pipeline`: ``num_stages``,
    ``get_stage_module(i)``, ``split_gm`` (the stage modules as ``submod_pp_i``),
    ``build_stage(i, device)``; calling it runs the stages in turn."""

    def __init__(self, split_gm: _SplitModule, num_stages: int, replicated_params: list) -> None:
        super().__init__()
        self.split_gm = split_gm
        self.num_stages = num_stages
        self.replicated_params = replicated_params
        self.has_loss_and_backward = False

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.split_gm(*args, **kwargs)

    def get_stage_module(self, stage_idx: int) -> Module:
        """The module of stage ``stage_idx``."""
        if not 0 <= stage_idx < self.num_stages:
            raise ValueError(f"Invalid stage index {stage_idx}! (the pipe has stages 0 to {self.num_stages - 1})")
        return self.split_gm._modules[_SUBMOD.format(stage_idx)]

    def build_stage(self, stage_index: int, device: Any, group: Any = None) -> PipelineStage:
        """A :class:`PipelineStage` running stage ``stage_index`` on ``device`` (its module moved
        there, and the ops that create tensors creating them there), usable with the schedules."""
        return build_stage(self.get_stage_module(stage_index), stage_index, self.info(), device, group)

    def info(self) -> PipeInfo:
        """torch's ``pipe.info()``: the stage count (and the split module as its graph)."""
        return PipeInfo(self.split_gm, self.num_stages, self.has_loss_and_backward)

    def print_readable(self) -> None:
        print(self.split_gm)


def pipeline(module: Module, mb_args: tuple, mb_kwargs: dict | None = None, split_spec: dict | None = None,
             split_policy: Callable | None = None) -> Pipe:
    """Splits ``module`` into pipeline stages (torch's ``torch.distributed.pipelining.pipeline``).

    ``module.forward(*mb_args, **mb_kwargs)`` is traced once on one micro-batch; a new stage
    starts at each ``pipe_split()`` call inside it and before (``SplitPoint.BEGINNING``) or after
    (``SplitPoint.END``) each call of the submodules that ``split_spec`` names by path. The stages
    replay the traced ops, so shapes are those of ``mb_args`` and Python control flow is frozen as
    traced (control flow on tensor values cannot be traced: RuntimeError).

    >>> pipe = pipeline(model, (x_mb,), split_spec={"layers.2": SplitPoint.BEGINNING})
    >>> stage = pipe.build_stage(rank, device)   # then ScheduleGPipe(stage, n_microbatches, loss_fn)
    """
    if split_spec is not None and split_policy is not None:
        raise ValueError("Cannot specify both `split_spec` and `split_policy`. Please use only one of them.")
    if split_policy is not None:
        raise NotImplementedError("holoflow pipeline(): split_policy (a rewrite of torch.fx GraphModules) is not "
                                  "supported; name the split points with split_spec={path: SplitPoint.BEGINNING} "
                                  "or call pipe_split() inside forward")
    if not isinstance(module, Module):
        raise TypeError(f"pipeline(): module must be an nn.Module, got {type(module).__name__}")
    if not isinstance(mb_args, tuple):
        mb_args = (mb_args,)
    ir, cuts, steps, out_grads, spec, leaves = _trace(module, mb_args, mb_kwargs or {}, split_spec)
    held = {id(t): n for n, t in list(module.named_parameters()) + list(module.named_buffers())}
    programs = _programs(ir, _parts(ir, cuts), steps, out_grads, held)
    stages, replicated = _stage_modules(module, programs, (spec, leaves))
    return Pipe(_SplitModule(stages), len(stages), replicated)

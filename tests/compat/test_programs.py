"""Realistic PyTorch programs (programs/*.py) run unchanged on torch and under mock_torch: same
initial weights (torch's RNG), per-step losses and last-step parameter gradients compared."""
from __future__ import annotations

import functools
import linecache
import math
from pathlib import Path

import pytest
import torch as real_torch

import holoflow as flow
from holoflow import mock_torch

PROGRAMS = sorted((Path(__file__).parent / "programs").glob("*.py"))
# per-program tolerances where mixed precision or long recurrences round differently
TOL = {"gpt_checkpoint_bf16": dict(loss=1e-3, grad=(5e-2, 5e-2))}
DEFAULT = dict(loss=2e-4, grad=(2e-3, 2e-4))


def _exec(path: Path) -> dict:
    source = path.read_text()
    name = str(path)
    linecache.cache[name] = (len(source), None, source.splitlines(True), name)
    g = {"__name__": "user_training_script", "__file__": name}
    exec(compile(source, name, "exec"), g)
    return g


def _torch(t):
    return t.to_torch() if isinstance(t, flow.Tensor) else t


def _grads(g: dict) -> dict:
    out = {}
    for mname, model in g["MODELS"].items():
        for pname, p in model.named_parameters():
            out[f"{mname}.{pname}"] = None if p.grad is None else _torch(p.grad).detach().float()
    return out


@functools.lru_cache(maxsize=None)
def _torch_run(path: Path) -> tuple:
    """torch's per-step losses and last-step gradients of the program at ``path``; run once per
    session (the compiled variant below compares with the same run)."""
    assert not mock_torch.is_enabled()
    tg = _exec(path)
    assert tg["torch"] is real_torch
    out = tuple(tg["LOSSES"]), _grads(tg)
    # the program's objects go now, by reference counts: left to the cyclic collector (the
    # namespace is a cycle through its functions), a DataLoader's persistent workers lose their
    # queues first and are joined only after 5 s each (dataloader_workers: 10 s, in a later test)
    tg.clear()
    return out


@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_program_matches_torch(path):
    tol = TOL.get(path.stem, DEFAULT)
    assert not mock_torch.is_enabled()
    tl, tgr = _torch_run(path)
    with mock_torch.enable():
        fg = _exec(path)
    assert fg["torch"] is not real_torch
    tl, fl = list(tl), fg["LOSSES"]
    assert len(tl) == len(fl) and len(tl) >= 2
    assert all(math.isfinite(v) for v in tl)
    for i, (a, b) in enumerate(zip(tl, fl)):
        assert math.isclose(a, b, rel_tol=tol["loss"], abs_tol=tol["loss"]), \
            f"{path.stem}: step {i} loss {b} (holoflow) vs {a} (torch); losses {fl} vs {tl}"
    fgr = _grads(fg)
    assert tgr.keys() == fgr.keys()
    rtol, atol = tol["grad"]
    for k, tv in tgr.items():
        fv = fgr[k]
        assert (tv is None) == (fv is None), f"{path.stem}: grad of {k} is None on one side only"
        if tv is not None:
            real_torch.testing.assert_close(fv, tv, rtol=rtol, atol=atol, msg=lambda m: f"{path.stem} {k}: {m}")


# -- the same programs with every model compiled -----------------------------------------------

# torch.compile refuses a double backward through compiled code too
DOUBLE_BACKWARD = {"hnn_custom_autograd", "maml_second_order", "pinn_hessian"}
# programs whose every model call runs eagerly (holoflow.compile warns why): data-dependent
# shapes or branches (bincount, nonzero, .tolist(), pack_padded_sequence's lengths, `if tensor`), module hooks, tensors reached
# through lists, a GP with no module call at all (fno_darcy traces since creation ops such
# as linspace are nodes of the trace), and model calls inside a non-reentrant checkpoint (its
# saved-tensor hooks are active there: autograd_extensions). transformer_masks traces since a
# decoder's tgt_mask no longer has its values read for torch's causal-mask hint in a trace
ALL_EAGER = {"autograd_extensions", "clip_caption", "gnn_scatter", "gp_regression", "gradcam_surgery_finetune",
             "keyword_spotting_muon_amp", "mae_vit_checkpoint_amp", "mdn_mixture", "moe_transformer_xl", "qat_hooks"}


def _compile_outermost_calls(monkeypatch) -> dict:
    """Routes every outermost module call through a holoflow.compile of that module (plain
    kernels); returns the compilers by module id."""
    from holoflow.graph.compile_module import _Compiler
    from holoflow.nn.module import Module
    plain, compilers, depth = Module.__call__, {}, [0]

    def call(self, *args, **kwargs):
        if depth[0]:
            return plain(self, *args, **kwargs)
        depth[0] += 1
        try:
            c = compilers.get(id(self))
            if c is None or c.fn is not self:
                c = compilers[id(self)] = _Compiler(self, "eager", False)
            return c(*args, **kwargs)
        finally:
            depth[0] -= 1
    monkeypatch.setattr(Module, "__call__", call)
    return compilers


@pytest.mark.filterwarnings("ignore:holoflow.compile")
@pytest.mark.parametrize("path", PROGRAMS, ids=[p.stem for p in PROGRAMS])
def test_program_with_its_models_compiled_matches_torch(path, monkeypatch):
    """Each program with every model call traced into holoflow.compile's forward and backward
    programs (or run eagerly where it cannot be traced) gives torch's losses and gradients."""
    compilers = _compile_outermost_calls(monkeypatch)
    if path.stem in DOUBLE_BACKWARD:
        with pytest.raises(RuntimeError, match="backward of a compiled call cannot be differentiated"):
            test_program_matches_torch(path)
        return
    test_program_matches_torch(path)
    traced = sum(type(p).__name__ == "_Plan" for c in compilers.values() for p in c.plans.values())
    assert (traced == 0) == (path.stem in ALL_EAGER), f"{path.stem}: {traced} traced plans"

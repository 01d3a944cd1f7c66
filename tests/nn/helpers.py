"""Builds a holoflow module and its torch twin with equal weights, and compares them."""
from __future__ import annotations

from typing import Callable

import torch

import holoflow as flow


def twin(make_flow: Callable, make_torch: Callable, dtype: torch.dtype = torch.float32, seed: int = 0):
    """Both modules, torch's built under ``seed``; its state dict loaded into holoflow's."""
    torch.manual_seed(seed)
    tm = make_torch().to(dtype)
    fm = make_flow().to(dtype)
    res = fm.load_state_dict({k: flow.from_torch(v.detach().clone()) for k, v in tm.state_dict().items()})
    assert not res.missing_keys and not res.unexpected_keys
    return fm, tm


def to_flow(t: torch.Tensor, grad: bool = False) -> flow.Tensor:
    x = flow.from_torch(t.detach().clone())
    if grad:
        x.requires_grad_(True)
    return x


def close(f, t, atol: float, rtol: float, what: str = "") -> None:
    got = f.to_torch() if isinstance(f, flow.Tensor) else f
    torch.testing.assert_close(got, t.detach(), atol=atol, rtol=rtol, msg=lambda m: f"{what}: {m}")


def tol(dtype: torch.dtype) -> tuple[float, float]:
    return (1e-5, 1e-4) if dtype == torch.float32 else (1e-10, 1e-9)


def compare(fm, tm, inputs: list, dtype: torch.dtype = torch.float32, grad: bool = True, seed: int = 1,
            out_index: int | None = None, atol: float | None = None, **kwargs) -> None:
    """Forward (and backward with a random upstream grad) of both modules on equal inputs;
    outputs, input grads, parameter grads and buffers must match."""
    a, r = tol(dtype)
    a = atol if atol is not None else a
    t_in = [x.detach().clone().requires_grad_(grad and x.is_floating_point()) if isinstance(x, torch.Tensor)
            else x for x in inputs]
    f_in = [to_flow(x, grad and x.is_floating_point()) if isinstance(x, torch.Tensor) else x for x in inputs]
    f_out, t_out = fm(*f_in, **_kw_flow(kwargs)), tm(*t_in, **kwargs)
    if out_index is not None:
        f_out, t_out = f_out[out_index], t_out[out_index]
    close(f_out, t_out, a, r, "output")
    for (fk, fb), (tk, tb) in zip(fm.state_dict().items(), tm.state_dict().items()):
        assert fk == tk
        close(fb, tb, a, r, f"state {fk}")
    if not grad:
        return
    g = torch.Generator().manual_seed(seed)
    dy = torch.randn(t_out.shape, generator=g, dtype=torch.float64).to(t_out.dtype)
    t_out.backward(dy)
    f_out.backward(to_flow(dy))
    for i, (fx, tx) in enumerate(zip(f_in, t_in)):
        if isinstance(tx, torch.Tensor) and tx.requires_grad:
            close(fx.grad, tx.grad, a, r, f"grad of input {i}")
    t_params = dict(tm.named_parameters())
    for name, p in fm.named_parameters():
        tp = t_params[name]
        if tp.grad is None:
            assert p.grad is None, name
        else:
            close(p.grad, tp.grad, a, r, f"grad of {name}")


def _kw_flow(kwargs: dict) -> dict:
    return {k: to_flow(v) if isinstance(v, torch.Tensor) else v for k, v in kwargs.items()}

"""Functions run on every rank of the Gloo worlds (tests/dist/pool.py) by the checkpoint tests:
a small MLP trained under a parallel layout, saved and resumed through flow.save / flow.load."""
import torch

import holoflow as flow
from holoflow.distributed.global_tensor import from_full
from holoflow.sbp import B, S

MESH = {"dp2": [0, 1], "tp4": [0, 1, 2, 3], "2d4": [[0, 1], [2, 3]]}
MEGATRON = {"0.weight": S(0), "0.bias": S(0), "2.weight": S(1)}


def layout(mode: str):
    """(placement, param layout fn, data sbp) of a mode; single: (None, None, None)."""
    if mode == "single":
        return None, None, None
    place = flow.placement("cpu", MESH[mode] if mode in MESH else list(range(flow.env.get_world_size())))
    if mode in ("dp2", "dp"):   # dp: data parallel over every rank of the world
        return place, lambda name, t: B, (S(0),)
    if mode == "tp4":
        return place, lambda name, t: MEGATRON.get(name, B), (B,)
    return place, lambda name, t: (B, MEGATRON.get(name, B)), (S(0), B)   # dp x tp


def model(mode: str):
    place, fn, _ = layout(mode)
    flow.manual_seed(0)
    m = flow.nn.Sequential(flow.nn.Linear(6, 16), flow.nn.Tanh(), flow.nn.Linear(16, 4))
    return m.to_global(place, fn) if place is not None else m


def train(rank: int, mode: str, data, start: int, stop: int, load_dir=None, save_dir=None) -> list:
    """Steps ``start..stop`` of AdamW under ``mode``; resumes from ``load_dir`` (into this
    layout) and saves to ``save_dir`` when given; returns the losses."""
    xs, ys = data
    place, _, data_sbp = layout(mode)
    m = model(mode)
    opt = flow.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.01)
    if load_dir is not None:
        ck = flow.load(load_dir, like={"model": m, "optim": opt})
        assert ck["step"] == start, (ck["step"], start)
        m.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
    losses = []
    for i in range(start, stop):
        x, y = flow.from_torch(xs[i]), flow.from_torch(ys[i])
        if place is not None:
            x, y = from_full(xs[i], place, data_sbp), from_full(ys[i], place, data_sbp)
        loss = ((m(x) - y) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    if save_dir is not None:
        flow.save({"model": m.state_dict(), "optim": opt.state_dict(), "step": stop}, save_dir)
    return losses


def data(steps: int, seed: int = 5):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, 8, 6, generator=g), torch.randn(steps, 8, 4, generator=g)

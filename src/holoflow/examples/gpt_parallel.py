"""The example GPT trained with data x tensor parallelism on a 2-D mesh of ranks, in the global view.

    python -m holoflow.distributed.launch --nproc_per_node 4 -m holoflow.examples.gpt_parallel --steps 50
    python -m holoflow.distributed.launch --nproc_per_node 4 -m holoflow.examples.gpt_parallel --graph --zero 2
    python -m holoflow.distributed.launch --nproc_per_node 4 -m holoflow.examples.gpt_parallel --graph --tp 1 --zero 3

``--graph`` compiles the same training step as an ``nn.Graph`` of global tensors (boxing as graph
nodes, one plan per rank; ``--zero 1|2|3`` shards the optimizer state / also the gradients / also
the parameters of the data-parallel parameters, on a mesh with one axis of more than one rank);
``--tp 1`` is plain data parallelism. ``--dp`` (default: world size / ``--tp``) is checked
against the world.

The model, corpus, optimizer and training step are :mod:`holoflow.examples.gpt`'s, unchanged; only
the layout is new. The world forms a ``dp x tp`` mesh (``--tp``, default 2: a 2x2 mesh on 4
ranks). Mesh axis 0 splits the batch (data parallel); mesh axis 1 splits the transformer
weights Megatron-style. ``nn.Linear`` stores its weight as (out, in), so a column-parallel layer
(attention ``qkv``, MLP ``fc``) splits the weight and bias on dim 0 — ``S(0)`` — and its output
on the feature dim; a row-parallel layer (the two ``proj``) splits the weight on dim 1 — ``S(1)``
— and yields a partial sum. Embeddings (the tied head with them) and LayerNorms are broadcast.

Every rank builds the model from the same seed and reads the same batch; ``Module.to_global``
and ``from_full`` keep each rank's shard without communication. The boxing the global ops need
(the all-reduce after each row-parallel layer, the all-reduce of data-parallel gradients at
accumulation, ...) is inserted by the dispatcher, so the loss curve equals the single-process
one up to float rounding.
"""
from __future__ import annotations

import argparse
import json
from typing import Any, Sequence

import numpy as np
import torch

import holoflow as flow
from holoflow.core.sbp import B, S
from holoflow.distributed.comm_track import count
from holoflow.distributed.global_tensor import from_full

from . import corpus, gpt

# weight-name suffix -> SBP on the tensor-parallel mesh axis (anything else is broadcast)
TENSOR_PARALLEL = {
    "attn.qkv.weight": S(0), "attn.qkv.bias": S(0),   # column parallel
    "attn.proj.weight": S(1),                         # row parallel (bias added after the sum)
    "mlp.fc.weight": S(0), "mlp.fc.bias": S(0),       # column parallel
    "mlp.proj.weight": S(1),                          # row parallel
}


def mesh(world_size: int, tp: int) -> flow.placement:
    """The ``(world_size // tp) x tp`` CPU mesh: rows are data-parallel replicas."""
    if tp < 1 or world_size % tp:
        raise ValueError(f"gpt_parallel: --tp {tp} does not divide the world size {world_size}")
    return flow.placement("cpu", np.arange(world_size).reshape(world_size // tp, tp).tolist())


def param_sbp(name: str, t: Any) -> tuple:
    """The nd-SBP of a parameter: broadcast over data parallel, TENSOR_PARALLEL over the model axis."""
    for suffix, sbp in TENSOR_PARALLEL.items():
        if name.endswith(suffix):
            return (B, sbp)
    return (B, B)


def make_parallel_model(cfg: gpt.Config, place: flow.placement, graph: bool = False):
    """gpt's model (same seed on every rank), its tensors laid out by :func:`param_sbp`."""
    model = gpt.make_model(flow, cfg).to_global(place, param_sbp)
    if graph:   # position ids come from global_mode inside the graph's build
        return model
    # forward() makes its position ids with arange, a local tensor identical on every rank:
    # hand the embedding the global (broadcast) version of it
    broadcast = (B,) * place.ndim
    model.pos.register_forward_pre_hook(lambda mod, args: (from_full(args[0]._data, place, broadcast),))
    return model


def global_batch(a: np.ndarray, place: flow.placement):
    """The batch every rank read, split over the data-parallel axis."""
    return from_full(torch.from_numpy(np.ascontiguousarray(a)), place, (S(0),) + (B,) * (place.ndim - 1))


def train(cfg: gpt.Config, place: flow.placement, data: tuple | None = None) -> dict[str, Any]:
    """``cfg.steps`` steps of gpt's training loop on global tensors; returns the per-step losses,
    the collectives of the last step by kind (on a real world) and the model."""
    train_data, _ = data if data is not None else corpus.splits(cfg.corpus_chars)
    model = make_parallel_model(cfg, place)
    opt = gpt.make_optimizer(flow, model, cfg)
    rng = np.random.default_rng(cfg.seed)  # the same batch order as gpt.train
    losses, comms = [], {}
    for step in range(cfg.steps):
        xb, yb = corpus.get_batch(train_data, cfg.block_size, cfg.batch_size, rng)
        with count() as c:
            losses.append(gpt.train_step(flow, model, opt, global_batch(xb, place), global_batch(yb, place),
                                         gpt.lr_at(step, cfg), cfg))
        comms = dict(c.counts)
    return {"train": losses, "comms": comms, "model": model}


def train_graph(cfg: gpt.Config, place: flow.placement, data: tuple | None = None, zero: int = 0,
                steps: int | None = None, auto: bool = False) -> dict[str, Any]:
    """The same training as :func:`train`, compiled as an ``nn.Graph`` of global tensors; the
    learning rate is set per step as in gpt's loop (the update reads it at run time). ``auto``:
    the model placed broadcast and its layout chosen by ``config.enable_auto_parallel()``."""
    train_data, _ = data if data is not None else corpus.splits(cfg.corpus_chars)
    broadcast = (B,) * place.ndim
    model = gpt.make_model(flow, cfg).to_global(place, broadcast) if auto else \
        make_parallel_model(cfg, place, graph=True)
    opt = gpt.make_optimizer(flow, model, cfg)

    class TrainStep(flow.nn.Graph):
        def __init__(self):
            super().__init__()
            self.model = model
            self.add_optimizer(opt)
            if zero:
                self.config.enable_zero(True, stage=zero)
            if auto:
                self.config.enable_auto_parallel()

        def build(self, x, y):
            with flow.utils.global_view.global_mode(True, placement=place, sbp=broadcast), \
                    gpt.autocast_ctx(flow, cfg):
                _, loss = self.model(x, y)
            loss.backward()
            if cfg.grad_clip > 0:
                flow.nn.utils.clip_grad_norm_(self.model.parameters(), cfg.grad_clip)
            return loss
    step_fn = TrainStep()
    rng = np.random.default_rng(cfg.seed)
    losses = []
    for step in range(cfg.steps if steps is None else steps):
        xb, yb = corpus.get_batch(train_data, cfg.block_size, cfg.batch_size, rng)
        for g in opt.param_groups:
            g["lr"] = gpt.lr_at(step, cfg)
        loss = step_fn(global_batch(xb, place), global_batch(yb, place))
        losses.append(loss.to_global(sbp=broadcast).to_local().item())
    return {"train": losses, "model": model, "graph": step_fn}


def parse_args(argv: Sequence[str] | None) -> tuple[gpt.Config, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="holoflow-gpt-parallel", description=__doc__.split("\n")[0])
    ap.add_argument("--dp", type=int, default=None, help="data-parallel ranks (mesh axis 0); default world / tp")
    ap.add_argument("--tp", type=int, default=2, help="ranks per tensor-parallel group (mesh axis 1)")
    ap.add_argument("--json", default=None, help="rank 0 writes the losses here")
    ap.add_argument("--graph", action="store_true", help="compile the step as an nn.Graph of global tensors")
    ap.add_argument("--zero", type=int, default=0, choices=(0, 1, 2, 3), help="ZeRO stage of the graph (--graph)")
    ap.add_argument("--auto", action="store_true", help="the graph's layout chosen by auto-parallel (--graph)")
    ap.add_argument("--corpus-chars", type=int, default=gpt.Config.corpus_chars)
    ns, rest = ap.parse_known_args(argv)
    cfg = gpt.parse_args(rest)
    cfg.corpus_chars = ns.corpus_chars
    return cfg, ns


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Trains on every rank of the launched world; rank 0 prints the losses (and writes --json)."""
    cfg, ns = parse_args(argv)
    flow.env.init()
    rank, world = flow.env.get_rank(), flow.env.get_world_size()
    if ns.dp is not None and ns.dp * ns.tp != world:
        raise ValueError(f"holoflow.examples.gpt_parallel: --dp {ns.dp} x --tp {ns.tp} must equal the "
                         f"world size {world}")
    place = mesh(world, ns.tp)
    if rank == 0:
        print(f"holoflow GPT, data x tensor parallel on a {place.hierarchy[0]}x{place.hierarchy[1]} mesh: "
              f"{cfg.n_layer} layers, d={cfg.n_embd}, {cfg.n_head} heads, batch {cfg.batch_size}, "
              f"{cfg.steps} steps")
    out = train_graph(cfg, place, zero=ns.zero, auto=ns.auto) if ns.graph else train(cfg, place)
    if rank == 0 and ns.graph:
        print(out["graph"].explain().split("# holoflow program")[0])
    if rank == 0:
        for i, loss in enumerate(out["train"]):
            if i % max(1, cfg.steps // 20) == 0 or i == cfg.steps - 1:
                print(f"step {i}: loss {loss:.4f}")
        if "comms" in out:
            print(f"collectives per step (rank 0): {out['comms']}")
        if ns.json:
            with open(ns.json, "w") as f:
                json.dump({"train": out["train"], "comms": out.get("comms", {})}, f)
    return out


if __name__ == "__main__":
    main()

"""Run on every rank of the Gloo pool by test_gpt_parallel.py."""
from holoflow.examples import gpt, gpt_parallel


def train_losses(rank: int, cfg: dict, tp: int):
    """gpt_parallel's training on this world; the per-step losses and the last step's collectives."""
    import holoflow as flow
    out = gpt_parallel.train(gpt.Config(**cfg), gpt_parallel.mesh(flow.env.get_world_size(), tp))
    return out["train"], out["comms"]


def graph_losses(rank: int, cfg: dict, tp: int, zero: int, auto: bool = False):
    """The same training compiled as an nn.Graph of global tensors (``--graph``, ``--zero``,
    ``--auto``); the per-step losses and the graph's boxing table."""
    import holoflow as flow
    out = gpt_parallel.train_graph(gpt.Config(**cfg), gpt_parallel.mesh(flow.env.get_world_size(), tp), zero=zero,
                                   auto=auto)
    return out["train"], [(b.src, b.dst, b.node.source) for b in out["graph"].boxing()]

"""Run on every rank of the Gloo pool by test_gpt_parallel.py."""
from holoflow.examples import gpt, gpt_parallel


def train_losses(rank: int, cfg: dict, tp: int):
    """gpt_parallel's training on this world; the per-step losses and the last step's collectives."""
    import holoflow as flow
    out = gpt_parallel.train(gpt.Config(**cfg), gpt_parallel.mesh(flow.env.get_world_size(), tp))
    return out["train"], out["comms"]

"""The environment of a fresh process outside any launched world: torchrun's variables dropped,
holoflow's sources on its path."""
import os

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")
WORLD_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "LOCAL_WORLD_SIZE")


def plain_env(**extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in WORLD_VARS}
    env["PYTHONPATH"] = SRC
    env.update(extra)
    return env

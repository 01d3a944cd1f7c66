"""A training job for the launcher tests (run by ``python -m holoflow.distributed.launch``):
the MLP of ckpt_fns, data parallel over every rank, AdamW, a CheckpointManager (every 2 steps,
keep 2) that it resumes from. Rank 0 appends ``attempt step loss`` lines to OUT/losses.txt.

    train_script.py OUT STEPS [KILL_AT]   (rank 1 SIGKILLs itself before step KILL_AT, first attempt only)
"""
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import holoflow as flow  # noqa: E402
from holoflow.checkpoint import CheckpointManager  # noqa: E402
from holoflow.distributed.global_tensor import from_full  # noqa: E402

import ckpt_fns  # noqa: E402


def main() -> None:
    out, steps = sys.argv[1], int(sys.argv[2])
    kill_at = int(sys.argv[3]) if len(sys.argv) > 3 else -1
    rank = flow.env.get_rank()
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    xs, ys = ckpt_fns.data(steps)
    place, _, data_sbp = ckpt_fns.layout("dp")
    m = ckpt_fns.model("dp")
    opt = flow.optim.AdamW(m.parameters(), lr=0.05, weight_decay=0.01)
    mgr = CheckpointManager(os.path.join(out, "ckpts"), every=2, keep=2)
    start, got = 0, mgr.load(like={"model": m, "optim": opt})
    if got is not None:
        start, ck = got
        m.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optim"])
    for i in range(start, steps):
        if attempt == 0 and i == kill_at and rank == 1:
            os.kill(os.getpid(), signal.SIGKILL)
        loss = ((m(from_full(xs[i], place, data_sbp)) - from_full(ys[i], place, data_sbp)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        value = loss.item()
        if rank == 0:
            with open(os.path.join(out, "losses.txt"), "a") as f:
                f.write(f"{attempt} {i} {value!r}\n")
        mgr.save(i + 1, {"model": m.state_dict(), "optim": opt.state_dict()})
    flow.env.shutdown()


if __name__ == "__main__":
    main()

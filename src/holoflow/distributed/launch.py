"""``python -m holoflow.distributed.launch --nproc_per_node N script.py args``: torchrun underneath.

Starts ``nproc_per_node`` processes per node with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
MASTER_ADDR and MASTER_PORT set, which ``holoflow.env`` reads. Multi-node (``--nnodes``,
``--node_rank``, ``--master_addr``, ``--master_port``), restarts (``--max_restarts``) and
everything else come from ``torch.distributed.run``; options holoflow does not know are passed to
it unchanged (e.g. ``--rdzv_backend c10d --rdzv_endpoint host:port`` for elastic jobs).

Restarts: when a worker dies, the whole group is restarted (TORCHELASTIC_RESTART_COUNT counts
attempts; ``holoflow.env.init`` keys its process group by the attempt). The program resumes from
its last checkpoint, e.g. with ``holoflow.checkpoint.CheckpointManager``; the loop is in
tests/checkpoint/train_script.py. Multi-node on one machine (loopback)::

    python -m holoflow.distributed.launch --nnodes 2 --node_rank 0 --master_port 29500 train.py &
    python -m holoflow.distributed.launch --nnodes 2 --node_rank 1 --master_port 29500 train.py
"""
from __future__ import annotations

import argparse
import sys
from typing import Sequence


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m holoflow.distributed.launch",
                                description="Launch a holoflow program on several processes (via torchrun).")
    p.add_argument("--nproc_per_node", "--nproc-per-node", type=str, default="1",
                   help="processes per node (an int, or torchrun's 'auto', 'cpu', 'gpu')")
    p.add_argument("--nnodes", type=str, default="1", help="number of nodes, or MIN:MAX for elastic jobs")
    p.add_argument("--node_rank", "--node-rank", type=int, default=0, help="this node's rank")
    p.add_argument("--master_addr", "--master-addr", type=str, default="127.0.0.1", help="address of node 0")
    p.add_argument("--master_port", "--master-port", type=int, default=None,
                   help="a free port on node 0 (default: a free port, single node only)")
    p.add_argument("--max_restarts", "--max-restarts", type=int, default=0,
                   help="restarts of the whole worker group after a failure")
    p.add_argument("-m", "--module", action="store_true", help="run the program as a module (python -m)")
    return p


def translate(argv: Sequence[str]) -> list[str]:
    """holoflow's launcher arguments -> ``torch.distributed.run`` arguments."""
    argv = list(argv)
    split = next((i for i, a in enumerate(argv) if not a.startswith("-") and not _is_value(argv, i)), len(argv))
    opts, program = argv[:split], argv[split:]
    if not program:
        raise SystemExit("holoflow.distributed.launch: no script given; usage: "
                         "python -m holoflow.distributed.launch --nproc_per_node N script.py [args]")
    ns, extra = _parser().parse_known_args(opts)
    out = [f"--nproc_per_node={ns.nproc_per_node}", f"--nnodes={ns.nnodes}", f"--max_restarts={ns.max_restarts}"]
    rdzv = any(a.startswith("--rdzv") or a == "--standalone" for a in extra)
    if not rdzv:
        if ns.master_port is None and ns.nnodes in ("1", "1:1"):
            out.append("--standalone")
        else:
            if ns.master_port is None:
                raise SystemExit("holoflow.distributed.launch: --master_port is required with --nnodes > 1")
            out += [f"--node_rank={ns.node_rank}", f"--master_addr={ns.master_addr}", f"--master_port={ns.master_port}"]
    if ns.module:
        out.append("--module")
    return out + extra + program


_VALUED = {"--nproc_per_node", "--nproc-per-node", "--nnodes", "--node_rank", "--node-rank", "--master_addr",
           "--master-addr", "--master_port", "--master-port", "--max_restarts", "--max-restarts",
           "--rdzv_backend", "--rdzv-backend", "--rdzv_endpoint", "--rdzv-endpoint", "--rdzv_id", "--rdzv-id",
           "--rdzv_conf", "--rdzv-conf", "--log_dir", "--log-dir", "--redirects", "--tee", "--monitor_interval",
           "--monitor-interval", "--start_method", "--start-method", "--role", "--local_addr", "--local-addr"}


def _is_value(argv: list[str], i: int) -> bool:
    """Is ``argv[i]`` the value of the option before it (``--nnodes 2``)?"""
    return i > 0 and argv[i - 1] in _VALUED


def main(argv: Sequence[str] | None = None) -> None:
    """Runs ``torch.distributed.run`` with the translated arguments."""
    from torch.distributed import run as torchrun
    torchrun.main(translate(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    main()

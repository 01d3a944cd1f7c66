"""The process environment: rank, world size, and the default process group, set up lazily.

Under ``torchrun`` / ``python -m holoflow.distributed.launch`` the variables RANK, WORLD_SIZE,
LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR and MASTER_PORT describe the world. Reading a rank
needs nothing more; the default process group (Gloo for CPU tensors, plus NCCL for CUDA tensors
when CUDA is available) is created on the first collective or by :func:`init`. Without those
variables the world is one process and no process group is ever created.

Every rank of the world must call :func:`init` (directly or through its first collective):
creating the default group is a rendezvous of all ranks.

On a thread acting as a simulated rank (``world.simulate``) the queries answer as that rank's
process would: its rank, the simulated world's size, one node holding every rank. So a program
that branches on its rank (``if flow.env.get_rank() == 0: print(...)``) runs as on real ranks.
"""
from __future__ import annotations

import datetime
import os
import socket

import torch
import torch.distributed as dist

from ..core.errors import HoloflowError
from . import world

_DEFAULT_TIMEOUT_S = 300.0
_timeout_s: float | None = None  # None: read HOLOFLOW_COMM_TIMEOUT on first use


def _int_env(name: str, default: int) -> int:
    v = os.environ.get(name)
    if v is None or v == "":
        return default
    try:
        return int(v)
    except ValueError:
        raise HoloflowError(f"holoflow.env: environment variable {name}={v!r} is not an integer") from None


def get_rank() -> int:
    """This process's global rank (0 in a world of one); a simulated rank's on its thread."""
    sim = world.simulated_rank()
    if sim is not None:
        return sim
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank()
    return _int_env("RANK", 0)


def get_world_size() -> int:
    """The number of processes in the world (1 without torchrun's variables); the simulated
    world's ranks on a simulated rank's thread."""
    sim = world.simulated_world_size()
    if sim is not None:
        return sim
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return _int_env("WORLD_SIZE", 1)


def get_local_rank() -> int:
    """This process's rank on its node (LOCAL_RANK); a simulated rank's (one node) on its thread."""
    sim = world.simulated_rank()
    if sim is not None:
        return sim
    return _int_env("LOCAL_RANK", get_rank() % get_local_world_size())


def get_local_world_size() -> int:
    """The number of processes on this node (LOCAL_WORLD_SIZE); a simulated world's ranks."""
    sim = world.simulated_world_size()
    if sim is not None:
        return sim
    return _int_env("LOCAL_WORLD_SIZE", get_world_size())


def get_node_size() -> int:
    """The number of nodes: world size / processes per node (a simulated world: one)."""
    if world.simulated_world_size() is not None:
        return 1
    local = _int_env("LOCAL_WORLD_SIZE", 0)
    ws = get_world_size()
    return max(1, ws // local) if local > 0 else 1


def is_multi_process() -> bool:
    """True when the world has more than one process."""
    return get_world_size() > 1


def get_comm_timeout() -> float:
    """Seconds a collective may wait for its peers (HOLOFLOW_COMM_TIMEOUT, default 300)."""
    global _timeout_s
    if _timeout_s is None:
        v = os.environ.get("HOLOFLOW_COMM_TIMEOUT")
        _timeout_s = float(v) if v else _DEFAULT_TIMEOUT_S
    return _timeout_s


def set_comm_timeout(seconds: float) -> None:
    """Sets how long every later collective waits for its peers before raising ``CommError``."""
    global _timeout_s
    if seconds <= 0:
        raise ValueError(f"holoflow.env.set_comm_timeout: seconds must be positive, got {seconds}")
    _timeout_s = float(seconds)


def comm_timeout() -> datetime.timedelta:
    """The configured collective timeout as a ``timedelta``."""
    return datetime.timedelta(seconds=get_comm_timeout())


def backend() -> str:
    """The backend string of the default group: Gloo for CPU, NCCL for CUDA when available."""
    if torch.cuda.is_available() and dist.is_nccl_available():
        return "cpu:gloo,cuda:nccl"
    return "gloo"


def init() -> bool:
    """Creates the default process group from torchrun's variables if the world has more than one
    process; returns whether a group exists. Idempotent; every rank must call it. It reads the
    process's variables alone (a simulated rank's thread sets up its process's group, if any)."""
    if not dist.is_available():
        if _int_env("WORLD_SIZE", 1) > 1:
            raise HoloflowError("holoflow.env.init: torch.distributed is not available in this build")
        return False
    if dist.is_initialized():
        return True
    ws = _int_env("WORLD_SIZE", 1)
    if ws <= 1:
        return False
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise HoloflowError(f"holoflow.env.init: WORLD_SIZE={ws} but {', '.join(missing)} not set; "
                            f"launch with `python -m holoflow.distributed.launch --nproc_per_node N script.py`")
    rank = _int_env("RANK", 0)
    if torch.cuda.is_available():
        local = _int_env("LOCAL_RANK", rank % _int_env("LOCAL_WORLD_SIZE", ws))
        torch.cuda.set_device(local % max(1, torch.cuda.device_count()))
    _import_group_pinning_modules()
    dist.init_process_group(backend(), rank=rank, world_size=ws, timeout=comm_timeout(),
                            store=_restart_store(rank, ws))
    announce()
    return True


def announce() -> None:
    """Writes who runs this rank into the default group's store, so a failed collective can say
    which peer process is gone."""
    store().set(f"holoflow/proc/{dist.get_rank()}", f"{socket.gethostname()} {os.getpid()}")


def _import_group_pinning_modules() -> None:
    """Imports, before the default group exists, torch modules whose functions take
    ``dist.group.WORLD`` as a default argument value (FSDP's ShardedGradScaler): imported after
    ``init_process_group`` (torch._dynamo imports them, and the first meta-tensor shape rule imports
    torch._dynamo) they hold the group forever, ``destroy_process_group`` cannot free it, and its
    Gloo threads, still alive at interpreter finalization, could abort the process ("terminate
    called without an active exception")."""
    import torch.distributed.fsdp.sharded_grad_scaler  # noqa: F401


def _restart_store(rank: int, ws: int):
    """After a restart by the launcher (``--max_restarts``), a store whose keys are this
    attempt's: torch's agent store keeps the dead attempt's Gloo addresses, and the new group
    would connect to them ("Connection refused"). None (torch's own env:// store) otherwise."""
    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    if attempt in ("", "0"):
        return None
    agent_hosts = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), ws,
                         is_master=rank == 0 and not agent_hosts, timeout=comm_timeout())
    return dist.PrefixStore(f"holoflow/attempt_{attempt}", base)


def ensure_initialized() -> None:
    """Initialises the default group if needed (called by every collective)."""
    if not dist.is_initialized():
        init()


def store():
    """The default group's c10d store (collective bookkeeping lives there)."""
    ensure_initialized()
    return dist.distributed_c10d._get_default_store()


def shutdown() -> None:
    """Waits for collectives still in flight (up to the comm timeout), then destroys every process
    group (e.g. at the end of a script); the world is set up again on the next collective."""
    from . import groups
    groups.destroy_world(get_comm_timeout())


def all_device_placement(device_type: str = "cpu"):
    """OneFlow's ``flow.env.all_device_placement``: the placement of every rank of the world on
    ``device_type`` (``flow.placement.all(device_type)``)."""
    from .placement import placement
    return placement.all(device_type)


__all__ = ["all_device_placement", "get_rank", "get_world_size", "get_local_rank", "get_local_world_size",
           "get_node_size", "is_multi_process", "init", "set_comm_timeout", "get_comm_timeout", "shutdown"]

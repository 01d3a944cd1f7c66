"""A minimal multi-rank job that exits without any teardown of its own (run by test_exit.py).

It leaves an asynchronous all-reduce unwaited and a sub-group alive, as real scripts do. An
atexit handler registered before holoflow is imported runs after holoflow's (atexit is LIFO) and
reports whether the process groups were destroyed; one registered after runs first and can still
communicate."""
import atexit
import sys

import torch.distributed as dist


def _after():
    print(f"after-holoflow-exit: initialized={dist.is_initialized()}", flush=True)


atexit.register(_after)

import torch  # noqa: E402

import holoflow as flow  # noqa: E402
from holoflow.distributed import comm  # noqa: E402


def _user_exit():
    x = torch.ones(2)
    comm.all_reduce(x)  # the user's own exit handler still talks to the peers
    print(f"user-exit: sum={x.tolist()}", flush=True)


atexit.register(_user_exit)
flow.env.init()
r = flow.env.get_rank()
comm.all_gather(torch.tensor([float(r)]))
if flow.env.get_world_size() > 2:
    comm.all_reduce(torch.ones(3), (0, 1) if r < 2 else (2, 3))
pending = comm.all_reduce(torch.ones(1000), async_op=True)  # never waited
print(f"main-done rank={r}", flush=True)
sys.exit(0)

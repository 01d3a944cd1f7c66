"""A minimal multi-rank job that exits without any teardown of its own (run by test_exit.py).

It leaves an asynchronous all-reduce unwaited and a sub-group alive, as real scripts do. An
atexit handler registered before holoflow is imported runs after holoflow's (atexit is LIFO) and
reports whether the process groups were destroyed and freed (no Gloo work thread left: a group
still referenced at finalization kept its threads, and one of them could abort the process); one
registered after runs first and can still communicate. The global mean's shape rule runs on meta
tensors, which imports torch._dynamo after the group exists (its import used to pin the group in
one of torch's default argument values)."""
import atexit
import os
import sys

import torch.distributed as dist


def _gloo_threads() -> int:
    """Gloo's work threads alive (they release finished work, whose tensors need the GIL: one doing
    so during finalization aborts). The unwaited work below keeps its Gloo context, and so one
    I/O loop thread, until the module's globals go: that one touches no Python object."""
    names = []
    for t in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{t}/comm") as f:
                names.append(f.read().strip())
        except OSError:
            pass
    return sum(n == "pt_gloo_runloop" for n in names)


def _after():
    print(f"after-holoflow-exit: initialized={dist.is_initialized()} gloo_threads={_gloo_threads()} "
          f"dynamo={'torch._dynamo' in sys.modules}", flush=True)


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
world = flow.placement("cpu", ranks=list(range(flow.env.get_world_size())))
m = flow.ones(4, 6, placement=world, sbp=flow.sbp.split(0)).mean(dim=0)   # a meta-tensor shape rule
assert m.to_global(sbp=flow.sbp.broadcast).to_local().tolist() == [1.0] * 6
if flow.env.get_world_size() > 2:
    comm.all_reduce(torch.ones(3), (0, 1) if r < 2 else (2, 3))
pending = comm.all_reduce(torch.ones(1000), async_op=True)  # never waited
print(f"main-done rank={r}", flush=True)
sys.exit(0)

"""DDP's buffer broadcast follows torch's flag (require_forward_param_sync): a forward broadcasts
the first rank's buffers when the forward before it synchronised gradients (grad mode on, not
inside no_sync()); the first forward always does. (tests/dist/test_parallel_programs.py
evaluates a BatchNorm model after DDP training on Gloo against torch.)"""
import holoflow as flow
from holoflow.distributed import world


def _seen(r):
    """The BatchNorm's running mean at the start of each of five forwards (after DDP's broadcast,
    if any), on rank ``r`` whose batches have mean ``r + 1``."""
    bn = flow.nn.BatchNorm1d(1, momentum=1.0)   # (its running mean: the last training batch's mean)
    seen = []
    bn.register_forward_pre_hook(lambda mod, args: seen.append(mod.running_mean.item()))
    ddp = flow.nn.parallel.DistributedDataParallel(bn)
    x = flow.tensor([[r + 0.5], [r + 1.5]])
    ddp(x).sum().backward()                 # 1: the first forward broadcasts (zeros everywhere)
    ddp.eval()
    with flow.no_grad():
        ddp(x)                              # 2: after a synchronised one: broadcast (rank 0's mean)
    ddp.train()
    with ddp.no_sync():
        ddp(x).sum().backward()             # 3: after a no_grad one: none
    ddp(x).sum().backward()                 # 4: after a no_sync one: none (each rank's own mean)
    ddp(x).sum().backward()                 # 5: after a synchronised one: broadcast
    return seen


def test_ddp_broadcasts_buffers_when_the_previous_forward_synchronised():
    for r, seen in enumerate(world.simulate(2, _seen)):
        assert seen == [0.0, 1.0, 1.0, r + 1.0, 1.0], f"rank {r}: {seen}"

"""A simulated rank (world.simulate) is, to the program it runs, the process of a real rank: it
answers its own rank and world (holoflow.env, torch.distributed under mock_torch), and its local
random ops draw from default generators of its own, forked from the process's, which
``manual_seed`` on the rank seeds alone. Before, every thread answered the process's rank 0 of a
world of one, and all ranks drew from the process's one generator, rank 1 the numbers after
rank 0's, in whatever order the threads ran (core/generators.py; distributed/env.py)."""
import sys

import numpy as np
import pytest

import holoflow as flow
import holoflow.nn.functional as F
from holoflow import mock_torch
from holoflow.distributed import world
from holoflow.sbp import B, S


def _identity(rank: int) -> dict:
    env = flow.env
    return {"rank": env.get_rank(), "world": env.get_world_size(), "local_rank": env.get_local_rank(),
            "local_world": env.get_local_world_size(), "nodes": env.get_node_size(),
            "multi": env.is_multi_process(), "all": list(env.all_device_placement("cpu").ranks)}


def test_env_answers_each_simulated_ranks_identity():
    got = world.simulate(4, _identity)
    assert got == [{"rank": r, "world": 4, "local_rank": r, "local_world": 4, "nodes": 1, "multi": True,
                    "all": [0, 1, 2, 3]} for r in range(4)]
    assert (flow.env.get_rank(), flow.env.get_world_size()) == (0, 1)   # the process, outside


def test_torch_distributed_under_mock_torch_answers_simulated_identity():
    with mock_torch.enable():
        import torch
        import torch.distributed as dist

    def script(rank):
        assert dist.is_available() and dist.is_initialized()
        dist.init_process_group("gloo")   # the simulated world is the group: nothing to set up
        assert dist.get_backend() == "gloo"
        odd = dist.new_group([1, 3])
        t = torch.ones(2) * dist.get_rank()
        dist.all_reduce(t)
        dist.destroy_process_group()   # (the simulated world lives on until simulate returns)
        return (dist.get_rank(), dist.get_world_size(), dist.get_rank(odd), dist.get_world_size(odd),
                dist.get_node_local_rank(), t.tolist())

    got = world.simulate(4, script)
    assert got == [(r, 4, {1: 0, 3: 1}.get(r, -1), 2, r, [6.0, 6.0]) for r in range(4)]
    with mock_torch.enable():
        import torch.distributed as dist
    assert not dist.is_initialized() and dist.get_rank() == 0   # the process, outside


def test_init_process_group_on_a_simulated_rank_refuses_another_ranks_identity():
    with mock_torch.enable():
        import torch.distributed as dist

    def script(rank):
        with pytest.raises(ValueError, match="rank=0, world_size=2 on simulated rank 1 of a simulated world of 2"):
            dist.init_process_group("gloo", rank=0, world_size=2)
        return True
    world.simulate(2, lambda r: script(r) if r == 1 else True)


def test_a_program_branching_on_its_rank_does_per_rank_work():
    said = []

    def program(rank):
        if flow.env.get_rank() == 0:   # OneFlow's examples print on rank 0 only
            said.append(f"loss on rank {flow.env.get_rank()}")
        sampler = flow.utils.data.DistributedSampler(list(range(8)), shuffle=False)   # its rank's share
        return list(sampler)

    assert world.simulate(4, program) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert said == ["loss on rank 0"]


def _draws() -> dict:
    """Local random draws of every kind holoflow makes (the default generator, never one given)."""
    x = flow.ones(16, 8)
    lin = flow.nn.Linear(8, 4)
    out = {"randn": flow.randn(3, 5), "rand": flow.rand(4), "randint": flow.randint(0, 100, (6,)),
           "randperm": flow.randperm(10), "normal": flow.normal(0.0, 2.0, (5,)),
           "normal_tensor": flow.normal(flow.zeros(4), flow.ones(4)),
           "dropout": F.dropout(x, 0.5), "bernoulli": flow.bernoulli(x * 0.3),
           "multinomial": flow.multinomial(flow.ones(2, 6), 3), "uniform_": flow.empty(5).uniform_(),
           "randn_like": flow.randn_like(x), "linear.weight": lin.weight.detach(), "linear.bias": lin.bias.detach(),
           "rrelu": F.rrelu(x - 2, training=True), "gamma": flow.distributions.Gamma(flow.ones(3), 1.0).sample(),
           "attention_dropout": F.scaled_dot_product_attention(x.reshape(2, 8, 8), x.reshape(2, 8, 8),
                                                               x.reshape(2, 8, 8), dropout_p=0.5),
           "sampler": flow.tensor(list(flow.utils.data.RandomSampler(range(12)))),
           "sparse_init": flow.nn.init.sparse_(flow.empty(6, 3), 0.5), "get_rng_state": flow.get_rng_state()}
    return {k: v.numpy() for k, v in out.items()}


def _seeded_draws(seed: int, barrier: bool = False) -> list[dict]:
    """``_draws`` twice after ``manual_seed(seed)``; ``barrier``: every rank seeds, then every rank
    draws (with the threads in lockstep, a shared generator could not pass by chance)."""
    flow.manual_seed(seed)
    runs = []
    for _ in range(2):
        if barrier:
            flow.comm.barrier()
        runs.append(_draws())
    return runs


def _same(a: list[dict], b: list[dict]) -> None:
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            np.testing.assert_array_equal(ra[k], rb[k], err_msg=k)


@pytest.mark.parametrize("n", [2, 4])
def test_seeded_ranks_draw_what_one_seeded_process_draws(n):
    alone = _seeded_draws(0)
    for got in world.simulate(n, lambda r: _seeded_draws(0, barrier=True)):
        _same(got, alone)
    assert flow.initial_seed() == 0


def test_manual_seed_on_a_rank_seeds_that_rank_alone():
    def program(rank):
        flow.manual_seed(100 + rank)
        flow.comm.barrier()   # every rank seeded before any draws
        return flow.initial_seed(), _draws()

    flow.manual_seed(5)
    got = world.simulate(3, program)
    assert flow.initial_seed() == 5 and np.array_equal(flow.randn(4).numpy(), _fresh(5, lambda: flow.randn(4)))
    for r, (seed, draws) in enumerate(got):
        assert seed == 100 + r
        _same([draws], [_fresh(100 + r, _draws)])


def _fresh(seed: int, fn):
    with flow.random.fork_rng():
        flow.manual_seed(seed)
        out = fn()
    return out.numpy() if hasattr(out, "numpy") else out


def test_unseeded_ranks_start_from_the_process_state_and_leave_it_alone():
    flow.manual_seed(11)
    flow.randn(7)   # (somewhere in the stream, not at a seed)
    state = flow.get_rng_state()
    got = world.simulate(2, lambda r: (flow.comm.barrier(), flow.randn(3).numpy(), flow.rand(2).numpy())[1:])
    assert np.array_equal(flow.get_rng_state().numpy(), state.numpy())   # not advanced by the ranks
    want = (flow.randn(3).numpy(), flow.rand(2).numpy())
    for g in got:
        np.testing.assert_array_equal(g[0], want[0])
        np.testing.assert_array_equal(g[1], want[1])


def test_concurrent_ranks_do_not_perturb_each_others_streams():
    """Four ranks drawing freely, each with a seed of its own, the threads switched as often as
    the interpreter can (and started together), get the streams four processes would."""
    def stream() -> np.ndarray:
        return np.concatenate([np.concatenate([flow.randn(17).numpy(), F.dropout(flow.ones(33), 0.5).numpy(),
                                               flow.randperm(9).numpy().astype(np.float32)]) for _ in range(40)])

    def program(rank):
        flow.manual_seed(rank * 7 + 1)
        flow.comm.barrier()
        return stream()

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        runs = [world.simulate(4, program) for _ in range(3)]
    finally:
        sys.setswitchinterval(interval)
    for got in runs:
        for r in range(4):
            np.testing.assert_array_equal(got[r], _fresh(r * 7 + 1, stream))


@pytest.mark.parametrize("sbp", [S(0), B])
def test_a_global_random_tensor_is_the_one_process_draw_of_its_logical_shape(sbp):
    def program(rank):
        flow.manual_seed(3)
        flow.comm.barrier()
        place = flow.placement("cpu", [0, 1, 2, 3])
        g = flow.randn(8, 6, placement=place, sbp=sbp)
        u = flow.rand(4, 4, placement=place, sbp=sbp)
        return g.to_global(sbp=B).to_local().numpy(), u.to_global(sbp=B).to_local().numpy(), flow.randn(2).numpy()

    want = _fresh(3, lambda: [flow.randn(8, 6).numpy(), flow.rand(4, 4).numpy(), flow.randn(2).numpy()])
    for got in world.simulate(4, program):
        for a, b in zip(got, want, strict=True):
            np.testing.assert_array_equal(a, b)


def test_checkpoint_recompute_replays_the_ranks_own_random_state():
    """``utils.checkpoint`` saves and restores the rank's generator, so the recomputed dropout
    masks the forward's and the gradient is the one without checkpointing."""
    def grads(use_checkpoint: bool, sync=lambda: None) -> np.ndarray:
        flow.manual_seed(9)
        sync()
        x = flow.ones(32, requires_grad=True)

        def block(t):
            return F.dropout(t * 2, 0.5)
        y = flow.utils.checkpoint.checkpoint(block, x, use_reentrant=True) if use_checkpoint else block(x)
        flow.randn(5)   # (draws between forward and backward)
        y.sum().backward()
        return x.grad.numpy()

    want = grads(False)
    for got in world.simulate(2, lambda r: grads(True, flow.comm.barrier)):
        np.testing.assert_array_equal(got, want)


def test_fork_rng_and_rng_state_on_a_rank_are_the_ranks():
    def program(rank):
        flow.manual_seed(rank)
        flow.comm.barrier()
        state = flow.get_rng_state()
        with flow.random.fork_rng():
            flow.randn(10)
        a = flow.randn(3).numpy()
        flow.set_rng_state(state)
        return a, flow.randn(3).numpy(), flow.default_generator.initial_seed()

    for r, (a, b, seed) in enumerate(world.simulate(2, program)):
        np.testing.assert_array_equal(a, _fresh(r, lambda: flow.randn(3)))
        np.testing.assert_array_equal(a, b)
        assert seed == r


# -- nn.Graph's local random nodes, holoflow.cuda's seeding ------------------------------------------

class _RandomGraph(flow.nn.Graph):
    """Local random nodes of each kind a graph holds: dropout, random creation (the trace ran
    ``flow.rand``'s kernel for real to learn its shape: a draw from the default generator), a
    sampler with ``generator=None`` attr, an in-place sampler and ``randn_like``."""

    def build(self, x):
        return (F.dropout(x, 0.5), flow.rand(3), flow.randint(0, 50, (4,)), flow.bernoulli(x * 0.3),
                flow.zeros(5).uniform_(), flow.randn_like(x), flow.normal(0.0, 2.0, (3,)), flow.randperm(6))


def _graph_draws(x=None) -> np.ndarray:
    """Two steps of ``_RandomGraph``, an eager draw between them and one after."""
    g, x = _RandomGraph(), flow.ones(6) if x is None else x
    parts = []
    for _ in range(2):
        parts += [o.numpy().astype(np.float64).ravel() for o in g(x)] + [flow.randn(2).numpy().astype(np.float64)]
    return np.concatenate(parts)


def _eager_draws() -> np.ndarray:
    """What ``_graph_draws`` computes, eagerly."""
    x, parts = flow.ones(6), []
    for _ in range(2):
        outs = (F.dropout(x, 0.5), flow.rand(3), flow.randint(0, 50, (4,)), flow.bernoulli(x * 0.3),
                flow.zeros(5).uniform_(), flow.randn_like(x), flow.normal(0.0, 2.0, (3,)), flow.randperm(6))
        parts += [o.numpy().astype(np.float64).ravel() for o in outs] + [flow.randn(2).numpy().astype(np.float64)]
    return np.concatenate(parts)


def test_a_graphs_random_nodes_draw_as_eager_in_one_process():
    """Regression: the trace ran a random creation's kernel for real (``device=None`` was not
    made meta for its shape rule), so a graph holding ``flow.rand`` drew one draw late."""
    want = _fresh(4, _eager_draws)
    np.testing.assert_array_equal(_fresh(4, _graph_draws), want)


def test_a_graphs_random_nodes_on_a_rank_draw_from_the_ranks_generator():
    """Local random nodes of an nn.Graph on simulated ranks draw what eager draws there and what a
    process seeded alike draws (they drew from the process's generator, shared by the ranks),
    and leave the process's stream alone."""
    flow.manual_seed(1)
    state = flow.get_rng_state().numpy()

    def program(rank):
        flow.manual_seed(30 + rank)
        flow.comm.barrier()   # every rank seeded before any draws
        return _graph_draws()

    got = world.simulate(3, program)
    assert np.array_equal(flow.get_rng_state().numpy(), state)
    for r in range(3):
        want = _fresh(30 + r, _eager_draws)
        np.testing.assert_array_equal(got[r], want, err_msg=f"rank {r}")
    assert not np.array_equal(got[0], got[1])


def test_graph_draws_on_four_interleaved_ranks_are_four_processes_draws():
    """The ranks' threads switched as often as the interpreter can, each compiling and running
    its own graph: every rank's stream is its own seed's."""
    def program(rank):
        flow.manual_seed(rank + 100)
        flow.comm.barrier()
        return _graph_draws(flow.ones(40))

    interval = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        got = world.simulate(4, program)
    finally:
        sys.setswitchinterval(interval)
    for r in range(4):
        np.testing.assert_array_equal(got[r], _fresh(r + 100, lambda: _graph_draws(flow.ones(40))))


def test_cuda_seeding_on_a_rank_leaves_the_process_cuda_state_alone():
    """holoflow.cuda's seeding on a simulated rank was torch.cuda's: it queued (on a machine
    without CUDA; on a GPU it did at once) a seeding of the process's CUDA generators, which
    every rank and the process share."""
    import torch
    queued = len(torch.cuda._queued_calls)

    def program(rank):
        flow.cuda.manual_seed(rank)
        flow.cuda.manual_seed_all(rank)
        flow.cuda.seed()
        flow.cuda.seed_all()
        return True

    assert world.simulate(2, program) == [True, True]
    assert len(torch.cuda._queued_calls) == queued


def test_cuda_seeding_on_a_rank_seeds_that_ranks_cuda_generators_alone():
    """``holoflow.cuda.manual_seed`` / ``manual_seed_all`` / ``seed_all`` on a simulated rank seed
    the rank's own CUDA generators (those made later too), as they seed a process's.
    ``manual_seed`` still seeds every device; the CPU's stream is left alone by the CUDA calls."""
    import torch
    from holoflow.core import generators
    queued = len(torch.cuda._queued_calls)

    def program(rank):
        gens = generators.current()
        flow.manual_seed(rank)
        cpu = flow.randn(3).numpy()
        flow.cuda.manual_seed(10 + rank)
        seeds = [(gens.seed_of("cuda:0"), gens.seed_of("cuda:1"))]
        flow.cuda.manual_seed_all(20 + rank)
        seeds.append((gens.seed_of("cuda:0"), gens.seed_of("cuda:1")))
        flow.cuda.manual_seed(30 + rank)   # (device 0: the current one)
        seeds.append((gens.seed_of("cuda:0"), gens.seed_of("cuda:1")))
        flow.cuda.seed_all()
        drawn = gens.seed_of("cuda:0")
        seeds.append(drawn == gens.seed_of("cuda:1") and drawn not in (20 + rank, 30 + rank))
        flow.manual_seed(40 + rank)
        seeds.append((gens.seed_of("cuda:0"), gens.seed_of("cuda:1"), gens.seed_of("cpu")))
        flow.manual_seed(rank)
        return seeds, cpu, flow.randn(3).numpy()

    got = world.simulate(2, program)
    for r, (seeds, cpu, again) in enumerate(got):
        assert seeds == [(10 + r, r), (20 + r, 20 + r), (30 + r, 20 + r), True, (40 + r, 40 + r, 40 + r)]
        np.testing.assert_array_equal(cpu, again)   # (the CUDA calls drew nothing from the CPU's)
    assert len(torch.cuda._queued_calls) == queued   # the process's CUDA state: untouched


def test_cuda_seeding_under_mock_torch_is_the_ranks_and_patches_restore_torchs():
    """torch.cuda's seeding functions under mock_torch are holoflow.cuda's (the rank's), and a
    ``mock.patch("torch.cuda.manual_seed", f)`` through the mock patches torch's own and restores it."""
    from unittest import mock

    import torch as real_torch
    from holoflow.core import generators
    original = real_torch.cuda.manual_seed
    with mock_torch.enable():
        import torch
        assert torch.cuda.manual_seed is flow.cuda.manual_seed is flow.cuda.random.manual_seed
        with mock.patch("torch.cuda.manual_seed", lambda s: None):
            assert real_torch.cuda.manual_seed is not original
    assert real_torch.cuda.manual_seed is original and flow.cuda.manual_seed is flow.cuda.random.manual_seed

    def program(rank):
        torch.cuda.manual_seed_all(7 * rank)
        return generators.current().seed_of("cuda:0")
    assert world.simulate(2, program) == [0, 7]


# -- against real ranks --------------------------------------------------------------------------

def _rank_program(rank: int) -> dict:
    """Seeded apart per rank, then local draws and a global one: what a rank answers and draws."""
    place = flow.placement("cpu", [0, 1])
    flow.manual_seed(20 + rank)
    out = {"rank": flow.env.get_rank(), "world": flow.env.get_world_size(),
           "randn": flow.randn(4, 3).numpy(), "dropout": F.dropout(flow.ones(20), 0.5).numpy(),
           "randperm": flow.randperm(12).numpy(), "linear": flow.nn.Linear(3, 2).weight.detach().numpy()}
    g = flow.randn(6, 2, placement=place, sbp=S(0))
    out["global"] = g.to_global(sbp=B).to_local().numpy()
    out["global_dropout"] = F.dropout(flow.ones(8, 4, placement=place, sbp=S(1)), 0.5).to_global(sbp=B) \
        .to_local().numpy()
    out["after"] = flow.rand(3).numpy()
    out["graph"] = _graph_draws()   # local random nodes of nn.Graph: the rank's generator
    flow.cuda.manual_seed(5 + rank)   # (CUDA's generators: the CPU's stream goes on)
    flow.cuda.manual_seed_all(9)
    out["after_cuda_seeding"] = flow.randn(3).numpy()
    return out


def _on_gloo(rank: int) -> dict:
    return _rank_program(rank)


def test_simulated_ranks_draw_and_answer_as_gloo_ranks(world2):
    real = world2.run(_on_gloo)
    simulated = world.simulate(2, _rank_program)
    for r in range(2):
        assert (simulated[r]["rank"], simulated[r]["world"]) == (r, 2)
        assert real[r].keys() == simulated[r].keys()
        for k in real[r]:
            np.testing.assert_array_equal(simulated[r][k], real[r][k], err_msg=f"rank {r}: {k}")
    assert not np.array_equal(simulated[0]["randn"], simulated[1]["randn"])   # (seeded apart)


def _torch_ddp_script(rank: int) -> dict:
    """A torch data-parallel script, unchanged under mock_torch: seeds, a model from rank 0 (DDP's
    broadcast), each rank's share of the data, averaged gradients, and object collectives."""
    with mock_torch.enable():
        import torch
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP
        from torch.utils.data import DataLoader, DistributedSampler

    torch.manual_seed(dist.get_rank())   # (models differ until DDP broadcasts rank 0's)
    model = DDP(torch.nn.Linear(4, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    data = [(torch.full((4,), float(i)), torch.full((2,), float(i % 3))) for i in range(8)]
    loader = DataLoader(data, batch_size=2, sampler=DistributedSampler(data, shuffle=True, seed=1))
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(model(torch.nn.functional.dropout(x, 0.25)), y).backward()
        opt.step()
    objs = [{"from": dist.get_rank()}]
    dist.broadcast_object_list(objs, src=1)
    every = [None] * dist.get_world_size()
    dist.all_gather_object(every, (dist.get_rank(), "hi"))
    # point to point: send/recv, batch_isend_irecv, and isends waited for after later irecvs
    rank, peer = dist.get_rank(), 1 - dist.get_rank()
    got = torch.zeros(2)
    if rank == 0:
        dist.send(model.module.bias.detach() * 3, dst=1)
        dist.recv(got, src=1)
    else:
        dist.recv(got, src=0)
        dist.send(got + 1, dst=0)
    came = torch.zeros(3, dtype=torch.float64)
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.arange(3.0, dtype=torch.float64) + 10 * rank, peer),
                                    dist.P2POp(dist.irecv, came, peer)])
    for w in works:
        w.wait()
    first, second = torch.zeros(2), torch.zeros(4)
    sends = [dist.isend(torch.full((2,), 1.0 + rank), peer), dist.isend(torch.arange(4.0) * (rank + 2), peer)]
    recvs = [dist.irecv(first, peer), dist.irecv(second, peer)]
    for w in recvs + sends:
        w.wait()
    return {"weight": model.module.weight.detach().numpy(), "bias": model.module.bias.detach().numpy(),
            "objs": objs, "every": every, "p2p": [got.tolist(), came.tolist(), first.tolist(), second.tolist()]}


def test_a_torch_ddp_script_on_simulated_ranks_runs_as_on_gloo_ranks(world2):
    real = world2.run(_torch_ddp_script)
    simulated = world.simulate(2, _torch_ddp_script)
    for r in range(2):
        assert simulated[r]["objs"] == real[r]["objs"] == [{"from": 1}]
        assert simulated[r]["every"] == real[r]["every"] == [(0, "hi"), (1, "hi")]
        assert simulated[r]["p2p"] == real[r]["p2p"]
        assert real[r]["p2p"][1:] == [[10.0 * (1 - r) + i for i in range(3)], [2.0 - r] * 2,
                                      [i * (3.0 - r) for i in range(4)]]
        for k in ("weight", "bias"):
            np.testing.assert_array_equal(simulated[r][k], real[r][k], err_msg=f"rank {r}: {k}")
    np.testing.assert_array_equal(simulated[0]["weight"], simulated[1]["weight"])   # (averaged gradients)


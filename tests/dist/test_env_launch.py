"""holoflow.env in workers and in a plain process; the public flow.comm API on holoflow Tensors;
the launcher end to end."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

import holoflow as flow
from holoflow.distributed import launch
from plain_env import plain_env

SRC = os.path.join(os.path.dirname(__file__), "..", "..", "src")


def _env(rank):
    e = flow.env
    return (e.get_rank(), e.get_world_size(), e.get_local_rank(), e.get_local_world_size(), e.get_node_size(),
            e.is_multi_process())


def test_env_in_workers(world2, world4):
    assert world2.run(_env) == [(r, 2, r, 2, 1, True) for r in range(2)]
    assert world4.run(_env) == [(r, 4, r, 4, 1, True) for r in range(4)]


def test_env_world_of_one_in_a_plain_process():
    code = textwrap.dedent("""
        import holoflow as flow, torch, torch.distributed as dist
        e = flow.env
        assert (e.get_rank(), e.get_world_size(), e.get_local_rank(), e.get_node_size()) == (0, 1, 0, 1)
        assert not e.is_multi_process() and e.init() is False
        x = flow.ones(3); flow.comm.all_reduce(x); flow.comm.barrier(); flow.comm.broadcast(x, 0)
        assert x.tolist() == [1.0, 1.0, 1.0]
        assert not dist.is_initialized()
        print("ok")
    """)
    out = subprocess.run([sys.executable, "-c", code], env=plain_env(), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_comm_timeout_setting(monkeypatch):
    from holoflow.distributed import env
    monkeypatch.setattr(env, "_timeout_s", None)
    monkeypatch.setenv("HOLOFLOW_COMM_TIMEOUT", "12.5")
    assert env.get_comm_timeout() == 12.5
    env.set_comm_timeout(3)
    assert env.comm_timeout().total_seconds() == 3
    with pytest.raises(ValueError):
        env.set_comm_timeout(0)


def _public_api(rank):
    n = flow.env.get_world_size()
    x = flow.ones(2) * (rank + 1)
    with flow.comm.count() as c:
        flow.comm.all_reduce(x)
    assert x.tolist() == [n * (n + 1) / 2] * 2 and c.counts["all_reduce"] == 1
    outs = [flow.zeros(r + 1) for r in range(n)]
    flow.comm.all_gather(outs, flow.ones(rank + 1) * rank)
    assert [o.tolist() for o in outs] == [[float(r)] * (r + 1) for r in range(n)]
    out = flow.zeros(2)
    flow.comm.reduce_scatter(out, [flow.ones(2) * (i + rank) for i in range(n)])
    assert out.tolist() == [float(n * rank + n * (n - 1) / 2)] * 2
    b = flow.tensor([float(rank)])
    flow.comm.broadcast(b, n - 1)
    assert b.item() == n - 1
    got = [flow.zeros(s + 1) for s in range(n)]
    flow.comm.all_to_all(got, [flow.full((rank + 1,), float(10 * rank + d)) for d in range(n)])
    assert [g.tolist() for g in got] == [[float(10 * s + rank)] * (s + 1) for s in range(n)]
    if rank == 0:
        flow.comm.send(flow.tensor([5.0, 6.0]), 1)
    elif rank == 1:
        r = flow.comm.recv(flow.zeros(2), 0)
        assert r.tolist() == [5.0, 6.0]
    gl = [flow.zeros(1) for _ in range(n)] if rank == 0 else None
    flow.comm.gather(flow.tensor([float(rank)]), gl, dst=0)
    if rank == 0:
        assert [g.item() for g in gl] == list(range(n))
    s = flow.zeros(2)
    flow.comm.scatter(s, [flow.full((2,), float(i)) for i in range(n)] if rank == 0 else None, src=0)
    assert s.tolist() == [float(rank)] * 2
    flow.comm.barrier()
    h = flow.comm.all_reduce(x, op=flow.comm.ReduceOp.MAX, async_op=True)
    h.wait()
    return True


def test_public_comm_api(world2, world4):
    assert world2.run(_public_api) == [True] * 2
    assert world4.run(_public_api) == [True] * 4


def test_launch_translates_arguments():
    assert launch.translate(["--nproc_per_node", "2", "s.py", "--lr", "1"]) == [
        "--nproc_per_node=2", "--nnodes=1", "--max_restarts=0", "--standalone", "s.py", "--lr", "1"]
    assert launch.translate(["--nnodes", "2", "--node_rank", "1", "--master_addr", "h", "--master_port", "99",
                             "--max_restarts", "3", "train.py"]) == [
        "--nproc_per_node=1", "--nnodes=2", "--max_restarts=3", "--node_rank=1", "--master_addr=h",
        "--master_port=99", "train.py"]
    with pytest.raises(SystemExit):
        launch.translate(["--nproc_per_node", "2"])


SCRIPT = """
import os
import holoflow as flow
x = flow.ones(3) * (flow.env.get_rank() + 1)
flow.comm.all_reduce(x)
line = f"rank {flow.env.get_rank()}/{flow.env.get_world_size()} local {flow.env.get_local_rank()}: {x.tolist()}"
os.write(1, (line + "\\n").encode())  # one write: the ranks share stdout
"""


def test_launcher_end_to_end(tmp_path):
    script = tmp_path / "allreduce.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1")
    out = subprocess.run([sys.executable, "-m", "holoflow.distributed.launch", "--nproc_per_node", "2", str(script)],
                         env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = sorted(re.findall(r"rank \d/\d local \d: \[[^\]]*\]", out.stdout))
    assert lines == ["rank 0/2 local 0: [3.0, 3.0, 3.0]", "rank 1/2 local 1: [3.0, 3.0, 3.0]"], out.stdout

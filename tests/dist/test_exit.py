"""Multi-rank processes exit cleanly: holoflow's atexit handler waits for collectives in flight and
destroys the process groups while the interpreter is whole (no "terminate called without an active
exception"), after the user's own atexit handlers, which may still communicate."""
import os
import subprocess
import sys
import time

from pool import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src")
RUNS, AT_ONCE, WORLD = 4, 4, 2


def _start(port: int) -> list[subprocess.Popen]:
    procs = []
    for r in range(WORLD):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(WORLD), LOCAL_RANK=str(r), LOCAL_WORLD_SIZE=str(WORLD),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1", HOLOFLOW_COMM_TIMEOUT="60",
                   PYTHONPATH=os.pathsep.join([SRC, os.environ.get("PYTHONPATH", "")]))
        procs.append(subprocess.Popen([sys.executable, os.path.join(HERE, "exit_job.py")], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    return procs


def test_runs_exit_cleanly():
    """RUNS two-rank runs (AT_ONCE at a time): every rank exits 0, its user exit handler could still
    all-reduce, and the groups were destroyed and freed (no Gloo thread left) before the interpreter
    was torn down, also after a meta shape rule imported torch._dynamo."""
    bad = []
    t0 = time.monotonic()
    for start in range(0, RUNS, AT_ONCE):
        batch = [_start(free_port()) for _ in range(min(AT_ONCE, RUNS - start))]
        for procs in batch:
            for r, p in enumerate(procs):
                try:
                    out, _ = p.communicate(timeout=240)
                except subprocess.TimeoutExpired:
                    p.kill()
                    out, _ = p.communicate()
                    bad.append((r, "hung", out))
                    continue
                ok = (p.returncode == 0 and "terminate called" not in out and f"main-done rank={r}" in out
                      and "user-exit: sum=[2.0, 2.0]" in out and "after-holoflow-exit: initialized=False gloo_threads=0 dynamo=True" in out)
                if not ok:
                    bad.append((r, p.returncode, out[-2000:]))
    assert not bad, f"{len(bad)} of {RUNS * WORLD} rank processes exited badly: {bad[:2]}"
    assert time.monotonic() - t0 < 600

"""Through the launcher: a rank killed mid-training restarts the job (--max_restarts), which
resumes from the last checkpoint; two launchers with --nnodes 2 on loopback form one world. The
losses equal an uninterrupted single-process run. Bounded by timeouts; ports chosen free."""
import os
import signal
import subprocess
import sys

import torch

import ckpt_fns
from pool import free_port

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src")
SCRIPT = os.path.join(HERE, "train_script.py")
STEPS, TIMEOUT_S = 7, 240


def _env():
    return dict(os.environ, PYTHONPATH=SRC, OMP_NUM_THREADS="1", HOLOFLOW_COMM_TIMEOUT="60")


def _launch(args, out):
    return subprocess.Popen([sys.executable, "-m", "holoflow.distributed.launch", *args, SCRIPT, str(out), str(STEPS),
                             *([] if "--max_restarts" not in args else ["3"])],
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)


def _finish(procs):
    """Each launcher's output; one still running after TIMEOUT_S is killed with its workers."""
    outs = []
    for p in procs:
        try:
            outs.append(p.communicate(timeout=TIMEOUT_S)[0])
        except subprocess.TimeoutExpired:
            for q in procs:
                if q.poll() is None:
                    os.killpg(q.pid, signal.SIGKILL)
            raise AssertionError(f"a launcher ran past {TIMEOUT_S}s: {p.args}\n{p.communicate()[0][-3000:]}") from None
    return outs


def _losses(out):
    rows = [line.split() for line in (out / "losses.txt").read_text().splitlines()]
    return [(int(a), int(s), float(v)) for a, s, v in rows]


def _expected():
    return ckpt_fns.train(0, "single", ckpt_fns.data(STEPS), 0, STEPS)


def test_killed_rank_restarts_and_resumes_from_the_last_checkpoint(tmp_path):
    (out,) = [tmp_path]
    proc = _launch(["--nproc_per_node", "2", "--max_restarts", "1"], out)
    (log,) = _finish([proc])
    assert proc.returncode == 0, log[-3000:]
    rows = _losses(out)
    first = [s for a, s, _ in rows if a == 0]
    second = [s for a, s, _ in rows if a == 1]
    assert first == [0, 1, 2], f"attempt 0 should stop when rank 1 dies before step 3: {rows}"
    assert second == list(range(2, STEPS)), f"attempt 1 should resume from the step-2 checkpoint: {rows}"
    last = {s: v for _, s, v in rows}
    torch.testing.assert_close(torch.tensor([last[s] for s in range(STEPS)]), torch.tensor(_expected()),
                               rtol=1e-5, atol=1e-6)
    ckpts = sorted(os.listdir(out / "ckpts"))
    assert ckpts == ["latest", "step-00000004", "step-00000006"], ckpts   # every=2, keep=2


def test_two_launchers_with_nnodes_2_on_loopback_train_as_one_world(tmp_path):
    port = free_port()
    common = ["--nnodes", "2", "--nproc_per_node", "1", "--master_addr", "127.0.0.1", "--master_port", str(port)]
    procs = [_launch([*common, "--node_rank", str(k)], tmp_path) for k in (0, 1)]
    logs = _finish(procs)
    assert [p.returncode for p in procs] == [0, 0], "\n----\n".join(log[-2000:] for log in logs)
    rows = _losses(tmp_path)
    assert [s for _, s, _ in rows] == list(range(STEPS))
    torch.testing.assert_close(torch.tensor([v for _, _, v in rows]), torch.tensor(_expected()), rtol=1e-5, atol=1e-6)

"""DataLoader workers under mock_torch, and every worker failure reaching the main process as an
exception naming the worker and the cause (each script runs in a subprocess with a deadline, so
a hang fails the test instead of stalling the suite)."""
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SRC = str(Path(__file__).resolve().parents[2] / "src")

PRELUDE = """
import os, sys
sys.path.insert(0, {src!r})
from holoflow import mock_torch
mock_torch.enable()
import torch
from torch.utils.data import DataLoader, Dataset, TensorDataset
"""


def _run(body: str, timeout: float = 90) -> subprocess.CompletedProcess:
    code = PRELUDE.format(src=SRC) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout)


def test_workers_under_mock_torch_give_the_single_process_batches():
    r = _run("""
        ds = TensorDataset(torch.arange(40.).reshape(20, 2), torch.arange(20))
        torch.manual_seed(0)
        a = [(x.tolist(), y.tolist()) for x, y in DataLoader(ds, batch_size=3, shuffle=True)]
        torch.manual_seed(0)
        b = [(x.tolist(), y.tolist()) for x, y in DataLoader(ds, batch_size=3, shuffle=True, num_workers=2)]
        kinds = {type(x).__module__ for x, _ in DataLoader(ds, batch_size=4, num_workers=2)}
        assert a == b and len(a) == 7, (a, b)
        print("OK", kinds)
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    assert "OK {'holoflow.core.tensor'}" in r.stdout


@pytest.mark.parametrize("case,cls,pattern", [
    ("raise", "KeyError", r"Caught KeyError in DataLoader worker process \d.*no item 5"),
    ("unpicklable", "PicklingError|AttributeError|TypeError", r"worker process \d while pickling its batch"),
    ("exit", "RuntimeError", r"worker \d \(pid \d+, exit code 3\) exited unexpectedly"),
])
def test_worker_failure_reaches_the_main_process(case, cls, pattern):
    r = _run(f"""
        class Bad(Dataset):
            def __len__(self):
                return 8
            def __getitem__(self, i):
                if i == 5 and {case!r} == "raise":
                    raise KeyError("no item 5")
                if i == 5 and {case!r} == "exit":
                    os._exit(3)
                return torch.ones(2) * i
        collate = (lambda b: (lambda: b)) if {case!r} == "unpicklable" else None
        try:
            for _ in DataLoader(Bad(), batch_size=2, num_workers=2, collate_fn=collate):
                pass
        except Exception as e:
            print("RAISED", type(e).__name__, "|", str(e).replace(chr(10), " "))
        else:
            print("NO ERROR")
    """)
    assert r.returncode == 0, r.stderr[-3000:]
    import re
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith(("RAISED", "NO ERROR")))
    assert re.match(rf"RAISED ({cls}) \|", line), line
    assert re.search(pattern, line), line

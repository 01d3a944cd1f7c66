"""runtime/heap.py: importing holoflow raises glibc's heap thresholds (one 4 MiB mmapped block freed),
so a few-MiB buffer freed and allocated again every step stays in the heap instead of being
returned to the kernel and faulted in again; ``HOLOFLOW_HEAP_WARMUP=0`` leaves glibc alone."""
import os
import platform
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc",
                                reason="glibc's malloc thresholds")

CHILD = r"""
import ctypes, resource
import holoflow
libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
n = 3 << 20
def step():
    p = libc.malloc(n)
    ctypes.memset(p, 1, n)     # touch every page, as a step's activations are written
    libc.free(p)
step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for _ in range(20):
    step()
print((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 20)
"""


def _faults_per_step(warmup: str) -> float:
    env = {**os.environ, "HOLOFLOW_HEAP_WARMUP": warmup}
    out = subprocess.run([sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return float(out.stdout.split()[-1])


def test_a_freed_step_buffer_is_not_faulted_in_again():
    warm, cold = _faults_per_step("1"), _faults_per_step("0")
    assert warm < 1, warm          # reused from the heap (measured 0)
    assert cold > 10, cold         # glibc's start values: given back and faulted in again (measured ~38)

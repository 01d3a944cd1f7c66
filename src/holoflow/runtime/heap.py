"""glibc's heap thresholds, raised once at import (``HOLOFLOW_HEAP_WARMUP=0`` leaves them alone).

glibc returns the top of its heap to the kernel when more than ``2 x mmap_threshold`` is free
there, and it raises that threshold only when a larger block that it had mmapped is freed. A
training step frees most of its activations at the end of backward, from the heap top down, so
with glibc's start value (128 KiB, trimming at 2 MiB past the first freed block of ~1 MiB) every
step gives a few MiB back and faults them in again in the next forward: ~100-350 minor page
faults per step of a small CNN, each step 5-30% longer, run to run. torch processes get higher
thresholds by accident (importing ``torch._dynamo``, as torch's optimizers do, frees a ~2 MiB
block). Freeing one 4 MiB mmapped block at import sets them as glibc itself would (mmap
threshold 4 MiB, trim threshold 8 MiB) and keeps glibc's own adjustment; measured faults per
CNN step: 88-118 -> 0.4-1.5 (bench/eager.py reports them).
"""
from __future__ import annotations

import ctypes
import os
import platform

WARMUP_BYTES = 4 << 20


def warm_glibc_heap() -> bool:
    """Frees one ``WARMUP_BYTES`` block through glibc's malloc (once per process; a no-op elsewhere
    or with ``HOLOFLOW_HEAP_WARMUP=0``); returns whether it did."""
    if os.environ.get("HOLOFLOW_HEAP_WARMUP", "1") == "0" or platform.system() != "Linux" \
            or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return False
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    block = libc.malloc(WARMUP_BYTES)   # above the start threshold: mmapped; freeing it raises it
    if not block:
        return False
    libc.free(block)
    return True

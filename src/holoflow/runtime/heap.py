"""glibc's heap thresholds, set once at import (``HOLOFLOW_GLIBC_HEAP=0`` leaves them alone).

A training step allocates its activations as it goes forward and frees most of them at the end
of backward, from the top of the heap down. glibc gives the free top of its heap back to the
kernel once it exceeds the *trim threshold*, and serves blocks above the *mmap threshold* from
fresh mappings unmapped again on free; either way the next step faults every page in again
(a minor fault and a zeroed page each). glibc starts both at 128 KiB and raises them only when
a larger mapped block is freed (the mmap threshold to its size, at most 32 MiB; the trim
threshold to twice that): a step of a small CNN faulted 100-350 pages in; the GPT of bench/dp_overlap.py
(d=128, 4 layers, batch 16, ~25 MiB of activations) faulted 2,500-6,500 pages per step, on one
rank and not the other depending on the heap's layout.

So holoflow sets both, as a training process wants them: blocks up to 32 MiB (glibc's largest
mmap threshold) come from the heap, and the heap top is never given back while the process
runs (the next step needs it again; :func:`release` gives it back on demand). A block larger
than 32 MiB is still mapped and unmapped each time, as in torch. A user's own settings
(``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_MMAP_THRESHOLD_``, ``GLIBC_TUNABLES`` with malloc tunables)
are left as they are.
"""
from __future__ import annotations

import ctypes
import os
import platform

M_TRIM_THRESHOLD = -1      # mallopt parameters (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 32 << 20  # glibc's largest on 64-bit (HEAP_MAX_SIZE / 2)
NEVER = -1                 # a trim threshold of SIZE_MAX: the top is never trimmed

_USER_KNOBS = ("MALLOC_TRIM_THRESHOLD_", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TOP_PAD_")


def _libc() -> ctypes.CDLL | None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return None
    try:
        return ctypes.CDLL("libc.so.6")
    except OSError:
        return None


def tune_glibc_heap() -> bool:
    """Sets the mmap threshold to 32 MiB and turns trimming off (once per process; a no-op off
    glibc, with ``HOLOFLOW_GLIBC_HEAP=0``, or when the user set glibc's malloc knobs); returns
    whether it did."""
    if os.environ.get("HOLOFLOW_GLIBC_HEAP", "1") == "0" or any(k in os.environ for k in _USER_KNOBS) \
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""):
        return False
    libc = _libc()
    if libc is None:
        return False
    libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    return bool(libc.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(libc.mallopt(M_TRIM_THRESHOLD, NEVER))


def release() -> bool:
    """Gives the heap's free memory back to the kernel now (glibc's ``malloc_trim(0)``): after
    training, before a long phase that needs less memory. Returns whether any was given back."""
    libc = _libc()
    if libc is None:
        return False
    libc.malloc_trim.argtypes = [ctypes.c_size_t]
    return bool(libc.malloc_trim(0))

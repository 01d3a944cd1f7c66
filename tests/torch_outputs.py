"""torch's side of the differential tests, recorded once per program.

A test that launches a torch program and holoflow's twin of it compares holoflow's outputs with
torch's; torch's do not depend on holoflow's code. ``recorded(name, parts, run)`` returns torch's
outputs for the program ``parts`` describes: from the committed store (tests/torch_reference/)
where the entry holds the key of ``parts`` on this machine, else from ``run()`` (torch, live, as
before the store existed) with a ``TorchRanLive`` warning naming the entry. The key hashes
everything torch's run depends on: the program's full text, the text of the harness code that
runs it (command, environment), the world size, torch's version, Python's, and the machine's
kernels (OS, architecture, CPU vendor, the vector width torch dispatches to, the environment
variables that steer them). Change a character of any of them and the entry misses, so a changed
program or a new torch is compared with a fresh run of torch, never with stale outputs
(tests/dist/test_torch_reference.py).

Refreshing the store (a maintainer's command; torch runs for every entry, and an entry file is
rewritten only where its outputs or key changed)::

    HOLOFLOW_RECORD_TORCH=1 python -m pytest tests/dist
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import sys
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

STORE = Path(__file__).parent / "torch_reference"
RECORD_VAR = "HOLOFLOW_RECORD_TORCH"
_NAMED: dict = {}   # entry name -> key, this session: two programs may not share an entry


class TorchRanLive(UserWarning):
    """An entry of the store missed: torch ran live (correct, only slower). Refresh the store."""


# environment variables that steer torch's kernels (ATEN_CPU_CAPABILITY, MKL_CBWR, ONEDNN_MAX_CPU_ISA, ...);
# not Intel OpenMP's KMP_* (scikit-learn's import sets two; torch's wheels run GNU OpenMP)
_KERNEL_ENV = ("ATEN_", "MKL_", "DNNL_", "ONEDNN_", "TORCH_", "PYTORCH_")


@lru_cache(maxsize=None)
def _cpu_vendor() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def machine() -> dict:
    """What torch's outputs depend on besides the program: its version and the kernels it picks here."""
    import torch
    return {"torch": torch.__version__, "python": "%d.%d" % sys.version_info[:2], "os": sys.platform,
            "arch": platform.machine(), "cpu_vendor": _cpu_vendor(),
            "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(_KERNEL_ENV)}}


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def key(parts: dict) -> str:
    """The store key of a program: a hash of ``parts`` (its text, its harness's text, its world
    size...) and of this machine's ``machine()``."""
    return _digest({"program": parts, "machine": machine()})


def path(name: str) -> Path:
    return STORE / f"{name}.json"


def _entries(name: str) -> list:
    try:
        return json.loads(path(name).read_text())["entries"]
    except FileNotFoundError:
        return []


def lookup(name: str, parts: dict) -> Any | None:
    """The stored outputs of entry ``name`` if it holds ``parts``'s key on this machine, else None."""
    k = key(parts)
    return next((e["outputs"] for e in _entries(name) if e["key"] == k), None)


def _why_missed(name: str) -> str:
    entries, here = _entries(name), machine()
    if not entries:
        return "nothing recorded"
    if any(e["machine"] == here for e in entries):
        return "its program, harness or world size changed since the recording"
    theirs = entries[0]["machine"]
    return "recorded for another torch or machine (" + ", ".join(
        f"{k}: {theirs.get(k)!r} there, {v!r} here" for k, v in here.items() if theirs.get(k) != v) + ")"


def recording() -> bool:
    return os.environ.get(RECORD_VAR) == "1"


def recorded(name: str, parts: dict, run: Callable[[], Any]) -> Any:
    """torch's outputs (JSON values) of the program ``parts`` describes: the store's, or ``run()``'s.

    Under ``HOLOFLOW_RECORD_TORCH=1`` torch always runs and the entry file is rewritten where it
    changes: this machine's outputs replaced, other machines' kept for the same program text,
    every entry of another text dropped.
    """
    if _NAMED.setdefault(name, key(parts)) != key(parts):
        raise ValueError(f"two programs share the torch_reference entry {name!r}: name them apart")
    if not recording():
        stored = lookup(name, parts)
        if stored is not None:
            return stored
        warnings.warn(TorchRanLive(f"torch ran live for {name!r}: {_why_missed(name)} (refresh: "
                                   f"{RECORD_VAR}=1 python -m pytest tests/dist)"), stacklevel=2)
        return run()
    outputs = json.loads(json.dumps(run()))   # as they will read back
    old, program = _entries(name), _digest(parts)
    new = [e for e in old if e["program"] == program and e["machine"] != machine()]
    new.append({"key": key(parts), "program": program, "machine": machine(), "outputs": outputs})
    if new != old:
        STORE.mkdir(exist_ok=True)   # (not sort_keys: some tests compare the outputs' key order)
        path(name).write_text(json.dumps({"entries": new}, separators=(",", ":")) + "\n")
    return outputs

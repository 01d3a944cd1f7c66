"""The checkpoint file on disk: atomic replacement, temp files of killed saves, and telling a
holoflow/safetensors file from a ``torch.save`` one by its content.

Saving writes ``<target>.holoflow-tmp-<pid>`` next to the target, fsyncs it and ``os.replace``-s
it over the target (:func:`temp_path`, :func:`fsync_dir`); a temp file whose process is gone is
deleted by the next save of that target (:func:`clean_stale_temps`). Sharded directories use the
same names for their temp directories.

:func:`sniff` recognises a format by content: a safetensors file is one whose header parses as
JSON with tensor entries inside the file; a torch zip starts with the zip signature; a legacy
``torch.save`` file is a pickle (first byte 0x80).
"""
from __future__ import annotations

import json
import os
import re
import shutil
import struct
from typing import BinaryIO

__all__ = ["TEMP_TAG", "temp_path", "clean_stale_temps", "fsync_dir", "sniff", "read_header"]

TEMP_TAG = ".holoflow-tmp-"
MAX_HEADER = 100 * 1024 * 1024   # safetensors' own limit on the JSON header


# -- temp files ------------------------------------------------------------------------------
def temp_path(target: str) -> str:
    """A fresh temp name next to ``target``: ``<target>.holoflow-tmp-<pid>`` (``-<n>`` added
    while that exists, e.g. another thread of this process saving the same target)."""
    base = f"{target}{TEMP_TAG}{os.getpid()}"
    tmp, n = base, 0
    while os.path.lexists(tmp):
        n += 1
        tmp = f"{base}-{n}"
    return tmp


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError):
        return True   # someone else's live process (or a pid we can't check): keep its file
    return True


def clean_stale_temps(target: str) -> list[str]:
    """Deletes ``<target>.holoflow-tmp-<pid>[-n]`` files/directories whose process is gone (a
    save killed mid-way); returns what it deleted. Temps of live processes are left alone."""
    directory = os.path.dirname(os.path.abspath(target)) or "."
    prefix = os.path.basename(target) + TEMP_TAG
    pattern = re.compile(re.escape(prefix) + r"(\d+)(-\d+)?$")
    removed = []
    try:
        names = os.listdir(directory)
    except OSError:
        return removed
    for name in names:
        m = pattern.match(name)
        if m is None or _pid_alive(int(m.group(1))):
            continue
        full = os.path.join(directory, name)
        try:
            if os.path.isdir(full) and not os.path.islink(full):
                shutil.rmtree(full)
            else:
                os.unlink(full)
            removed.append(full)
        except FileNotFoundError:
            pass   # another process cleaned it first
    return removed


def fsync_dir(directory: str) -> None:
    """Makes a rename inside ``directory`` durable (best effort)."""
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# -- recognising formats ---------------------------------------------------------------------
def sniff(f: BinaryIO, size: int) -> str:
    """The format of an open file by content: 'safetensors', 'zip', 'pickle', 'empty' or a
    sentence saying why it is none of them. A safetensors file is recognised only if its
    header is JSON whose entries lie inside the file; only then is anything else ruled out."""
    head = f.read(8)
    if not head:
        return "empty"
    st_error = None
    if len(head) == 8:
        (n,) = struct.unpack("<Q", head)
        if 2 <= n <= min(MAX_HEADER, size - 8):
            is_json, st_error = _check_st_header(f.read(n), size - 8 - n)
            if st_error is None:
                return "safetensors"
            if is_json:   # a JSON header: a (damaged) safetensors file, whatever its first byte
                return st_error
        else:
            st_error = f"the first 8 bytes give a header length of {n} for a file of {size} bytes"
    else:
        st_error = f"only {size} bytes"
    if head.startswith(b"PK\x03\x04"):
        return "zip"
    if head[:1] == b"\x80":
        return "pickle"
    return st_error


def _check_st_header(raw: bytes, body: int) -> tuple[bool, str | None]:
    """(is it a JSON object, None or what is wrong): is ``raw`` a safetensors header whose
    tensors lie in a body of ``body`` bytes?"""
    try:
        header = json.loads(raw)
    except (ValueError, UnicodeDecodeError, RecursionError):
        return False, "the safetensors header is not JSON"
    if not isinstance(header, dict):
        return False, "the safetensors header is not a JSON object"
    for k, v in header.items():
        if k == "__metadata__":
            continue
        offs = v.get("data_offsets") if isinstance(v, dict) else None
        if not (isinstance(offs, list) and len(offs) == 2 and all(isinstance(o, int) for o in offs)
                and 0 <= offs[0] <= offs[1]):
            return True, f"safetensors tensor {k!r} has no valid data_offsets"
        if offs[1] > body:
            return True, (f"truncated safetensors file: tensor {k!r} ends at byte {offs[1]} of the data, "
                          f"but the file holds only {body} data bytes")
    return True, None


def read_header(data: bytes) -> dict:
    """The JSON header of safetensors bytes (already recognised by :func:`sniff`)."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8:8 + n])

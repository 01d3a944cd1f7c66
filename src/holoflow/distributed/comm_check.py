"""Fingerprints: every rank verifies that its peers make the same collective before any payload moves.

Without this, ranks that issue different collectives pair up wrongly: an extra all-reduce of the
same size silently sums the wrong tensors, and one of another size aborts the process inside Gloo.
So before each payload collective, the members all-gather a small int64 *fingerprint* over the same
process group: the call's sequence number on the group, its kind, dtype, element count, a hash of
its shape, a hash of the user's source line (the first frame outside holoflow and torch), and the
call's description and site as text (for the message). All fingerprints have the same size on a
group, so the exchange itself can never mismatch. Every rank sees every fingerprint, so on a
mismatch every rank raises the same :class:`CommError`, naming each rank's call and user line,
before anything is sent (the process groups stay in step).

Point-to-point calls exchange fingerprints with their peer (a tagged send/recv pair): a ``send``
must meet a ``recv`` of the same dtype and size.

Two different lines are meant to pair up (the two branches of ``if rank == 0``)? Give them one
name with :func:`call_site`; the check then compares the name instead of the line.

The fingerprints travel on a side channel of direct TCP connections (:mod:`.comm_wire`), written
and read by the calling thread: ~10-30 us per collective on two local ranks, where one more Gloo
all-gather cost 0.2-3 ms (``bench/boxing.py --fingerprint-only`` measures it against the payload;
groups of more than ``comm_track.WIRE_MAX_GROUP`` ranks all-gather them over Gloo instead).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools
import os
import sys
import zlib
from typing import Any, Iterator, Sequence

import torch

_MAGIC = 0x484F4C4F
_HEAD = 8       # magic, seq, kind, dtype, numel, shape hash, site hash, flags
_TEXT = 6       # int64 words (48 bytes) per text field: the description, then the site
_FIXED = _HEAD + 2 * _TEXT
P2P_TAG = 0x4846  # fingerprints of send/recv travel under their own tag
_CMP_SHAPE = 1  # flag: element count and shape must agree (everything but all_to_all and barrier)

_DTYPES = [torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32,
           torch.int16, torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128]
_DTYPE_IDS = {d: i for i, d in enumerate(_DTYPES)}
_DTYPE_NAMES = {d: str(d).replace("torch.", "") for d in _DTYPES}
_PKG = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
_TORCH = os.path.dirname(os.path.abspath(torch.__file__))
_SKIP: dict[Any, bool] = {}
_SITE: contextvars.ContextVar[str | None] = contextvars.ContextVar("holoflow_call_site", default=None)


@contextlib.contextmanager
def call_site(name: str) -> Iterator[None]:
    """Collectives inside are identified by ``name`` instead of their source line, so calls made
    from different lines on different ranks (``if rank == 0: ... else: ...``) may pair up."""
    tok = _SITE.set(f"call_site({name!r})")
    try:
        yield
    finally:
        _SITE.reset(tok)


def user_site() -> str:
    """``"dir/file.py:line"`` of the innermost frame outside holoflow and torch (or the call's
    :func:`call_site` name)."""
    label = _SITE.get()
    if label is not None:
        return label
    f = sys._getframe(1)
    last = None
    while f is not None:
        code = f.f_code
        skip = _SKIP.get(code)
        if skip is None:
            fn = os.path.abspath(code.co_filename)
            skip = _SKIP[code] = fn.startswith((_PKG + os.sep, _TORCH + os.sep)) \
                or code.co_filename.startswith("<frozen")
        if not skip:
            return f"{_short(code.co_filename)}:{f.f_lineno}"
        last = last or f
        f = f.f_back
    return f"{_short(last.f_code.co_filename)}:{last.f_lineno}" if last is not None else "<unknown>"


_PROGRAM = "<holoflow program #"   # the file name of an nn.Graph's generated program (graph/ir.py)


def _short(path: str) -> str:
    if path.startswith(_PROGRAM):
        # numbered per process in compile order: ranks that compiled different numbers of plans
        # before (a pipeline's ranks off a stage build none) run one graph's program under
        # different numbers; its line is what identifies the call
        return "<holoflow program>"
    parts = os.path.normpath(path).split(os.sep)
    return "/".join(parts[-2:])


@functools.lru_cache(maxsize=4096)
def _crc(s: str) -> int:
    return zlib.crc32(s.encode())


@functools.lru_cache(maxsize=4096)
def _pack_text(s: str, tail: bool = False) -> tuple[int, ...]:
    """Up to 48 bytes of ``s`` (its end when ``tail``) as int64 words."""
    raw = s.encode()
    b = (raw[-8 * _TEXT:] if tail else raw[:8 * _TEXT]).ljust(8 * _TEXT, b"\0")
    return tuple(int.from_bytes(b[i:i + 8], "little", signed=True) for i in range(0, len(b), 8))


def _unpack_text(words: Sequence[int]) -> str:
    b = b"".join(int(w).to_bytes(8, "little", signed=True) for w in words)
    return b.rstrip(b"\0").decode(errors="replace")


def describe(kind: str, t: torch.Tensor | None) -> str:
    if t is None:
        return kind
    dt = str(t.dtype).replace("torch.", "")
    return f"{kind}({dt}{list(t.shape)})"


def fingerprint(seq: int, kind: str, t: torch.Tensor | None, site: str, size: int,
                splits: tuple[Sequence[int], Sequence[int]] | None = None) -> list[int]:
    """This rank's fingerprint of a call on a group of ``size`` ranks, as int64 words
    (``splits``: all_to_all's per-rank send and receive element counts, in group order)."""
    if t is not None:
        dtype = _DTYPE_IDS.get(t.dtype, -1)
        numel = t.numel()
        shape = tuple(t.shape)
        shape_h = _crc(repr(shape))
        desc = _pack_text(f"{kind}({_DTYPE_NAMES.get(t.dtype) or str(t.dtype).replace('torch.', '')}{list(shape)})")
    else:
        dtype, numel, shape_h, desc = -1, 0, 0, _pack_text(kind)
    flags = _CMP_SHAPE if splits is None and t is not None else 0
    ins, outs = splits if splits is not None else ((0,) * size, (0,) * size)
    return [_MAGIC, seq, _crc(kind), dtype, numel, shape_h, _crc(site), flags,
            *desc, *_pack_text(site, tail=True), *ins, *outs]


def _site_of(row: list[int]) -> str:
    return _unpack_text(row[_HEAD + _TEXT:_FIXED])


def _desc_of(row: list[int]) -> str:
    return f"{_unpack_text(row[_HEAD:_HEAD + _TEXT])} at {_site_of(row)}"


def mismatch(rows: list[list[int]], ranks: Sequence[int], me: int, p2p: bool = False) -> str | None:
    """Why the fingerprints ``rows`` (one per rank of ``ranks``, in order) disagree, or None."""
    mine = rows[ranks.index(me)]
    if any(r[0] != _MAGIC for r in rows):
        return "a peer's fingerprint is corrupt (did it call torch.distributed directly, bypassing holoflow?)"
    if p2p:
        a, b = rows
        kinds = {_crc("send"): "send", _crc("recv"): "recv"}
        if {kinds.get(a[2]), kinds.get(b[2])} != {"send", "recv"} or a[1] != b[1] or a[3:5] != b[3:5]:
            return "a send must meet a recv of the same dtype and size, as the k-th message between two ranks"
        return None
    seqs = {r[1] for r in rows}
    if len(seqs) > 1:
        return (f"the ranks are at different call numbers on this group ({sorted(seqs)}): an earlier "
                f"collective failed on some ranks only")
    if any(r[2] != mine[2] for r in rows):
        return "different kinds of collective"
    if any(r[3] != mine[3] for r in rows):
        return "different dtypes"
    if any(r[6] != mine[6] for r in rows):
        return "the same kind of collective from different source lines (an extra or a missing call)"
    if mine[7] & _CMP_SHAPE and any(r[4:6] != mine[4:6] for r in rows):
        return "different shapes"
    n = len(ranks)
    if not mine[7] & _CMP_SHAPE and any(rows[i][_FIXED + j] != rows[j][_FIXED + n + i]
                                        for i in range(n) for j in range(n)):
        return "what each rank sends does not match what its peers expect to receive"
    return None


def mismatch_error(reason: str, rows: list[list[int]], ranks: Sequence[int], me: int, seq: int):
    """The CommError every rank raises: each distinct call, with the ranks that made it."""
    from .comm_track import CommError
    by_call: dict[str, list[int]] = {}
    for r, row in zip(ranks, rows):
        by_call.setdefault(_desc_of(row), []).append(r)
    calls = "; ".join(f"rank{'s' if len(rs) > 1 else ''} {', '.join(map(str, rs))}: {d}" for d, rs in by_call.items())
    return CommError(
        f"holoflow.comm: mismatched collectives on group {list(ranks)} (call #{seq}, seen from rank {me}): "
        f"{reason}. {calls}. Every rank of a group must issue the same collectives in the same order "
        f"with matching dtypes and shapes; nothing was sent. If two different lines are meant to pair up "
        f"(the branches of `if rank == ...`), wrap both in `with holoflow.comm.call_site(\"name\"):`.")


__all__ = ["call_site", "user_site", "fingerprint", "mismatch", "mismatch_error", "describe"]

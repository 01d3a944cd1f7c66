"""A pool of rank processes for multi-process tests, started once and reused.

``World(n)`` starts ``n`` processes (one CPU thread each) that form a Gloo world on localhost
through ``holoflow.env.init()`` with torchrun's variables. Each is a fresh process forked from a
fork server that imported torch and holoflow once for the session (rank_preload.py) and did
nothing else: a start costs a fork instead of two imports per rank (a 4-rank world started in
~35 s on a loaded 2-core box, ~0.1 s forked); the rank then takes the starting process's
environment and working directory, as a spawned one would. ``world.run(fn, *args)``
runs the top-level function ``fn(rank, *args)`` on every rank and returns the per-rank results;
a failure on any rank raises an AssertionError carrying that rank's traceback. The world is
restarted before the next call after anything that may leave it out of step: a failing rank, a
rank that died, a call that timed out, or a collective that raised ``CommError``.
"""
from __future__ import annotations

import importlib
import inspect
import multiprocessing as mp
from multiprocessing import forkserver
import os
import socket
import sys
import time
import traceback
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = os.path.join(HERE, "..", "..", "src")
COMM_TIMEOUT_S = 30.0


def free_port() -> int:
    """A TCP port free on localhost right now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _context():
    """The fork server's context, with torch and holoflow imported in the server (once). The server
    finds rank_preload and this checkout's holoflow on the path it starts with (PYTHONPATH: it does
    not take this process's sys.path)."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["rank_preload"])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = os.pathsep.join([HERE, SRC] + ([saved] if saved else []))
    try:
        forkserver.ensure_running()  # started once; later calls find it running
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    return ctx


def _worker(rank: int, size: int, port: int, conn, comm_timeout: float, environ: dict, cwd: str) -> None:
    os.environ.clear()  # the starting process's, now (the server's is the one it had at the first start)
    os.environ.update(environ)
    try:
        os.chdir(cwd)
    except OSError:
        pass
    os.environ.update(OMP_NUM_THREADS="1", RANK=str(rank), WORLD_SIZE=str(size), LOCAL_RANK=str(rank),
                      LOCAL_WORLD_SIZE=str(size), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                      HOLOFLOW_COMM_TIMEOUT=str(comm_timeout))
    import torch
    torch.set_num_threads(1)
    for p in (SRC, os.path.join(HERE, ".."), HERE):
        if p not in sys.path:
            sys.path.insert(0, p)
    import holoflow as flow
    from holoflow.distributed import comm_track
    try:
        flow.env.init()
        conn.send(("ready", os.getpid()))
    except BaseException:  # noqa: B036 - report anything to the parent
        conn.send(("err", traceback.format_exc(), True))
        os._exit(1)
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            break
        if msg is None:
            break
        path, module, name, args = msg
        failures = comm_track.FAILURES
        try:
            if path not in sys.path:
                sys.path.insert(0, path)
            fn = getattr(importlib.import_module(module), name)
            reply = ("ok", fn(rank, *args))
        except BaseException:  # noqa: B036
            reply = ("err", traceback.format_exc())
        flow.env.set_comm_timeout(comm_timeout)
        comm_track.set_tracking(True)
        try:
            conn.send(reply + (comm_track.FAILURES != failures,))
        except Exception:  # noqa: BLE001 - an unpicklable result
            conn.send(("err", traceback.format_exc(), True))
    os._exit(0)  # skip torch's process-group teardown: peers may be gone


class World:
    """``n`` rank processes with a Gloo process group; see the module docstring."""

    def __init__(self, size: int, timeout: float = 120.0, comm_timeout: float = COMM_TIMEOUT_S) -> None:
        self.size, self.timeout, self.comm_timeout = size, timeout, comm_timeout
        self.procs: list = []
        self.conns: list = []
        self.starts = 0  # how many times the world was (re)started

    # -- life cycle ------------------------------------------------------------------------
    def start(self) -> None:
        ctx = _context()
        port = free_port()
        environ, cwd = dict(os.environ), os.getcwd()
        for rank in range(self.size):
            parent, child = ctx.Pipe()
            p = ctx.Process(target=_worker, args=(rank, self.size, port, child, self.comm_timeout, environ, cwd),
                            daemon=True)
            p.start()
            child.close()
            self.procs.append(p)
            self.conns.append(parent)
        self.starts += 1
        replies = self._collect(self.timeout)
        bad = [(r, x) for r, x in enumerate(replies) if x[0] != "ready"]
        if bad:
            self.close()
            raise AssertionError(f"world of {self.size} failed to start: " + "\n".join(f"rank {r}: {x}" for r, x in bad))

    def close(self) -> None:
        for c in self.conns:
            try:
                c.send(None)
            except (OSError, BrokenPipeError):
                pass
        for p in self.procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
        for c in self.conns:
            c.close()
        self.procs, self.conns = [], []

    @property
    def alive(self) -> bool:
        return bool(self.procs) and all(p.is_alive() for p in self.procs)

    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    # -- running ---------------------------------------------------------------------------
    def run_raw(self, fn: Callable, *args: Any, timeout: float | None = None) -> list[tuple]:
        """Runs ``fn(rank, *args)`` on every rank; per rank ``("ok", value, broken)``,
        ``("err", traceback, broken)``, ``("dead", exitcode)`` or ``("timeout",)``."""
        if not self.alive:
            self.close()
            self.start()
        msg = (os.path.dirname(os.path.abspath(inspect.getfile(fn))), fn.__module__, fn.__qualname__, args)
        for c in self.conns:
            c.send(msg)
        replies = self._collect(timeout or self.timeout)
        if any(x[0] != "ok" or x[-1] for x in replies):
            self.close()  # out of step, or dead: start afresh on next use
        return replies

    def run(self, fn: Callable, *args: Any, timeout: float | None = None) -> list:
        """Runs ``fn(rank, *args)`` on every rank and returns the results by rank; raises an
        AssertionError with the failing ranks' tracebacks if any rank failed."""
        replies = self.run_raw(fn, *args, timeout=timeout)
        bad = [(r, x) for r, x in enumerate(replies) if x[0] != "ok"]
        if bad:
            lines = [f"{fn.__qualname__} failed on a world of {self.size}:"]
            for r, x in bad:
                detail = {"err": lambda: x[1], "dead": lambda: f"process died (exit code {x[1]})",
                          "timeout": lambda: f"no answer within {timeout or self.timeout}s"}[x[0]]()
                lines.append(f"--- rank {r}: {detail}")
            raise AssertionError("\n".join(lines))
        return [x[1] for x in replies]

    def _collect(self, timeout: float) -> list[tuple]:
        deadline = time.monotonic() + timeout
        replies: list[tuple | None] = [None] * self.size
        first_error = None
        while any(r is None for r in replies):
            now = time.monotonic()
            if first_error is not None:  # the others may wait on the failed rank: give them a moment
                deadline = min(deadline, first_error + 3.0)
            if now > deadline:
                break
            for r, (c, p) in enumerate(zip(self.conns, self.procs)):
                if replies[r] is not None:
                    continue
                if c.poll(0.01):
                    try:
                        replies[r] = c.recv()
                    except EOFError:
                        p.join(timeout=1)
                        replies[r] = ("dead", p.exitcode)
                elif not p.is_alive():
                    replies[r] = ("dead", p.exitcode)
                if replies[r] is not None and replies[r][0] not in ("ok", "ready") and first_error is None:
                    first_error = time.monotonic()
        return [r if r is not None else ("timeout",) for r in replies]


def fresh_world(size: int, **kw: Any) -> World:
    """A world of its own (not the shared pool), for tests that kill ranks."""
    w = World(size, **kw)
    w.start()
    return w


def summed_world_size(rank: int) -> int:
    """A rank function: the world size as one all-reduce of ones counts it (the world works)."""
    import torch

    from holoflow.distributed import comm
    x = torch.ones(1)
    comm.all_reduce(x)
    return int(x.item())


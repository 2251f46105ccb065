"""Bounded worker processes for parsing untrusted files (PDF, DOCX, XLSX, HTML).

Why processes and not threads: a thread can be neither killed nor memory-bounded, so a PDF
whose page tree loops or a zip bomb in an XLSX would hold a thread (and the memory it grabbed)
until the daemon stops. A child process runs with `RLIMIT_AS` set (the address space it may
map, so an allocation past it raises MemoryError there and nowhere else) and is killed when a
job outlives its time. The children stay warm between jobs: pypdf, python-docx, openpyxl and
trafilatura are imported once, and `pdf_info` on a thousand pages costs the parse, not a start.

The child is `python -m daemon.parsing.child`, spoken to over its stdin and stdout,
one JSON line per job and per answer. Its job table is fixed in `child.py`: the parent names a
job, never a module or a path it cannot vouch for. `call` blocks; the daemon calls it through
`asyncio.to_thread`, so the event loop never waits on a parse.
"""

from __future__ import annotations

import atexit
import json
import os
import select
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

from daemon.core import confine
from daemon.core.child_env import child_env
from daemon.core.errors import DocumentError
from daemon.core.logs import store_log as log

MEMORY_MB = 1024  # address space per child: far above a parse of a sane file, far below the box
TIMEOUT = 20.0  # seconds per job; a search that needs longer stops early and says where
# A new child's start (interpreter, confinement, the parsers' imports) is not the job's time: on
# a loaded box it took the whole 20 s, and every document read "took too long" (issue 48).
START_TIMEOUT = 120.0
SIZE = 2  # children at most: two documents at once, and a stuck one does not block all


@dataclass(frozen=True)
class Limits:
    memory_mb: int = MEMORY_MB
    timeout: float = TIMEOUT
    size: int = SIZE


class _Child:
    """One worker process and the unread part of its answers."""

    def __init__(self, memory_mb: int) -> None:
        # No shell, our own interpreter, a fixed module; stderr dropped (pypdf warns a lot
        # about damaged files, and those warnings are not ours to log). The environment is
        # the allow list's, not roost's: that holds the channels' tokens, which a parser
        # exploited by a hostile file must not find. Plus where our modules are.
        env = child_env({"PYTHONPATH": os.pathsep.join(p for p in sys.path if p),
                         "LANG": "C.UTF-8"})
        self.proc = subprocess.Popen(
            confine.wrapped([sys.executable, "-m", "daemon.parsing.child",
                             str(memory_mb)]),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
            close_fds=True, env=env, cwd="/")
        self.buffer = b""

    def call(self, job: str, args: list[Any], timeout: float) -> Any:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps({"job": job, "args": args}).encode() + b"\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _TimedOut
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _Died
            self.buffer += chunk
        line, _, self.buffer = self.buffer.partition(b"\n")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        for stream in (self.proc.stdin, self.proc.stdout):
            if stream is not None:
                try:
                    stream.close()
                except OSError:  # a broken pipe to a killed child: nothing left to flush
                    pass


class _TimedOut(DocumentError):
    pass


class _Died(DocumentError):
    pass


class WorkerPool:
    """Up to `limits.size` warm children; each job gets one to itself."""

    def __init__(self, limits: Limits = Limits()) -> None:
        self.limits = limits
        self._idle: list[_Child] = []
        self._slots = threading.BoundedSemaphore(limits.size)
        self._lock = threading.Lock()
        self.started = 0  # children started so far (a killed one is replaced)

    def call(self, job: str, *args: Any, timeout: float | None = None) -> Any:
        """Run a job of `child.JOBS` in a child; its result, or DocumentError with a message
        that says what went wrong (the file's fault, the time or the memory bound)."""
        timeout = self.limits.timeout if timeout is None else timeout
        with self._slots:
            child = self._take()
            try:
                answer = child.call(job, list(args), timeout)
            except _TimedOut:
                child.stop()
                log.warning("document job %s killed after %.0f s", job, timeout)
                raise DocumentError(f"reading it took longer than {timeout:.0f} s, so I "
                                    "stopped; the file may be damaged or built to hang "
                                    "readers") from None
            except (_Died, OSError, ValueError):
                child.stop()
                log.warning("document worker died during %s", job)
                raise DocumentError("the reader crashed on this file (it may be damaged or "
                                    "built to exhaust memory)") from None
            if answer.get("fatal"):  # out of memory: that child is not to be trusted again
                child.stop()
            else:
                self._give_back(child)
        if "error" in answer:
            raise DocumentError(str(answer["error"]))
        return answer["ok"]

    def warm(self) -> None:
        """Start one child ahead of the first document (the daemon calls it at start)."""
        self.call("ping")

    def idle_pids(self) -> list[int]:
        """Process ids of the workers waiting for a job."""
        with self._lock:
            return [child.proc.pid for child in self._idle]

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for child in idle:
            child.stop()

    def _take(self) -> _Child:
        with self._lock:
            while self._idle:
                child = self._idle.pop()
                if child.proc.poll() is None:
                    return child
                child.stop()
            self.started += 1
        child = _Child(self.limits.memory_mb)
        try:
            child.call("ping", [], START_TIMEOUT)
        except (_TimedOut, _Died, OSError, ValueError):
            child.stop()
            log.warning("a document worker did not start within %.0f s", START_TIMEOUT)
            raise DocumentError("the document reader did not start; try again in a "
                                "moment") from None
        return child

    def _give_back(self, child: _Child) -> None:
        with self._lock:
            self._idle.append(child)


_shared: WorkerPool | None = None
_shared_lock = threading.Lock()


def shared_pool() -> WorkerPool:
    """The process's pool, started on first use and stopped at exit."""
    global _shared
    with _shared_lock:
        if _shared is None:
            _shared = WorkerPool()
            atexit.register(_shared.close)
        return _shared

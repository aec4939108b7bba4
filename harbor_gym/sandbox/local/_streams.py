"""The output of a local sandbox's commands, bounded on the host: pipes read into capped sinks, and a drainer for
what processes left behind keep writing (SPEC GYM-10: host disk and memory grow by at most the stated caps).

A command's stdout and stderr are pipes, never host files: a host file would grow with everything the command (or a
process of the sandbox that reopens it through ``/proc/<pid>/fd``) writes, whatever the output cap. `collect` reads
both pipes while the command runs, keeps the first ``cap`` bytes of each (`Sink`), counts the rest and drops it,
feeds ``stdin``, and returns when the command itself exits (its pidfd), or at the timeout. A pipe that processes
left behind still hold is handed to the sandbox's `Drainer`, which reads and drops until they close it, so that
they never block on a full pipe nor die of SIGPIPE (a service started with ``&`` keeps logging, as before); the
drainer ends with the sandbox.
"""

from __future__ import annotations

import errno
import os
import selectors
import subprocess
import threading
import time
from typing import BinaryIO

__all__ = ["Sink", "collect", "Drainer"]

_CHUNK = 1 << 16


class Sink:
    """Keeps the first ``cap`` bytes fed to it (in memory, or written to ``file``) and counts all of them.
    With ``halt_past_cap``, `collect` stops the command as soon as more than ``cap`` bytes came."""

    def __init__(self, cap: int, file: BinaryIO | None = None, *, halt_past_cap: bool = False) -> None:
        self.cap = cap
        self.file = file
        self.halt_past_cap = halt_past_cap
        self.head = bytearray()
        self.size = 0

    def feed(self, data: bytes) -> None:
        keep = max(0, min(len(data), self.cap - self.size))
        if keep:
            if self.file is not None:
                self.file.write(data[:keep])
            else:
                self.head += data[:keep]
        self.size += len(data)


def _read_now(fd: int, sink: Sink) -> bool:
    """Read what ``fd`` holds now (non-blocking); True at end of file."""
    os.set_blocking(fd, False)
    while True:
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            return True
        if not data:
            return True
        sink.feed(data)


def collect(proc: subprocess.Popen, pipes: dict[int, Sink], *, stdin_fd: int | None, stdin: bytes | None,
            timeout: float | None, drainer: "Drainer") -> bool:
    """Read ``pipes`` (read end -> sink) and write ``stdin`` until ``proc`` exits or ``timeout`` passes.

    Returns:
        True iff the timeout passed first, or a ``halt_past_cap`` sink overflowed (the caller kills the process
        group and reaps ``proc``).

    After return every read end is closed or owned by ``drainer``; the stdin pipe is closed.
    """
    sel = selectors.DefaultSelector()
    pidfd = os.pidfd_open(proc.pid)
    sel.register(pidfd, selectors.EVENT_READ, "exit")
    for fd in pipes:
        sel.register(fd, selectors.EVENT_READ, "out")
    view = memoryview(stdin or b"")
    if stdin_fd is not None:
        os.set_blocking(stdin_fd, False)
        if view:
            sel.register(stdin_fd, selectors.EVENT_WRITE, "in")
        else:
            os.close(stdin_fd)
            stdin_fd = None
    open_fds = set(pipes)
    deadline = None if timeout is None else time.monotonic() + timeout
    exited = timed_out = False
    try:
        while not exited:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                timed_out = True
                break
            for key, _ in sel.select(left):
                if key.data == "exit":
                    exited = True
                elif key.data == "in":
                    try:
                        n = os.write(stdin_fd, view[:_CHUNK])
                        view = view[n:]
                    except BlockingIOError:
                        continue
                    except OSError:  # the command closed its stdin (EPIPE): the rest is not wanted
                        view = view[:0]
                    if not view:
                        sel.unregister(stdin_fd)
                        os.close(stdin_fd)
                        stdin_fd = None
                else:
                    try:
                        data = os.read(key.fd, _CHUNK)
                    except OSError:
                        data = b""
                    if data:
                        sink = pipes[key.fd]
                        sink.feed(data)
                        if sink.halt_past_cap and sink.size > sink.cap:
                            timed_out = exited = True  # stop reading: the caller kills the command
                    else:
                        sel.unregister(key.fd)
                        open_fds.discard(key.fd)
                        os.close(key.fd)
    finally:
        sel.close()
        os.close(pidfd)
        if stdin_fd is not None:
            os.close(stdin_fd)
    for fd in sorted(open_fds):
        if timed_out or not _read_now(fd, pipes[fd]):
            drainer.adopt(fd)  # a process left behind still holds the pipe
        else:
            os.close(fd)
    return timed_out


class Drainer:
    """One daemon thread per sandbox that reads and drops what left-behind processes write into adopted pipes,
    closing each at its end of file; `close` stops it and closes every pipe (their writers then get EPIPE)."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._lock = threading.Lock()
        self._pending: list[int] = []
        self._thread: threading.Thread | None = None
        self._wake_r, self._wake_w = -1, -1
        self._closed = False

    def adopt(self, fd: int) -> None:
        with self._lock:
            if self._closed:
                os.close(fd)
                return
            if self._thread is None:
                self._wake_r, self._wake_w = os.pipe()
                self._thread = threading.Thread(target=self._loop, name=f"harbor-gym-drain-{self._name}",
                                                daemon=True)
                self._thread.start()
            self._pending.append(fd)
        try:
            os.write(self._wake_w, b"x")
        except OSError as exc:
            if exc.errno != errno.EAGAIN:
                raise

    def _loop(self) -> None:
        sel = selectors.DefaultSelector()
        sel.register(self._wake_r, selectors.EVENT_READ, None)
        fds: set[int] = set()
        try:
            while True:
                for key, _ in sel.select():
                    if key.fd == self._wake_r:
                        os.read(self._wake_r, 4096)
                        with self._lock:
                            if self._closed:
                                return
                            pending, self._pending = self._pending, []
                        for fd in pending:
                            os.set_blocking(fd, False)
                            sel.register(fd, selectors.EVENT_READ, None)
                            fds.add(fd)
                        continue
                    try:
                        data = os.read(key.fd, _CHUNK)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if not data:
                        sel.unregister(key.fd)
                        fds.discard(key.fd)
                        os.close(key.fd)
        finally:
            sel.close()
            for fd in fds:
                os.close(fd)
            with self._lock:
                for fd in self._pending:
                    os.close(fd)
                self._pending = []

    def close(self) -> None:
        """Stop the thread and close every adopted pipe. Idempotent, never raises."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            thread = self._thread
        if thread is None:
            return
        try:
            os.write(self._wake_w, b"x")
        except OSError:
            pass
        thread.join(timeout=5)
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass

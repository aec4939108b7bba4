"""One command in a Docker container: the POSIX-sh wrapper, the attached-stream reader and the timeout kill.

Design (DockerSandbox.exec): the command runs under a small ``sh`` wrapper that starts it in its own session
(``setsid``; ``set -m`` where setsid is missing) with stdout/stderr going to files in a private temporary folder,
prints the command's pid, waits for it, then emits the files (each capped with ``head -c``) on the exec's own
stdout/stderr and a trailer with the exit code and the full sizes. Background processes the command leaves behind
hold the files, not the attached stream, so the call returns as soon as the command ends. Two engine requests
per command (exec create + attached start); the exit code comes from the trailer, not an extra inspect. The stream
is read from the socket under the SDK's HTTP reply, after the bytes that reply's buffered reader took with the
headers (`start_attached`): the SDK's own readers drop those, which loses a fast command's whole output.

Timeout: the host reads the stream against the deadline; when it passes, one root exec kills the command's
whole process group (``kill -KILL -- -pid``), the wrapper then reports what was captured, and the result has
``timed_out=True``. A stream that ends without a trailer means the container died: `SandboxError` naming it.
Needs only ``sh`` and coreutils or busybox (``mktemp``, ``head``, ``stat``, ``rm``).
"""

from __future__ import annotations

import socket
import struct
import time
from dataclasses import dataclass

__all__ = ["WRAPPER", "wrap", "StreamResult", "start_attached", "read_stream", "read_all", "kill_command",
           "cut_marker"]

WRAPPER = r"""cap=$1; shift
d=$(mktemp -d "${TMPDIR:-/tmp}/.hg-exec.XXXXXX") || { echo "harbor_gym: mktemp failed" >&2; exit 125; }
exec 3<&0
if command -v setsid >/dev/null 2>&1; then
  setsid "$@" <&3 3<&- >"$d/o" 2>"$d/e" &
else
  set -m; "$@" <&3 3<&- >"$d/o" 2>"$d/e" &
fi
p=$!
exec 3<&-
printf 'P%s\n' "$p"
wait "$p"; rc=$?
[ "$rc" -gt 128 ] && sleep 0.1
head -c "$cap" "$d/o"; head -c "$cap" "$d/e" >&2
sz=$(stat -c %s "$d/o" "$d/e")
rm -rf "$d"
printf '\036HG %s %s %s\n' "$rc" $sz >&2
exit "$rc"
"""

_TRAILER = b"\x1eHG "


def wrap(argv: list[str], cap: int) -> list[str]:
    """The exec argv running ``argv`` under the wrapper with output capped at ``cap`` bytes per stream."""
    return ["/bin/sh", "-c", WRAPPER, "harbor-gym-exec", str(cap), *argv]


def cut_marker(cap: int, total: int) -> str:
    """The marker appended to an output cut at ``cap`` of ``total`` bytes (same text as `truncate_output`)."""
    return f"\n[... harbor_gym: output cut at {cap} bytes of {total} ...]\n"


@dataclass
class StreamResult:
    """What came back on an attached exec stream."""

    pid: int | None
    stdout: bytes
    stderr: bytes
    exit_code: int | None  # from the trailer; None if the wrapper did not finish
    stdout_size: int
    stderr_size: int
    timed_out: bool
    eof: bool  # the stream ended (as opposed to the host giving up on it)


def start_attached(api, exec_id: str) -> tuple[object, bytes]:
    """Start an exec attached: its socket, and the stream bytes the SDK already read past the upgrade's headers.

    The SDK parses the ``101 UPGRADED`` reply through a buffered reader and hands back the socket under it; when
    the command's first output arrived with the headers (a fast command, a busy client), that output sits in the
    reader's buffer and a read of the socket never sees it (a lost pid line and trailer looked like an exec that
    never started). The buffer is taken without blocking: at most one non-blocking read of the socket.
    """
    sock = api.exec_start(exec_id, socket=True)
    return sock, _take_buffered(sock)


def _take_buffered(sock) -> bytes:
    fp = getattr(getattr(getattr(getattr(sock, "_response", None), "raw", None), "_fp", None), "fp", None)
    raw = getattr(sock, "_sock", sock)
    if fp is None or not hasattr(fp, "read1") or not hasattr(raw, "setblocking"):
        return b""
    before = raw.gettimeout()
    raw.setblocking(False)
    try:
        return fp.read1(1 << 16) or b""  # buffered bytes first, without touching the socket
    except OSError:  # nothing buffered and nothing on the socket yet (TLS says so with SSLWantReadError)
        return b""
    finally:
        raw.settimeout(before)


class _Reader:
    """Parses Docker's multiplexed stream (8-byte frame headers) from a raw socket, against deadlines."""

    def __init__(self, sock, early: bytes = b"") -> None:
        self.sock = getattr(sock, "_sock", sock)
        self.buf = bytearray()
        self.out = bytearray()
        self.err = bytearray()
        self.eof = False
        self._frames(early)

    def pump(self, until: float | None) -> bool:
        """Read one chunk; False when ``until`` passed without data."""
        wait = None if until is None else until - time.monotonic()
        if wait is not None and wait <= 0:
            return False
        self.sock.settimeout(wait)
        try:
            chunk = self.sock.recv(1 << 16)
        except (socket.timeout, TimeoutError):
            return False
        except OSError:
            chunk = b""
        if not chunk:
            self.eof = True
            return True
        self._frames(chunk)
        return True

    def _frames(self, chunk: bytes) -> None:
        self.buf += chunk
        while len(self.buf) >= 8:
            kind, size = self.buf[0], struct.unpack(">I", self.buf[4:8])[0]
            if len(self.buf) < 8 + size:
                break
            payload = self.buf[8:8 + size]
            del self.buf[:8 + size]
            (self.err if kind == 2 else self.out).extend(payload)

    def pid(self) -> int | None:
        if self.out.startswith(b"P"):
            nl = self.out.find(b"\n")
            if nl > 1 and self.out[1:nl].isdigit():
                return int(self.out[1:nl])
        return None


def read_stream(sock, *, deadline: float | None, on_deadline, grace_s: float, poll_s: float, on_poll,
                early: bytes = b"") -> StreamResult:
    """Read the wrapper's stream until it ends (``early``: the bytes `start_attached` recovered, read first).

    ``on_deadline(pid)`` is called once when ``deadline`` (monotonic) passes with the command's pid (it kills the
    process group); reading then continues for at most ``grace_s``. Without a deadline the stream is read in
    ``poll_s`` slices and ``on_poll()`` is called after each quiet slice (it raises if the container died).
    """
    reader = _Reader(sock, early)
    timed_out = False
    give_up: float | None = None
    try:
        while not reader.eof:
            now = time.monotonic()
            if give_up is not None:
                if not reader.pump(give_up):
                    break
                continue
            if deadline is not None and now >= deadline:
                pid = reader.pid()
                if pid is None:  # the wrapper has not even said its pid yet: give it a moment
                    reader.pump(now + min(grace_s, 2.0))
                    pid = reader.pid()
                timed_out = True
                on_deadline(pid)
                give_up = time.monotonic() + grace_s
                continue
            until = now + poll_s if deadline is None else min(deadline, now + poll_s)
            if not reader.pump(until) and (deadline is None or time.monotonic() < deadline):
                on_poll()
    finally:
        try:
            sock.close()
        except OSError:
            pass
    out, err = bytes(reader.out), bytes(reader.err)
    pid = reader.pid()
    if pid is not None:
        out = out[out.find(b"\n") + 1:]
    exit_code = None
    so = len(out)
    se = None
    cut = err.rfind(_TRAILER)
    if cut >= 0 and err.endswith(b"\n"):
        fields = err[cut + len(_TRAILER):].split()
        if len(fields) == 3 and all(f.lstrip(b"-").isdigit() for f in fields):
            exit_code, so, se = int(fields[0]), int(fields[1]), int(fields[2])
            err = err[:cut]
    return StreamResult(pid=pid, stdout=out, stderr=err, exit_code=exit_code, stdout_size=so,
                        stderr_size=se if se is not None else len(err), timed_out=timed_out, eof=reader.eof)


def read_all(api, exec_id: str, *, timeout: float = 60.0) -> tuple[bytes, bytes]:
    """Start an exec attached and read its (stdout, stderr) to the end, within ``timeout`` seconds of quiet.

    For harbor_gym's own short commands (the SDK's non-socket ``exec_start`` reads the same socket and loses the
    bytes buffered with the headers, see `start_attached`)."""
    sock, early = start_attached(api, exec_id)
    reader = _Reader(sock, early)
    try:
        while not reader.eof:
            if not reader.pump(time.monotonic() + timeout):
                break
    finally:
        try:
            sock.close()
        except OSError:
            pass
    return bytes(reader.out), bytes(reader.err)


def kill_command(api, container_id: str, pid: int) -> None:
    """Kill the process group (and the process) ``pid`` in the container, as root. Best effort."""
    # dash wants "-s KILL --" before a negative pid; busybox and others may want the shorter forms
    script = ('kill -s KILL -- "-$1" 2>/dev/null || kill -s KILL "-$1" 2>/dev/null || kill -KILL "-$1" 2>/dev/null;'
              ' kill -s KILL "$1" 2>/dev/null; :')
    exec_id = api.exec_create(container_id, ["/bin/sh", "-c", script, "harbor-gym-kill", str(pid)], user="0",
                              stdout=False, stderr=False)["Id"]
    api.exec_start(exec_id, detach=True)

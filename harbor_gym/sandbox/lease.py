"""Leases: every sandbox's main process exits by itself when the host stops renewing its lease, plus the registry
that stops every live sandbox at interpreter exit.

One lease file per host process run (``<cache>/leases/<run_id>.lease``), its mtime touched by one daemon heartbeat
thread. Docker sandboxes bind-mount the file read-only and run `lease_command` as their main process (under an
init): a POSIX-sh loop that exits when the file's mtime is older than the TTL, so a host killed with SIGKILL or by
the OOM killer leaves nothing running for longer than about TTL + check interval (and ``auto_remove`` removes the
container). ``harbor-gym gc`` reads the same files to tell a live run from a dead one.

On normal paths everything is removed on stop, on exceptions, on Ctrl-C (context managers) and at interpreter exit
(`atexit` stops every registered sandbox, then releases the lease).

SIGTERM: Python's default ends the process at once, skipping ``finally`` blocks, context managers and `atexit`. So
the first time a sandbox is registered from the main thread (or `exit_on_sigterm` is called there, as
`HarborVectorEnv` and `prewarm` do, whose sandboxes register from worker threads), harbor_gym installs a SIGTERM
handler raising ``SystemExit(143)`` (128 + SIGTERM) in the main thread, so the process takes the same clean-up path
as Ctrl-C and exits with status 143. It does so once and only if SIGTERM still has Python's default handler
(``SIG_DFL``): a handler of the program's own (such as ``harbor-gym``'s, which turns SIGTERM into Ctrl-C) is never
replaced. A process that never registers a sandbox or calls `exit_on_sigterm` from its main thread keeps the
default, and its sandboxes are left to their leases.
"""

from __future__ import annotations

import atexit
import logging
import math
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

__all__ = [
    "Lease",
    "LEASE_MOUNT",
    "lease_dir",
    "lease_path",
    "lease_is_live",
    "lease_command",
    "process_lease",
    "register",
    "unregister",
    "stop_all",
    "exit_on_sigterm",
]

log = logging.getLogger("harbor_gym.sandbox")

#: Where the lease file appears inside a container (read-only).
LEASE_MOUNT = "/run/harbor-gym/lease"

# The container's main process. $1 lease file, $2 ttl seconds, $3 check interval seconds. Only sh, stat, date and
# sleep (coreutils or busybox). A missing file counts as expired.
_LEASE_LOOP = r"""f=$1; ttl=$2; iv=$3
trap 'exit 0' TERM INT HUP
while :; do
  m=$(stat -c %Y "$f" 2>/dev/null) || exit 0
  n=$(date +%s)
  [ $((n - m)) -gt "$ttl" ] && exit 0
  sleep "$iv"
done"""


def lease_dir() -> Path:
    """The folder holding this host's lease files (``$HARBOR_GYM_CACHE``, else ``~/.cache/harbor_gym``)."""
    cache = os.environ.get("HARBOR_GYM_CACHE") or str(Path.home() / ".cache" / "harbor_gym")
    return Path(cache) / "leases"


def lease_path(run_id: str, directory: Path | None = None) -> Path:
    """The lease file of the run ``run_id``."""
    return (directory or lease_dir()) / f"{run_id}.lease"


def lease_is_live(run_id: str, ttl_s: float, directory: Path | None = None) -> bool:
    """True iff the run's lease file exists here and was renewed within ``ttl_s`` seconds."""
    try:
        mtime = lease_path(run_id, directory).stat().st_mtime
    except OSError:
        return False
    return time.time() - mtime <= ttl_s


def lease_command(ttl_s: float) -> list[str]:
    """The argv of a sandbox's main process: exits when the lease at `LEASE_MOUNT` is older than ``ttl_s``."""
    ttl = max(1, math.ceil(ttl_s))
    interval = max(1, min(5, ttl // 4))
    return ["/bin/sh", "-c", _LEASE_LOOP, "harbor-gym-lease", LEASE_MOUNT, str(ttl), str(interval)]


class Lease:
    """A lease file renewed by a daemon heartbeat thread.

    Args:
        run_id: the run's id (default: a fresh uuid hex); containers carry it in `RUN_LABEL`.
        directory: where the file lives (default `lease_dir`).
        interval_s: renewal period; `want_ttl` shortens it to a quarter of the shortest TTL in use.

    Guarantees: after `start` the file exists and is renewed every ``interval_s`` until `pause` or `release`;
    after `release` the file is gone (every container bound to it exits within its TTL + check interval).
    """

    def __init__(self, *, run_id: str | None = None, directory: Path | None = None, interval_s: float = 5.0) -> None:
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.path = lease_path(self.run_id, directory)
        self._interval = interval_s
        self._wake = threading.Event()
        self._stopped = True
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def start(self) -> "Lease":
        """Create the file and start renewing it (no-op if already renewing)."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.renew()
            if self._thread is None or not self._thread.is_alive():
                self._stopped = False
                self._thread = threading.Thread(target=self._beat, name=f"harbor-gym-lease-{self.run_id}",
                                                daemon=True)
                self._thread.start()
        return self

    @property
    def is_renewing(self) -> bool:
        """True iff the heartbeat thread is running."""
        return self._thread is not None and self._thread.is_alive() and not self._stopped

    def want_ttl(self, ttl_s: float) -> None:
        """Make sure renewals come at least 4 times per ``ttl_s`` (renews now)."""
        interval = max(0.2, ttl_s / 4)
        if interval < self._interval:
            self._interval = interval
            self._wake.set()
        self.renew()

    def renew(self) -> None:
        """Touch the file now (create it if missing)."""
        try:
            os.utime(self.path)
        except FileNotFoundError:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.touch()

    def pause(self) -> None:
        """Stop renewing (the file stays and goes stale): sandboxes bound to it expire. For tests and drills."""
        self._stopped = True
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._thread = None

    def release(self) -> None:
        """Stop renewing and delete the file. Idempotent."""
        self.pause()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass

    def _beat(self) -> None:
        while True:
            self._wake.wait(self._interval)
            self._wake.clear()
            if self._stopped:
                return
            try:
                self.renew()
            except OSError as exc:  # a full disk must not kill the thread; the next beat retries
                log.warning("lease %s: renewal failed: %s", self.path, exc)


_process_lock = threading.Lock()
_process_lease: Lease | None = None


def process_lease() -> Lease:
    """This process's lease (started on first use; a forked child gets a fresh one)."""
    global _process_lease
    with _process_lock:
        if _process_lease is None:
            _process_lease = Lease().start()
            _ensure_atexit()
        return _process_lease


def _after_fork_in_child() -> None:
    global _process_lease, _live, _process_lock
    _process_lease = None
    _live = {}
    _process_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)


class _Stoppable(Protocol):
    def stop(self) -> None: ...


_live: dict[int, _Stoppable] = {}
_atexit_done = False


def _ensure_atexit() -> None:
    global _atexit_done
    if not _atexit_done:
        atexit.register(_at_exit)
        _atexit_done = True


def register(sandbox: _Stoppable) -> None:
    """Remember a sandbox that is being started so that `stop_all` (at interpreter exit) stops it. From the main
    thread, also installs the SIGTERM handler of `exit_on_sigterm` (once)."""
    _ensure_atexit()
    exit_on_sigterm()
    _live[id(sandbox)] = sandbox


def unregister(sandbox: _Stoppable) -> None:
    """Forget a stopped sandbox."""
    _live.pop(id(sandbox), None)


def stop_all() -> None:
    """Stop every registered sandbox; one failure does not stop the rest."""
    for sandbox in list(_live.values()):
        try:
            sandbox.stop()
        except Exception as exc:  # keep stopping the others; the lease removes what this misses
            log.warning("stopping %r at exit failed: %s", sandbox, exc)
    _live.clear()


_sigterm_decided = False


def _sigterm_exit(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def exit_on_sigterm() -> bool:
    """Make SIGTERM take the Ctrl-C path: install, in the main thread, a handler raising ``SystemExit(143)``, so
    that ``finally`` blocks, context managers and `atexit` run and remove this process's sandboxes.

    Decided once per process, at the first call from the main thread: installed only if SIGTERM has Python's
    default handler (``SIG_DFL``), never over a handler of the program's own. Calls from other threads do nothing
    (the next call from the main thread decides). Returns True iff this call installed the handler.
    """
    global _sigterm_decided
    if _sigterm_decided or threading.current_thread() is not threading.main_thread():
        return False
    _sigterm_decided = True
    try:
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return False
        signal.signal(signal.SIGTERM, _sigterm_exit)
    except (ValueError, OSError) as exc:  # not the main interpreter, or no signals here: keep the default
        log.debug("SIGTERM handler not installed: %s", exc)
        return False
    return True


def _at_exit() -> None:
    stop_all()
    lease = _process_lease
    if lease is not None:
        lease.release()

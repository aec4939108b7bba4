"""Leases: a sandbox whose host process stops renewing its lease is removed from outside the sandbox, plus the
registry that stops every live sandbox at interpreter exit (SPEC GYM-10; README P3).

One lease per host process run (``run_id``), renewed by daemon threads of the process:

- a host file (``<cache>/leases/<run_id>.lease``), its mtime touched by the heartbeat thread. The local backend's
  keeper (a host process outside the sandbox) ends its sandbox when the file goes stale; ``harbor-gym gc`` and the
  reaping of temporary log folders read it to tell a live run from a dead one;
- on each Docker engine the run uses, the file ``/leases/<run_id>`` in that engine's reaper container
  (`harbor_gym.sandbox._reaper`, attached as a *remote* with `Lease.add_remote`), rewritten through the engine API.
  The reaper removes every container, network and volume labelled with a stale lease within ``lease_ttl_s`` + 2 s
  (+ removal), whatever runs inside the sandbox: nothing in a sandbox takes part, nothing is bind-mounted into it.

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
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from typing import Protocol

__all__ = [
    "Lease",
    "lease_dir",
    "lease_path",
    "lease_is_live",
    "idle_command",
    "process_lease",
    "register",
    "unregister",
    "stop_all",
    "exit_on_sigterm",
]

log = logging.getLogger("harbor_gym.sandbox")

# A sandbox's main process (under the engine's init): it only waits. Only sh and sleep (coreutils or busybox).
_IDLE_LOOP = "trap 'exit 0' TERM INT HUP; while :; do sleep 3600 & wait $!; done"


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


def idle_command() -> list[str]:
    """The argv of a Docker sandbox's main process: it waits forever (the lease is enforced from outside, by the
    engine's reaper, so stopping or killing this process gains an agent nothing; killing it ends the sandbox)."""
    return ["/bin/sh", "-c", _IDLE_LOOP, "harbor-gym-sandbox"]


class _Remote(Protocol):
    def start(self) -> None: ...
    def wake(self) -> None: ...
    def release(self) -> None: ...


class Lease:
    """A lease file renewed by a daemon heartbeat thread, and its copies in engine reapers (remotes).

    Args:
        run_id: the run's id (default: a fresh uuid hex); containers carry it in `RUN_LABEL` and the reaper's
            ``io.harbor-gym.lease``.
        directory: where the file lives (default `lease_dir`).
        interval_s: renewal period; `want_ttl` shortens it to a quarter of the shortest TTL in use.

    Guarantees: after `start` the file exists and is renewed every ``interval_s`` (and so is every remote) until
    `pause` or `release`; after `release` the file is gone and every remote says ``released`` (every sandbox bound
    to it is removed by its keeper or reaper within its TTL + check interval).
    """

    def __init__(self, *, run_id: str | None = None, directory: Path | None = None, interval_s: float = 5.0) -> None:
        self.run_id = run_id or uuid.uuid4().hex[:16]
        self.path = lease_path(self.run_id, directory)
        self._interval = interval_s
        self._wake = threading.Event()
        self._stopped = True
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self._remotes: list[_Remote] = []

    @property
    def interval_s(self) -> float:
        """The current renewal period in seconds."""
        return self._interval

    @property
    def remotes(self) -> list[_Remote]:
        """The remotes renewed with this lease (a copy)."""
        return list(self._remotes)

    def add_remote(self, remote: _Remote) -> None:
        """Renew ``remote`` (an engine reaper's copy of this lease) along with the file: it is started now if the
        lease renews, and on every later `start`; woken on `want_ttl` and `pause`; released on `release`."""
        with self._lock:
            self._remotes.append(remote)
            renewing = self.is_renewing
        if renewing:
            remote.start()

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
            remotes = list(self._remotes)
        for remote in remotes:
            remote.start()
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
            for remote in list(self._remotes):
                remote.wake()
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
        for remote in list(self._remotes):
            remote.wake()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=5)
        self._thread = None

    def release(self) -> None:
        """Stop renewing, delete the file and mark every remote released. Idempotent."""
        self.pause()
        try:
            self.path.unlink()
        except FileNotFoundError:
            pass
        remotes, self._remotes = list(self._remotes), []
        for remote in remotes:
            remote.release()

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

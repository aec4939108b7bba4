"""`SandboxPool`: up to ``size`` pristine sandboxes of one spec, refilled and torn down in background threads.

Holds the pool itself (claim, refill, reaper, close), its state enum and its counters; the wrapper it hands
out is in `_pooled`, the process's pools and the ``sandbox_factory`` in `_registry`. Guarantees: see
`harbor_gym.sandbox.pool` (SPEC GYM-2).
"""

from __future__ import annotations

import collections
import enum
import logging
import threading
import time
from typing import Callable

from harbor_gym.errors import ConfigError, SandboxError
from harbor_gym.sandbox._engine import engine_scope, scoped_client
from harbor_gym.sandbox.base import Sandbox, SandboxSettings, SandboxSpec, SandboxState
from harbor_gym.sandbox.pool._pooled import PooledSandbox

__all__ = ["MAX_CONCURRENT_STARTS", "PoolState", "PoolStats", "SandboxPool"]

log = logging.getLogger("harbor_gym.sandbox.pool")

#: Background starts in flight at once, over all pools of the process (a start is mostly engine work on the
#: host's cores; two keeps a 2-core host responsive). A cold start inside `SandboxPool.claim` does not wait for it.
MAX_CONCURRENT_STARTS = 2
#: After a failed background start, the refill waits this long (doubling per failure, capped at 30 s).
_BACKOFF_S = 1.0

_start_slots = threading.BoundedSemaphore(MAX_CONCURRENT_STARTS)


class PoolState(enum.Enum):
    """Lifecycle of a pool: open (claims and refills) -> closed (everything it started is removed)."""

    OPEN = "open"
    CLOSED = "closed"


class PoolStats:
    """Counters of one pool (read them; the pool updates them under its lock).

    Attributes:
        warm_claims: claims served by a ready sandbox.
        cold_claims: claims that had to start a sandbox themselves.
        started: background starts that succeeded.
        failed_starts: background starts that failed.
        discarded: ready sandboxes found dead at claim and removed.
        retired: handed-out sandboxes torn down by the reaper.
        max_pool: the highest ``ready + starting`` ever seen (never above ``size``).
    """

    __slots__ = ("warm_claims", "cold_claims", "started", "failed_starts", "discarded", "retired", "max_pool")

    def __init__(self) -> None:
        self.warm_claims = self.cold_claims = self.started = self.failed_starts = 0
        self.discarded = self.retired = self.max_pool = 0

    def as_dict(self) -> dict[str, int]:
        return {k: getattr(self, k) for k in self.__slots__}

    def __repr__(self) -> str:
        return f"PoolStats({self.as_dict()})"


class SandboxPool:
    """Up to ``size`` pristine, running sandboxes of one spec, refilled in the background.

    Args:
        spec: what every sandbox of the pool is.
        backend: ``"docker"``, ``"local"`` or ``"auto"`` (resolved once, here).
        settings: host settings (labels, lease TTL, aliases); default: those of ``EnvConfig()``.
        size: the bound of pristine sandboxes kept (``0``: keep none; claims then always start their own).
        fill: start filling now (default); ``False`` waits for the first claim or `fill`.
        prepare: run on every sandbox right after its start, before it counts as ready (e.g. the episode's
            seeding, so that it leaves the reset path too); a claim that starts its own sandbox runs it as well.
            A sandbox whose ``prepare`` raised is removed. ``None``: none.

    Raises:
        ConfigError: ``size`` is negative.
        SandboxUnavailableError: an unknown or unavailable backend.
    """

    def __init__(self, spec: SandboxSpec, *, backend: str = "auto", settings: SandboxSettings | None = None,
                 size: int = 2, fill: bool = True, prepare: Callable[[Sandbox], None] | None = None) -> None:
        from harbor_gym import sandbox as sandbox_pkg

        if size < 0:
            raise ConfigError(f"a pool's size must be >= 0, got {size}", field="pool_size")
        self.spec = spec
        self.backend = sandbox_pkg.choose_backend(backend)
        self.settings = settings or sandbox_pkg._default_settings()
        #: The engine of the `engine_scope` the pool was made in (``EnvConfig.engines``): its sandboxes start there.
        self.client = scoped_client()
        self.stats = PoolStats()
        self.prepare = prepare
        self._size = size
        self._state = PoolState.OPEN
        self._lock = threading.Condition()
        self._ready: collections.deque[Sandbox] = collections.deque()
        self._starting: set[int] = set()  # ids of sandboxes being started in the background
        self._starting_sbs: dict[int, Sandbox] = {}
        self._out: dict[int, Sandbox] = {}  # handed out, not yet retired
        self._reap_q: collections.deque[Sandbox] = collections.deque()
        self._reaping = 0
        self._removal_events: dict[int, threading.Event] = {}  # retired sandbox id -> set once removed
        self._backoff_until = 0.0
        self._failures = 0
        self._last_error: BaseException | None = None
        self._refill_thread = threading.Thread(target=self._refill_loop, daemon=True,
                                               name=f"harbor-gym-pool-refill-{spec.name_hint}")
        self._reaper_thread = threading.Thread(target=self._reap_loop, daemon=True,
                                               name=f"harbor-gym-pool-reaper-{spec.name_hint}")
        self._filling = fill
        self._refill_thread.start()
        self._reaper_thread.start()

    # --- state ---------------------------------------------------------------------------------------------
    @property
    def state(self) -> PoolState:
        return self._state

    @property
    def size(self) -> int:
        """The bound of pristine sandboxes kept."""
        return self._size

    @property
    def ready_count(self) -> int:
        """Pristine sandboxes ready to be claimed now."""
        with self._lock:
            return len(self._ready)

    @property
    def starting_count(self) -> int:
        """Background starts in flight."""
        with self._lock:
            return len(self._starting)

    @property
    def outstanding_count(self) -> int:
        """Sandboxes handed out or retired but not yet removed."""
        with self._lock:
            return len(self._out) + len(self._reap_q) + self._reaping

    @property
    def last_error(self) -> BaseException | None:
        """The error of the last failed background start (cleared by a success)."""
        return self._last_error

    def resize(self, size: int) -> None:
        """Change the bound; extra ready sandboxes are removed, missing ones started in the background.

        Raises:
            ConfigError: ``size`` is negative.
        """
        if size < 0:
            raise ConfigError(f"a pool's size must be >= 0, got {size}", field="pool_size")
        with self._lock:
            self._size = size
            extra = []
            while len(self._ready) + len(self._starting) > size and self._ready:
                extra.append(self._ready.pop())
            self._reap_q.extend(extra)
            self._lock.notify_all()

    # --- claim -----------------------------------------------------------------------------------------------
    def claim(self) -> PooledSandbox:
        """A running, pristine sandbox: a ready one (health-checked) or, when none is ready, one started now.

        Returns a `PooledSandbox`; its ``stop()`` retires it (it never comes back to the pool).

        Raises:
            SandboxError: the pool is closed, or (cold path) as `harbor_gym.sandbox.open`; nothing is left running.
        """
        from harbor_gym import sandbox as sandbox_pkg

        while True:
            with self._lock:
                if self._state is PoolState.CLOSED:
                    raise SandboxError(f"the sandbox pool of {self.spec.name_hint!r} is closed", field="pool")
                self._filling = True
                candidate = self._ready.popleft() if self._ready else None
                self._lock.notify_all()  # a slot freed: refill
            if candidate is None:
                break
            if candidate.is_alive():
                return self._hand_out(candidate, warm=True)
            log.warning("pool %s: discarding a ready sandbox that died (%s)", self.spec.name_hint, candidate.name)
            with self._lock:
                self.stats.discarded += 1
                self._reap_q.append(candidate)
                self._lock.notify_all()
        with engine_scope(self.client):
            sandbox = sandbox_pkg.open(self.spec, backend=self.backend, settings=self.settings)
        if self.prepare is not None:
            try:
                self.prepare(sandbox)
            except BaseException:
                sandbox.stop()
                raise
        return self._hand_out(sandbox, warm=False)

    def _hand_out(self, sandbox: Sandbox, *, warm: bool) -> PooledSandbox:
        with self._lock:
            if self._state is PoolState.CLOSED:
                self._reap_q.append(sandbox)
                self._lock.notify_all()
                raise SandboxError(f"the sandbox pool of {self.spec.name_hint!r} is closed", field="pool")
            self._out[id(sandbox)] = sandbox
            if warm:
                self.stats.warm_claims += 1
            else:
                self.stats.cold_claims += 1
        return PooledSandbox(sandbox, self, warm=warm)

    def _retire(self, sandbox: Sandbox, removed: threading.Event | None = None) -> None:
        with self._lock:
            if self._state is PoolState.CLOSED:  # close() removed it already
                if removed is not None:
                    removed.set()
                return
            self._out.pop(id(sandbox), None)
            self.stats.retired += 1
            if removed is not None:
                self._removal_events[id(sandbox)] = removed
            self._reap_q.append(sandbox)
            self._lock.notify_all()

    # --- fill ------------------------------------------------------------------------------------------------
    def fill(self, *, timeout: float | None = None) -> int:
        """Start filling (if not yet) and wait until ``size`` sandboxes are ready, or a start fails, or
        ``timeout`` passes. Returns the number ready.

        Raises:
            SandboxError: a background start failed while waiting (its error is chained).
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._filling = True
            self._lock.notify_all()
            failures = self._failures
            while len(self._ready) < self._size and self._state is PoolState.OPEN:
                if self._failures > failures:
                    raise SandboxError(f"pool {self.spec.name_hint!r}: a start failed: {self._last_error}",
                                       field="pool") from self._last_error
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._lock.wait(0.5 if left is None else min(left, 0.5))
            return len(self._ready)

    def _refill_loop(self) -> None:
        while True:
            with self._lock:
                while True:
                    if self._state is PoolState.CLOSED:
                        return
                    room = self._size - len(self._ready) - len(self._starting)
                    wait = self._backoff_until - time.monotonic()
                    if self._filling and room > 0 and wait <= 0 and len(self._starting) < MAX_CONCURRENT_STARTS:
                        break
                    self._lock.wait(max(0.05, wait) if wait > 0 else None)
                from harbor_gym import sandbox as sandbox_pkg

                with engine_scope(self.client):
                    sandbox = sandbox_pkg.create(self.spec, backend=self.backend, settings=self.settings)
                self._starting.add(id(sandbox))
                self._starting_sbs[id(sandbox)] = sandbox
                self.stats.max_pool = max(self.stats.max_pool, len(self._ready) + len(self._starting))
            threading.Thread(target=self._start_one, args=(sandbox,), daemon=True,
                             name=f"harbor-gym-pool-start-{sandbox.name}").start()

    def _start_one(self, sandbox: Sandbox) -> None:
        error: BaseException | None = None
        with _start_slots:
            if self._state is PoolState.OPEN:
                try:
                    sandbox.start()  # after a raise nothing of it is left (backend contract)
                    if self.prepare is not None:
                        self.prepare(sandbox)
                except BaseException as exc:  # noqa: BLE001 - a failed background start is recorded, not raised
                    error = exc
        with self._lock:
            self._starting.discard(id(sandbox))
            self._starting_sbs.pop(id(sandbox), None)
            if error is not None:
                self._reap_q.append(sandbox)  # a prepare that failed leaves a running sandbox
                self.stats.failed_starts += 1
                self._failures += 1
                self._last_error = error
                self._backoff_until = time.monotonic() + min(30.0, _BACKOFF_S * 2 ** min(self._failures - 1, 5))
                log.warning("pool %s: a background start failed (%s); retrying later", self.spec.name_hint, error)
            elif self._state is PoolState.OPEN and sandbox.state is SandboxState.RUNNING:
                self._ready.append(sandbox)
                self.stats.started += 1
                self._failures = 0
                self._last_error = None
            else:  # closed while starting, or never started
                self._reap_q.append(sandbox)
            self._lock.notify_all()

    # --- teardown ------------------------------------------------------------------------------------------
    def _reap_loop(self) -> None:
        while True:
            with self._lock:
                while not self._reap_q:
                    if self._state is PoolState.CLOSED:
                        return
                    self._lock.wait()
                sandbox = self._reap_q.popleft()
                self._reaping += 1
            try:
                sandbox.stop()
            except Exception as exc:  # stop never raises by contract; the lease removes what this misses
                log.warning("pool %s: removing %s failed: %s", self.spec.name_hint, sandbox.name, exc)
            finally:
                with self._lock:
                    self._reaping -= 1
                    event = self._removal_events.pop(id(sandbox), None)
                    if event is not None:
                        event.set()
                    self._lock.notify_all()

    def drain(self, *, timeout: float | None = 60.0) -> bool:
        """Wait until every retired sandbox is removed. Returns True iff nothing is left to remove."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._reap_q or self._reaping:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return False
                self._lock.wait(0.5 if left is None else min(0.5, left))
            return True

    def close(self) -> None:
        """Remove every sandbox the pool started (ready, starting, handed out and not yet removed). Idempotent;
        never raises for a dead sandbox. Handed-out sandboxes still in use are removed too: close the envs first."""
        with self._lock:
            if self._state is PoolState.CLOSED:
                return
            self._state = PoolState.CLOSED
            victims = [*self._ready, *self._out.values(), *self._reap_q]
            self._ready.clear()
            self._out.clear()
            self._reap_q.clear()
            self._lock.notify_all()
        first: BaseException | None = None
        for sandbox in victims:
            try:
                sandbox.stop()
            except Exception as exc:  # close every part, then report the first failure
                first = first or exc
        # Starts in flight see the closed state and hand their sandbox back; wait for them, then remove those.
        deadline = time.monotonic() + max(60.0, self.spec.build_timeout_s)
        with self._lock:
            while (self._starting or self._reaping) and time.monotonic() < deadline:
                self._lock.wait(0.2)
            late = list(self._reap_q) + list(self._starting_sbs.values())
            self._reap_q.clear()
        for sandbox in late:
            try:
                sandbox.stop()
            except Exception as exc:
                first = first or exc
        with self._lock:
            events = list(self._removal_events.values())
            self._removal_events.clear()
        for event in events:
            event.set()
        self._refill_thread.join(timeout=5)
        self._reaper_thread.join(timeout=5)
        from harbor_gym.sandbox.pool._registry import _unregister

        _unregister(self)
        if first is not None:
            log.warning("pool %s: a sandbox failed to stop at close: %s", self.spec.name_hint, first)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"SandboxPool({self.spec.name_hint!r}, backend={self.backend}, size={self._size}, "
                f"ready={len(self._ready)}, starting={len(self._starting)}, state={self._state.value})")

"""Warm pools: pristine sandboxes started ahead of need, so that ``reset`` does not wait on a container start.

One `SandboxPool` per (spec, backend, settings). It keeps up to ``size`` sandboxes started and never used
("pristine"), refills in a background thread (at most `MAX_CONCURRENT_STARTS` background starts at a time, process
wide), and tears handed-out sandboxes down in a background reaper, so that neither the start nor the teardown sits
on the reset path.

Guarantees:
- A sandbox is handed out at most once and never returns to the pool: `PooledSandbox.stop` retires it to the
  reaper (SPEC GYM-2: every episode starts on a sandbox no episode used).
- ``ready + starting <= size`` at all times (handed-out sandboxes are not the pool's any more).
- A ready sandbox is health-checked (``is_alive``, one engine request) before it is handed out; a dead one is
  discarded. When no ready sandbox is left, `SandboxPool.claim` starts one itself.
- Pool sandboxes are ordinary backend sandboxes: they hold the process lease (a SIGKILLed host leaves nothing past
  the lease TTL) and are registered for the interpreter-exit stop.
- `SandboxPool.close` (and `close_pools`, also run at interpreter exit) removes every sandbox the pool started:
  ready ones, ones still starting, and handed-out ones not yet torn down. It is idempotent.

- `PooledSandbox.wait_removed` / `PoolFactory.wait_removed` wait until retired sandboxes are really gone (what
  ``HarborEnv.close`` does, so that nothing of its episodes outlives it).

Use: ``EnvConfig(pool_size=N)`` (any env, `Episode`, the vector env, ``harbor-gym run``), or
``HarborEnv(path, sandbox_factory=pool_factory(config))``; ``harbor-gym prewarm PATH --size N`` fills pools ahead of a
run. The episode claims with `PoolFactory.claim_prepared`, so its seeding (GYM-2) runs ahead on the pool too.
"""

from __future__ import annotations

import atexit
import collections
import enum
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from harbor_gym.errors import ConfigError, SandboxError
from harbor_gym.sandbox.base import ExecResult, Sandbox, SandboxSettings, SandboxSpec, SandboxState

if TYPE_CHECKING:
    from pathlib import Path

    from harbor_gym.config import EnvConfig

__all__ = [
    "SandboxPool",
    "PoolState",
    "PoolStats",
    "PooledSandbox",
    "PoolFactory",
    "MAX_CONCURRENT_STARTS",
    "get_pool",
    "pool_factory",
    "pools",
    "close_pools",
]

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


class PooledSandbox:
    """A sandbox handed out by a pool: every call goes to the backend sandbox, except `stop`, which hands it to
    the pool's reaper (teardown off the caller's path) and returns at once. After `stop` the sandbox is never used
    again by anyone; ``state`` reads ``STOPPED`` from then on."""

    def __init__(self, inner: Sandbox, pool: "SandboxPool", *, warm: bool) -> None:
        self._inner = inner
        self._pool = pool
        self._stopped = False
        self._removed = threading.Event()
        #: True iff the sandbox came from the pool's ready set (False: started by the claim itself).
        self.warm = warm
        self.backend = inner.backend
        self.name = inner.name

    @property
    def inner(self) -> Sandbox:
        """The backend sandbox (for inspection)."""
        return self._inner

    @property
    def state(self) -> SandboxState:
        return SandboxState.STOPPED if self._stopped else self._inner.state

    @property
    def workdir(self) -> str:
        return self._inner.workdir

    @property
    def default_user(self) -> str:
        return self._inner.default_user

    def start(self) -> None:
        """A pooled sandbox is handed out running; starting it again is refused like on any backend."""
        raise SandboxError(f"sandbox {self.name} was already started (handed out running by its pool)")

    def exec(self, command: str | Sequence[str], *, timeout: float | None, user: str | None = None,
             env: Mapping[str, str] | None = None, cwd: str | None = None, stdin: bytes | None = None) -> ExecResult:
        return self._inner.exec(command, timeout=timeout, user=user, env=env, cwd=cwd, stdin=stdin)

    def put(self, local: "Path", dest: str, *, owner: str | None = None, mode: int | None = None) -> None:
        self._inner.put(local, dest, owner=owner, mode=mode)

    def put_bytes(self, data: bytes, dest: str, *, owner: str | None = None, mode: int = 0o644) -> None:
        self._inner.put_bytes(data, dest, owner=owner, mode=mode)

    def get(self, src: str, dest_dir: "Path") -> "Path":
        return self._inner.get(src, dest_dir)

    def read_file(self, path: str, *, max_bytes: int) -> bytes | None:
        return self._inner.read_file(path, max_bytes=max_bytes)

    def is_alive(self) -> bool:
        return not self._stopped and self._inner.is_alive()

    def stop(self) -> None:
        """Retire the sandbox: the pool's reaper removes it in the background. Idempotent; never raises."""
        if self._stopped:
            return
        self._stopped = True
        self._pool._retire(self._inner, self._removed)

    @property
    def stopped(self) -> bool:
        """True once `stop` was called (the sandbox is retired; it may still be being removed)."""
        return self._stopped

    def wait_removed(self, timeout: float | None = 60.0) -> bool:
        """Wait until the retired sandbox is removed (by the reaper or by the pool's close). Returns True iff it
        was; False at once when `stop` was never called."""
        if not self._stopped:
            return False
        return self._removed.wait(timeout)

    def __getattr__(self, name: str) -> Any:  # backend extras (container_id, spec, engine_requests, ...)
        return getattr(self._inner, name)

    def __enter__(self) -> "PooledSandbox":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def __repr__(self) -> str:
        return f"PooledSandbox({self._inner!r}, warm={self.warm})"


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
        with _registry_lock:
            for key, pool in list(_registry.items()):
                if pool is self:
                    del _registry[key]
        if first is not None:
            log.warning("pool %s: a sandbox failed to stop at close: %s", self.spec.name_hint, first)

    def __enter__(self) -> "SandboxPool":
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"SandboxPool({self.spec.name_hint!r}, backend={self.backend}, size={self._size}, "
                f"ready={len(self._ready)}, starting={len(self._starting)}, state={self._state.value})")


# --- the process-wide registry -------------------------------------------------------------------------------
_registry_lock = threading.Lock()
_registry: dict[tuple, SandboxPool] = {}
_atexit_registered = False


def _settings_key(settings: SandboxSettings) -> tuple:
    def frozen(m: Mapping[str, str]) -> tuple:
        return tuple(sorted(m.items()))

    return (settings.pull_policy, frozen(settings.image_aliases), frozen(settings.rootfs_aliases),
            settings.lease_ttl_s, settings.output_cap_bytes, frozen(settings.labels))


def get_pool(spec: SandboxSpec, *, backend: str = "auto", settings: SandboxSettings | None = None,
             size: int = 2, prepare: Callable[[Sandbox], None] | None = None,
             prepare_key: Any = None) -> SandboxPool:
    """The process's pool for (``spec``, ``backend``, ``settings``, ``prepare_key``), made on first use. A later
    call asking for a larger ``size`` grows the pool; a smaller one leaves it as it is.

    ``prepare`` (see `SandboxPool`) is taken from the call that makes the pool; ``prepare_key`` must name what it
    does (equal keys = equal preparations; ``None`` = no preparation).

    Raises:
        ConfigError: ``size`` is negative. SandboxUnavailableError: an unknown or unavailable backend.
    """
    global _atexit_registered
    from harbor_gym import sandbox as sandbox_pkg

    chosen = sandbox_pkg.choose_backend(backend)
    settings = settings or sandbox_pkg._default_settings()
    if (prepare is None) != (prepare_key is None):
        raise ConfigError("give prepare and prepare_key together", field="get_pool")
    key = (spec.key(), chosen, _settings_key(settings), prepare_key)
    with _registry_lock:
        pool = _registry.get(key)
        if pool is None or pool.state is PoolState.CLOSED:
            pool = SandboxPool(spec, backend=chosen, settings=settings, size=size, prepare=prepare)
            _registry[key] = pool
            if not _atexit_registered:
                atexit.register(close_pools)
                _atexit_registered = True
            return pool
    if size > pool.size:
        pool.resize(size)
    return pool


class PoolFactory:
    """A ``sandbox_factory`` (``spec -> started Sandbox``) claiming from the process's warm pools; picklable.

    ``factory(spec)`` claims a pristine sandbox of ``spec``. ``factory.claim_prepared(spec, key, prepare)`` claims
    one on which ``prepare`` already ran (in the background for warm ones): the hook through which the episode's
    seeding leaves the reset path as well (SPEC GYM-2; `harbor_gym.episode` uses it when the factory has it).

    A failing ``prepare`` never yields a sandbox: in the background it is recorded (``stats.failed_starts``,
    ``last_error``) and the sandbox removed; when no prepared sandbox is ready, the claim starts one and runs
    ``prepare`` itself, so that its error (e.g. a failed seed healthcheck's `SeedError`) is what the claim raises.

    The factory remembers the sandboxes it handed out until they are removed, so that `wait_removed` can wait for
    them (not pickled: a copy in another process starts with none).
    """

    def __init__(self, *, backend: str, settings: SandboxSettings, size: int) -> None:
        self.backend = backend
        self.settings = settings
        self.pool_size = size
        self._handed: list[PooledSandbox] = []
        self._handed_lock = threading.Lock()

    def __call__(self, spec: SandboxSpec) -> Sandbox:
        return self._track(get_pool(spec, backend=self.backend, settings=self.settings, size=self.pool_size).claim())

    def claim_prepared(self, spec: SandboxSpec, key: Any, prepare: Callable[[Sandbox], None]) -> Sandbox:
        """A pristine sandbox of ``spec`` on which ``prepare`` ran (``key`` names the preparation: equal keys must
        mean equal preparations). Raises what ``prepare`` raised on a cold claim (nothing is left running)."""
        return self._track(get_pool(spec, backend=self.backend, settings=self.settings, size=self.pool_size,
                                    prepare=prepare, prepare_key=key).claim())

    def _track(self, sandbox: PooledSandbox) -> PooledSandbox:
        with self._handed_lock:
            self._handed = [sb for sb in self._handed if not (sb.stopped and sb._removed.is_set())]
            self._handed.append(sandbox)
        return sandbox

    def wait_removed(self, timeout: float | None = 60.0) -> bool:
        """Wait until every sandbox this factory handed out and that was stopped since is removed (ones still in
        use are not waited for). Returns True iff all of them were removed within ``timeout``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._handed_lock:
            stopped = [sb for sb in self._handed if sb.stopped]
        ok = True
        for sb in stopped:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            ok = sb.wait_removed(left) and ok
        with self._handed_lock:
            self._handed = [sb for sb in self._handed if not (sb.stopped and sb._removed.is_set())]
        return ok

    def __getstate__(self) -> dict[str, Any]:
        return {"backend": self.backend, "settings": self.settings, "pool_size": self.pool_size}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(backend=state["backend"], settings=state["settings"], size=state["pool_size"])

    def pools(self) -> list[SandboxPool]:
        """The open pools this factory's claims use (same backend and settings)."""
        wanted = (self.backend, _settings_key(self.settings))
        with _registry_lock:
            return [p for k, p in _registry.items() if (k[1], k[2]) == wanted]

    def __repr__(self) -> str:
        return f"PoolFactory(backend={self.backend!r}, size={self.pool_size})"


def pool_factory(config: "EnvConfig | Mapping[str, Any] | None" = None, *, size: int | None = None) -> PoolFactory:
    """A `PoolFactory` (a ``sandbox_factory``) that claims from the process's warm pools.

    Args:
        config: the env's config (backend and settings are taken from it).
        size: the pool bound per spec; default ``config.pool_size``, and at least 1.

    Raises:
        ConfigError: an invalid config or a negative size.
    """
    from harbor_gym.config import EnvConfig

    cfg = EnvConfig.coerce(dict(config) if isinstance(config, Mapping) else config)
    bound = size if size is not None else max(1, int(getattr(cfg, "pool_size", 0) or 0))
    if bound < 0:
        raise ConfigError(f"a pool's size must be >= 0, got {bound}", field="pool_size")
    from harbor_gym import sandbox as sandbox_pkg

    return PoolFactory(backend=sandbox_pkg.choose_backend(cfg.backend.value), settings=SandboxSettings.from_config(cfg),
                       size=bound)


def pools() -> list[SandboxPool]:
    """The process's open pools."""
    with _registry_lock:
        return list(_registry.values())


def close_pools() -> None:
    """Close every pool of the process (also run at interpreter exit); one failure does not stop the rest."""
    for pool in pools():
        try:
            pool.close()
        except Exception as exc:  # keep closing the others
            log.warning("closing %r failed: %s", pool, exc)


def _after_fork_in_child() -> None:
    # A forked child owns none of the parent's sandboxes and none of its threads.
    global _registry_lock
    _registry.clear()
    _registry_lock = threading.Lock()


os.register_at_fork(after_in_child=_after_fork_in_child)

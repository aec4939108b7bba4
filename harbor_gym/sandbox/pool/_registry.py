"""The process's warm pools: the registry (`get_pool`, `pools`, `close_pools`) and the `PoolFactory` over it.

One `SandboxPool` per (spec, backend, settings, preparation), made on first use; `close_pools` runs at
interpreter exit; a forked child starts with no pools (it owns none of the parent's sandboxes or threads).
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Mapping

from harbor_gym.errors import ConfigError
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox._engine import engine_key, scoped_client
from harbor_gym.sandbox.base import Sandbox, SandboxSettings, SandboxSpec
from harbor_gym.sandbox.pool._pool import PoolState, SandboxPool
from harbor_gym.sandbox.pool._pooled import PooledSandbox

if TYPE_CHECKING:
    from harbor_gym.config import EnvConfig

__all__ = ["PoolFactory", "close_pools", "get_pool", "pool_factory", "pools"]

log = logging.getLogger("harbor_gym.sandbox.pool")

# --- the process-wide registry -------------------------------------------------------------------------------
_registry_lock = threading.Lock()
_registry: dict[tuple, SandboxPool] = {}
_atexit_registered = False


def _settings_key(settings: SandboxSettings) -> tuple:
    def frozen(m: Mapping[str, str]) -> tuple:
        return tuple(sorted(m.items()))

    return (settings.pull_policy, frozen(settings.image_aliases), frozen(settings.rootfs_aliases),
            settings.lease_ttl_s, settings.output_cap_bytes, frozen(settings.labels))


def _unregister(pool: SandboxPool) -> None:
    """Drop ``pool`` from the registry (its `SandboxPool.close` calls this)."""
    with _registry_lock:
        for key, registered in list(_registry.items()):
            if registered is pool:
                del _registry[key]


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

    # Pool sandboxes start in background threads, where no SIGTERM handler can be installed: do it here, on the
    # caller's thread (a no-op off the main thread or when the program has a handler of its own).
    leases.exit_on_sigterm()
    chosen = sandbox_pkg.choose_backend(backend)
    settings = settings or sandbox_pkg._default_settings()
    if (prepare is None) != (prepare_key is None):
        raise ConfigError("give prepare and prepare_key together", field="get_pool")
    scoped = scoped_client()  # one pool per engine (EnvConfig.engines): the episode's engine scope names it
    key = (spec.key(), chosen, _settings_key(settings), prepare_key, engine_key(scoped) if scoped else "")
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

    return PoolFactory(backend=sandbox_pkg.config_backend(cfg), settings=SandboxSettings.from_config(cfg), size=bound)


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

"""Several Docker engines behind one run (``EnvConfig.engines``, issue 17 item 1): where each episode's sandboxes
start, and which engines are out.

- **Placement** (documented policy): an episode takes the engine with the fewest in-flight episodes of this
  process among the engines in service; ties go to the engine listed first. Every sandbox, compose group, image,
  lease and warm pool of that episode is on that engine (`harbor_gym.sandbox._engine.engine_scope`).
- **Outages:** an engine that stops answering (a connection refused or reset, a ping that fails) is taken out of
  service with a named cause (``engine tcp://…: does not answer (…)``) that the affected episodes carry. Once
  `EngineSet.probe_interval_s` (``EnvConfig.engine_probe_interval_s``, default 30 s) has passed, the next placement
  pings it and puts it back if it answers. When every engine is out, placement raises `SandboxUnavailableError`
  (retryable) naming each engine's cause.
- **Images** an engine lacks are copied from another engine of the set (or the environment's engine) that has them,
  through the engine API (``save``/``load``; `harbor_gym.sandbox.images`), or built there from the task's
  ``environment/``.
- **Remote engines** (``tcp://``, ``ssh://``): nothing of this host is bind-mounted there (a compose file's
  read-only task-folder bind is uploaded instead), and each engine's lease reaper runs on that engine with the
  engine's own socket (``EnvConfig.engine_sockets`` names its path on the engine's host; default
  ``/var/run/docker.sock``), so a dead trainer host is still reaped. A reaper checks that its socket reaches the
  engine it runs on (by engine ID) and refuses to reap otherwise.

The set is per process and per (engines, sockets, interval): vector envs and collectors in one process share it.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox._engine import REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    import docker

__all__ = ["Engine", "EngineSet", "engine_set", "url_problem", "known_clients", "REAPER_SOCKET_ATTR", "DEFAULT_PROBE_INTERVAL_S",
           "ENGINE_URL_SCHEMES"]

log = logging.getLogger("harbor_gym.sandbox")

#: How long an engine that stopped answering stays out before it is probed again.
DEFAULT_PROBE_INTERVAL_S = 30.0
#: The Docker host URL schemes ``EnvConfig.engines`` accepts.
ENGINE_URL_SCHEMES = ("unix://", "tcp://", "ssh://")
#: Attribute of an engine's SDK client naming its socket's path on the engine's host (for its reaper).
REAPER_SOCKET_ATTR = "_harbor_gym_reaper_socket"
#: The API version the set's clients speak, so that making a client sends no request (an engine may be down).
_API_VERSION = "1.41"
_PING_TIMEOUT_S = 5


@dataclass
class Engine:
    """One engine of a set: its URL, its client (made on first use) and its service state.

    Attributes:
        url: the Docker host URL as configured.
        socket: the engine socket's path on the engine's host (mounted into its reaper).
        in_flight: this process's episodes placed on it and not yet released.
        down_cause: why it is out of service, else ``None``.
        placed: how many episodes were ever placed on it (for reports).
    """

    url: str
    socket: str
    in_flight: int = 0
    down_cause: str | None = None
    down_until: float = 0.0
    placed: int = 0
    _client: Any = field(default=None, repr=False)

    @property
    def client(self) -> "docker.DockerClient":
        """The engine's SDK client (made once; no request is sent to make it)."""
        if self._client is None:
            import docker

            try:
                client = docker.DockerClient(base_url=self.url, version=_API_VERSION,
                                             timeout=int(REQUEST_TIMEOUT_S), max_pool_size=64)
            except docker.errors.DockerException as exc:
                raise SandboxUnavailableError(f"engine {self.url}: no client can be made: {exc}",
                                              field="EnvConfig.engines", retryable=False) from exc
            setattr(client, REAPER_SOCKET_ATTR, self.socket)
            self._client = client
        return self._client

    @property
    def in_service(self) -> bool:
        return self.down_cause is None


def url_problem(url: object) -> str | None:
    """``None`` if ``url`` is a Docker host URL ``EnvConfig.engines`` accepts, else what is wrong with it."""
    if not isinstance(url, str) or not url.startswith(ENGINE_URL_SCHEMES) or not url.split("://", 1)[1]:
        return f"{url!r} is not a Docker host URL ({', '.join(ENGINE_URL_SCHEMES)})"
    return None


def _default_socket(url: str) -> str:
    return url[len("unix://"):] if url.startswith("unix://") else "/var/run/docker.sock"


def _ping(engine: Engine) -> str | None:
    """``None`` if the engine answers a ping within a few seconds, else why not."""
    import docker

    try:
        probe = docker.DockerClient(base_url=engine.url, version=_API_VERSION, timeout=_PING_TIMEOUT_S)
        try:
            probe.ping()
        finally:
            probe.close()
        return None
    except Exception as exc:  # any failure to reach it means it is out
        return f"{type(exc).__name__}: {str(exc)[:200]}"


class EngineSet:
    """The engines of one configuration, with least-in-flight placement and outage tracking (thread-safe).

    Args:
        urls: Docker host URLs, in order of preference for ties.
        sockets: URL -> the engine socket's path on its host (default: the path of a ``unix://`` URL, else
            ``/var/run/docker.sock``).
        probe_interval_s: how long an engine stays out before it is pinged again.
        ping: how an engine is probed (``engine -> None | cause``; a test seam for the pure policy).
    """

    def __init__(self, urls: Sequence[str], sockets: Mapping[str, str] | None = None, *,
                 probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S,
                 ping: Callable[[Engine], str | None] = _ping) -> None:
        if not urls:
            raise SandboxUnavailableError("an engine set needs at least one engine URL", field="EnvConfig.engines")
        sockets = dict(sockets or {})
        self.engines = [Engine(url, sockets.get(url) or _default_socket(url)) for url in urls]
        self.probe_interval_s = probe_interval_s
        self._ping = ping
        self._lock = threading.Lock()

    def acquire(self) -> Engine:
        """Place one episode: the in-service engine with the fewest in-flight episodes (ties: listed first).
        Engines out for longer than the probe interval are pinged first and put back when they answer.

        Raises:
            SandboxUnavailableError: every engine is out (retryable), naming each one's cause.
        """
        now = time.monotonic()
        with self._lock:
            due = [e for e in self.engines if not e.in_service and now >= e.down_until]
            for e in due:  # claimed for probing: no other thread probes it meanwhile
                e.down_until = now + self.probe_interval_s
        for e in due:
            cause = self._ping(e)
            with self._lock:
                if cause is None:
                    log.info("engine %s answers again: back in service", e.url)
                    e.down_cause = None
                else:
                    e.down_cause = f"engine {e.url} does not answer ({cause})"
        with self._lock:
            live = [e for e in self.engines if e.in_service]
            if not live:
                causes = "; ".join(f"{e.down_cause} (probed again in "
                                   f"{max(0.0, e.down_until - time.monotonic()):.0f} s)" for e in self.engines)
                raise SandboxUnavailableError(f"no engine of EnvConfig.engines is in service: {causes}",
                                              field="EnvConfig.engines", retryable=True)
            chosen = min(live, key=lambda e: (e.in_flight, self.engines.index(e)))
            chosen.in_flight += 1
            chosen.placed += 1
            return chosen

    def release(self, engine: Engine) -> None:
        """The episode placed on ``engine`` is over (idempotence is the caller's: call once per `acquire`)."""
        with self._lock:
            engine.in_flight = max(0, engine.in_flight - 1)

    def mark_down(self, engine: Engine, cause: str) -> str:
        """Take ``engine`` out of service for the probe interval; returns the cause text episodes should carry."""
        with self._lock:
            if engine.in_service:
                log.warning("%s: out of service, probed again in %.0f s", cause, self.probe_interval_s)
            engine.down_cause = cause
            engine.down_until = time.monotonic() + self.probe_interval_s
            return cause

    def check(self, engine: Engine) -> str | None:
        """After a sandbox error on ``engine``: ``None`` if it still answers, else the cause (and it is out)."""
        cause = self._ping(engine)
        if cause is None:
            return None
        return self.mark_down(engine, f"engine {engine.url} does not answer ({cause})")

    def status(self) -> list[dict[str, Any]]:
        """Per engine: url, in_service, in_flight, placed, down_cause (a snapshot, for reports and tests)."""
        with self._lock:
            return [{"url": e.url, "in_service": e.in_service, "in_flight": e.in_flight, "placed": e.placed,
                     "down_cause": e.down_cause} for e in self.engines]


_sets_lock = threading.Lock()
_sets: dict[tuple, EngineSet] = {}


def engine_set(urls: Sequence[str], sockets: Mapping[str, str] | None = None, *,
               probe_interval_s: float = DEFAULT_PROBE_INTERVAL_S) -> EngineSet:
    """The process's `EngineSet` for these engines (made on first use, shared by every env of the process)."""
    key = (tuple(urls), tuple(sorted((sockets or {}).items())), float(probe_interval_s))
    with _sets_lock:
        found = _sets.get(key)
        if found is None:
            found = _sets[key] = EngineSet(urls, sockets, probe_interval_s=probe_interval_s)
        return found


def known_clients() -> list[Any]:
    """The clients this process made for engines of any set (for copying an image from a peer engine)."""
    with _sets_lock:
        sets = list(_sets.values())
    return [e._client for s in sets for e in s.engines if e._client is not None]


def _after_fork_in_child() -> None:
    global _sets_lock
    _sets_lock = threading.Lock()
    _sets.clear()


os.register_at_fork(after_in_child=_after_fork_in_child)

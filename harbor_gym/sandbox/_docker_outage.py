"""`DockerOutageMixin.outage_report`: after a failed command, whether the container's own processes ended it (SPEC
GYM-12), as far as the engine can tell without trusting anything inside the container.

Evidence, in order, each from the host or the engine (nothing a sandbox process prints):

1. our own state: a sandbox this process stopped (close, a vector env's Ctrl-C) is never the agent's doing;
2. the engine answers a ping, else ``None`` (an unreachable engine is never the agent's doing);
3. the run's lease file (host-side) is fresh: otherwise the container's main process may have ended because the
   host stopped renewing it;
4. the container: still running → a root probe command (``true``) must run, else ``cannot_run_commands`` (pids or
   memory exhausted); not running (or removed by auto-remove) → the engine's own ``die``/``oom`` events for the
   container since it started: ``oom_killed`` or ``died (exit N)``. Events live in the running engine's memory,
   so a container that died with a previous engine instance (an engine restart) has none: ``None``; a container
   killed or stopped through the engine's API (a ``kill``/``stop`` event: someone outside the sandbox, never a
   process inside it) is not the agent's doing either: ``None``.

Engine requests: ping + inspect (+ events, or + the probe exec's 2).
"""

from __future__ import annotations

import logging
import time
from typing import TYPE_CHECKING, Any

from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox.base import SandboxState

if TYPE_CHECKING:
    from harbor_gym.sandbox.base import SandboxSettings

__all__ = ["DockerOutageMixin"]

log = logging.getLogger("harbor_gym.sandbox")

#: Bound of the probe command of a running container.
_PROBE_S = 10.0
#: How far back the engine's events are asked for (its buffer holds the last 256 anyway).
_EVENTS_WINDOW_S = 24 * 3600


class DockerOutageMixin:
    """`outage_report` for `DockerSandbox` (it holds the state and the client)."""

    if TYPE_CHECKING:
        name: str
        container_id: str | None
        run_id: str | None
        settings: SandboxSettings
        _state: SandboxState

        @property
        def client(self) -> Any: ...
        def _count(self, n: int = 1) -> None: ...
        def exec(self, command: Any, **kwargs: Any) -> Any: ...

    def outage_report(self) -> str | None:
        """GYM-12: what the container's own processes did to it, or ``None`` when nothing says they did (we
        stopped it, the engine does not answer or restarted, the lease lapsed, the container runs commands).

        Returns:
            ``"cannot_run_commands"``, ``"oom_killed"``, ``"died (exit N)"`` or ``None``. Never raises.
        """
        try:
            return self._outage_report()
        except Exception as exc:  # evidence we cannot get is no evidence
            log.debug("sandbox %s: outage report failed: %s", self.name, exc)
            return None

    def _outage_report(self) -> str | None:
        import docker.errors

        if self._state is not SandboxState.RUNNING or self.container_id is None:
            return None
        api = self.client.api
        try:
            api.ping()
        except Exception:
            return None
        finally:
            self._count()
        if self.run_id and not leases.lease_is_live(self.run_id, self.settings.lease_ttl_s):
            return None
        try:
            attrs = api.inspect_container(self.container_id)
            state = attrs.get("State") or {}
        except docker.errors.NotFound:
            state = {}
        finally:
            self._count()
        if state.get("Running") and not state.get("Paused"):
            try:
                # in /: whether commands run at all, not whether the workdir still exists
                res = self.exec(["true"], timeout=_PROBE_S, user="root", cwd="/")
            except Exception:
                res = None
            if res is None or not res.ok:
                if self._state is not SandboxState.RUNNING:
                    return None
                state = self._state_now()  # a container on its way out still shows running for a moment
                if state.get("Running"):
                    return "cannot_run_commands"
            else:
                return None
        return self._death_from_events(bool(state.get("OOMKilled")))

    def _state_now(self) -> dict:
        """The container's ``State`` after the engine settled (``{}`` once removed), within about 2 s."""
        import docker.errors

        deadline = time.monotonic() + 2.0
        while True:
            try:
                state = (self.client.api.inspect_container(self.container_id).get("State") or {})
            except docker.errors.NotFound:
                return {}
            finally:
                self._count()
            if not state.get("Running") or time.monotonic() >= deadline:
                return state
            time.sleep(0.2)

    def _death_from_events(self, oom_killed: bool) -> str | None:
        """The engine's ``die`` (and ``oom``) events of this container, seen by the running engine instance."""
        now = time.time()
        stream = self.client.api.events(since=int(now - _EVENTS_WINDOW_S), until=int(now) + 1, decode=True,
                                        filters={"container": self.container_id, "type": "container"})
        self._count()
        died: int | None = None
        seen = killed_outside = False
        for event in stream:
            action = event.get("Action") or event.get("status") or ""
            if action == "oom":
                oom_killed = True
            elif action in ("kill", "stop", "pause"):  # through the engine's API: from outside the sandbox
                killed_outside = True
            elif action == "die":
                seen = True
                code = ((event.get("Actor") or {}).get("Attributes") or {}).get("exitCode")
                died = int(code) if str(code).lstrip("-").isdigit() else None
        if not seen or killed_outside or self._state is not SandboxState.RUNNING:
            return None
        if oom_killed:
            return "oom_killed"
        return "died" if died is None else f"died (exit {died})"

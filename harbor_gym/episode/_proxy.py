"""The capture proxy of one episode (issue 18 items 2 and 4): its session on the process's shared proxy, the route
from the agent sandbox to it, the variables each activation gets, the activation windows and the refused counts.

Guarantees:
- `open_episode_proxy` runs before any sandbox starts. Where sandboxes of the backend have no route to a host
  service (a remote or rootless engine, podman, several engines, a local backend without root: whatever
  `harbor_gym.sandbox.host_route.listen_addresses` refuses) it raises `SeedRefusedError` naming why; nothing is
  left open then.
- One `CaptureProxy` per process and upstream (`harbor_gym.proxy.shared_proxy`) listens on every address of
  ``listen_addresses(backend)`` on one port; one host route per (backend, port) admits sandboxes to that port and
  lives as long as the process (closed at exit): warm pools' sandboxes, which carry the port in their spec, keep
  working between episodes. Each episode has its own `ProxySession` (an unguessable token, checked on every call),
  closed with the episode.
- The variables (`activation_env`) reach only the commands of an activation (`ProxyEnvExec` wraps the turn's
  exec), never the container's environment: setup.sh, healthchecks, artifact hooks and verifiers never see the
  token, and a call outside an activation window is refused by the proxy anyway (403, counted, never recorded).
"""

from __future__ import annotations

import atexit
import logging
import threading
from typing import Any, Callable, Mapping

from harbor_gym.errors import SandboxUnavailableError, SeedRefusedError
from harbor_gym.sandbox.base import ExecResult

__all__ = ["EpisodeProxy", "ProxyEnvExec", "open_episode_proxy", "activation_env"]

_log = logging.getLogger("harbor_gym.episode")

_routes_lock = threading.Lock()
_routes: dict[tuple[str, int], Any] = {}


def _close_routes() -> None:
    with _routes_lock:
        routes = list(_routes.values())
        _routes.clear()
    for route in routes:
        try:
            route.close()
        except Exception as exc:  # at exit: report, close the others
            _log.warning("closing a host route failed: %s", exc)


atexit.register(_close_routes)


def _route(backend: str, port: int) -> None:
    """Open (once per process) the host route of ``backend`` to ``port``."""
    from harbor_gym.sandbox import host_route

    with _routes_lock:
        if (backend, port) not in _routes:
            _routes[(backend, port)] = host_route.open_route(backend, port)


def activation_env(names: Any, *, openai_base_url: str, anthropic_base_url: str, token: str) -> dict[str, str]:
    """The variables an activation's commands get (issue 18 item 2), by the names of `EnvConfig.model_env`
    (``None``: that variable is not set): the OpenAI base URL (``http://ADDR:PORT/v1``), the Anthropic base URL
    (``http://ADDR:PORT``: Anthropic clients append ``/v1/messages``), and the session ``token`` as both keys."""
    values = {names.openai_base_url: openai_base_url, names.anthropic_base_url: anthropic_base_url,
              names.openai_api_key: token, names.anthropic_api_key: token}
    return {name: value for name, value in values.items() if name}


class ProxyEnvExec:
    """An activation's ``exec`` (`Turn._exec_fn`) that lays the proxy variables under each command's ``env`` (an
    ``env`` the agent passes wins). Its repr never shows them (the token is a secret of the sandbox)."""

    def __init__(self, exec_fn: Callable[..., ExecResult], env: Mapping[str, str]) -> None:
        self._exec_fn = exec_fn
        self._env = dict(env)

    def __call__(self, command: Any, *, env: Mapping[str, str] | None = None, **kwargs: Any) -> ExecResult:
        return self._exec_fn(command, env={**self._env, **dict(env or {})}, **kwargs)

    def __repr__(self) -> str:
        return f"ProxyEnvExec({self._exec_fn!r}, <{len(self._env)} proxy variables>)"


class EpisodeProxy:
    """One episode's `ProxySession` and the port its sandbox must reach (see the module docstring).

    Attributes:
        port: the proxy's TCP port on the host (the agent sandbox's ``host_service_port``).
    """

    def __init__(self, session: Any, port: int, names: Any) -> None:
        self._session = session
        self.port = port
        self._names = names
        self._refused_seen = 0
        self._open = False
        self._closed = False

    def env_for(self, address: str | None) -> dict[str, str]:
        """The activation's variables for the sandbox's ``host_service_address`` (``"IP:PORT"``); ``{}`` for
        ``None`` (a sandbox that got no route: the harness then finds no model, logged)."""
        if not address:
            _log.warning("the agent sandbox has no host_service_address: its activations get no model variables")
            return {}
        return activation_env(self._names, openai_base_url=self._session.base_url_for(address),
                              anthropic_base_url=self._session.anthropic_base_url_for(address),
                              token=self._session.token)

    def begin(self, turn_index: int) -> None:
        """Open turn ``turn_index``'s activation window: calls with the token are accepted and recorded from now."""
        self._session.begin_activation(turn_index)
        self._open = True

    def end(self) -> tuple[tuple[Any, ...], int]:
        """Close the window: calls still in flight are cancelled (recorded ``cancelled``). Returns the window's
        `ModelCall`s in order and how many calls it refused past its cap (429; refusals outside windows are
        counted by `refused_since_last`). ``((), 0)`` when no window is open."""
        if not self._open:
            return (), 0
        self._open = False
        got = self._session.end_activation()
        return tuple(got.calls), int(got.refused_over_cap)

    def refused_since_last(self) -> int:
        """Calls refused outside any window (403) since the last call of this method (a turn's span: the engine
        asks once per turn record)."""
        now = int(self._session.refused_outside)
        delta, self._refused_seen = now - self._refused_seen, now
        return max(0, delta)

    def close(self) -> None:
        """End the session (its token answers 401 from now); a window still open is cancelled first. Idempotent."""
        if self._closed:
            return
        self._closed = True
        try:
            if self._open:
                self.end()
        finally:
            self._session.close()


def open_episode_proxy(upstream: Any, *, backend: str, names: Any, label: str, where: Any = None) -> EpisodeProxy:
    """The capture proxy of one episode on ``backend`` (issue 18): the shared proxy listening where sandboxes of
    ``backend`` reach it, the route to its port, and a new session labelled ``label``.

    Args:
        upstream: `EnvConfig.model_upstream` (a `harbor_gym.proxy.ModelUpstream`).
        backend: ``docker`` or ``local``: the provider the agent sandbox will run on.
        names: `EnvConfig.model_env` (the variables' names).
        where: the task's ``task.toml`` path, for the refusal's message.

    Raises:
        SeedRefusedError: sandboxes of ``backend`` have no route to a host service here (naming why); nothing was
            opened.
    """
    from harbor_gym.proxy import shared_proxy
    from harbor_gym.sandbox import host_route

    try:
        addresses = tuple(host_route.listen_addresses(backend))
        proxy = shared_proxy(upstream, addresses=addresses)
        _route(backend, proxy.port)
    except SandboxUnavailableError as exc:
        raise SeedRefusedError(
            f"EnvConfig.model_upstream is set, but sandboxes of the {backend!r} backend cannot reach a host service "
            f"here: {exc}. The capture proxy needs a route (a local root Docker engine, or the local backend as "
            "root); run there, or unset model_upstream", path=where, field="EnvConfig.model_upstream",
            rule="GYM-10") from exc
    return EpisodeProxy(proxy.open_session(label=label), proxy.port, names)

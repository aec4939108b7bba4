"""harbor_gym.sandbox: where commands run. `open` a `Sandbox` for a `SandboxSpec` on a backend.

Backends: ``docker`` (`DockerSandbox`, the Docker engine through the SDK), ``podman`` (`PodmanSandbox`, podman through
its Docker-compatible API with the same SDK; never chosen by ``auto``) and ``local`` (bubblewrap over an unpacked
root filesystem, `harbor_gym.sandbox.local.LocalSandbox`, imported lazily). ``backend`` is the one name of this
choice everywhere (this API, ``EnvConfig.backend``, the CLI): ``"auto"`` takes docker when an engine answers, else
local.
Compose groups (a task's ``main`` with its sidecars): `open_group` / `ComposeGroup` (docker and podman, COMPOSE-2).
"""

from __future__ import annotations

import importlib
import logging
import threading

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox._engine import count_requests, engine_answers, RequestCounter
from harbor_gym.sandbox.base import (
    MANAGED_LABEL,
    RUN_LABEL,
    ExecResult,
    Sandbox,
    SandboxSettings,
    SandboxSpec,
    SandboxState,
    truncate_output,
)
from harbor_gym.sandbox.docker_backend import DockerSandbox
from harbor_gym.sandbox.compose import ComposeGroup, open_group

__all__ = [
    "open",
    "create",
    "choose_backend",
    "config_backend",
    "engine_client",
    "BACKENDS",
    "ENGINE_BACKENDS",
    "Sandbox",
    "SandboxSpec",
    "SandboxSettings",
    "SandboxState",
    "ExecResult",
    "DockerSandbox",
    "ComposeGroup",
    "open_group",
    "MANAGED_LABEL",
    "RUN_LABEL",
    "truncate_output",
    "count_requests",
    "RequestCounter",
]

log = logging.getLogger("harbor_gym.sandbox")

#: The backend names ``backend=`` accepts.
BACKENDS = ("auto", "docker", "podman", "local")
#: The backends that run containers through the Docker SDK (an engine's client; compose groups).
ENGINE_BACKENDS = ("docker", "podman")

_choice_lock = threading.Lock()
_auto_choice: str | None = None


def choose_backend(backend: str = "auto") -> str:
    """The concrete backend for ``backend``: ``"auto"`` -> ``"docker"`` if a Docker engine answers a ping (asked
    once per process), else ``"local"``; logs the choice at INFO. ``"docker"``/``"podman"``/``"local"`` are
    returned as given.

    Raises:
        SandboxUnavailableError: an unknown backend name.
    """
    global _auto_choice
    name = getattr(backend, "value", backend)
    if name not in BACKENDS:
        raise SandboxUnavailableError(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}", field="backend")
    if name != "auto":
        return name
    with _choice_lock:
        if _auto_choice is None:
            reason = engine_answers()
            _auto_choice = "docker" if reason is None else "local"
            if reason is None:
                log.info("sandbox backend auto -> docker (a Docker engine answers)")
            else:
                log.info("sandbox backend auto -> local (no Docker engine: %s)", reason)
        return _auto_choice


def config_backend(config: object) -> str:
    """The concrete backend of an `EnvConfig`: ``"docker"`` when it lists ``engines`` (issue 17: they are Docker
    engines), else `choose_backend` of its ``backend``."""
    if getattr(config, "engines", None):
        return "docker"
    backend = getattr(config, "backend", "auto")
    return choose_backend(getattr(backend, "value", backend))


def engine_client(backend: str):
    """The Docker SDK client of an engine backend: the process's Docker client (``docker``) or podman's
    (``podman``, `harbor_gym.sandbox._podman.podman_client`).

    Raises:
        SandboxUnavailableError: ``backend`` is not an engine backend, or its engine is not there.
    """
    from harbor_gym.sandbox._engine import get_client

    if backend == "podman":
        from harbor_gym.sandbox._podman import podman_client

        return podman_client()
    if backend == "docker":
        return get_client()
    raise SandboxUnavailableError(f"backend {backend!r} has no engine client", field="backend")


def _default_settings() -> SandboxSettings:
    from harbor_gym.config import EnvConfig

    return SandboxSettings.from_config(EnvConfig())


def create(spec: SandboxSpec, *, backend: str = "auto", settings: SandboxSettings | None = None) -> Sandbox:
    """An unstarted sandbox for ``spec`` on ``backend`` (see `choose_backend`); nothing runs yet.

    Raises:
        SandboxUnavailableError: the backend is unknown or not available here.
    """
    chosen = choose_backend(backend)
    settings = settings or _default_settings()
    if chosen == "docker":
        return DockerSandbox(spec, settings)
    if chosen == "podman":
        from harbor_gym.sandbox.podman_backend import PodmanSandbox

        return PodmanSandbox(spec, settings)
    try:
        local = importlib.import_module("harbor_gym.sandbox.local")
    except ModuleNotFoundError as exc:
        if exc.name and exc.name.startswith("harbor_gym.sandbox.local"):
            raise SandboxUnavailableError("the local (bubblewrap) backend is not available in this build",
                                          field="backend") from exc
        raise
    return local.LocalSandbox(spec, settings)


def open(spec: SandboxSpec, *, backend: str = "auto", settings: SandboxSettings | None = None) -> Sandbox:  # noqa: A001
    """Create and start a sandbox for ``spec``. Use it as a context manager (``with sandbox.open(spec) as sb:``).

    Returns a running `Sandbox`. After a raise nothing of it is left running.

    Raises:
        SandboxUnavailableError, ImageError, SandboxError: as `Sandbox.start`.
    """
    sandbox = create(spec, backend=backend, settings=settings)
    try:
        sandbox.start()
    except BaseException:
        sandbox.stop()
        raise
    return sandbox

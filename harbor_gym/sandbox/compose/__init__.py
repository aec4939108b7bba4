"""harbor_gym.sandbox.compose: compose groups, a task's ``main`` sandbox with its sidecars (SPEC
COMPOSE-1..3).

`open_group` starts a `ComposeGroup` for a parsed compose file (``Task.compose``) on a backend that can run
groups (``docker``); the ``local`` backend cannot and refuses with `SandboxUnavailableError` (COMPOSE-2: "a
provider that cannot run groups refuses at seed").
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Mapping

from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.sandbox.base import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.compose._service import GROUP_LABEL, SERVICE_LABEL, ServiceSandbox
from harbor_gym.sandbox.compose.group import DEFAULT_START_TIMEOUT_S, ComposeGroup

if TYPE_CHECKING:
    from harbor_gym.task.compose import ComposeFile

__all__ = [
    "ComposeGroup",
    "ServiceSandbox",
    "open_group",
    "refuse_groups",
    "GROUP_LABEL",
    "SERVICE_LABEL",
    "DEFAULT_START_TIMEOUT_S",
]


def refuse_groups(compose: "ComposeFile", backend: str) -> None:
    """Raise unless ``backend`` (a concrete name, see `harbor_gym.sandbox.choose_backend`) can run groups.

    Raises:
        SandboxUnavailableError: ``backend`` is neither ``docker`` nor ``podman`` (COMPOSE-2), naming the compose
            file.
    """
    if backend not in ("docker", "podman"):
        raise SandboxUnavailableError(
            f"this task's environment is a compose group ({len(compose.services)} services: "
            f"{', '.join(compose.service_names)}), which the {backend!r} backend cannot run; use the docker or podman "
            "backend (a provider that cannot run groups refuses at seed)",
            path=compose.path, field="backend", rule="COMPOSE-2")


def open_group(
    compose: "ComposeFile",
    *,
    backend: str = "auto",
    settings: SandboxSettings | None = None,
    main_spec: SandboxSpec | None = None,
    network: bool = False,
    labels: Mapping[str, str] | None = None,
    name_hint: str = "group",
    build_timeout_s: float = 600.0,
    start_timeout_s: float = DEFAULT_START_TIMEOUT_S,
    sidecar_storage_mb: int | None = None,
) -> ComposeGroup:
    """Create and start a `ComposeGroup` (see its arguments). Returns it running; after a raise nothing of it
    is left.

    Raises:
        SandboxUnavailableError: the backend cannot run groups (``local``, COMPOSE-2) or is unknown; no
            engine.
        ImageError, SandboxError: as `ComposeGroup.start`.
    """
    from harbor_gym.sandbox import _default_settings, choose_backend

    chosen = choose_backend(backend)
    refuse_groups(compose, chosen)
    client = None
    if chosen == "podman":
        from harbor_gym.sandbox import engine_client

        client = engine_client(chosen)
    group = ComposeGroup(compose, settings=settings or _default_settings(), main_spec=main_spec, client=client,
                         network=network, labels=labels, name_hint=name_hint, build_timeout_s=build_timeout_s,
                         start_timeout_s=start_timeout_s, sidecar_storage_mb=sidecar_storage_mb)
    group.start()  # stops itself on any failure
    return group

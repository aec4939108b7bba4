"""The supported subset of ``environment/docker-compose.yaml`` (SPEC COMPOSE-1..3): frozen models, parser.

Pure: reads the file, starts nothing. ``parse_compose_file(path)`` returns a `ComposeFile` or raises
`TaskLoadError` naming the compose file, the key (``services.<svc>.<key>``) and the rule. Supported, per
service: ``image`` or ``build`` (a context string, or ``{context, dockerfile}``), ``environment`` (mapping or
``K=V`` list), ``command``/``entrypoint`` (string split like a shell, or a list), ``working_dir``, ``user``,
``volumes`` (named volumes declared at the top level, and paths inside the environment folder), ``depends_on``
(list, or mapping with ``condition: service_started|service_healthy``), ``healthcheck`` (``test``,
``interval``, ``timeout``, ``retries``, ``start_period``, ``disable``),
``deploy.resources.{limits,reservations}`` (``cpus``, ``memory``, ``pids`` in limits) and the legacy
``cpus``/``mem_limit``. At the top level: ``services``, ``volumes`` (names only) and the obsolete ``version``.
``x-*`` extension keys are ignored, as compose does. Anything else is refused (rule ``COMPOSE-1``; sizes
``COMPOSE-2``; paths outside ``environment/`` ``LOAD-13``), never silently ignored. Values are interpolated first
(``${VAR}``, ``${VAR:-default}``, ``${VAR:?msg}``, ``$$``) from the task's env, Harbor's compose variables, the host
allowlist and ``.env`` beside the file; `harbor_gym.task._compose_vars` documents the sources and the exact list of
Harbor's variables, and why ``HOST_*_PATH`` never becomes a host bind mount.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from pathlib import Path

from harbor_gym.errors import TaskLoadError
from harbor_gym.task._compose_vars import ComposeVariables

__all__ = [
    "COMPOSE_RULE",
    "MAIN_SERVICE",
    "ComposeBuild",
    "ComposeFile",
    "ComposeHealthcheck",
    "ComposeMount",
    "ComposeResources",
    "ComposeService",
    "check_sidecar_names",
    "parse_compose_file",
    "parse_compose_text",
]

#: Rule label of refusals of the compose file's structure (unsupported keys, missing ``main``, bad values).
COMPOSE_RULE = "COMPOSE-1"
#: The agent's sandbox (COMPOSE-1).
MAIN_SERVICE = "main"


@dataclass(frozen=True)
class ComposeBuild:
    """``build``: the context folder (absolute, inside ``environment/``) and the Dockerfile relative to it."""

    context: Path
    dockerfile: str = "Dockerfile"


@dataclass(frozen=True)
class ComposeHealthcheck:
    """``healthcheck`` in Docker's form: ``test`` is ``("CMD", argv...)`` or ``("CMD-SHELL", command)``, or
    ``("NONE",)`` when disabled (the image's own check is switched off too). Durations in seconds."""

    test: tuple[str, ...]
    interval_s: float = 30.0
    timeout_s: float = 30.0
    retries: int = 3
    start_period_s: float = 0.0

    @property
    def disabled(self) -> bool:
        """The service has no healthcheck (``disable: true`` or ``test: ["NONE"]``)."""
        return self.test[:1] == ("NONE",)


@dataclass(frozen=True)
class ComposeMount:
    """One ``volumes`` entry: a named volume of the group (``kind="volume"``, ``source`` = its compose name)
    or a path inside ``environment/`` (``kind="bind"``, ``source`` = the absolute host path)."""

    kind: str  # "volume" | "bind"
    source: str
    target: str
    read_only: bool = False


@dataclass(frozen=True)
class ComposeResources:
    """A size: ``cpus`` (float), ``memory_bytes`` and ``pids``; ``None`` = not given."""

    cpus: float | None = None
    memory_bytes: int | None = None
    pids: int | None = None


@dataclass(frozen=True)
class ComposeService:
    """One service of the group; ``main`` is the agent sandbox, any other a sidecar (COMPOSE-1).

    Attributes:
        name: the service name; sidecars are reachable from ``main`` (and each other) by it.
        image / build: exactly one is set.
        environment: ``(name, value)`` pairs in file order (see `env`).
        command / entrypoint: argv overrides of the image's CMD / ENTRYPOINT; ``None`` = the image's.
        working_dir, user: ``None`` = the image's.
        mounts: the ``volumes`` entries.
        depends_on: ``(service, condition)`` pairs, condition ``service_started`` or ``service_healthy``.
        healthcheck: ``None`` = the image's own (if any).
        limits, reservations, legacy: ``deploy.resources.limits``, ``.reservations``, top-level
            ``cpus``/``mem_limit``; `size` combines them (COMPOSE-2).
    """

    name: str
    image: str | None = None
    build: ComposeBuild | None = None
    environment: tuple[tuple[str, str], ...] = ()
    command: tuple[str, ...] | None = None
    entrypoint: tuple[str, ...] | None = None
    working_dir: str | None = None
    user: str | None = None
    mounts: tuple[ComposeMount, ...] = ()
    depends_on: tuple[tuple[str, str], ...] = ()
    healthcheck: ComposeHealthcheck | None = None
    limits: ComposeResources = field(default_factory=ComposeResources)
    reservations: ComposeResources = field(default_factory=ComposeResources)
    legacy: ComposeResources = field(default_factory=ComposeResources)

    @property
    def env(self) -> dict[str, str]:
        """``environment`` as a dict (a later duplicate wins)."""
        return dict(self.environment)

    @property
    def is_main(self) -> bool:
        return self.name == MAIN_SERVICE

    def size(self) -> ComposeResources:
        """COMPOSE-2, per resource: ``deploy.resources.limits``, else ``.reservations``, else the legacy
        ``cpus``/``mem_limit``, else ``None`` (the provider default). ``pids`` only comes from limits."""

        def first(*values):
            return next((v for v in values if v is not None), None)

        return ComposeResources(
            cpus=first(self.limits.cpus, self.reservations.cpus, self.legacy.cpus),
            memory_bytes=first(self.limits.memory_bytes, self.reservations.memory_bytes,
                               self.legacy.memory_bytes),
            pids=self.limits.pids,
        )


@dataclass(frozen=True)
class ComposeFile:
    """A parsed, validated compose file. Pickles and hashes.

    Attributes:
        path: the compose file.
        env_dir: the folder holding it (``environment/``); build contexts and bind paths lie inside it.
        services: every service in file order; ``main`` is among them.
        volumes: the named volumes declared at the top level.
    """

    path: Path
    env_dir: Path
    services: tuple[ComposeService, ...]
    volumes: tuple[str, ...] = ()

    @property
    def main(self) -> ComposeService:
        """Service ``main`` (COMPOSE-1)."""
        return self.service(MAIN_SERVICE)

    @property
    def sidecars(self) -> tuple[ComposeService, ...]:
        """Every service but ``main``, in file order."""
        return tuple(s for s in self.services if not s.is_main)

    @property
    def service_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.services)

    def service(self, name: str) -> ComposeService:
        """The service called ``name``.

        Raises:
            KeyError: no such service.
        """
        for svc in self.services:
            if svc.name == name:
                return svc
        raise KeyError(f"{self.path}: no service {name!r}; services: {list(self.service_names)}")

    def start_order(self) -> tuple[ComposeService, ...]:
        """Services ordered so that each comes after everything it depends on (file order otherwise)."""
        done: list[str] = []

        def visit(name: str) -> None:
            if name in done:
                return
            for dep, _ in self.service(name).depends_on:
                visit(dep)
            done.append(name)

        for svc in self.services:
            visit(svc.name)
        return tuple(self.service(n) for n in done)


def check_sidecar_names(compose: ComposeFile, uses: list[tuple[str, str]], toml_path: Path) -> None:
    """LOAD-12: every service named by an artifact entry or collect hook (``(field, service)`` pairs of
    ``task.toml``) is a service of ``compose``.

    Raises:
        TaskLoadError: the first unknown service, naming the ``task.toml`` field.
    """
    names = set(compose.service_names)
    for field_path, service in uses:
        if service not in names:
            raise TaskLoadError(
                f"names service {service!r}, which is not a service of {compose.path.name} "
                f"(services: {', '.join(compose.service_names)})",
                path=toml_path, field=field_path, rule="LOAD-12")


# --- parsing ----------------------------------------------------------------------------------------------


def parse_compose_file(path: Path, *, variables: ComposeVariables | None = None) -> ComposeFile:
    """Read, interpolate and validate the compose file ``path`` (its folder is the environment folder).

    ``variables``: where ``${VAR}`` values come from besides ``.env`` (``None``: no task env, no Harbor variables,
    no host variable).

    Raises:
        TaskLoadError: unreadable, not YAML, an unsupported key (named), a bad value, no ``main`` service
            (COMPOSE-1), a bad size (COMPOSE-2), a path outside the environment folder (LOAD-13), a required
            variable (``${VAR:?msg}``) unset or a malformed ``${...}`` (COMPOSE-1), a ``HOST_*_PATH`` variable
            outside a mount source (LOAD-13).
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"cannot read the compose file: {exc}", path=path, rule=COMPOSE_RULE) from exc
    return parse_compose_text(text, path=path, variables=variables)


def parse_compose_text(text: str, *, path: Path, variables: ComposeVariables | None = None) -> ComposeFile:
    """Validate compose YAML ``text`` as if it were the file ``path`` (see `parse_compose_file`)."""
    import yaml

    from harbor_gym.task._compose_parse import Refusal, parse_data
    from harbor_gym.task._compose_vars import ComposeVariableWarning, InterpolationError, interpolate_data, read_dotenv

    path = Path(path)
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TaskLoadError(f"not valid YAML: {exc}", path=path, rule=COMPOSE_RULE) from exc
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", ComposeVariableWarning)
            data = interpolate_data(data, variables or ComposeVariables(), read_dotenv(path.parent / ".env"))
        for item in caught:  # shown as coming from the compose file, not from harbor_gym's source
            warnings.warn_explicit(item.message, item.category, filename=str(path), lineno=1)
    except InterpolationError as bad:
        raise TaskLoadError(bad.message, path=path, field=bad.key, rule=bad.rule) from None
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"cannot read .env beside the compose file: {exc}", path=path.parent / ".env",
                            rule=COMPOSE_RULE) from exc
    try:
        return parse_data(data, path)
    except Refusal as refusal:
        raise TaskLoadError(refusal.message, path=path, field=refusal.key, rule=refusal.rule) from None

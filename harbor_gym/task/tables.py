"""The leaf tables of ``task.toml`` and shared pieces: enums, the frozen base model, rule-carrying errors.

Holds ``[task]``, healthchecks (FMT-8), collect hooks and artifact entries (FMT-9) and the ``[environment]``
schema (FMT-7), plus the LOAD-10 host checks. :mod:`harbor_gym.task.models` builds the whole ``task.toml``
from them and re-exports every name here. Validators are pure; a rule they enforce raises
:class:`RuleViolation` (a ``ValueError`` carrying the SPEC rule ID), which :mod:`harbor_gym.task.toml_io`
turns into a ``TaskLoadError``. Scalars are strict (no ``"600"`` or ``true`` for a number) and numbers finite:
anything else is LOAD-1.
"""

from __future__ import annotations

import math
import re
from enum import Enum
from typing import Annotated, Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    Strict,
    StrictInt,
    StrictStr,
    field_validator,
    model_validator,
)

__all__ = [
    "STEP_NAME_PATTERN",
    "TASK_NAME_PATTERN",
    "ArtifactEntry",
    "Author",
    "CollectHook",
    "EnvironmentConfig",
    "HealthcheckConfig",
    "MultiStepRewardStrategy",
    "NetworkMode",
    "Number",
    "OperatingSystem",
    "RuleViolation",
    "TaskMeta",
    "VerifierEnvironmentMode",
    "check_allowed_hosts",
    "is_network_restriction",
]

STEP_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
"""FMT-12: what a step name must match (full match)."""

TASK_NAME_PATTERN = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")
"""FMT-4: what ``[task].name`` must match (full match), besides containing no ``..``."""

Number = Annotated[float, Strict()]
"""A TOML integer or float (never a bool or a string); finiteness comes from ``allow_inf_nan=False``."""


class RuleViolation(ValueError):
    """A value breaks a SPEC rule other than a plain type error; carries the rule ID and an optional
    sub-field.

    Raised by validators; ``toml_io`` turns it into ``TaskLoadError(rule=rule)`` with the field path of the
    model plus ``field`` (when given).
    """

    def __init__(self, rule: str, message: str, field: str | None = None) -> None:
        super().__init__(message)
        self.rule = rule
        self.message = message
        self.field = field


class NetworkMode(str, Enum):
    """FMT-7: a sandbox's network policy."""

    PUBLIC = "public"
    NO_NETWORK = "no-network"
    ALLOWLIST = "allowlist"


class VerifierEnvironmentMode(str, Enum):
    """VER-1: where a step's verifier runs: in the agent sandbox (``shared``) or a fresh one
    (``separate``)."""

    SHARED = "shared"
    SEPARATE = "separate"


class MultiStepRewardStrategy(str, Enum):
    """FMT-4, RWD-7/8: how turn rewards roll up into the episode reward."""

    MEAN = "mean"
    FINAL = "final"


class OperatingSystem(str, Enum):
    """FMT-7: the sandbox OS; ``windows`` is refused at load (LOAD-15)."""

    LINUX = "linux"
    WINDOWS = "windows"


def _to_toml(value: Any) -> Any:
    """Plain TOML data of a model value: enums as their values, tuples as arrays, unset (``None``) fields left
    out."""
    if isinstance(value, BaseModel):
        out = {}
        for name in type(value).model_fields:
            item = getattr(value, name)
            if item is not None:
                out[name] = _to_toml(item)
        return out
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [_to_toml(item) for item in value]
    if isinstance(value, dict):
        return {key: _to_toml(item) for key, item in value.items()}
    return value


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False, validate_default=False)

    def to_toml_dict(self) -> dict[str, Any]:
        """This table as plain TOML data (``tomli_w.dumps`` accepts it); reloading it gives an equal model.

        Unset (``None``) fields are left out, defaults are written out, legacy keys never appear (FMT-13).
        """
        return _to_toml(self)


_HOST_LABEL = re.compile(r"^[A-Za-z0-9_](?:[A-Za-z0-9_-]*[A-Za-z0-9_])?$")


def _host_entry_problem(entry: str) -> str | None:
    """LOAD-10: why an ``allowed_hosts`` entry is refused, or ``None`` if it is a host name, IP or ``*.``
    wildcard."""
    if "://" in entry:
        return "is a URL (give the host name only)"
    if "/" in entry or "\\" in entry:
        return "is a path (give the host name only)"
    if ":" in entry:
        return "has a port (give the host name only)"
    body = entry.removeprefix("*.")
    if "*" in body:
        return "has a wildcard other than a leading '*.'"
    labels = body.rstrip(".").split(".") if body else []
    if not labels or not all(_HOST_LABEL.match(label) for label in labels):
        return "is not a host name"
    return None


def is_network_restriction(network_mode: NetworkMode | None, allowed_hosts: tuple[str, ...] | None) -> bool:
    """LOAD-8/9: a table restricts the network iff its ``network_mode`` is set and not ``public``, or it lists
    ``allowed_hosts`` (legacy ``allow_internet = false`` has become ``no-network`` by then, FMT-13)."""
    return (network_mode is not None and network_mode != NetworkMode.PUBLIC) or allowed_hosts is not None


def check_allowed_hosts(network_mode: NetworkMode | None, allowed_hosts: tuple[str, ...] | None) -> None:
    """LOAD-10: ``allowed_hosts`` needs ``network_mode = "allowlist"`` and plain host entries."""
    if allowed_hosts is None:
        return
    if network_mode != NetworkMode.ALLOWLIST:
        raise RuleViolation(
            "LOAD-10",
            'allowed_hosts is set without network_mode = "allowlist"; add that network_mode or drop allowed_hosts',
            "allowed_hosts",
        )
    for i, entry in enumerate(allowed_hosts):
        problem = _host_entry_problem(entry)
        if problem is not None:
            raise RuleViolation("LOAD-10", f"entry {entry!r} {problem}", f"allowed_hosts.{i}")


class Author(_Model):
    """One entry of ``[task].authors``."""

    name: StrictStr = Field(description="The author's name (required).")
    email: StrictStr | None = Field(None, description="The author's e-mail; unset: none given.")


class TaskMeta(_Model):
    """``[task]`` (FMT-4): descriptive only; the task ID is the folder name (FMT-3)."""

    name: StrictStr | None = Field(
        None, description="Label 'org/name' matching TASK_NAME_PATTERN without '..'; unset: no label (FMT-3)."
    )
    version: StrictStr | None = Field(None, description="Task version, non-empty; unset: none.")
    description: StrictStr = Field("", description="Free text; unset: empty.")
    authors: tuple[Author, ...] = Field((), description="Authors as {name, email}; unset: none.")
    keywords: tuple[StrictStr, ...] = Field((), description="Keywords; unset: none.")

    @field_validator("name")
    @classmethod
    def _name_format(cls, value: str | None) -> str | None:
        if value is not None and (not TASK_NAME_PATTERN.match(value) or ".." in value):
            raise ValueError(
                f"{value!r} must look like 'org/name' ({TASK_NAME_PATTERN.pattern}) without '..'"
            )
        return value

    @field_validator("version")
    @classmethod
    def _version_nonempty(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must be non-empty when given")
        return value


class HealthcheckConfig(_Model):
    """``[environment.healthcheck]`` / ``[steps.healthcheck]`` (FMT-8), polled as TURN-7 says; never scaled
    (BUD-3)."""

    command: StrictStr = Field(description="Shell command run with bash; exit 0 passes (required).")
    interval_sec: Number = Field(5.0, ge=0, description="Sleep after a counted failure, seconds.")
    timeout_sec: Number = Field(30.0, gt=0, description="Bound of one attempt, seconds (overrun = failure).")
    start_period_sec: Number = Field(
        0.0, ge=0, description="Grace period whose failures are not counted, seconds."
    )
    start_interval_sec: Number = Field(
        5.0, ge=0, description="Sleep after a failure in the grace period, seconds."
    )
    retries: StrictInt = Field(
        3, ge=0, description="Counted failures that fail the check (at least 1 is used)."
    )


class CollectHook(_Model):
    """One ``[[verifier.collect]]`` / ``[[steps.verifier.collect]]`` entry (FMT-9, ART-1/3)."""

    command: StrictStr = Field(description="Command run before artifact collection (required).")
    service: StrictStr = Field("main", description="Compose service to run in; 'main' is the agent sandbox.")
    timeout_sec: Number = Field(60.0, gt=0, description="Bound of the hook, seconds (never scaled, BUD-3).")
    user: StrictStr | None = Field(None, description="User to run as; unset: the service's default user.")


def _path_parts(path: str) -> list[str]:
    return [part for part in path.replace("\\", "/").split("/") if part]


class ArtifactEntry(_Model):
    """One ``artifacts`` entry (FMT-9): a string ``p`` means ``{source = p}``. LOAD-12 applies."""

    source: StrictStr = Field(min_length=1, description="Path to collect from the service (required).")
    destination: StrictStr | None = Field(
        None,
        description="Relative path under the turn's artifacts/ folder; unset: the source minus its leading '/'.",
    )
    exclude: tuple[StrictStr, ...] = Field(
        (), description="Glob patterns left out (directories only, ART-5)."
    )
    service: StrictStr | None = Field(None, description="Compose service to collect from; unset: main.")

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, data: Any) -> Any:
        return {"source": data} if isinstance(data, str) else data

    @model_validator(mode="after")
    def _paths(self) -> ArtifactEntry:
        if ".." in _path_parts(self.source):
            raise RuleViolation("LOAD-12", f"source {self.source!r} contains '..'", "source")
        if self.service not in (None, "main") and not self.source.startswith("/"):
            raise RuleViolation(
                "LOAD-12", f"a sidecar entry (service {self.service!r}) needs an absolute source", "source"
            )
        dest = self.destination
        if dest is not None:
            if dest.startswith("/") or re.match(r"^[A-Za-z]:", dest):
                raise RuleViolation(
                    "LOAD-12", f"destination {dest!r} is absolute; make it relative", "destination"
                )
            if "\\" in dest:
                raise RuleViolation("LOAD-12", f"destination {dest!r} contains '\\'; use '/'", "destination")
            parts = _path_parts(dest)
            if ".." in parts:
                raise RuleViolation("LOAD-12", f"destination {dest!r} contains '..'", "destination")
            if [p for p in parts if p != "."] == ["manifest.json"]:
                raise RuleViolation(
                    "LOAD-12", "destination 'manifest.json' is reserved (ART-4)", "destination"
                )
            if not [p for p in parts if p != "."]:
                raise RuleViolation("LOAD-12", f"destination {dest!r} names no path", "destination")
        return self


class EnvironmentConfig(_Model):
    """``[environment]`` and every table of its schema (``[verifier.environment]``,
    ``[steps.verifier.environment]``), FMT-7. Unset resources mean the provider default; LOAD-24 decides at
    seed what the provider cannot honour."""

    docker_image: StrictStr | None = Field(
        None, description="Image to run; wins over environment/Dockerfile (FMT-10)."
    )
    cpus: Annotated[float, Strict(), Field(allow_inf_nan=True)] | None = Field(
        None, description="CPU limit (finite, > 0; LOAD-11); unset: provider default."
    )
    memory_mb: StrictInt | None = Field(
        None, gt=0, description="Memory limit in MiB; unset: provider default."
    )
    storage_mb: StrictInt | None = Field(
        None, gt=0, description="Disk limit in MiB; unset: provider default."
    )
    gpus: StrictInt | None = Field(None, ge=0, description="Number of GPUs; unset: none requested.")
    gpu_types: tuple[StrictStr, ...] | None = Field(None, description="Acceptable GPU types; unset: any.")
    tpu: StrictStr | StrictInt | None = Field(
        None, description="TPU request (provider-specific); unset: none."
    )
    skills_dir: StrictStr | None = Field(
        None, description="Folder of agent skills in the sandbox; unset: none."
    )
    healthcheck: HealthcheckConfig | None = Field(None, description="Seed healthcheck (TURN-7); unset: none.")
    workdir: StrictStr | None = Field(
        None, description="Agent workdir; unset: the image's WORKDIR, else '/'."
    )
    allowed_hosts: tuple[StrictStr, ...] | None = Field(
        None, description="Hosts reachable under network_mode 'allowlist' (LOAD-10); unset: none listed."
    )
    build_timeout_sec: Number = Field(
        600.0, gt=0, description="Bound of an image build / sandbox start (BUD-9)."
    )
    os: OperatingSystem = Field(
        OperatingSystem.LINUX, description="Sandbox OS; 'windows' is refused (LOAD-15)."
    )
    mcp_servers: tuple[dict[StrictStr, Any], ...] = Field((), description="MCP server tables for the agent.")
    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict,
        description="Environment of every command in the sandbox; values may be FMT-15 templates.",
    )
    network_mode: NetworkMode = Field(NetworkMode.PUBLIC, description="Network policy of the sandbox.")

    @field_validator("cpus")
    @classmethod
    def _cpus_finite(cls, value: float | None) -> float | None:
        if value is not None and not math.isfinite(value):
            raise RuleViolation("LOAD-11", f"cpus must be a finite number, got {value}")
        if value is not None and value <= 0:
            raise ValueError(f"cpus must be > 0, got {value}")
        return value

    @model_validator(mode="after")
    def _rules(self) -> EnvironmentConfig:
        if self.os == OperatingSystem.WINDOWS:
            raise RuleViolation("LOAD-15", 'os = "windows" is out of scope; use "linux"', "os")
        check_allowed_hosts(self.network_mode, self.allowed_hosts)
        return self

"""Parsing helpers of `harbor_gym.task.compose`: YAML data -> `ComposeFile`, every key checked (private)."""

from __future__ import annotations

import math
import re
import shlex
from pathlib import Path
from typing import Any

from harbor_gym.task.compose import (
    COMPOSE_RULE,
    MAIN_SERVICE,
    ComposeBuild,
    ComposeFile,
    ComposeHealthcheck,
    ComposeMount,
    ComposeResources,
    ComposeService,
)
from harbor_gym.task.files import is_within

__all__ = ["Refusal", "parse_data"]

_SERVICE_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_VOLUME_NAME = re.compile(r"^[a-zA-Z0-9][a-zA-Z0-9_.-]*$")
_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(us|ms|s|m|h)")
_BYTES = re.compile(r"^(\d+(?:\.\d+)?)\s*([bkmg]?)b?$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_SECONDS = {"us": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}

_SERVICE_KEYS = frozenset({
    "image", "build", "environment", "command", "entrypoint", "working_dir", "user", "volumes", "depends_on",
    "healthcheck", "deploy", "cpus", "mem_limit",
})
_HEALTHCHECK_KEYS = frozenset({"test", "interval", "timeout", "retries", "start_period", "disable"})
_CONDITIONS = ("service_started", "service_healthy")



class Refusal(Exception):
    """A refusal at ``key`` (dotted path), turned into `TaskLoadError` by `parse_compose_text`."""

    def __init__(self, key: str, message: str, rule: str = COMPOSE_RULE) -> None:
        super().__init__(message)
        self.key, self.message, self.rule = key, message, rule



def parse_data(data: Any, path: Path) -> ComposeFile:
    env_dir = path.parent
    if not isinstance(data, dict):
        raise Refusal("services", "the file must be a mapping with a 'services' key")
    for key in data:
        if key in ("services", "volumes", "version") or _is_extension(key):
            continue
        raise Refusal(str(key), f"top-level key {key!r} is not supported by harbor_gym's compose subset "
                                 "(supported: services, volumes, version, x-*)")
    volumes = _top_volumes(data.get("volumes"))
    services_raw = data.get("services")
    if not isinstance(services_raw, dict) or not services_raw:
        raise Refusal("services", "'services' must be a non-empty mapping of service names")
    if MAIN_SERVICE not in services_raw:
        raise Refusal("services.main", "no service 'main': service main is the agent's sandbox (COMPOSE-1)")
    services = []
    for name, body in services_raw.items():
        name = str(name)
        if not _SERVICE_NAME.match(name):
            raise Refusal(f"services.{name}", "a service name must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
        services.append(_service(name, body, env_dir, volumes))
    compose = ComposeFile(path=path, env_dir=env_dir, services=tuple(services), volumes=volumes)
    _check_dependencies(compose)
    return compose


def _is_extension(key: Any) -> bool:
    return isinstance(key, str) and key.startswith("x-")


def _top_volumes(raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise Refusal("volumes", "top-level 'volumes' must be a mapping of volume names")
    names = []
    for name, body in raw.items():
        name = str(name)
        if not _VOLUME_NAME.match(name):
            raise Refusal(f"volumes.{name}", "a volume name must match [a-zA-Z0-9][a-zA-Z0-9_.-]*")
        if body not in (None, {}):
            keys = list(body) if isinstance(body, dict) else [body]
            raise Refusal(f"volumes.{name}.{keys[0]}" if isinstance(body, dict) else f"volumes.{name}",
                          "volume options (driver, external, name, ...) are not supported; declare the "
                          "volume with no options")
        names.append(name)
    return tuple(names)


def _service(name: str, body: Any, env_dir: Path, volumes: tuple[str, ...]) -> ComposeService:
    where = f"services.{name}"
    if body is None:
        body = {}
    if not isinstance(body, dict):
        raise Refusal(where, "a service must be a mapping")
    for key in body:
        if key not in _SERVICE_KEYS and not _is_extension(key):
            raise Refusal(f"{where}.{key}", f"key {key!r} is not supported by harbor_gym's compose subset "
                                             f"(supported: {', '.join(sorted(_SERVICE_KEYS))}, x-*)")
    image = body.get("image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise Refusal(f"{where}.image", "must be a non-empty image name")
    build = _build(body["build"], env_dir, f"{where}.build") if "build" in body else None
    if image is None and build is None:
        raise Refusal(where, "needs 'image' or 'build'")
    if image is not None and build is not None:
        raise Refusal(f"{where}.image", "give either 'image' or 'build', not both")
    deploy = _deploy(body.get("deploy"), f"{where}.deploy")
    return ComposeService(
        name=name,
        image=image,
        build=build,
        environment=_environment(body.get("environment"), f"{where}.environment"),
        command=_argv(body.get("command"), f"{where}.command"),
        entrypoint=_argv(body.get("entrypoint"), f"{where}.entrypoint"),
        working_dir=_abs_path(body.get("working_dir"), f"{where}.working_dir"),
        user=_user(body.get("user"), f"{where}.user"),
        mounts=_mounts(body.get("volumes"), env_dir, volumes, f"{where}.volumes"),
        depends_on=_depends_on(body.get("depends_on"), f"{where}.depends_on"),
        healthcheck=_healthcheck(body.get("healthcheck"), f"{where}.healthcheck"),
        limits=deploy[0],
        reservations=deploy[1],
        legacy=ComposeResources(
            cpus=_cpus(body.get("cpus"), f"{where}.cpus"),
            memory_bytes=_bytes(body.get("mem_limit"), f"{where}.mem_limit"),
        ),
    )


def _build(raw: Any, env_dir: Path, where: str) -> ComposeBuild:
    if isinstance(raw, str):
        raw = {"context": raw}
    if not isinstance(raw, dict):
        raise Refusal(where, "must be a context path or a mapping with context and dockerfile")
    for key in raw:
        if key not in ("context", "dockerfile"):
            raise Refusal(f"{where}.{key}", f"build key {key!r} is not supported (context, dockerfile)")
    context_raw = raw.get("context", ".")
    if not isinstance(context_raw, str) or not context_raw:
        raise Refusal(f"{where}.context", "must be a path relative to the environment folder")
    if "://" in context_raw or context_raw.startswith(("git@", "/", "~")):
        raise Refusal(f"{where}.context", "must be a relative path inside the environment folder", "LOAD-13")
    context = env_dir / context_raw
    if not is_within(context, env_dir):
        raise Refusal(f"{where}.context", f"{context_raw!r} is outside the environment folder", "LOAD-13")
    if not context.is_dir():
        raise Refusal(f"{where}.context", f"build context {context_raw!r} is not a folder")
    dockerfile = raw.get("dockerfile", "Dockerfile")
    if not isinstance(dockerfile, str) or not dockerfile or dockerfile.startswith("/"):
        raise Refusal(f"{where}.dockerfile", "must be a path relative to the build context")
    if not is_within(context / dockerfile, context):
        raise Refusal(f"{where}.dockerfile", f"{dockerfile!r} resolves outside the build context", "LOAD-13")
    if not (context / dockerfile).is_file():
        raise Refusal(f"{where}.dockerfile", f"no {dockerfile} in build context {context_raw!r}")
    return ComposeBuild(context=Path(context.resolve()), dockerfile=dockerfile)


def _scalar_text(value: Any, where: str) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float, str)):
        return str(value)
    raise Refusal(where, f"must be a string or number, got {type(value).__name__}")


def _environment(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    pairs: list[tuple[str, str]] = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            if value is None:
                raise Refusal(f"{where}.{key}", "a variable without a value (taken from the host) is not "
                                                 "supported; give its value")
            pairs.append((str(key), _scalar_text(value, f"{where}.{key}")))
    elif isinstance(raw, list):
        for i, item in enumerate(raw):
            if not isinstance(item, str) or "=" not in item:
                raise Refusal(f"{where}[{i}]", "list entries must be 'NAME=value' (host pass-through is not "
                                                "supported)")
            key, _, value = item.partition("=")
            pairs.append((key, value))
    else:
        raise Refusal(where, "must be a mapping or a list of NAME=value")
    for key, _ in pairs:
        if not key or "=" in key:
            raise Refusal(where, f"bad variable name {key!r}")
    return tuple(pairs)


def _argv(raw: Any, where: str) -> tuple[str, ...] | None:
    if raw is None:
        return None
    if isinstance(raw, str):
        try:
            return tuple(shlex.split(raw))
        except ValueError as exc:
            raise Refusal(where, f"cannot split the command like a shell: {exc}") from exc
    if isinstance(raw, list):
        return tuple(_scalar_text(v, f"{where}[{i}]") for i, v in enumerate(raw))
    raise Refusal(where, "must be a string or a list of strings")


def _abs_path(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if not isinstance(raw, str) or not raw.startswith("/"):
        raise Refusal(where, "must be an absolute path inside the container")
    return raw


def _user(raw: Any, where: str) -> str | None:
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int)) or str(raw) == "":
        raise Refusal(where, "must be a user name or uid (optionally :group)")
    return str(raw)


def _mounts(raw: Any, env_dir: Path, volumes: tuple[str, ...], where: str) -> tuple[ComposeMount, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise Refusal(where, "must be a list")
    out = []
    for i, item in enumerate(raw):
        at = f"{where}[{i}]"
        if isinstance(item, str):
            kind, source, target, read_only = _short_mount(item, at)
        elif isinstance(item, dict):
            kind, source, target, read_only = _long_mount(item, at)
        else:
            raise Refusal(at, "must be 'source:target[:ro]' or a mapping with type, source, target")
        if not isinstance(target, str) or not target.startswith("/"):
            raise Refusal(at, "the target must be an absolute path inside the container")
        if kind == "volume":
            if source not in volumes:
                raise Refusal(at, f"named volume {source!r} is not declared in the top-level 'volumes'")
            out.append(ComposeMount("volume", source, target, read_only))
            continue
        if source.startswith(("/", "~")):
            raise Refusal(at, f"host path {source!r} is outside the environment folder; only relative paths "
                               "inside it can be mounted", "LOAD-13")
        host = env_dir / source
        if not is_within(host, env_dir):
            raise Refusal(at, f"{source!r} resolves outside the environment folder", "LOAD-13")
        if not host.exists():
            raise Refusal(at, f"{source!r} does not exist in the environment folder")
        out.append(ComposeMount("bind", str(host.resolve()), target, read_only))
    return tuple(out)


def _short_mount(item: str, at: str) -> tuple[str, str, str, bool]:
    parts = item.split(":")
    if len(parts) < 2 or len(parts) > 3:
        raise Refusal(at, f"{item!r}: anonymous volumes are not supported; use 'name:/path' with a declared "
                           "volume, or './path:/path'")
    source, target = parts[0], parts[1]
    mode = parts[2] if len(parts) == 3 else "rw"
    if mode not in ("ro", "rw"):
        raise Refusal(at, f"{item!r}: mount option {mode!r} is not supported (ro or rw)")
    kind = "bind" if source.startswith((".", "/", "~")) else "volume"
    return kind, source, target, mode == "ro"


def _long_mount(item: dict, at: str) -> tuple[str, str, str, bool]:
    for key in item:
        if key not in ("type", "source", "target", "read_only"):
            raise Refusal(f"{at}.{key}", f"mount key {key!r} is not supported (type, source, target, "
                                         "read_only)")
    kind = item.get("type")
    if kind not in ("volume", "bind"):
        raise Refusal(f"{at}.type", "must be 'volume' or 'bind' (tmpfs, npipe, cluster are not supported)")
    source = item.get("source")
    if not isinstance(source, str) or not source:
        raise Refusal(f"{at}.source", "is required (anonymous volumes are not supported)")
    read_only = item.get("read_only", False)
    if not isinstance(read_only, bool):
        raise Refusal(f"{at}.read_only", "must be true or false")
    return kind, source, item.get("target"), read_only


def _depends_on(raw: Any, where: str) -> tuple[tuple[str, str], ...]:
    if raw is None:
        return ()
    if isinstance(raw, list):
        if not all(isinstance(n, str) for n in raw):
            raise Refusal(where, "list entries must be service names")
        return tuple((n, "service_started") for n in raw)
    if not isinstance(raw, dict):
        raise Refusal(where, "must be a list of services or a mapping service -> {condition}")
    out = []
    for dep, body in raw.items():
        dep = str(dep)
        body = body or {}
        if not isinstance(body, dict):
            raise Refusal(f"{where}.{dep}", "must be a mapping with 'condition'")
        for key in body:
            if key != "condition":
                raise Refusal(f"{where}.{dep}.{key}", f"depends_on key {key!r} is not supported (condition)")
        condition = body.get("condition", "service_started")
        if condition not in _CONDITIONS:
            raise Refusal(f"{where}.{dep}.condition",
                           f"condition {condition!r} is not supported ({' or '.join(_CONDITIONS)})")
        out.append((dep, condition))
    return tuple(out)


def _duration(raw: Any, where: str) -> float:
    if isinstance(raw, str):
        text = raw.strip()
        pos, total = 0, 0.0
        for m in _DURATION_PART.finditer(text):
            if m.start() != pos:
                break
            total += float(m.group(1)) * _SECONDS[m.group(2)]
            pos = m.end()
        if pos == len(text) and text:
            return total
    raise Refusal(where, f"{raw!r} is not a duration like '5s', '500ms' or '1m30s'")


def _healthcheck(raw: Any, where: str) -> ComposeHealthcheck | None:
    if raw is None:
        return None
    if not isinstance(raw, dict):
        raise Refusal(where, "must be a mapping")
    for key in raw:
        if key not in _HEALTHCHECK_KEYS:
            raise Refusal(f"{where}.{key}", f"healthcheck key {key!r} is not supported "
                                             f"({', '.join(sorted(_HEALTHCHECK_KEYS))})")
    if raw.get("disable") is True:
        return ComposeHealthcheck(test=("NONE",))
    if raw.get("disable") not in (None, False):
        raise Refusal(f"{where}.disable", "must be true or false")
    test = raw.get("test")
    if isinstance(test, str) and test:
        form: tuple[str, ...] = ("CMD-SHELL", test)
    elif isinstance(test, list) and test and all(isinstance(t, str) for t in test):
        form = tuple(test)
        if form[0] == "CMD-SHELL" and len(form) != 2:
            raise Refusal(f"{where}.test", "CMD-SHELL takes exactly one command string")
        if form[0] not in ("CMD", "CMD-SHELL", "NONE") or (form[0] == "CMD" and len(form) < 2):
            raise Refusal(f"{where}.test", "a list must start with CMD (then argv), CMD-SHELL or NONE")
    else:
        raise Refusal(f"{where}.test", "is required: a command string or a CMD/CMD-SHELL list")
    retries = raw.get("retries", 3)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        raise Refusal(f"{where}.retries", "must be an integer >= 0")
    def seconds(key: str, default: float) -> float:
        return _duration(raw[key], f"{where}.{key}") if key in raw else default

    check = ComposeHealthcheck(test=form, interval_s=seconds("interval", 30.0),
                               timeout_s=seconds("timeout", 30.0), retries=retries,
                               start_period_s=seconds("start_period", 0.0))
    for name, value in (("interval", check.interval_s), ("timeout", check.timeout_s)):
        if name in raw and value < 0.001:
            raise Refusal(f"{where}.{name}", "must be at least 1ms")
    return check


def _cpus(raw: Any, where: str) -> float | None:
    if raw is None:
        return None
    try:
        value = float(raw) if not isinstance(raw, bool) else math.nan
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value) or value <= 0:
        raise Refusal(where, f"{raw!r} is not a finite number of CPUs > 0", "COMPOSE-2")
    return value


def _bytes(raw: Any, where: str) -> int | None:
    if raw is None:
        return None
    if isinstance(raw, int) and not isinstance(raw, bool) and raw > 0:
        return raw
    m = _BYTES.match(raw.strip()) if isinstance(raw, str) else None
    if m is None or float(m.group(1)) <= 0:
        raise Refusal(where, f"{raw!r} is not a size like '512m', '1g' or a byte count", "COMPOSE-2")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def _resources(raw: Any, where: str, *, pids: bool) -> ComposeResources:
    if raw is None:
        return ComposeResources()
    if not isinstance(raw, dict):
        raise Refusal(where, "must be a mapping", "COMPOSE-2")
    allowed = ("cpus", "memory", "pids") if pids else ("cpus", "memory")
    for key in raw:
        if key not in allowed:
            raise Refusal(f"{where}.{key}", f"resource {key!r} is not supported ({', '.join(allowed)})",
                           "COMPOSE-2")
    count = raw.get("pids")
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count <= 0):
        raise Refusal(f"{where}.pids", "must be an integer > 0", "COMPOSE-2")
    return ComposeResources(cpus=_cpus(raw.get("cpus"), f"{where}.cpus"),
                            memory_bytes=_bytes(raw.get("memory"), f"{where}.memory"), pids=count)


def _deploy(raw: Any, where: str) -> tuple[ComposeResources, ComposeResources]:
    if raw is None:
        return ComposeResources(), ComposeResources()
    if not isinstance(raw, dict):
        raise Refusal(where, "must be a mapping")
    for key in raw:
        if key != "resources":
            raise Refusal(f"{where}.{key}", f"deploy key {key!r} is not supported (resources)")
    resources = raw.get("resources") or {}
    if not isinstance(resources, dict):
        raise Refusal(f"{where}.resources", "must be a mapping", "COMPOSE-2")
    for key in resources:
        if key not in ("limits", "reservations"):
            raise Refusal(f"{where}.resources.{key}", f"key {key!r} is not supported (limits, reservations)",
                           "COMPOSE-2")
    return (_resources(resources.get("limits"), f"{where}.resources.limits", pids=True),
            _resources(resources.get("reservations"), f"{where}.resources.reservations", pids=False))


def _check_dependencies(compose: ComposeFile) -> None:
    names = set(compose.service_names)
    for svc in compose.services:
        for dep, condition in svc.depends_on:
            at = f"services.{svc.name}.depends_on.{dep}"
            if dep not in names:
                raise Refusal(at, f"depends on {dep!r}, which is not a service of the file")
            if dep == svc.name:
                raise Refusal(at, "a service cannot depend on itself")
            target = compose.service(dep)
            check = target.healthcheck
            if condition == "service_healthy" and check is not None and check.disabled:
                raise Refusal(at, f"waits for {dep!r} to be healthy but its healthcheck is disabled")
    state: dict[str, int] = {}

    def visit(name: str, trail: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            cycle = " -> ".join(trail[trail.index(name):] + (name,))
            raise Refusal(f"services.{name}.depends_on", f"dependency cycle: {cycle}")
        state[name] = 1
        for dep, _ in compose.service(name).depends_on:
            visit(dep, trail + (name,))
        state[name] = 2

    for svc in compose.services:
        visit(svc.name, ())

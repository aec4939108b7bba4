"""Variable interpolation of ``environment/docker-compose.yaml`` (private helper of `harbor_gym.task.compose`).

Syntax (the compose specification's): ``$$`` is a literal ``$``; ``$VAR`` and ``${VAR}`` (unset: empty, with a
warning); ``${VAR:-default}`` / ``${VAR-default}`` (default when unset or empty / when unset); ``${VAR:?message}`` /
``${VAR?message}`` (refused when unset or empty / when unset, naming the variable and the message);
``${VAR:+other}`` / ``${VAR+other}``. Defaults may nest ``${...}``. Keys are never interpolated; values are.

Where values come from, first match wins (as ``docker compose`` sees Harbor 0.25's runner environment):
1. the task's ``[environment].env`` (literal values; FMT-15 templates resolved through the allowlist);
2. the variables Harbor's Docker runner defines for compose files (`HARBOR_VARIABLES`), as harbor_gym computes them:
   ``CONTEXT_DIR`` = ``.`` (the environment folder; relative paths resolve inside it), ``MAIN_IMAGE_NAME`` =
   ``hb__<task name>`` (sanitized like Harbor's), ``PREBUILT_IMAGE_NAME`` = ``[environment].docker_image`` (only
   when set), ``CPUS`` = ``[environment].cpus`` (else 1), ``MEMORY`` = ``<memory_mb>M`` (``[environment].memory_mb``,
   else `EnvConfig.default_memory_mb`, else 2048), ``ENV_VERIFIER_LOGS_PATH`` = ``/logs/verifier``,
   ``ENV_AGENT_LOGS_PATH`` = ``/logs/agent``, ``ENV_ARTIFACTS_PATH`` = ``/logs/artifacts``;
3. host variables named in `EnvConfig.host_env_allowlist` (empty by default): any other host variable counts as
   unset and is never read;
4. the ``.env`` file beside the compose file (``KEY=VALUE`` lines, ``#`` comments, optional ``export`` and quotes).

Harbor's host-path variables (`HOST_PATH_VARIABLES`: ``HOST_VERIFIER_LOGS_PATH``, ``HOST_AGENT_LOGS_PATH``,
``HOST_ARTIFACTS_PATH``) never become host bind mounts: a ``volumes`` entry whose source names one is dropped with a
warning (harbor_gym provides ``/logs/verifier``, ``/logs/agent`` and ``/logs/artifacts`` through its own copy channel,
GYM-10), and any other use of them is refused (LOAD-13).
"""

from __future__ import annotations

import os
import re
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = ["HARBOR_VARIABLES", "HOST_PATH_VARIABLES", "ComposeVariables", "ComposeVariableWarning",
           "InterpolationError", "harbor_variables", "interpolate_data", "read_dotenv"]

#: The non-host variables Harbor 0.25's Docker runner defines for compose files (DockerEnvironmentEnvVars).
HARBOR_VARIABLES = ("MAIN_IMAGE_NAME", "CONTEXT_DIR", "PREBUILT_IMAGE_NAME", "CPUS", "MEMORY",
                    "ENV_VERIFIER_LOGS_PATH", "ENV_AGENT_LOGS_PATH", "ENV_ARTIFACTS_PATH")
#: Harbor's host folders of a trial: never bind-mounted by harbor_gym.
HOST_PATH_VARIABLES = ("HOST_VERIFIER_LOGS_PATH", "HOST_AGENT_LOGS_PATH", "HOST_ARTIFACTS_PATH")

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_OPS = (":-", ":?", ":+", "-", "?", "+")
_DOTENV = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_.-]*)\s*=\s*(.*)$")


class ComposeVariableWarning(UserWarning):
    """A compose variable was unset (empty string used) or a host-path mount was dropped."""


class _HostPathUsed(Exception):
    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.name = name


class InterpolationError(Exception):
    """A ``${VAR:?msg}`` that is unset, or a malformed ``${...}``; ``key`` is the dotted path of the value."""

    def __init__(self, key: str, message: str, rule: str = "COMPOSE-1") -> None:
        super().__init__(message)
        self.key, self.message, self.rule = key, message, rule


@dataclass(frozen=True)
class ComposeVariables:
    """Where a compose file's variables come from (see the module docstring).

    Attributes:
        task_env: the task's ``[environment].env`` after FMT-15 (highest precedence).
        harbor: `harbor_variables` of the task.
        host_allowlist: host variables that may be read (`EnvConfig.host_env_allowlist`).
        host_env: the host environment (``None``: ``os.environ``).
    """

    task_env: Mapping[str, str] = field(default_factory=dict)
    harbor: Mapping[str, str] = field(default_factory=dict)
    host_allowlist: tuple[str, ...] = ()
    host_env: Mapping[str, str] | None = None

    def lookup(self, dotenv: Mapping[str, str]) -> Callable[[str], str | None]:
        host = os.environ if self.host_env is None else self.host_env
        allowed = frozenset(self.host_allowlist)

        def get(name: str) -> str | None:
            if name in HOST_PATH_VARIABLES and name not in self.task_env:
                raise _HostPathUsed(name)
            for source in (self.task_env, self.harbor):
                if name in source:
                    return source[name]
            if name in allowed and name in host:
                return host[name]
            return dotenv.get(name)

        return get


def _sanitize_image_name(name: str) -> str:
    name = name.lower()
    if not re.match(r"^[a-z0-9]", name):
        name = "0" + name
    return re.sub(r"[^a-z0-9._-]", "-", name)


def harbor_variables(task_name: str, *, cpus: float | None, memory_mb: int | None,
                     docker_image: str | None) -> dict[str, str]:
    """The `HARBOR_VARIABLES` as harbor_gym computes them for a task (see the module docstring)."""
    out = {
        "MAIN_IMAGE_NAME": _sanitize_image_name(f"hb__{task_name}"),
        "CONTEXT_DIR": ".",
        "CPUS": f"{cpus:g}" if cpus is not None else "1",
        "MEMORY": f"{memory_mb if memory_mb is not None else 2048}M",
        "ENV_VERIFIER_LOGS_PATH": "/logs/verifier",
        "ENV_AGENT_LOGS_PATH": "/logs/agent",
        "ENV_ARTIFACTS_PATH": "/logs/artifacts",
    }
    if docker_image:
        out["PREBUILT_IMAGE_NAME"] = docker_image
    return out


def read_dotenv(path: Path) -> dict[str, str]:
    """``KEY=VALUE`` lines of ``path`` (missing file: ``{}``); ``#`` lines and blank lines skipped, ``export``
    allowed, one level of matching quotes removed, an unquoted value's `` #`` comment dropped."""
    if not path.is_file():
        return {}
    out: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _DOTENV.match(line)
        if m is None:
            continue
        key, value = m.group(1), m.group(2).strip()
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        elif " #" in value:
            value = value.split(" #", 1)[0].rstrip()
        out[key] = value
    return out


def _closing_brace(text: str, start: int) -> int:
    """Index of the ``}`` closing the ``{`` at ``start``, or -1."""
    depth = 0
    i = start
    while i < len(text):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


def _interpolate(text: str, get: Callable[[str], str | None], key: str) -> str:
    out: list[str] = []
    i = 0
    while i < len(text):
        ch = text[i]
        if ch != "$":
            out.append(ch)
            i += 1
            continue
        nxt = text[i + 1:i + 2]
        if nxt == "$":
            out.append("$")
            i += 2
            continue
        if nxt == "{":
            end = _closing_brace(text, i + 1)
            if end < 0:
                raise InterpolationError(key, f"unterminated '${{' in {text!r}")
            out.append(_expand(text[i + 2:end], get, key))
            i = end + 1
            continue
        m = _NAME.match(text, i + 1)
        if m is None:
            out.append("$")
            i += 1
            continue
        out.append(_value(m.group(), get, key))
        i = m.end()
    return "".join(out)


def _value(name: str, get: Callable[[str], str | None], key: str) -> str:
    value = get(name)
    if value is None:
        warnings.warn(ComposeVariableWarning(f"{key}: variable {name} is not set (not in the task's env, Harbor's "
                                             "compose variables, the host allowlist or .env): empty string used"),
                      stacklevel=2)
        return ""
    return value


def _expand(body: str, get: Callable[[str], str | None], key: str) -> str:
    m = _NAME.match(body)
    if m is None:
        raise InterpolationError(key, f"invalid interpolation '${{{body}}}'")
    name, rest = m.group(), body[m.end():]
    if not rest:
        return _value(name, get, key)
    op = next((o for o in _OPS if rest.startswith(o)), None)
    if op is None:
        raise InterpolationError(key, f"invalid interpolation '${{{body}}}'")
    arg = rest[len(op):]
    value = get(name)
    if op == ":-":
        return value if value else _interpolate(arg, get, key)
    if op == "-":
        return value if value is not None else _interpolate(arg, get, key)
    if op in (":?", "?"):
        if (op == ":?" and not value) or value is None:
            message = _interpolate(arg, get, key) or "required"
            raise InterpolationError(key, f"variable {name} is required: {message} (set it in environment/.env, the "
                                          "task's [environment].env, or allowlist a host variable with "
                                          "EnvConfig.host_env_allowlist)")
        return value
    if op == ":+":
        return _interpolate(arg, get, key) if value else ""
    return _interpolate(arg, get, key) if value is not None else ""


def _walk(data: Any, get: Callable[[str], str | None], key: str) -> Any:
    if isinstance(data, dict):
        return {k: _walk_entry(k, v, get, f"{key}.{k}" if key else str(k)) for k, v in data.items()}
    if isinstance(data, list):
        return [_walk(v, get, f"{key}[{i}]") for i, v in enumerate(data)]
    if isinstance(data, str):
        try:
            return _interpolate(data, get, key)
        except _HostPathUsed as used:
            raise InterpolationError(key, f"{used.name} is a host folder of Harbor's runner; harbor_gym never makes "
                                          "it a host bind mount or passes it on (only a 'volumes' entry naming it is "
                                          "accepted, and dropped)", "LOAD-13") from None
    return data


def _walk_entry(name: Any, value: Any, get: Callable[[str], str | None], key: str) -> Any:
    if name == "volumes" and isinstance(value, list) and key.startswith("services."):
        return [_walk(v, get, f"{key}[{i}]") for i, v in enumerate(value) if not _drops(v, get, f"{key}[{i}]")]
    return _walk(value, get, key)


def _drops(entry: Any, get: Callable[[str], str | None], key: str) -> bool:
    """A ``volumes`` entry whose source names a `HOST_PATH_VARIABLES` variable is dropped, with a warning."""
    source = entry.get("source") if isinstance(entry, dict) else entry.split(":", 1)[0] if isinstance(entry, str) \
        else None
    if not isinstance(source, str):
        return False
    try:
        _interpolate(source, get, key)
    except _HostPathUsed as used:
        warnings.warn(ComposeVariableWarning(f"{key}: mount of ${{{used.name}}} (a host folder of Harbor's runner) "
                                             "dropped; harbor_gym never bind-mounts host folders and provides /logs "
                                             "itself"), stacklevel=2)
        return True
    except InterpolationError:
        return False
    return False


def interpolate_data(data: Any, variables: ComposeVariables, dotenv: Mapping[str, str]) -> Any:
    """``data`` (the compose file's YAML) with every string value interpolated (see the module docstring).

    Raises:
        InterpolationError: a required variable is unset, an interpolation is malformed (COMPOSE-1), or a host-path
            variable is used outside a ``volumes`` source (LOAD-13). ``key`` names the value.
    """
    return _walk(data, variables.lookup(dotenv), "")


"""Pure text helpers of the task layer: FMT-2 canary stripping and FMT-15 env templates (with the host variable
allowlist, `EnvConfig.host_env_allowlist`)."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

from harbor_gym.errors import EnvTemplateError

__all__ = ["is_env_template", "resolve_env_templates", "strip_canary"]

_TEMPLATE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-(.*))?\}$", re.DOTALL)


def _is_blank(line: str) -> bool:
    return not line.strip()


def strip_canary(text: str) -> str:
    """FMT-2: drop the leading canary lines and the blank lines after them.

    A canary line is a ``#`` line containing "canary" (any case), or an HTML comment (``<!-- ... -->``,
    possibly spanning lines) whose text contains "canary". Only the leading run counts: blank lines may sit
    between canary lines; the first other line ends the run. Without a canary the text is returned unchanged.
    """
    lines = text.splitlines(keepends=True)
    i = 0
    cut = 0
    while i < len(lines):
        stripped = lines[i].strip()
        if _is_blank(lines[i]):
            i += 1
            continue
        if stripped.startswith("#") and "canary" in stripped.lower():
            i += 1
            cut = i
            continue
        if stripped.startswith("<!--"):
            j = i
            while j < len(lines) and "-->" not in lines[j]:
                j += 1
            if j == len(lines):
                break
            comment = "".join(lines[i : j + 1])
            tail = lines[j].split("-->", 1)[1]
            if "canary" in comment.lower() and not tail.strip():
                i = j + 1
                cut = i
                continue
        break
    if cut == 0:
        return text
    while cut < len(lines) and _is_blank(lines[cut]):
        cut += 1
    return "".join(lines[cut:])


def is_env_template(value: str) -> bool:
    """FMT-15: whether ``value`` is exactly ``${VAR}`` or ``${VAR:-default}``."""
    return _TEMPLATE.match(value) is not None


def resolve_env_templates(env: Mapping[str, str], host_env: Mapping[str, str], *,
                          allowlist: Iterable[str] | None = None) -> dict[str, str]:
    """FMT-15: resolve env values that are exactly ``${VAR}`` / ``${VAR:-default}`` against ``host_env``.

    ``${VAR}`` takes ``host_env[VAR]`` (an empty value counts as set); ``${VAR:-default}`` takes
    ``host_env[VAR]`` when set and non-empty, else ``default`` (shell semantics). Any other value is kept
    literally. With an ``allowlist`` (`EnvConfig.host_env_allowlist`), a variable outside it counts as unset
    whatever the host holds: its default is used and ``host_env`` is never read for it, so a downloaded task
    cannot read the trainer's secrets. ``None``: every host variable is readable (callers that have a config
    always pass its allowlist).

    Raises:
        EnvTemplateError: LOAD-23, naming the variable (``.variable``) and the env key (``field``), when
            ``${VAR}`` names a variable outside the allowlist, or one unset on the host. Nothing is resolved then.
    """
    allowed = None if allowlist is None else frozenset(allowlist)
    out: dict[str, str] = {}
    for key, value in env.items():
        match = _TEMPLATE.match(value) if isinstance(value, str) else None
        if match is None:
            out[key] = value
            continue
        var, default = match.group(1), match.group(2)
        readable = allowed is None or var in allowed
        if default is not None:
            host = host_env.get(var) if readable else None
            out[key] = host if host else default
        elif readable and var in host_env:
            out[key] = host_env[var]
        elif not readable:
            raise EnvTemplateError(
                f"names host variable {var}, which is not in EnvConfig.host_env_allowlist, so a task cannot read "
                f"it; add {var} to host_env_allowlist or write ${{{var}:-default}}",
                field=key,
                rule="LOAD-23",
                variable=var,
            )
        else:
            raise EnvTemplateError(
                f"host variable {var} is unset and the template has no default; set it or write ${{{var}:-default}}",
                field=key,
                rule="LOAD-23",
                variable=var,
            )
    return out

"""Reading and writing ``task.toml``: parsing, legacy keys (FMT-13), unknown keys (FMT-14), error mapping.

This is the only place where pydantic's ``ValidationError`` is caught: every failure becomes a
``TaskLoadError`` naming the file, the field path (``steps[1].verifier.timeout_sec``,
``environment.memory_mb``) and the rule.
"""

from __future__ import annotations

import tomllib
import typing
import re
import warnings
from pathlib import Path
from typing import Any, TypeVar

import tomli_w
from pydantic import BaseModel, ValidationError

from harbor_gym.errors import TaskLoadError
from harbor_gym.task.legacy import migrate_legacy
from harbor_gym.task.models import DatasetSettings, RuleViolation, TaskConfig

__all__ = [
    "LegacyKeyWarning",
    "UnknownKeyWarning",
    "dump_task_toml",
    "find_unknown_keys",
    "format_field_path",
    "parse_settings_toml",
    "parse_task_toml",
    "task_config_from_dict",
]

M = TypeVar("M", bound=BaseModel)


class UnknownKeyWarning(UserWarning):
    """FMT-14: a ``task.toml`` (or ``dataset.toml``) holds keys harbor_gym does not know; they are ignored."""


class LegacyKeyWarning(DeprecationWarning):
    """FMT-13: a ``task.toml`` uses legacy keys; they were migrated (dump the config to get the current
    form)."""


def format_field_path(parts: list[str | int] | tuple[str | int, ...]) -> str:
    """``("steps", 1, "verifier", "timeout_sec")`` -> ``"steps[1].verifier.timeout_sec"``."""
    text = ""
    for part in parts:
        if isinstance(part, int):
            text += f"[{part}]"
        else:
            text += f".{part}" if text else part
    return text


def _split_field(field: str | None) -> list[str | int]:
    if not field:
        return []
    return [int(p) if p.isdigit() else p for p in field.split(".")]


def _walk_type(tp: Any, value: Any, path: list[str | int], out: list[str]) -> None:
    """Collect unknown keys of ``value`` read as type ``tp`` (models recurse; free dicts are not walked)."""
    origin = typing.get_origin(tp)
    if origin is typing.Annotated:
        _walk_type(typing.get_args(tp)[0], value, path, out)
        return
    if isinstance(tp, type) and issubclass(tp, BaseModel):
        if isinstance(value, dict):
            _walk_model(tp, value, path, out)
        return
    if origin in (tuple, list) and isinstance(value, list):
        args = [a for a in typing.get_args(tp) if a is not Ellipsis]
        if args:
            for i, item in enumerate(value):
                _walk_type(args[0], item, [*path, i], out)
        return
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        for arg in typing.get_args(tp):
            arg_origin = typing.get_origin(arg)
            if isinstance(value, dict) and isinstance(arg, type) and issubclass(arg, BaseModel):
                _walk_type(arg, value, path, out)
                return
            if isinstance(value, list) and arg_origin in (tuple, list):
                _walk_type(arg, value, path, out)
                return


def _walk_model(model: type[BaseModel], data: dict[str, Any], path: list[str | int], out: list[str]) -> None:
    fields = model.model_fields
    for key, value in data.items():
        if key not in fields:
            out.append(format_field_path([*path, key]))
        else:
            _walk_type(fields[key].annotation, value, [*path, key], out)


def find_unknown_keys(model: type[BaseModel], data: dict[str, Any]) -> list[str]:
    """FMT-14: the field paths of every key of ``data`` that ``model`` (recursively) does not declare."""
    out: list[str] = []
    _walk_model(model, data, [], out)
    return out


def _clean_loc(loc: tuple[Any, ...], data: Any, missing: bool) -> list[str | int]:
    """Keep the parts of a pydantic error location that index the input (drop union-member tags)."""
    parts: list[str | int] = []
    cur = data
    for i, item in enumerate(loc):
        if (
            isinstance(item, int)
            and isinstance(cur, list)
            and 0 <= item < len(cur)
            or isinstance(item, str)
            and isinstance(cur, dict)
            and item in cur
        ):
            parts.append(item)
            cur = cur[item]
        elif isinstance(item, str) and isinstance(cur, dict) and missing and i == len(loc) - 1:
            parts.append(item)
    return parts


def _load_error(exc: ValidationError, data: dict[str, Any], path: Path, what: str) -> TaskLoadError:
    err = exc.errors()[0]
    cause = (err.get("ctx") or {}).get("error")
    parts = _clean_loc(tuple(err["loc"]), data, err["type"] == "missing")
    if isinstance(cause, RuleViolation):
        field = format_field_path([*parts, *_split_field(cause.field)])
        return TaskLoadError(cause.message, path=path, field=field or what, rule=cause.rule)
    message = err["msg"].removeprefix("Value error, ")
    if err["type"] != "missing":
        shown = repr(err.get("input"))
        message += f" (got {shown[:80]})"
    more = len(exc.errors()) - 1
    if more:
        message += f"; {more} more error(s)"
    return TaskLoadError(message, path=path, field=format_field_path(parts) or what, rule="LOAD-1")


#: Python's once-per-location registry for `_warn_at`: the same warning of the same file line shows once per process
#: under the default filter (``check`` loads a folder under both semantics).
_WARNED: dict[Any, Any] = {}


def _key_line(path: Path, key: str) -> int:
    """The 1-based line of ``path`` where the last dotted part of ``key`` is first assigned (1 if not found)."""
    name = str(key).split(".")[-1].strip("[]'\"")
    try:
        lines = path.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return 1
    pattern = re.compile(r"^\s*[\"']?" + re.escape(name) + r"[\"']?\s*=")
    return next((i for i, line in enumerate(lines, 1) if pattern.match(line)), 1)


def _warn_at(path: Path, warning: Warning, key: str) -> None:
    """Issue ``warning`` as coming from the task's own file and the line of ``key`` (not harbor_gym's source), so
    that the printed warning names the file and shows the key's line."""
    warnings.warn_explicit(warning, type(warning), filename=str(path), lineno=_key_line(path, key),
                           module="harbor_gym.task", registry=_WARNED)


def _validate(model: type[M], data: dict[str, Any], path: Path, what: str,
              context: dict[str, Any] | None = None) -> M:
    unknown = find_unknown_keys(model, data)
    if unknown:
        _warn_at(path, UnknownKeyWarning(f"unknown keys ignored (FMT-14): {', '.join(unknown)}"), unknown[0])
    try:
        return model.model_validate(data, context=context)
    except ValidationError as exc:
        raise _load_error(exc, data, path, what) from exc


def task_config_from_dict(raw: dict[str, Any], *, path: Path, semantics: str = "seed") -> TaskConfig:
    """Validate raw TOML data as a ``TaskConfig`` (FMT-13 migration first, then one FMT-14 warning if needed).

    Raises:
        TaskLoadError: LOAD-1/2/7..12/15 with ``path`` (the task.toml), the field path and the rule.
    """
    try:
        data, legacy = migrate_legacy(raw)
    except RuleViolation as exc:
        raise TaskLoadError(
            exc.message, path=path, field=format_field_path(_split_field(exc.field)), rule=exc.rule
        ) from exc
    if legacy:
        names = ", ".join(format_field_path(_split_field(key)) for key in legacy)
        _warn_at(path, LegacyKeyWarning(f"legacy keys migrated (FMT-13): {names}"), legacy[0])
    return _validate(TaskConfig, data, path, "task.toml", {"semantics": semantics})


def _read_toml(path: Path, rule: str) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise TaskLoadError("file missing", path=path, rule=rule) from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(f"cannot read: {exc}", path=path, rule=rule) from exc
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise TaskLoadError(f"not valid TOML: {exc}", path=path, rule=rule) from exc


def parse_task_toml(path: Path, *, semantics: str = "seed") -> TaskConfig:
    """Read and validate one ``task.toml`` file (``semantics="harbor"``: step names as Harbor accepts, DIFF-8).

    Raises:
        TaskLoadError: the file is missing, not UTF-8 TOML (LOAD-1), or breaks a rule of §2/§3.
    """
    return task_config_from_dict(_read_toml(path, "LOAD-1"), path=path, semantics=semantics)


def parse_settings_toml(path: Path) -> DatasetSettings:
    """Read and validate a dataset's ``dataset.toml`` (LOAD-16 for the multiplier, LOAD-1 for anything
    else)."""
    return _validate(DatasetSettings, _read_toml(path, "LOAD-1"), path, "dataset.toml")


def dump_task_toml(config: TaskConfig) -> str:
    """``task.toml`` text for ``config``: loading it gives a config equal to ``config`` (legacy keys
    migrated)."""
    return tomli_w.dumps(config.to_toml_dict())

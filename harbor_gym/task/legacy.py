"""FMT-13: the one place where legacy ``task.toml`` keys are migrated, before validation.

Rules (SPEC FMT-13, LOAD-11), applied to a copy of the raw TOML data:

- top-level ``version`` is read as ``schema_version``; an explicit ``schema_version`` wins (``version`` is
  dropped);
- top-level ``multi_step_reward_mode`` is dropped;
- in every environment table (``[environment]``, ``[verifier.environment]``, ``[steps.verifier.environment]``)
  ``memory``/``storage`` strings ``"<n>G"``, ``"<n>M"``, ``"<n>K"`` (case-insensitive, optional ``B``, ``n``
  may be decimal) become ``memory_mb``/``storage_mb`` = n×1024, n×1, n÷1024, truncated toward zero; with both
  the legacy and the new key present the values must agree, else LOAD-11;
- ``allow_internet`` (a bool) in an environment table, ``[agent]``, ``[verifier]``, ``[steps.agent]`` or
  ``[steps.verifier]`` becomes ``network_mode = "public"``/``"no-network"`` unless that table sets
  ``network_mode`` or ``allowed_hosts``, in which case it is dropped.
"""

from __future__ import annotations

import copy
import math
import re
from collections.abc import Iterator
from typing import Any

from harbor_gym.task.models import RuleViolation

__all__ = ["migrate_legacy"]

_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([GMK])B?\s*$", re.IGNORECASE)
_FACTOR = {"G": 1024.0, "M": 1.0, "K": 1.0 / 1024.0}


def _size_mb(text: Any, field: str) -> int:
    """FMT-13: ``"2G"`` -> 2048, ``"512M"`` -> 512, ``"1024K"`` -> 1 (truncated)."""
    if not isinstance(text, str):
        raise RuleViolation(
            "LOAD-1", f"must be a size string like '2G', '512M' or '1024K', got {text!r}", field
        )
    match = _SIZE.match(text)
    if match is None:
        raise RuleViolation("LOAD-1", f"{text!r} is not a size like '2G', '512M' or '1024K'", field)
    value = float(match.group(1)) * _FACTOR[match.group(2).upper()]
    if not math.isfinite(value):
        raise RuleViolation("LOAD-1", f"{text!r} is too large", field)
    return int(value)


def _tables(raw: dict[str, Any]) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Yield (path, table, is_environment_table) for every table legacy keys may sit in."""

    def sub(table: Any, key: str) -> Any:
        return table.get(key) if isinstance(table, dict) else None

    candidates: list[tuple[str, Any, bool]] = [
        ("environment", raw.get("environment"), True),
        ("agent", raw.get("agent"), False),
        ("verifier", raw.get("verifier"), False),
        ("verifier.environment", sub(raw.get("verifier"), "environment"), True),
    ]
    steps = raw.get("steps")
    if isinstance(steps, list):
        for i, step in enumerate(steps):
            candidates.append((f"steps.{i}.agent", sub(step, "agent"), False))
            candidates.append((f"steps.{i}.verifier", sub(step, "verifier"), False))
            candidates.append(
                (f"steps.{i}.verifier.environment", sub(sub(step, "verifier"), "environment"), True)
            )
    for path, table, is_env in candidates:
        if isinstance(table, dict):
            yield path, table, is_env


def migrate_legacy(raw: dict[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """Return a migrated copy of ``raw`` and the dotted paths of the legacy keys found (FMT-13).

    Raises:
        RuleViolation: a legacy value of the wrong type (LOAD-1) or conflicting with its new key (LOAD-11);
            its ``field`` is the dotted path of the key.
    """
    data = copy.deepcopy(raw)
    found: list[str] = []
    if "version" in data:
        found.append("version")
        version = data.pop("version")
        if "schema_version" not in data:
            data["schema_version"] = version
    if "multi_step_reward_mode" in data:
        found.append("multi_step_reward_mode")
        data.pop("multi_step_reward_mode")
    for path, table, is_env in _tables(data):
        if is_env:
            for legacy, new in (("memory", "memory_mb"), ("storage", "storage_mb")):
                if legacy not in table:
                    continue
                found.append(f"{path}.{legacy}")
                value = _size_mb(table.pop(legacy), f"{path}.{legacy}")
                if new in table and table[new] != value:
                    raise RuleViolation(
                        "LOAD-11",
                        f"{legacy} ({value} MiB) conflicts with {new} = {table[new]!r}; keep only {new}",
                        f"{path}.{legacy}",
                    )
                table[new] = value
        if "allow_internet" in table:
            found.append(f"{path}.allow_internet")
            allow = table.pop("allow_internet")
            if not isinstance(allow, bool):
                raise RuleViolation(
                    "LOAD-1", f"must be true or false, got {allow!r}", f"{path}.allow_internet"
                )
            if "network_mode" not in table and "allowed_hosts" not in table:
                table["network_mode"] = "public" if allow else "no-network"
    return data, found

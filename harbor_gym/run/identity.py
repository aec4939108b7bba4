"""A run's identity (issue 15, honest resume): ``<out>/run.json`` records what produced the rows of a results folder,
so that ``harbor-gym run`` never resumes into a folder written by another agent, seed, semantics, config or task.

The identity is plain JSON: ``agent`` (the ``--agent`` spec), ``agent_args`` (its constructor arguments; for
``chat`` the model and endpoint, never a key), ``seed``, ``semantics``, ``config_digest`` (sha256 of the
`EnvConfig` fields that change an episode's outcome: everything except container labels, ``logs_root``, the pool
size and the backend choice) and ``tasks`` (task id -> sha256 of the task folder's files: relative paths and
bytes). ``rollouts_per_task`` is not part of it: a resume with a larger K adds rollouts.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any, Mapping

from harbor_gym.errors import ConfigError

__all__ = ["RUN_FILE", "run_identity", "identity_differences", "check_resume", "write_identity",
           "config_digest", "task_digest"]

#: The identity file of a results folder.
RUN_FILE = "run.json"
#: Config fields that do not change what an episode does (who labels it, where its logs go, how it is started).
_VOLATILE = frozenset({"labels", "logs_root", "pool_size", "backend"})


def config_digest(config: Any) -> str:
    """sha256 of the config's outcome-relevant fields (see the module docstring)."""
    data = {k: v for k, v in config.model_dump(mode="json").items() if k not in _VOLATILE}
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()


def task_digest(folder: str | Path) -> str:
    """sha256 over the task folder's regular files (relative path and bytes, sorted); links by their target."""
    root = Path(folder)
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames.sort()
        for name in sorted(filenames):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            digest.update(rel.encode() + b"\0")
            if path.is_symlink():
                digest.update(b"link:" + os.readlink(path).encode())
            elif path.is_file():
                digest.update(path.read_bytes())
            digest.update(b"\0")
    return digest.hexdigest()


def run_identity(*, agent: str, agent_args: Mapping[str, Any], seed: int, semantics: str, config: Any,
                 tasks: Mapping[str, Any]) -> dict[str, Any]:
    """The identity of a run (plain JSON; see the module docstring). ``tasks``: task id -> loaded `Task`."""
    return {
        "agent": agent,
        "agent_args": json.loads(json.dumps(dict(agent_args), sort_keys=True, default=str)),
        "seed": int(seed),
        "semantics": str(getattr(semantics, "value", semantics)),
        "config_digest": config_digest(config),
        "tasks": {task_id: task_digest(task.path) for task_id, task in sorted(tasks.items())},
    }


def identity_differences(old: Mapping[str, Any], new: Mapping[str, Any]) -> list[str]:
    """What differs between two identities, one readable item each (empty: the same run)."""
    diffs = []
    for key in ("agent", "agent_args", "seed", "semantics"):
        if old.get(key) != new.get(key):
            diffs.append(f"{key}: {old.get(key)!r} then, {new.get(key)!r} now")
    if old.get("config_digest") != new.get("config_digest"):
        diffs.append("config: the environment settings differ (config digest)")
    before, now = dict(old.get("tasks") or {}), dict(new.get("tasks") or {})
    changed = sorted(t for t in set(before) & set(now) if before[t] != now[t])
    if changed:
        diffs.append(f"tasks changed since: {', '.join(changed)}")
    return diffs


def check_resume(out: Path, identity: Mapping[str, Any], *, force: bool = False) -> list[str]:
    """Check that ``out`` may take this run's rows; returns warnings to show.

    - ``out/run.json`` with the same identity (tasks only added or removed are allowed): nothing to say;
    - a different identity: refused, unless ``force`` (then a warning saying what differs);
    - no ``run.json`` but rows (a folder written before run identities): resumed, with a warning.

    Raises:
        ConfigError: the identity differs (``field="--out"``); the message says what and names ``--force-resume``.
    """
    path = Path(out) / RUN_FILE
    if not path.is_file():
        has_rows = any((Path(out) / name).is_file() and (Path(out) / name).stat().st_size
                       for name in ("rollouts.jsonl", "rollouts_failures.jsonl"))
        if has_rows:
            return [f"{out} has results but no {RUN_FILE} (written before run identities): resuming without "
                    "checking that they came from the same agent, seed and tasks"]
        return []
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        old = {}
        if not force:
            raise ConfigError(f"cannot read {path}: {exc}; --force-resume resumes anyway", field="--out") from exc
    diffs = identity_differences(old, identity)
    if not diffs:
        return []
    text = "; ".join(diffs)
    if force:
        return [f"--force-resume: resuming {out} although its run differs: {text}"]
    raise ConfigError(f"{out} holds results of a different run ({text}); use another --out, or --force-resume "
                      "to add to it anyway", field="--out")


def write_identity(out: Path, identity: Mapping[str, Any]) -> None:
    """Write ``out/run.json`` atomically (a temporary file renamed over it)."""
    path = Path(out) / RUN_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{RUN_FILE}.tmp")
    tmp.write_text(json.dumps(dict(identity), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)

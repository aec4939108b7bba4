"""Harbor's dataset registry format (``registry.json``), read and validated (pure: reads one file or URL).

The format (Harbor 0.25, ``harbor/models/registry.py``): a JSON list of datasets, each
``{"name", "version", "description", "tasks": [{"name", "git_url", "git_commit_id", "path"}]}`` (extra keys such as
``metrics`` are ignored). harbor_gym needs every task pinned: ``git_url`` and a ``git_commit_id`` of 7 to 40 hex
digits. A task without ``git_url`` is a folder on this machine (``path``, relative to the registry file).
"""

from __future__ import annotations

import json
import re
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor_gym.errors import DatasetError

__all__ = ["DatasetRef", "RegistryDataset", "RegistryTask", "parse_dataset_ref", "read_registry", "find_dataset"]

_REF = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._/-]*)@(?P<version>[A-Za-z0-9][A-Za-z0-9._+-]*)$")
_COMMIT = re.compile(r"^[0-9a-fA-F]{7,40}$")
_TASK_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
_DATASET_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*(/[A-Za-z0-9][A-Za-z0-9._-]*)*$")
_VERSION = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._+-]*$")
_MAX_NAME = 200
#: Transports a registry read from the network may name: never a host path or ``file://`` (that would copy the
#: host's own repositories into a sandbox), never git's ``ext::`` (a host command).
_REMOTE_GIT = re.compile(r"^(https?|ssh|git)://|^[A-Za-z0-9._-]+@[A-Za-z0-9.-]+:")


def is_remote_source(source: str) -> bool:
    """True for a registry read over the network (``http(s)://``): its entries may name only network
    repositories, never a path of this host."""
    return urllib.parse.urlparse(source).scheme in ("http", "https")


@dataclass(frozen=True)
class DatasetRef:
    """``NAME@VERSION``."""

    name: str
    version: str

    def __str__(self) -> str:
        return f"{self.name}@{self.version}"


@dataclass(frozen=True)
class RegistryTask:
    """One task of a dataset: ``path`` inside the repository ``git_url`` at commit ``git_commit_id`` (or, without
    ``git_url``, the local folder ``path``)."""

    name: str
    path: str
    git_url: str | None = None
    git_commit_id: str | None = None


@dataclass(frozen=True)
class RegistryDataset:
    """One dataset entry of a registry file."""

    name: str
    version: str
    description: str
    tasks: tuple[RegistryTask, ...]
    registry: str  # where it was read from (path or URL), for messages and relative local paths

    @property
    def ref(self) -> DatasetRef:
        return DatasetRef(self.name, self.version)


def parse_dataset_ref(text: str) -> DatasetRef | None:
    """``NAME@VERSION`` as a `DatasetRef`, or ``None`` when ``text`` does not have that shape."""
    m = _REF.match(str(text))
    return DatasetRef(m.group("name"), m.group("version")) if m else None


def _read_source(source: str) -> str:
    scheme = urllib.parse.urlparse(source).scheme
    if scheme in ("http", "https", "file"):
        try:
            with urllib.request.urlopen(source, timeout=60) as response:  # noqa: S310 (the user's own registry)
                return response.read().decode("utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            raise DatasetError(f"cannot read the registry: {exc}", path=source, field="registry",
                               retryable=True) from exc
    try:
        return Path(source).expanduser().read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"cannot read the registry file: {exc}", path=source, field="registry") from exc


def _task(raw: Any, where: str, source: str) -> RegistryTask:
    if not isinstance(raw, dict):
        raise DatasetError("a task entry must be an object {name, git_url, git_commit_id, path}", path=source,
                           field=where)
    name, path = raw.get("name"), raw.get("path")
    if not isinstance(name, str) or not _TASK_NAME.match(name):
        raise DatasetError(f"task name {name!r} must match [A-Za-z0-9][A-Za-z0-9._-]*", path=source,
                           field=f"{where}.name")
    if not isinstance(path, str) or not path:
        raise DatasetError("'path' (the task folder inside the repository) is required", path=source,
                           field=f"{where}.path")
    url, commit = raw.get("git_url"), raw.get("git_commit_id")
    parts = Path(path).parts
    if Path(path).is_absolute() or ".." in parts or "\x00" in path or "\\" in path:
        raise DatasetError(f"'path' {path!r} must be relative to the repository root (or, for a local task, to the "
                           "registry's folder), without '..'", path=source, field=f"{where}.path")
    if url is None and is_remote_source(source):
        raise DatasetError("a registry read from the network cannot name a local task folder (no 'git_url'): it "
                           "would copy a folder of this host", path=source, field=f"{where}.git_url")
    if url is not None:
        if not isinstance(url, str) or not url or url.startswith("-"):
            raise DatasetError("'git_url' must be a repository URL or path", path=source, field=f"{where}.git_url")
        if url.lower().startswith("ext::") or (is_remote_source(source) and not _REMOTE_GIT.match(url)):
            raise DatasetError(f"'git_url' {url!r} must be an http(s), ssh or git URL in a registry read from the "
                               "network (a host path, file:// or ext:: would reach this host)", path=source,
                               field=f"{where}.git_url")
        if not isinstance(commit, str) or not _COMMIT.match(commit):
            raise DatasetError(f"'git_commit_id' {commit!r} must pin a commit (7 to 40 hex digits); a branch or no "
                               "commit would make the dataset change under the same name", path=source,
                               field=f"{where}.git_commit_id")
        commit = commit.lower()
    return RegistryTask(name=name, path=path.strip("/") or ".", git_url=url, git_commit_id=commit)


def read_registry(source: str) -> tuple[RegistryDataset, ...]:
    """Every dataset of the registry ``source`` (a path or an http(s)/file URL).

    Raises:
        DatasetError: unreadable, not JSON, or an entry that is not in Harbor's format (named).
    """
    try:
        data = json.loads(_read_source(source))
    except json.JSONDecodeError as exc:
        raise DatasetError(f"not valid JSON: {exc}", path=source, field="registry") from exc
    if isinstance(data, dict) and "datasets" in data:
        data = data["datasets"]
    if not isinstance(data, list):
        raise DatasetError("a registry is a JSON list of datasets {name, version, description, tasks}",
                           path=source, field="registry")
    out = []
    for i, entry in enumerate(data):
        where = f"[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise DatasetError("a dataset entry must be an object with a 'name'", path=source, field=where)
        name = entry["name"]
        if len(name) > _MAX_NAME or not _DATASET_NAME.match(name) or ".." in name.split("/"):
            raise DatasetError(f"dataset name {name[:80]!r} must be path segments of [A-Za-z0-9._-] joined by '/' "
                               f"(at most {_MAX_NAME} characters)", path=source, field=f"{where}.name")
        version = entry.get("version")
        if not isinstance(version, (str, int, float)) or isinstance(version, bool) or str(version) == "":
            raise DatasetError("'version' is required", path=source, field=f"{where}.version")
        if len(str(version)) > _MAX_NAME or not _VERSION.match(str(version)):
            raise DatasetError(f"version {str(version)[:80]!r} must match [A-Za-z0-9][A-Za-z0-9._+-]* (at most "
                               f"{_MAX_NAME} characters)", path=source, field=f"{where}.version")
        tasks_raw = entry.get("tasks")
        if not isinstance(tasks_raw, list) or not tasks_raw:
            raise DatasetError("'tasks' must be a non-empty list", path=source, field=f"{where}.tasks")
        tasks = tuple(_task(t, f"{where}.tasks[{j}]", source) for j, t in enumerate(tasks_raw))
        names = [t.name for t in tasks]
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise DatasetError(f"two tasks are named {dup!r}", path=source, field=f"{where}.tasks")
        out.append(RegistryDataset(name=entry["name"], version=str(version),
                                   description=str(entry.get("description") or ""), tasks=tasks,
                                   registry=source))
    return tuple(out)


def find_dataset(ref: DatasetRef, source: str) -> RegistryDataset:
    """The dataset ``ref`` of the registry ``source``.

    Raises:
        DatasetError: as `read_registry`, or no such name or version (the known versions are listed).
    """
    datasets = read_registry(source)
    for ds in datasets:
        if ds.name == ref.name and ds.version == ref.version:
            return ds
    versions = sorted(ds.version for ds in datasets if ds.name == ref.name)
    if versions:
        raise DatasetError(f"dataset {ref.name!r} has no version {ref.version!r} (versions: {', '.join(versions)})",
                           path=source, field=str(ref))
    raise DatasetError(f"no dataset named {ref.name!r} in the registry", path=source, field=str(ref))

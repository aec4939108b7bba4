"""Datasets by name, fetched once: git repositories at pinned commits, cut into a content-addressed cache folder.

``materialize(dataset)`` returns a local folder of task folders (one per registry task, named by the task's
``name``) that `harbor_gym.task.load_dataset` loads like any other. Layout under the cache root
(``$HARBOR_GYM_CACHE``, else ``~/.cache/harbor_gym``):

- ``datasets/repos/<sha256(git_url)[:16]>.git``: a bare mirror per repository, fetched with the ``git`` client;
- ``datasets/<name>@<version>-<key>/``: the dataset, where ``key`` digests every task's name, URL, commit and path,
  so that a changed registry entry is a new folder and an unchanged one is never fetched again (a rerun is offline).

Guarantees: a dataset folder appears whole or not at all (built beside it, then renamed); each commit is verified
(``git rev-parse <commit>^{commit}`` must name the registry's commit) before anything is cut from it; a task path
that is not a folder at that commit is an error naming the URL, commit and path; archives are unpacked with
tarfile's ``data`` filter (no absolute paths, no ``..``, no links leaving the folder). Concurrent callers of the same
dataset wait on one lock file and build it once. The manifest records a digest of the whole tree as it was cut
(`tree_digest`: every name, kind, mode, content and link target); a cached folder whose tree no longer matches it
(a file changed, added or removed after the fetch) is never used: it is cut again from its pinned commits. git runs
with its ``ext::`` transport and host-configured helpers off, so a registry's URL cannot run a host command.
"""

from __future__ import annotations

import fcntl
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from pathlib import Path

from harbor_gym.datasets._registry import RegistryDataset, RegistryTask
from harbor_gym.errors import DatasetError

__all__ = ["cache_root", "dataset_key", "materialize", "tree_digest", "MANIFEST"]

#: The file inside a dataset folder that records where each task came from.
MANIFEST = ".harbor-gym-dataset.json"
_GIT_TIMEOUT_S = 600.0


def cache_root() -> Path:
    """``$HARBOR_GYM_CACHE/datasets``, else ``~/.cache/harbor_gym/datasets``."""
    base = os.environ.get("HARBOR_GYM_CACHE") or str(Path.home() / ".cache" / "harbor_gym")
    return Path(base) / "datasets"


def dataset_key(dataset: RegistryDataset) -> str:
    """16 hex digits naming the dataset's content: every task's name, URL, commit and path."""
    rows = [[t.name, t.git_url, t.git_commit_id, t.path] for t in dataset.tasks]
    if any(t.git_url is None for t in dataset.tasks):
        rows.append(["registry", str(Path(dataset.registry).resolve())])
    blob = json.dumps([dataset.name, dataset.version, rows], sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


#: git options of every call: no ``ext::`` (runs a host command) or ``fd::`` transport, and URLs of a registry are
#: never treated as options.
_GIT_SAFETY = ["-c", "protocol.ext.allow=never", "-c", "protocol.fd.allow=never", "-c", "core.hooksPath=/dev/null"]


def _git_env() -> dict[str, str]:
    return {**os.environ, "GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "true", "LC_ALL": "C"}


def _git(args: list[str], *, cwd: Path | None = None, what: str, retryable: bool = False) -> str:
    try:
        done = subprocess.run(["git", *_GIT_SAFETY, *args], cwd=cwd, env=_git_env(), capture_output=True,
                              timeout=_GIT_TIMEOUT_S, check=False)
    except FileNotFoundError as exc:
        raise DatasetError("the git client is not installed; install git to fetch datasets by name",
                           field="git") from exc
    except subprocess.TimeoutExpired as exc:
        raise DatasetError(f"{what}: git did not finish in {_GIT_TIMEOUT_S:g} s", field="git",
                           retryable=True) from exc
    if done.returncode != 0:
        tail = done.stderr.decode("utf-8", "replace").strip().splitlines()[-3:]
        raise DatasetError(f"{what}: {' / '.join(tail) or f'git exit {done.returncode}'}", field="git",
                           retryable=retryable)
    return done.stdout.decode("utf-8", "replace")


def _mirror(url: str) -> Path:
    return cache_root() / "repos" / f"{hashlib.sha256(url.encode()).hexdigest()[:16]}.git"


def _resolve_commit(repo: Path, commit: str) -> str | None:
    try:
        full = _git(["rev-parse", "--verify", "--quiet", f"{commit}^{{commit}}"], cwd=repo, what="rev-parse").strip()
    except DatasetError:
        return None
    return full if full.startswith(commit) else None


def _fetched_repo(task: RegistryTask) -> tuple[Path, str]:
    """The bare mirror of ``task.git_url`` holding ``task.git_commit_id`` (fetched when missing), and the full sha.

    Raises:
        DatasetError: the repository cannot be fetched (retryable), or the commit is not in it.
    """
    url, commit = str(task.git_url), str(task.git_commit_id)
    repo = _mirror(url)
    if not (repo / "HEAD").is_file():
        repo.parent.mkdir(parents=True, exist_ok=True)
        _git(["init", "--quiet", "--bare", str(repo)], what=f"cannot create a mirror of {url}")
    full = _resolve_commit(repo, commit)
    if full is None:
        _git(["fetch", "--quiet", "--no-tags", "--", url, "+refs/heads/*:refs/heads/*", "+refs/tags/*:refs/tags/*"],
             cwd=repo, what=f"cannot fetch {url}", retryable=True)
        full = _resolve_commit(repo, commit)
    if full is None and len(commit) == 40:
        try:  # a commit no branch or tag reaches: servers that allow it hand it out by id
            _git(["fetch", "--quiet", "--no-tags", "--", url, commit], cwd=repo, what=f"cannot fetch {commit}")
        except DatasetError:
            pass
        full = _resolve_commit(repo, commit)
    if full is None:
        raise DatasetError(f"commit {commit} is not in {url} (fetched its branches and tags); fix git_commit_id",
                           field=f"tasks.{task.name}.git_commit_id")
    return repo, full


def _cut(repo: Path, full: str, task: RegistryTask, dest: Path, url: str) -> None:
    """Unpack ``task.path`` at commit ``full`` of ``repo`` into ``dest``."""
    kind = _git(["cat-file", "-t", f"{full}:{task.path}"], cwd=repo, what="cat-file", retryable=False) \
        if task.path != "." else "tree\n"
    if kind.strip() != "tree":
        raise DatasetError(f"{task.path!r} is not a folder at commit {full[:12]} of {url}", field=f"tasks.{task.name}.path")
    prefix = "" if task.path == "." else task.path.rstrip("/") + "/"
    done = subprocess.run(["git", *_GIT_SAFETY, "archive", "--format=tar", f"{full}:{task.path}" if prefix else full],
                          cwd=repo, env=_git_env(), capture_output=True, timeout=_GIT_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise DatasetError(f"cannot archive {task.path!r} at {full[:12]} of {url}: "
                           f"{done.stderr.decode('utf-8', 'replace').strip()[-300:]}", field=f"tasks.{task.name}.path")
    dest.mkdir(parents=True)
    with tarfile.open(fileobj=io.BytesIO(done.stdout)) as tar:
        try:
            tar.extractall(dest, filter="data")
        except tarfile.FilterError as exc:
            raise DatasetError(f"{task.path!r} at {full[:12]} of {url} holds an entry that would leave its folder: "
                               f"{exc}", field=f"tasks.{task.name}.path") from exc


def _missing_path_error(repo: Path, full: str, task: RegistryTask, url: str) -> DatasetError | None:
    if task.path == ".":
        return None
    try:
        _git(["cat-file", "-e", f"{full}:{task.path}"], cwd=repo, what="cat-file")
    except DatasetError:
        return DatasetError(f"no task path {task.path!r} at commit {full[:12]} of {url}; fix the registry's 'path'",
                            field=f"tasks.{task.name}.path")
    return None


def _build(dataset: RegistryDataset, staging: Path) -> list[dict]:
    rows = []
    for task in dataset.tasks:
        dest = staging / task.name
        if task.git_url is None:
            base = Path(dataset.registry).expanduser().resolve().parent
            src = (base / task.path).resolve()
            if not src.is_relative_to(base):  # a link under the registry's folder leading out of it
                raise DatasetError(f"local task folder {task.path!r} leads out of the registry's folder {base}",
                                   path=dataset.registry, field=f"tasks.{task.name}.path")
            if not src.is_dir():
                raise DatasetError(f"local task folder {src} does not exist", path=dataset.registry,
                                   field=f"tasks.{task.name}.path")
            shutil.copytree(src, dest, symlinks=True)
            rows.append({"name": task.name, "path": str(src)})
            continue
        repo, full = _fetched_repo(task)
        missing = _missing_path_error(repo, full, task, task.git_url)
        if missing is not None:
            raise missing
        _cut(repo, full, task, dest, task.git_url)
        rows.append({"name": task.name, "git_url": task.git_url, "git_commit_id": full, "path": task.path})
    return rows


def tree_digest(root: Path) -> str:
    """SHA-256 over every entry below ``root`` except the manifest: its relative name, kind, mode, and the bytes of
    a file or the target of a link (links are never followed). Any change, addition or removal changes it."""
    digest = hashlib.sha256()
    for dirpath, dirnames, filenames in os.walk(root, followlinks=False):
        dirnames.sort()
        base = Path(dirpath)
        for name in sorted(dirnames + filenames):
            path = base / name
            rel = path.relative_to(root).as_posix()
            if rel == MANIFEST:
                continue
            st = path.lstat()
            digest.update(json.dumps([rel, oct(st.st_mode)]).encode() + b"\0")
            if path.is_symlink():
                digest.update(os.readlink(path).encode("utf-8", "surrogateescape") + b"\0")
            elif path.is_file():
                with open(path, "rb") as fh:
                    for block in iter(lambda: fh.read(1 << 20), b""):
                        digest.update(block)
                digest.update(b"\0")
    return digest.hexdigest()


def _intact(final: Path) -> bool:
    """True when ``final`` holds a manifest whose recorded tree digest is the folder's tree now."""
    try:
        recorded = json.loads((final / MANIFEST).read_text(encoding="utf-8")).get("tree_sha256")
    except (OSError, ValueError):
        return False
    return isinstance(recorded, str) and recorded == tree_digest(final)


def materialize(dataset: RegistryDataset) -> Path:
    """The local folder of ``dataset`` (one task folder per registry task), fetching and cutting it if it is not
    cached yet. A cached one is returned without touching git or the network.

    Raises:
        DatasetError: a repository cannot be fetched (``retryable``), a commit is not in it, a task path is missing
            at its commit or is not a folder; nothing is left in the cache then.
    """
    root = cache_root()
    final = root / f"{dataset.name.replace('/', '__')}@{dataset.version}-{dataset_key(dataset)}"
    if final.parent != root or final.name.startswith("."):  # names and versions are checked at read; never trust
        raise DatasetError(f"dataset {dataset.name!r}@{dataset.version!r} does not name a folder of the cache",
                           path=dataset.registry, field="name")
    if _intact(final):
        return final
    root.mkdir(parents=True, exist_ok=True)
    with open(root / f".lock-{final.name}", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _intact(final):
            return final
        staging = Path(tempfile.mkdtemp(prefix=".building-", dir=root))
        try:
            rows = _build(dataset, staging)
            (staging / MANIFEST).write_text(json.dumps(
                {"name": dataset.name, "version": dataset.version, "registry": dataset.registry, "tasks": rows,
                 "tree_sha256": tree_digest(staging)}, indent=2), encoding="utf-8")
            if final.exists() or final.is_symlink():  # partial, tampered with, or an older layout: replace it
                if final.is_symlink() or not final.is_dir():
                    final.unlink()
                else:
                    shutil.rmtree(final)
            os.rename(staging, final)
        finally:
            if staging.exists():
                shutil.rmtree(staging, ignore_errors=True)
    return final

"""Hostile: registries and fetched trees written by an adversary (dataset names, versions, paths, URLs, cached
trees), against the dataset cache (LOAD-13, GYM-10). No Docker: git and the file system are the attack surface."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from harbor_gym.datasets import MANIFEST, read_registry
from harbor_gym.datasets._cache import materialize
from harbor_gym.errors import DatasetError, TaskLoadError
from harbor_gym.task import load_dataset

ENVS = Path(__file__).resolve().parents[2] / "envs"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main", *args],
                          cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def _repo(tmp_path: Path, build) -> tuple[Path, str]:
    """A bare repository of one commit whose work tree ``build(work)`` fills; (bare repo, sha)."""
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", cwd=work)
    build(work)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "x", cwd=work)
    sha = _git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "remote.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    shutil.rmtree(work)
    return bare, sha


def _registry(path: Path, entries: list[dict]) -> str:
    path.write_text(json.dumps(entries))
    return str(path)


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HARBOR_GYM_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "datasets"


def _entry(name="demo", version="1", **task):
    return {"name": name, "version": version, "tasks": [{"name": "t", "path": "cake", **task}]}


@pytest.mark.parametrize("field, value", [
    ("version", "1/../../../../escaped"), ("version", "../x"), ("version", "/abs"), ("version", "1\x00"),
    ("version", "a" * 500), ("name", "../../escaped"), ("name", "/etc"), ("name", "a/../../b"), ("name", "a\\b"),
    ("name", ".hidden"), ("name", "x" * 500), ("name", "a//b"),
], ids=lambda v: v if len(str(v)) < 40 else f"{str(v)[:8]}...{len(v)}")
def test_load_13_names_and_versions_cannot_escape_the_cache(tmp_path, cache, field, value):
    # SPEC: LOAD-13, GYM-10: a registry's dataset name or version never names a folder outside the cache (traversal,
    # absolute, NUL, backslash, hidden, overlong): it is refused at read, naming the field.
    bare, sha = _repo(tmp_path, lambda w: shutil.copytree(ENVS / "cake", w / "cake"))
    entry = _entry(git_url=str(bare), git_commit_id=sha)
    entry[field] = value
    with pytest.raises(DatasetError) as err:
        read_registry(_registry(tmp_path / "registry.json", [entry]))
    assert err.value.field.endswith(field)
    assert not (tmp_path / "escaped").exists() and not (tmp_path / "cache" / "escaped").exists()


@pytest.mark.parametrize("path", ["../outside", "/etc", "cake/../../outside", "a\\..\\b"])
def test_load_13_task_paths_stay_inside_their_repository_or_registry(tmp_path, cache, path):
    # SPEC: LOAD-13: a task path (git or local) is relative to its repository or the registry's folder, never '..'
    # or absolute.
    (tmp_path / "outside").mkdir()
    for entry in (_entry(path=path), _entry(path=path, git_url="https://example.invalid/r.git", git_commit_id="a" * 40)):
        with pytest.raises(DatasetError, match="must be relative"):
            read_registry(_registry(tmp_path / "registry.json", [entry]))


def test_load_13_a_local_task_linking_out_of_the_registry_folder_is_refused(tmp_path, cache):
    # SPEC: LOAD-13: a local task folder reached through a link that leads out of the registry's folder is refused;
    # nothing of the host folder is copied into the cache.
    secret = tmp_path / "host-secret"
    shutil.copytree(ENVS / "cake", secret)
    reg_dir = tmp_path / "reg"
    reg_dir.mkdir()
    (reg_dir / "cake").symlink_to(secret)
    (dataset,) = read_registry(_registry(reg_dir / "registry.json", [_entry()]))
    with pytest.raises(DatasetError, match="leads out of the registry's folder"):
        materialize(dataset)
    assert not any(p.name == "task.toml" for p in cache.rglob("*")) if cache.exists() else True


@pytest.mark.parametrize("url", ["/root/private.git", "file:///root/private.git", "ext::sh -c touch% /tmp/hg-ext-pwned",
                                 "--upload-pack=touch /tmp/hg-ext-pwned", "./relative.git"])
def test_gym_10_a_network_registry_names_only_network_repositories(tmp_path, url, monkeypatch):
    # SPEC: GYM-10: a registry read from the network cannot make this host copy one of its own repositories or
    # folders into a sandbox (host paths, file://, local tasks) nor run a host command (ext::, option injection).
    import harbor_gym.datasets._registry as reg

    monkeypatch.setattr(reg, "_read_source", lambda source: json.dumps([_entry(git_url=url, git_commit_id="a" * 40)]))
    with pytest.raises(DatasetError, match="git_url"):
        read_registry("https://registry.example.invalid/registry.json")
    monkeypatch.setattr(reg, "_read_source", lambda source: json.dumps([_entry()]))
    with pytest.raises(DatasetError, match="local task folder"):
        read_registry("https://registry.example.invalid/registry.json")
    assert not Path("/tmp/hg-ext-pwned").exists()


def test_gym_10_ext_transport_never_runs_even_from_a_local_registry(tmp_path, cache):
    # SPEC: GYM-10: git's ext:: transport (a host command) is off for every fetch.
    canary = tmp_path / "ext-pwned"
    entry = _entry(git_url=f"ext::sh -c touch% {canary}", git_commit_id="a" * 40)
    with pytest.raises(DatasetError):
        read_registry(_registry(tmp_path / "registry.json", [entry]))
    assert not canary.exists()


def test_load_13_links_in_a_fetched_tree_never_leave_the_task(tmp_path, cache):
    # SPEC: LOAD-13: a fetched task whose files link out of its folder (to the host or another dataset's cache)
    # is refused when cut or when loaded; nothing outside is read.
    def build(w: Path) -> None:
        shutil.copytree(ENVS / "cake", w / "cake")
        (w / "cake" / "environment").mkdir(exist_ok=True)
        os.symlink("/etc/shadow", w / "cake" / "environment" / "shadow")
        os.symlink("../../other", w / "cake" / "environment" / "sibling")

    bare, sha = _repo(tmp_path, build)
    (dataset,) = read_registry(_registry(tmp_path / "registry.json", [_entry(git_url=str(bare), git_commit_id=sha)]))
    with pytest.raises((DatasetError, TaskLoadError)):
        load_dataset(materialize(dataset))


def test_gym_10_similar_names_never_share_a_cache_folder(tmp_path, cache):
    # SPEC: GYM-10: datasets whose names fold to the same text ('a/b' and 'a__b', 'a-b@1' and 'a@b-1') get
    # distinct cache folders; neither is ever served from the other's.
    bare, sha = _repo(tmp_path, lambda w: (shutil.copytree(ENVS / "cake", w / "cake"),
                                           shutil.copytree(ENVS / "gated-counter", w / "counter")))
    specs = [("a/b", "1", "cake"), ("a__b", "1", "counter"), ("a-b", "1", "cake"), ("a", "b-1", "counter")]
    folders = {}
    for name, version, path in specs:
        (dataset,) = read_registry(_registry(tmp_path / "registry.json", [
            {"name": name, "version": version, "tasks": [{"name": "t", "path": path, "git_url": str(bare),
                                                          "git_commit_id": sha}]}]))
        folders[(name, version)] = materialize(dataset)
    assert len(set(folders.values())) == len(specs)
    for (name, version, path), folder in zip(specs, folders.values()):
        manifest = json.loads((folder / MANIFEST).read_text())
        assert (manifest["name"], manifest["version"], manifest["tasks"][0]["path"]) == (name, version, path)


def test_gym_10_a_cached_tree_changed_after_the_fetch_is_never_used(tmp_path, cache):
    # SPEC: GYM-10: the cache verifies a dataset's tree against the digest recorded when it was cut from its pinned
    # commit; a file changed, added or removed afterwards (another process, a poisoned cache) makes it cut again.
    bare, sha = _repo(tmp_path, lambda w: shutil.copytree(ENVS / "cake", w / "cake"))
    (dataset,) = read_registry(_registry(tmp_path / "registry.json", [_entry(git_url=str(bare), git_commit_id=sha)]))
    folder = materialize(dataset)
    test_sh = folder / "t" / "steps" / "01-select-cake-base" / "tests" / "test.sh"
    honest = test_sh.read_bytes()
    for tamper in (lambda: test_sh.write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"),
                   lambda: (folder / "t" / "environment" / "extra").write_text("x"),
                   lambda: (folder / "t" / "instruction.md").unlink()):
        tamper()
        again = materialize(dataset)
        assert again == folder
        assert test_sh.read_bytes() == honest
        assert not (folder / "t" / "environment" / "extra").exists()
        assert (folder / "t" / "instruction.md").is_file()

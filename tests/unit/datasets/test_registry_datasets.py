"""Datasets by name (Issue 16 item 3): Harbor's registry.json format, a local bare git repository made by the test,
the content-addressed cache, commit verification, clear errors; and `harbor_gym.make`'s error for an unknown name
(item 4). No Docker."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

import harbor_gym
from harbor_gym.datasets import MANIFEST, cache_root, parse_dataset_ref, read_registry, resolve_dataset
from harbor_gym.errors import DatasetError, HarborGymError, TargetNotFoundError
from harbor_gym.task import load_dataset

ENVS = Path(__file__).resolve().parents[3] / "envs"


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                           *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


def make_bare_repo(tmp_path: Path, tasks: dict[str, str]) -> tuple[Path, str]:
    """A bare repository holding ``tasks`` (repo path -> envs/<name>) in one commit; (bare repo, commit sha)."""
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", cwd=work)
    for rel, example in tasks.items():
        shutil.copytree(ENVS / example, work / rel)
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "tasks", cwd=work)
    sha = _git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "remote.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    shutil.rmtree(work)
    return bare, sha


def write_registry(path: Path, bare: Path, sha: str, tasks: dict[str, str], *, version: str = "1.0") -> Path:
    entry = {"name": "demo", "version": version, "description": "a demo dataset",
             "tasks": [{"name": name, "git_url": str(bare), "git_commit_id": sha, "path": rel}
                       for name, rel in tasks.items()]}
    path.write_text(json.dumps([entry], indent=2))
    return path


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    monkeypatch.setenv("HARBOR_GYM_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("HARBOR_GYM_SETTINGS", str(tmp_path / "no-settings.toml"))
    return tmp_path / "cache" / "datasets"


def test_dataset_ref_shape():
    # Issue 16 item 3: NAME@VERSION, nothing else
    ref = parse_dataset_ref("terminal-bench@2.0")
    assert (ref.name, ref.version) == ("terminal-bench", "2.0")
    assert parse_dataset_ref("envs/cake") is None and parse_dataset_ref("demo@") is None


def test_registry_format_is_harbors_and_pins_commits(tmp_path):
    # Issue 16 item 3: Harbor's registry.json (list of datasets with name, version, description, tasks)
    reg = tmp_path / "registry.json"
    reg.write_text(json.dumps([{"name": "d", "version": "1", "description": "x", "metrics": [],
                                "tasks": [{"name": "a", "git_url": "u", "git_commit_id": "abcdef1", "path": "t/a"}]}]))
    (ds,) = read_registry(str(reg))
    assert ds.name == "d" and ds.version == "1" and ds.tasks[0].path == "t/a"
    reg.write_text(json.dumps([{"name": "d", "version": "1",
                                "tasks": [{"name": "a", "git_url": "u", "git_commit_id": "main", "path": "t/a"}]}]))
    with pytest.raises(DatasetError, match="must pin a commit"):
        read_registry(str(reg))


def test_registry_dataset_is_fetched_once_verified_and_loads_like_a_folder(tmp_path, cache):
    # Issue 16 item 3: fetched once into a content-addressed cache, commit verified, loads like a local folder
    bare, sha = make_bare_repo(tmp_path, {"tasks/cake": "cake", "tasks/counter": "gated-counter"})
    reg = write_registry(tmp_path / "registry.json", bare, sha, {"cake": "tasks/cake", "counter": "tasks/counter"})
    folder = resolve_dataset("demo@1.0", {"registry": str(reg)})
    assert folder.parent == cache and folder.name.startswith("demo@1.0-")
    manifest = json.loads((folder / MANIFEST).read_text())
    assert {t["git_commit_id"] for t in manifest["tasks"]} == {sha}
    dataset = load_dataset(folder)
    assert dataset.task_ids == ("cake", "counter") and not dataset.failures
    # rerun offline: the repository is gone, the cached dataset is served unchanged
    shutil.move(str(bare), str(tmp_path / "gone.git"))
    shutil.rmtree(cache / "repos")
    assert resolve_dataset("demo@1.0", {"registry": str(reg)}) == folder
    # a changed entry is a new folder (content-addressed), never the old one
    write_registry(reg, tmp_path / "gone.git", sha, {"cake": "tasks/cake"})
    assert resolve_dataset("demo@1.0", {"registry": str(reg)}) != folder


def test_wrong_commit_is_a_clear_error_and_leaves_nothing(tmp_path, cache):
    # Issue 16 item 3: a wrong commit is a clear error
    bare, _ = make_bare_repo(tmp_path, {"tasks/cake": "cake"})
    reg = write_registry(tmp_path / "registry.json", bare, "0123456789abcdef0123456789abcdef01234567",
                         {"cake": "tasks/cake"})
    with pytest.raises(DatasetError, match="commit 0123456789abcdef0123456789abcdef01234567 is not in"):
        resolve_dataset("demo@1.0", {"registry": str(reg)})
    assert [p.name for p in cache.iterdir() if p.name.startswith("demo")] == []


def test_missing_task_path_is_a_clear_error(tmp_path, cache):
    # Issue 16 item 3: a missing task path is a clear error naming the path and the commit
    bare, sha = make_bare_repo(tmp_path, {"tasks/cake": "cake"})
    reg = write_registry(tmp_path / "registry.json", bare, sha, {"cake": "tasks/no-such-task"})
    with pytest.raises(DatasetError, match=rf"no task path 'tasks/no-such-task' at commit {sha[:12]}"):
        resolve_dataset("demo@1.0", {"registry": str(reg)})


def test_unknown_version_lists_the_known_ones(tmp_path, cache):
    bare, sha = make_bare_repo(tmp_path, {"tasks/cake": "cake"})
    reg = write_registry(tmp_path / "registry.json", bare, sha, {"cake": "tasks/cake"})
    with pytest.raises(DatasetError, match=r"no version '9.9' \(versions: 1.0\)"):
        resolve_dataset("demo@9.9", {"registry": str(reg)})


def test_a_name_without_a_registry_says_how_to_configure_one(cache):
    with pytest.raises(DatasetError, match="no registry is configured"):
        resolve_dataset("demo@1.0", None)


def test_an_existing_path_wins_over_a_registry_name(tmp_path, cache, monkeypatch):
    # Issue 16 item 3: an existing path always wins over a registry name
    shutil.copytree(ENVS / "cake", tmp_path / "demo@1.0")
    monkeypatch.chdir(tmp_path)
    env = harbor_gym.make("demo@1.0", config={"registry": str(tmp_path / "missing-registry.json")})
    try:
        assert env.unwrapped.task.id == "demo@1.0"
    finally:
        env.close()


def test_make_names_an_unknown_target(cache):
    # Issue 16 item 4: not a Gymnasium namespace error
    with pytest.raises(TargetNotFoundError) as info:
        harbor_gym.make("no-such-thing")
    assert str(info.value).startswith("no such task folder or registered id: no-such-thing")
    assert isinstance(info.value, HarborGymError)
    with pytest.raises(TargetNotFoundError, match="no such task folder or registered id: envs/nope"):
        harbor_gym.make("envs/nope")


def test_make_resolves_a_dataset_name(tmp_path, cache):
    # Issue 16 item 3: harbor_gym.make("NAME@VERSION")
    bare, sha = make_bare_repo(tmp_path, {"tasks/cake": "cake"})
    reg = write_registry(tmp_path / "registry.json", bare, sha, {"cake": "tasks/cake"})
    env = harbor_gym.make("demo@1.0", config={"registry": str(reg)})
    try:
        assert env.unwrapped.dataset.task_ids == ("cake",)
        assert Path(env.unwrapped.dataset.path).is_relative_to(cache)
    finally:
        env.close()

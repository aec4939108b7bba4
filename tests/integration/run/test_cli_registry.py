"""``harbor-gym run NAME@VERSION`` through a registry file (Issue 16 item 3, must-hold): a local registry file and a
local bare git repository made by the test; the run fetches once into the cache, and a rerun works offline (the
repository is gone). A wrong commit or a missing task path is a clear error with exit 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from harbor_gym.config import settings_path

from run_helpers import ENVS, REPO, cli_args, read_rows

pytestmark = pytest.mark.docker


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=main",
                           *args], cwd=cwd, check=True, capture_output=True, text=True).stdout.strip()


@pytest.fixture
def registry(tmp_path) -> tuple[Path, dict, str]:
    """(registry file, environment for the CLI, commit): dataset demo@1.0 = envs/cake at a pinned commit of a local
    bare repository; a settings file (the host's own plus ``registry``) and a private cache."""
    work = tmp_path / "work"
    work.mkdir()
    _git("init", "-q", cwd=work)
    shutil.copytree(ENVS / "cake", work / "tasks" / "cake")
    _git("add", "-A", cwd=work)
    _git("commit", "-q", "-m", "demo", cwd=work)
    sha = _git("rev-parse", "HEAD", cwd=work)
    bare = tmp_path / "demo.git"
    _git("clone", "-q", "--bare", str(work), str(bare), cwd=tmp_path)
    reg = tmp_path / "registry.json"
    reg.write_text(json.dumps([{"name": "demo", "version": "1.0", "description": "demo", "tasks": [
        {"name": "cake", "git_url": str(bare), "git_commit_id": sha, "path": "tasks/cake"}]}]))
    host = settings_path().read_text() if settings_path().is_file() else ""
    settings = tmp_path / "settings.toml"
    settings.write_text(f"registry = {json.dumps(str(reg))}\n{host}")
    env = {**os.environ, "HARBOR_GYM_SETTINGS": str(settings), "HARBOR_GYM_CACHE": str(tmp_path / "cache")}
    return reg, env, sha


def _run(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run(cli_args(*args), capture_output=True, text=True, timeout=300, cwd=REPO, env=env)


def test_run_dataset_by_name_fetches_once_and_reruns_offline(tmp_path, registry, no_leaks):
    # Issue 16 item 3 must-hold: `harbor-gym run demo@1.0 --agent oracle` runs, caches, reruns offline
    reg, env, sha = registry
    out = tmp_path / "out1"
    proc = _run(env, "demo@1.0", "--agent", "oracle", "--backend", "docker", "--out", str(out))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = read_rows(out / "rollouts.jsonl")
    assert [(r["task_id"], r["reward"]) for r in rows] == [("cake", 1.0)]
    cached = [p for p in (tmp_path / "cache" / "datasets").iterdir() if p.name.startswith("demo@1.0-")]
    assert len(cached) == 1 and (cached[0] / "cake" / "task.toml").is_file()
    manifest = json.loads((cached[0] / ".harbor-gym-dataset.json").read_text())
    assert manifest["tasks"][0]["git_commit_id"] == sha
    # offline: the repository and the mirror are gone; the cached dataset still runs
    shutil.rmtree(tmp_path / "demo.git")
    shutil.rmtree(tmp_path / "cache" / "datasets" / "repos")
    proc = _run(env, "demo@1.0", "--agent", "oracle", "--backend", "docker", "--out", str(tmp_path / "out2"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert [r["reward"] for r in read_rows(tmp_path / "out2" / "rollouts.jsonl")] == [1.0]


def test_run_wrong_commit_or_missing_path_is_a_clear_error(tmp_path, registry):
    # Issue 16 item 3 must-hold: a wrong commit or a missing task path is a clear error (exit 2, one line)
    reg, env, sha = registry
    data = json.loads(reg.read_text())
    data[0]["tasks"][0]["git_commit_id"] = "f" * 40
    reg.write_text(json.dumps(data))
    proc = _run(env, "demo@1.0", "--backend", "local", "--out", str(tmp_path / "o1"))  # fails before any sandbox
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"commit {'f' * 40} is not in {tmp_path / 'demo.git'}" in proc.stderr
    assert "Traceback" not in proc.stderr
    data[0]["tasks"][0].update(git_commit_id=sha, path="tasks/nope")
    reg.write_text(json.dumps(data))
    proc = _run(env, "demo@1.0", "--backend", "local", "--out", str(tmp_path / "o2"))
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"no task path 'tasks/nope' at commit {sha[:12]}" in proc.stderr
    assert "Traceback" not in proc.stderr


def _cli(env: dict, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "harbor_gym.cli", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO, env=env)


def test_check_and_validate_take_a_dataset_name(tmp_path, registry, no_leaks):
    # Issue 16 item 5 (lead's list): `check` and `validate` resolve NAME@VERSION as `run` does; a wrong commit or a
    # missing task path is the same clear error (exit 2, one line, no traceback)
    reg, env, sha = registry
    proc = _cli(env, "check", "demo@1.0")
    assert proc.returncode == 0 and "OK" in proc.stdout and "cake (2 steps)" in proc.stdout, proc.stdout + proc.stderr
    proc = _cli(env, "validate", "demo@1.0", "--backend", "docker")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "PASS" in proc.stdout and "cake:" in proc.stdout
    data = json.loads(reg.read_text())
    for command, change, expected in (
            ("check", {"git_commit_id": "f" * 40}, f"commit {'f' * 40} is not in {tmp_path / 'demo.git'}"),
            ("validate", {"git_commit_id": sha, "path": "tasks/nope"}, f"no task path 'tasks/nope' at commit {sha[:12]}"),
    ):
        data[0]["tasks"][0].update(change)
        data[0]["version"] = "1.1"  # nothing of demo@1.1 is cached
        reg.write_text(json.dumps(data))
        proc = _cli(env, command, "demo@1.1")
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert expected in proc.stderr and "Traceback" not in proc.stderr, proc.stderr
        assert proc.stderr.count("\n") == 1, proc.stderr  # one line

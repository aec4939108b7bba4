"""The pure seed plan (GYM-2, FMT-10): what it uploads and the key naming it; no sandbox."""

from __future__ import annotations

import io
import os
import shutil
import tarfile
from pathlib import Path

from harbor_gym.episode._seedplan import seed_plan
from harbor_gym.task import load_task

ENVS = Path(__file__).resolve().parents[3] / "envs"


def _copy(tmp_path: Path) -> Path:
    task = tmp_path / "cake"
    shutil.copytree(ENVS / "cake", task)
    return task


# SPEC: FMT-10
def test_plan_uploads_environment_files_relative_to_the_workdir(tmp_path):
    task = _copy(tmp_path)
    (task / "environment" / "sub").mkdir()
    (task / "environment" / "sub" / "x.sh").write_text("echo x\n")
    os.chmod(task / "environment" / "sub" / "x.sh", 0o755)
    plan = seed_plan(load_task(task))
    with tarfile.open(fileobj=io.BytesIO(plan.archive)) as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {"menu.txt", "sub/x.sh"}
        assert members["sub/x.sh"].mode == 0o755 and members["sub/x.sh"].uid == 0
        assert tar.extractfile("menu.txt").read() == (task / "environment" / "menu.txt").read_bytes()


# SPEC: GYM-2
def test_plan_key_names_the_preparation(tmp_path):
    task = _copy(tmp_path)
    first = seed_plan(load_task(task))
    assert seed_plan(load_task(task)).key == first.key  # deterministic: same folder, same key
    (task / "environment" / "menu.txt").write_text("changed\n")
    changed = seed_plan(load_task(task))
    assert changed.key != first.key  # content is part of the key
    os.chmod(task / "environment" / "menu.txt", 0o600)
    chmodded = seed_plan(load_task(task))
    assert chmodded.key != changed.key  # so is the mode
    toml = (task / "task.toml").read_text()
    (task / "task.toml").write_text(toml.replace("[agent]", '[environment.healthcheck]\ncommand = "true"\n\n[agent]'))
    with_hc = seed_plan(load_task(task))
    assert with_hc.healthcheck is not None and with_hc.key != chmodded.key  # and the healthcheck
    strict = seed_plan(load_task(task), workdir_must_exist=True)
    assert strict.workdir_must_exist and strict.key != with_hc.key  # and Harbor's missing-workdir check (issue 16)


# SPEC: FMT-10
def test_no_upload_without_docker_image(tmp_path):
    task = _copy(tmp_path)
    (task / "environment" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    toml = (task / "task.toml").read_text().replace('docker_image = "debian:bookworm-slim"', "")
    (task / "task.toml").write_text(toml)
    assert seed_plan(load_task(task)).archive == b""

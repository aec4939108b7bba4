"""``harbor-gym`` tells the truth (issue 16, item 5): each test runs the CLI in a subprocess and checks what a person
reads and the exit code. The commands that start no sandbox run everywhere; the others need Docker."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from run_helpers import ENVS, REPO

BOX_CHARS = set("┃━┏┓┗┛│─┡┩╇╋┼")


def harbor_gym(*args: str, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess:
    """``harbor-gym ARGS`` with stdout and stderr captured (so neither is a terminal)."""
    return subprocess.run([sys.executable, "-m", "harbor_gym.cli", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, **(env or {})})


def write_task(root: Path, toml: str, *, steps: tuple[str, ...] = ()) -> Path:
    """A task folder with ``toml`` as task.toml, a test.sh writing reward 1, and the given step folders."""
    root.mkdir(parents=True)
    (root / "task.toml").write_text(textwrap.dedent(toml))
    (root / "instruction.md").write_text("do it\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("echo 1 > /logs/verifier/reward.txt\n")
    for name in steps:
        (root / "steps" / name / "tests").mkdir(parents=True)
        (root / "steps" / name / "instruction.md").write_text("step\n")
    return root


def test_version_is_printed():
    proc = harbor_gym("--version")
    assert proc.returncode == 0
    from harbor_gym import __version__

    assert proc.stdout.strip() == f"harbor-gym {__version__}"


def test_bracketed_text_in_a_message_survives(tmp_path):
    # SPEC: LOAD-7 — the message names the table [verifier.environment]; rich markup must not eat it, and the
    # rule id appears once.
    task = write_task(tmp_path / "bad", """
        [environment]
        docker_image = "debian:bookworm-slim"
        [verifier]
        environment_mode = "shared"
        [verifier.environment]
        docker_image = "debian:bookworm-slim"
    """)
    proc = harbor_gym("check", str(task))
    assert proc.returncode == 1
    line = proc.stdout.strip()
    assert line.count("FAIL") == 1
    assert "LOAD-7" in line and line.count("LOAD-7") == 1, line
    assert "environment" in line and "[" in line


def test_rule_id_is_not_doubled():
    from harbor_gym.errors import TaskLoadError

    err = TaskLoadError("a step name violates FMT-12 (LOAD-2)", field="steps", rule="LOAD-2")
    assert str(err).count("LOAD-2") == 1
    assert str(TaskLoadError("bad name", rule="LOAD-2")).endswith("[LOAD-2]")


def test_check_reports_each_semantics_where_they_differ(tmp_path):
    # SPEC: LOAD-6, VER-4 — a separate step whose tests folder holds a Dockerfile and no docker_image anywhere: the
    # Seed refuses it (LOAD-6); Harbor builds the step's verifier from it (VER-4), so `check` shows both.
    task = write_task(tmp_path / "split", """
        [environment]
        docker_image = "debian:bookworm-slim"
        [[steps]]
        name = "one"
        [steps.verifier]
        environment_mode = "separate"
    """, steps=("one",))
    (task / "steps" / "one" / "tests" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    proc = harbor_gym("check", str(task))
    assert proc.returncode == 1, proc.stdout
    lines = proc.stdout.strip().splitlines()
    assert any(line.startswith("FAIL") and "[seed]" in line and "LOAD-6" in line for line in lines), lines
    assert any(line.startswith("OK") and "[harbor]" in line for line in lines), lines
    one = harbor_gym("check", "--semantics", "harbor", str(task))
    assert one.returncode == 0 and "[harbor]" not in one.stdout and one.stdout.startswith("OK")


def test_load_warning_names_the_task_file_and_key(tmp_path):
    # SPEC: FMT-14 — one warning, pointing at task.toml's line, not at harbor_gym's source.
    task = write_task(tmp_path / "warn", """
        [environment]
        docker_image = "debian:bookworm-slim"
        bogus_key = 1
    """)
    proc = harbor_gym("check", str(task))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"{task / 'task.toml'}:4: UnknownKeyWarning" in proc.stderr, proc.stderr
    assert "bogus_key" in proc.stderr and "harbor_gym/" not in proc.stderr


def test_prewarm_help_says_what_lasts():
    proc = harbor_gym("prewarm", "--help")
    assert proc.returncode == 0
    text = " ".join(proc.stdout.split())
    assert "What lasts after it exits is the image build cache" in text


def test_docker_backend_without_engine_is_one_line_and_exit_2(tmp_path):
    # An engine that is not there is bad input for --backend docker: one line naming where it looked, no retries.
    sock = tmp_path / "nothing.sock"
    proc = harbor_gym("run", str(ENVS / "cake"), "--backend", "docker", "--out", str(tmp_path / "out"),
                      env={"DOCKER_HOST": f"unix://{sock}"}, timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and str(sock) in lines[0] and "--backend local" in lines[0], lines
    assert not (tmp_path / "out" / "rollouts_failures.jsonl").exists()


@pytest.mark.bwrap
def test_auto_fallback_is_announced(tmp_path):
    sock = tmp_path / "nothing.sock"
    proc = harbor_gym("check", str(ENVS / "cake"))  # check starts nothing: the fallback line belongs to run
    assert "bubblewrap" not in proc.stderr
    proc = harbor_gym("run", str(ENVS / "cake"), "--backend", "auto", "--out", str(tmp_path / "out"),
                      env={"DOCKER_HOST": f"unix://{sock}"}, timeout=300)
    announced = [line for line in proc.stderr.splitlines() if "using the local (bubblewrap) backend" in line]
    assert len(announced) == 1 and str(sock) in announced[0], proc.stderr


@pytest.mark.docker
def test_run_summary_is_plain_text_when_piped_and_no_resource_warning(tmp_path):
    # The summary read from a pipe has no box art; with warnings on, no Docker socket is left unclosed.
    out = tmp_path / "out"
    proc = subprocess.run([sys.executable, "-W", "always::ResourceWarning", "-m", "harbor_gym.cli", "run",
                           str(ENVS / "cake"), "--backend", "docker", "--out", str(out)],
                          capture_output=True, text=True, timeout=300, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert not (set(proc.stdout) & BOX_CHARS), proc.stdout
    assert "cake" in proc.stdout and "1/1" in proc.stdout
    assert "ResourceWarning" not in proc.stderr, proc.stderr


@pytest.mark.docker
def test_images_lists_cached_builds(tmp_path):
    # A Dockerfile task builds once into the cache; `images` then lists it (it used to print nothing).
    task = write_task(tmp_path / "built", """
        [verifier]
        timeout_sec = 30
    """)
    (task / "environment").mkdir()
    marker = tmp_path.name
    (task / "environment" / "Dockerfile").write_text(f"FROM debian:bookworm-slim\nRUN echo {marker} > /marker\n")
    proc = harbor_gym("validate", str(task), "--backend", "docker")
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    listing = harbor_gym("images")
    assert listing.returncode == 0
    assert any(line.startswith("cached harbor-gym/build:") for line in listing.stdout.splitlines()), listing.stdout


@pytest.mark.docker
def test_validate_names_a_missing_reward_key(tmp_path):
    # SPEC: RWD-5, ORACLE-4 — the oracle's verifier writes a reward.json without `reward`: validate says so.
    task = write_task(tmp_path / "nokey", """
        [environment]
        docker_image = "debian:bookworm-slim"
        [verifier]
        timeout_sec = 30
    """)
    (task / "tests" / "test.sh").write_text("echo '{\"score\": 1}' > /logs/verifier/reward.json\n")
    (task / "solution").mkdir()
    (task / "solution" / "solve.sh").write_text("#!/bin/bash\ntrue\n")
    proc = harbor_gym("validate", str(task), "--backend", "docker")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "no `reward` key" in proc.stdout and "!= 1.0" not in proc.stdout, proc.stdout
    assert proc.stdout.count("FAIL") == 2, proc.stdout  # the task line and its one step, never "FAIL FAIL"

"""Honest resume of ``harbor-gym run`` (issue 15) on a real engine: run.json records the run's identity; a resume
with another identity is refused saying what differs (unless --force-resume); a same-identity resume skips exactly
the done (task, rollout) pairs; an --out without run.json resumes with a warning."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from async_helpers import TEST_LABEL, two_step_task

pytestmark = pytest.mark.docker

REPO = Path(__file__).resolve().parents[3]


def _run(*args: str) -> subprocess.CompletedProcess:
    argv = [sys.executable, "-m", "harbor_gym.cli", "run", *args, "--backend", "docker", "--label",
            "=".join(TEST_LABEL)]
    return subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)


def _keys(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(r["task_id"], r["rollout"]) for r in map(json.loads, path.read_text().splitlines())]


def test_identity_mismatch_is_refused_and_same_identity_resume_skips_done_pairs(tmp_path, warm_engine, no_leaks):
    data = tmp_path / "data"
    two_step_task(data, "t1")
    two_step_task(data, "t2")
    script = tmp_path / "solve.sh"
    script.write_text("echo ok > /app/a.txt; echo ok > /app/b.txt\n")
    out = tmp_path / "out"
    first = _run(str(data), "--agent", f"script:{script}", "-k", "1", "-c", "2", "--out", str(out))
    assert first.returncode == 0, first.stderr
    identity = json.loads((out / "run.json").read_text())
    assert identity["agent"] == f"script:{script}" and identity["seed"] == 0 and identity["semantics"] == "seed"
    assert set(identity["tasks"]) == {"t1", "t2"} and len(identity["config_digest"]) == 64
    rows = out / "rollouts.jsonl"
    assert sorted(_keys(rows)) == [("t1", 0), ("t2", 0)]
    first_keys = _keys(rows)

    other = _run(str(data), "--agent", "oracle", "-k", "2", "--out", str(out))  # another agent
    assert other.returncode == 2
    assert "different run" in other.stderr and "agent:" in other.stderr and "--force-resume" in other.stderr
    reseeded = _run(str(data), "--agent", f"script:{script}", "-k", "2", "--seed", "3", "--out", str(out))
    assert reseeded.returncode == 2 and "seed: 0 then, 3 now" in reseeded.stderr
    assert sorted(_keys(rows)) == [("t1", 0), ("t2", 0)]  # nothing ran

    (data / "t2" / "steps" / "b" / "instruction.md").write_text("Do step b, differently.\n")
    changed = _run(str(data), "--agent", f"script:{script}", "-k", "2", "--out", str(out))
    assert changed.returncode == 2 and "tasks changed since: t2" in changed.stderr
    (data / "t2" / "steps" / "b" / "instruction.md").write_text("Do step b.\n")  # as it was

    again = _run(str(data), "--agent", f"script:{script}", "-k", "2", "-c", "2", "--out", str(out))
    assert again.returncode == 0, again.stderr
    assert "2 episode(s) already in the results folder are skipped" in again.stderr
    keys = _keys(rows)
    assert keys[:2] == first_keys and sorted(keys[2:]) == [("t1", 1), ("t2", 1)]  # exactly the missing ones

    (out / "run.json").unlink()  # a folder written before run identities
    old = _run(str(data), "--agent", f"script:{script}", "-k", "2", "--out", str(out))
    assert old.returncode == 0 and "no run.json" in old.stderr
    assert len(_keys(rows)) == 4  # nothing re-ran
    forced = _run(str(data), "--agent", "oracle", "-k", "2", "--out", str(out), "--force-resume")
    assert forced.returncode == 0 and "--force-resume: resuming" in forced.stderr

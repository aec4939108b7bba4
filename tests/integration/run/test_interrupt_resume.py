"""Ctrl-C during ``harbor-gym run``: sandboxes removed, finished rows kept, nothing partial; a rerun resumes."""

from __future__ import annotations

import signal
import subprocess
import time

import pytest

from harbor_gym.run import RolloutRow

from run_helpers import REPO, cli_args, labelled, read_rows, run_cli

pytestmark = pytest.mark.docker


def _scripts(folder, create: str):
    folder.mkdir(exist_ok=True)
    (folder / "01-select-cake-base.sh").write_text("mkdir -p /app/cake && echo chocolate > /app/cake/base.txt\n")
    (folder / "02-select-frosting.sh").write_text("echo vanilla-buttercream > /app/cake/frosting.txt\n")
    (folder / "01-create.sh").write_text(create)
    (folder / "02-increment.sh").write_text("echo 2 > /app/counter.txt\n")
    (folder / "03-double.sh").write_text("echo 4 > /app/counter.txt\n")
    return folder


def _wait_for(predicate, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_sigint_removes_sandboxes_keeps_finished_rows_and_rerun_resumes(tmp_path, dataset, docker_client, no_leaks):
    # SPEC: GYM-7 (close stops every sandbox) — cake's two rollouts finish, gated-counter's hang in turn 1 until
    # SIGINT; then a rerun with working scripts runs only gated-counter's two rollouts.
    out = tmp_path / "out"
    slow = _scripts(tmp_path / "slow", "sleep 300\n")
    stdout, stderr = open(tmp_path / "stdout", "w"), open(tmp_path / "stderr", "w")
    proc = subprocess.Popen(cli_args(str(dataset), "--agent", f"script:{slow}", "-k", "2", "-c", "2",
                                     "--backend", "docker", "--out", str(out)), stdout=stdout, stderr=stderr,
                            cwd=REPO)
    try:
        _wait_for(lambda: len(read_rows(out / "rollouts.jsonl")) == 2, 120, "cake's two rollouts")
        _wait_for(lambda: len([c for c in labelled(docker_client) if c["State"] == "running"]) == 2, 60,
                  "two gated-counter sandboxes running")
        time.sleep(1.0)  # both are inside `sleep 300`
        proc.send_signal(signal.SIGINT)
        t0 = time.monotonic()
        rc = proc.wait(timeout=90)
        stopped_in = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        stdout.close()
        stderr.close()
    err = (tmp_path / "stderr").read_text()
    assert rc == 130, err
    # the turns in `sleep 300` were cut by stopping their sandboxes, not left to run out their 60 s budget
    assert stopped_in < 30, stopped_in
    assert "interrupted" in err and str(out) in err
    assert labelled(docker_client) == []  # the running sandboxes were removed
    rows = read_rows(out / "rollouts.jsonl")
    assert sorted((r["task_id"], r["rollout"]) for r in rows) == [("cake", 0), ("cake", 1)]
    assert read_rows(out / "rollouts_failures.jsonl") == []  # the interrupted episodes wrote nothing
    for line in (out / "rollouts.jsonl").read_text().splitlines():
        RolloutRow.model_validate_json(line)  # every line whole

    fast = _scripts(tmp_path / "fast", "echo 1 > /app/counter.txt\n")
    again = run_cli(str(dataset), "--agent", f"script:{fast}", "-k", "2", "-c", "2", "--backend", "docker",
                    "--out", str(out), "--force-resume")  # another agent spec: run.json would refuse it (issue 15)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "2 episode(s) already in the results folder are skipped" in again.stderr
    rows2 = read_rows(out / "rollouts.jsonl")
    assert rows2[:2] == rows  # the finished rows are untouched, never repeated
    assert sorted((r["task_id"], r["rollout"]) for r in rows2[2:]) == [("gated-counter", 0), ("gated-counter", 1)]
    assert all(r["reward"] == 1.0 for r in rows2[2:])
    # the interrupted attempts' logs were cleared: one episode folder per resumed rollout
    for k in (0, 1):
        assert len(list((out / "logs" / "gated-counter" / f"rollout-{k}" / "gated-counter").iterdir())) == 1

"""P2 "a run always ends", for broken tasks: a task whose image cannot be had, whose verifier never writes a valid
reward, hangs or floods, whose setup.sh lacks its run bit or has CRLF line endings, or whose healthcheck names a
command that does not exist. Each ends with the SPEC outcome, bounded in time, and (where an error is raised) a
message naming the task, the step or field, and the cause."""

from __future__ import annotations

import time

import pytest

from harbor_gym.errors import SeedError
from harbor_gym.sandbox._engine import count_requests, get_client

from .helpers import config, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

NO_IMAGE = 'docker_image = "debian:bookworm-slim"\n'


NO_FILE = "harbor_gym:reward_file_not_found"


def _measured_zero(results, final, *, turns: int = 1, kind: str | None = None) -> None:
    """RWD-6/STOP-1: a verified turn without a valid reward file is a measured 0 and stops the episode; one that
    wrote no reward file at all names it (``kind``), an invalid file has no failure kind."""
    last = results[-1]
    assert len(results) == turns and last.terminated and not last.truncated
    assert last.record.reward == 0.0 and not last.record.reward_valid and last.record.verifier_rewards == {}
    assert last.record.failure_kind == kind and final.graded and final.reward == 0.0 and not final.retryable


# SPEC: GYM-2 (P2: a Dockerfile that fails to build is a clear, non-retryable seed error with the build log's end)
def test_p2_dockerfile_that_fails_to_build(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]).replace(NO_IMAGE, ""),
                                 "environment/Dockerfile": "FROM debian:bookworm-slim\nCOPY no-such-file /x\n",
                                 "tests/test.sh": grade("true")}, name="broken-build")
    with pytest.raises(SeedError) as info:
        run_episode(task, ":")
    err = info.value
    text = str(err)
    assert not err.retryable and err.rule == "GYM-2"
    assert "broken-build" in text  # names the task
    assert "build failed" in text and "last lines of the build log" in text and "no-such-file" in text


# SPEC: GYM-2 (P2: an image that is nowhere is refused with a clear error and never pulled)
def test_p2_image_that_is_nowhere_is_not_pulled(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]).replace("debian:bookworm-slim",
                                                                   "example.invalid/nowhere:1.0"),
                                 "tests/test.sh": grade("true")}, name="no-image")
    counter = count_requests(get_client())
    with pytest.raises(SeedError) as info:
        run_episode(task, ":", config(pull_policy="never"))
    text = str(info.value)
    assert not info.value.retryable
    assert "no-image" in text and "example.invalid/nowhere:1.0" in text and "pull_policy is 'never'" in text
    assert not [p for p in counter.paths if "/images/create" in p]  # no pull was attempted


@pytest.mark.parametrize("script,problem", [
    ("#!/bin/bash\necho checked, but wrote nothing\n", "none"),
    ("#!/bin/bash\necho nan > /logs/verifier/reward.txt\n", "nan-txt"),
    ("#!/bin/bash\necho '{\"reward\": NaN}' > /logs/verifier/reward.json\necho 1 > /logs/verifier/reward.txt\n",
     "nan-json-no-fallback"),
], ids=["no-reward", "nan-txt", "nan-json"])
# SPEC: RWD-1, RWD-2, RWD-3, RWD-6, STOP-1 (P2: a verifier that never writes a valid reward is a measured 0)
def test_p2_verifier_without_a_valid_reward_is_a_measured_zero(tmp_path, script, problem):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": script}, name=f"rw-{problem}")
    results, final = run_episode(task, ":")
    _measured_zero(results, final, kind=NO_FILE if problem == "none" else None)


# SPEC: VER-7, RWD-6, BUD-2 (P2: a verifier hanging past its budget is cut at budget + grace: a measured 0)
@pytest.mark.parametrize("script", ["#!/bin/bash\nsleep 1000\n", "#!/bin/bash\ntrap '' TERM\nsleep 1000\n"],
                         ids=["sleeps", "ignores-sigterm"])
def test_p2_verifier_hanging_past_its_budget(tmp_path, script):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"], verifier_timeout=2), "tests/test.sh": script},
                      name="hang")
    t0 = time.monotonic()
    results, final = run_episode(task, ":", config(verifier_grace_s=3))
    took = time.monotonic() - t0
    _measured_zero(results, final, kind=NO_FILE)
    assert results[0].record.timings["verify"] < 2 + 3 + 5 and took < 30


# SPEC: VER-7, VER-9, RWD-2 (P2: a verifier flooding its output still grades; what comes back stays capped)
def test_p2_verifier_flooding_its_output(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "tests/test.sh": "#!/bin/bash\nhead -c 100000000 /dev/zero | tr '\\0' B\n"
                                                  "echo 1 > /logs/verifier/reward.txt\n"}, name="vflood")
    logs = tmp_path / "logs"
    results, final = run_episode(task, ":", config(logs_root=str(logs)))
    assert results[0].record.reward == 1.0 and final.reward == 1.0 and results[0].terminated
    # the host copy of test-stdout.txt is the sandbox's file (100 MB here at most), never more
    copies = list(logs.rglob("test-stdout.txt"))
    assert copies and all(c.stat().st_size <= 100_000_000 for c in copies)


# SPEC: TURN-5 (P2: setup.sh runs as `bash setup.sh`, so a missing run bit does not matter)
def test_p2_setup_sh_without_run_bit_runs(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "steps/s1/workdir/setup.sh": ("touch /app/setup-ran\n", 0o644),
                                 "tests/test.sh": grade("[ -f /app/setup-ran ]")}, name="setup-nox")
    results, final = run_episode(task, ":")
    assert results[0].record.reward == 1.0 and results[0].record.failure_kind is None and final.reward == 1.0


# SPEC: TURN-5, TURN-8, STOP-5 (P2: a CRLF setup.sh runs under bash as written; one that fails is a setup failure)
def test_p2_setup_sh_with_crlf_line_endings(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "steps/s1/workdir/setup.sh": "#!/bin/bash\r\ntouch /app/made\r\nexit 0\r\n",
                                 "tests/test.sh": grade("true")}, name="setup-crlf")
    results, final = run_episode(task, ":")
    record = results[0].record
    # bash reads "exit 0\r": a non-numeric argument, exit 2 -> TURN-8 setup failure, terminal at step 1 (STOP-5)
    assert record.failure_kind == "harbor:step_setup_failed" and record.agent_status is None
    assert results[0].terminated and not results[0].truncated
    assert not final.graded and final.reward is None and not final.retryable
    assert final.failure_kind == "harbor:step_setup_failed"


# SPEC: TURN-7, TURN-8, STOP-5 (P2: a step healthcheck naming a missing command fails the step, bounded)
def test_p2_step_healthcheck_command_that_does_not_exist(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml([
        'name = "s1"\n[steps.healthcheck]\ncommand = "no-such-command-xyz"\nretries = 2\ninterval_sec = 0.1\n'
        'start_interval_sec = 0.1\ntimeout_sec = 2\n', "s2"]), "tests/test.sh": grade("true")}, name="hc-step")
    t0 = time.monotonic()
    results, final = run_episode(task, ":")
    assert time.monotonic() - t0 < 30
    record = results[0].record
    assert len(results) == 1 and record.failure_kind == "harbor:step_healthcheck_failed"
    assert record.agent_status is None and results[0].terminated
    assert not final.graded and final.failure_kind == "harbor:step_healthcheck_failed" and not final.retryable


# SPEC: GYM-2, TURN-7 (P2: a seed healthcheck naming a missing command is a retryable SeedError naming the field)
def test_p2_seed_healthcheck_command_that_does_not_exist(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"], env=(
        '[environment.healthcheck]\ncommand = "no-such-command-xyz"\nretries = 1\ninterval_sec = 0.1\n'
        'timeout_sec = 2\n')), "tests/test.sh": grade("true")}, name="hc-seed")
    with pytest.raises(SeedError) as info:
        run_episode(task, ":")
    text = str(info.value)
    assert info.value.retryable and "hc-seed" in text and "environment.healthcheck" in text

"""TURN rules on real sandboxes: order, clean-up, preparation and its failure kinds, instruction, budget, logs."""

import json
import os
from pathlib import Path

import pytest

from harbor_gym.agents import Oracle
from harbor_gym.episode import HEALTHCHECK_FAILED, SETUP_FAILED, WORKDIR_FAILED

from .conftest import BACKENDS, REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker


# SPEC: TURN-1, TURN-6
@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_1_steps_share_one_sandbox_in_order(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "steps/s1/tests/test.sh": grade("[ -f /app/one ]"),
        "steps/s2/tests/test.sh": grade("[ -f /app/one ] && [ -f /app/two ] && pgrep -f 'sleep 321' >/dev/null"),
    })
    results, final = run_episode(task, ["touch /app/one; (sleep 321 &) ; true", "touch /app/two"], backend=backend)
    assert [r.record.step_name for r in results] == ["s1", "s2"]
    assert [r.record.reward for r in results] == [1.0, 1.0]  # TURN-6: files and processes survive
    assert final.reward == 1.0 and final.stopped_after_turn is None


# SPEC: TURN-2
@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_2_cleanup_between_turns_touches_only_tests_verifier_and_trajectory(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "tests/helper.txt": "base layer\n",
        "steps/s1/tests/test.sh": "#!/bin/bash\necho extra > /logs/verifier/extra.txt\necho 1 > /logs/verifier/reward.txt\n",
        "steps/s2/tests/test.sh": grade("[ \"$(cat /app/seen)\" = 'tests=0 verifier=0 traj=no keep=yes art=yes' ]"),
    })
    probe = ("echo \"tests=$(ls -A /tests | wc -l) verifier=$(ls -A /logs/verifier | wc -l) "
             "traj=$([ -e /logs/agent/trajectory.json ] && echo yes || echo no) "
             "keep=$([ -e /tmp/keep ] && echo yes || echo no) "
             "art=$([ -e /logs/artifacts/a.txt ] && echo yes || echo no)\" > /app/seen; "
             "stat -c %a /logs/verifier >> /app/mode")
    results, _ = run_episode(task, ["touch /tmp/keep; echo a > /logs/artifacts/a.txt", probe], backend=backend)
    assert results[1].record.reward == 1.0


# SPEC: TURN-4
@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_4_workdir_merge_root_owned_with_modes(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "steps/s1/workdir/keep.txt": "from s1\n",
        "steps/s1/workdir/same.txt": "old\n",
        "steps/s2/workdir/same.txt": "new\n",
        "steps/s2/workdir/deep/run.sh": ("#!/bin/sh\necho hi\n", 0o750),
        "steps/s2/workdir/deep/secret.txt": ("s\n", 0o600),
        "tests/test.sh": grade(
            "[ \"$(cat /app/same.txt)\" = new ] && [ -f /app/keep.txt ] && "
            "[ \"$(stat -c '%u:%g %a' /app/deep/run.sh)\" = '0:0 750' ] && "
            "[ \"$(stat -c '%u:%g %a' /app/deep/secret.txt)\" = '0:0 600' ] || [ \"$HARBOR_T\" = s1 ]"),
    })
    results, _ = run_episode(task, [": ", ": "], backend=backend)
    assert results[1].record.reward == 1.0


# SPEC: TURN-5
@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_5_setup_sh_runs_in_workdir_as_agent_user_and_stays(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1"], env='env = { GREETING = "hello" }'),
        "steps/s1/workdir/setup.sh": "echo \"$(id -un) $(pwd) $GREETING\" > /tmp/setup-ran\n",
        "steps/s1/setup.sh": "touch /tmp/never\n",
        "steps/s1/tests/test.sh": grade("[ \"$(cat /tmp/setup-ran)\" = 'root /app hello' ] && [ -r /app/setup.sh ] "
                                        "&& [ ! -e /tmp/never ]"),
    })
    results, _ = run_episode(task, ":", backend=backend)
    assert results[0].record.reward == 1.0


# SPEC: TURN-7
def test_turn_7_step_healthcheck_polls_until_it_passes(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n'
                           '[steps.healthcheck]\ncommand = "test -f /tmp/ready"\ninterval_sec = 0.2\n'
                           'start_interval_sec = 0.2\nstart_period_sec = 0\nretries = 20\ntimeout_sec = 2\n']),
        "steps/s1/workdir/setup.sh": "(sleep 1; touch /tmp/ready) > /dev/null 2>&1 &\n",
        "steps/s1/tests/test.sh": REWARD_1,
    })
    results, _ = run_episode(task, "test -f /tmp/ready")
    assert results[0].record.failure_kind is None and results[0].record.exit_code == 0


def _prep_failure_files(kind: str, at: str) -> dict:
    files = {}
    if kind == SETUP_FAILED:
        files[f"steps/{at}/workdir/setup.sh"] = "exit 3\n"
    elif kind == WORKDIR_FAILED:
        # a file (from the seed's environment/ copy, or left by s1's agent) where the step's workdir/ needs a folder
        files[f"steps/{at}/workdir/clash/inner.txt"] = "x\n"
        if at == "s1":
            files["environment/clash"] = "a file\n"
    return files


def _prep_toml(kind: str, at: str) -> str:
    bodies = []
    for name in ("s1", "s2", "s3"):
        body = f'name = "{name}"\n[steps.verifier]\ntimeout_sec = 10\n'
        if kind == HEALTHCHECK_FAILED and name == at:
            body += ('[steps.healthcheck]\ncommand = "false"\ninterval_sec = 0.1\nstart_interval_sec = 0.1\n'
                     'retries = 2\ntimeout_sec = 1\n')
        bodies.append(body)
    return toml(bodies)


# SPEC: TURN-8, STOP-5, RWD-6
@pytest.mark.parametrize("kind", [SETUP_FAILED, WORKDIR_FAILED, HEALTHCHECK_FAILED])
@pytest.mark.parametrize("at", ["s1", "s2"])
def test_turn_8_preparation_failure_kinds(tmp_path, kind, at):
    task = write_task(tmp_path, {"task.toml": _prep_toml(kind, at), "tests/test.sh": REWARD_1,
                                 **_prep_failure_files(kind, at)})
    results, final = run_episode(task, "touch /app/clash; touch /tmp/agent-ran")
    last = results[-1].record
    assert last.step_name == at and last.failure_kind == kind
    assert last.agent_status is None and last.verifier_mode is None  # neither agent nor verifier ran
    assert results[-1].terminated and not results[-1].truncated
    if at == "s1":  # STOP-5
        assert not final.graded and final.reward is None and final.failure_kind == kind and not final.retryable
    else:  # RWD-6: measured 0, counted in the mean
        assert final.graded and final.reward == pytest.approx(0.5) and last.reward == 0.0
        assert final.stopped_after_turn == "s2"
    assert len(results) == (1 if at == "s1" else 2)


# SPEC: TURN-9
def test_turn_9_instruction_is_step_file_and_template_wraps_turn_1_only(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "steps/s1/instruction.md": "<!-- canary GUID x -->\n\nFirst.\n",
        "steps/s2/instruction.md": "Second.\n",
        "tests/test.sh": REWARD_1,
    })
    results, _ = run_episode(task, ":", {"prompt_template": "Please: {{ instruction }}"})
    assert results[0].record.instruction == "Please: First.\n"
    assert results[1].record.instruction == "Second.\n"


# SPEC: TURN-10, GYM-4
@pytest.mark.parametrize("backend", BACKENDS)
def test_turn_10_activation_bounded_by_budget_and_processes_outlive_it(tmp_path, backend):
    task = write_task(tmp_path, {
        "task.toml": toml(['name = "s1"\n[steps.agent]\ntimeout_sec = 1\n[steps.verifier]\ntimeout_sec = 10\n']),
        "steps/s1/tests/test.sh": grade("pgrep -f 'sleep 222' >/dev/null && [ \"$(cat /tmp/env)\" = 's1 0 1' ]"),
    })
    script = "echo \"$HARBOR_STEP_NAME $HARBOR_STEP_INDEX $HARBOR_NUM_STEPS\" > /tmp/env; (setsid sleep 222 > /dev/null 2>&1 &); sleep 30"
    results, _ = run_episode(task, script, backend=backend)
    rec = results[0].record
    assert rec.agent_status == "timeout" and rec.timings["agent"] < 10
    assert rec.reward == 1.0  # timeout is graded (STOP-6); the background process outlived the activation


# SPEC: TURN-11
def test_turn_11_logs_per_turn_kept_under_logs_root(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "tests/test.sh": "#!/bin/bash\necho verifier-said-hi\necho 1 > /logs/verifier/reward.txt\n",
    })
    logs = tmp_path / "logs"
    results, final = run_episode(task, "echo agent-said-hi", {"logs_root": str(logs)})
    for r in results:
        d = Path(r.record.log_dir)
        assert d.is_dir() and d.name == r.record.step_name and d.parent.name == "steps"
        assert "verifier-said-hi" in (d / "verifier" / "test-stdout.txt").read_text()
        assert (d / "verifier" / "reward.txt").read_text().strip() == "1"
        assert "agent-said-hi" in (d / "agent" / "output.txt").read_text()
        assert json.loads((d / "agent" / "trajectory.json").read_text())["schema_version"] == "ATIF-v1.7"
        assert (d / "verifier" / "artifacts" / "manifest.json").is_file()
    assert Path(final.log_dir).is_dir()  # kept after close


# SPEC: TURN-11
def test_turn_11_logs_without_logs_root_are_temporary(tmp_path):
    from harbor_gym.episode import Episode

    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    with Episode(task, {"backend": "docker"}) as ep:
        ep.start()
        root = ep._logs.root
        r = ep.run_turn(":")
        assert r.record.log_dir is None and r.episode.log_dir is None and root.is_dir()
    assert not root.exists()


# SPEC: GYM-9, TURN-11
def test_gym_9_single_step_task_is_one_turn_named_by_task_id(tmp_path):
    task = tmp_path / "ep-single"
    (task / "tests").mkdir(parents=True)
    (task / "task.toml").write_text(toml([]) + "[verifier]\ntimeout_sec = 10\n")
    (task / "instruction.md").write_text("Write hello.\n")
    (task / "tests" / "test.sh").write_text(grade("[ -f /app/hello ]"))
    os.chmod(task / "tests" / "test.sh", 0o755)
    results, final = run_episode(task, "touch /app/hello", {"logs_root": str(tmp_path / "logs")})
    rec = results[0].record
    assert rec.step_name == "ep-single" and rec.instruction == "Write hello.\n" and rec.reward == 1.0
    assert Path(rec.log_dir).name != "steps" and (Path(rec.log_dir) / "verifier" / "reward.txt").is_file()
    assert final.reward == 1.0 and len(final.turns) == 1

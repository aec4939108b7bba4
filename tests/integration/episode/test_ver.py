"""VER rules on real sandboxes: shared and separate verifiers, staging, user and env, budget, trajectory, masking."""

import json

import pytest

from harbor_gym.agents import AgentOutcome, validate_trajectory

from .conftest import BACKENDS, REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

SEPARATE_TAIL = ('[verifier]\nenvironment_mode = "separate"\n[verifier.environment]\n'
                 'docker_image = "debian:bookworm-slim"\nworkdir = "/app"\nnetwork_mode = "no-network"\n')


# SPEC: VER-1, VER-3, VER-5
def test_ver_3_separate_step_verifies_in_fresh_sandbox_with_artifacts(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1"], top='artifacts = ["/app/out"]', tail=SEPARATE_TAIL),
        "tests/test.sh": REWARD_1,
    })
    # a [steps.verifier.environment] with docker_image keeps the image's /tests (VER-4): upload nothing
    results, final = run_episode(task, "mkdir -p /app/out; echo r > /app/out/result; chmod 4755 /app/out/result; "
                                       "echo private > /app/private")
    rec = results[0].record
    assert rec.verifier_mode == "separate" and final.verifier_mode == "separate"
    # /tests is the image's (empty) folder: test.sh is absent, so no reward file -> measured 0
    assert rec.reward_valid is False


# SPEC: VER-3, VER-4, VER-5, VER-6
def test_ver_5_separate_copy_of_agent_environment_gets_tests_and_artifacts(tmp_path):
    body = 'name = "s1"\n[steps.verifier]\ntimeout_sec = 10\nenvironment_mode = "separate"\n'
    task = write_task(tmp_path, {
        "task.toml": toml([body], top='artifacts = ["/app/out"]'),
        "tests/test.sh": grade(
            "[ \"$(cat /app/out/result)\" = r ] && [ ! -e /app/private ] && "
            "[ \"$(stat -c %a /app/out/result)\" = 755 ] && [ -f /logs/artifacts/conv.txt ] && "
            "[ -f /logs/agent/trajectory.json ]"),
    })
    results, _ = run_episode(task, "mkdir -p /app/out; echo r > /app/out/result; chmod 4755 /app/out/result; "
                                   "echo private > /app/private; echo c > /logs/artifacts/conv.txt")
    rec = results[0].record
    assert rec.verifier_mode == "separate" and rec.reward == 1.0


# SPEC: VER-2
def test_ver_2_separate_for_artifacts_overrides_shared(tmp_path):
    body = 'name = "s1"\nartifacts = ["/app/a.txt"]\n[steps.verifier]\ntimeout_sec = 10\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": grade("[ -f /app/a.txt ]")})
    on, _ = run_episode(task, "touch /app/a.txt /app/b.txt", {"separate_verifier_for_artifacts": True})
    off, _ = run_episode(task, "touch /app/a.txt")
    assert on[0].record.verifier_mode == "separate" and on[0].record.reward == 1.0
    assert off[0].record.verifier_mode == "shared"


# SPEC: VER-6, RWD-1
@pytest.mark.parametrize("backend", BACKENDS)
def test_ver_6_fake_reward_written_by_agent_is_discarded(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": "#!/bin/bash\nexit 0\n"})
    results, final = run_episode(task, "mkdir -p /logs/verifier; echo 1 > /logs/verifier/reward.txt; "
                                       "mkdir -p /tests; echo 'echo 1 > /logs/verifier/reward.txt' > /tests/test.sh",
                                 backend=backend)
    assert results[0].record.reward_valid is False and results[0].record.reward == 0.0
    assert final.reward == 0.0


# SPEC: VER-7
def test_ver_7_runs_as_verifier_user_in_workdir_with_merged_env(tmp_path):
    body = ('name = "s1"\n[steps.verifier]\ntimeout_sec = 10\nuser = "nobody"\n'
            '[steps.verifier.env]\nB = "step"\nC = "step"\n')
    task = write_task(tmp_path, {
        "task.toml": toml([body], env='env = { A = "env", B = "env", C = "env" }',
                          tail='[verifier.env]\nB = "verifier"\nC = "verifier"\nD = "${HG_TEST_UNSET_VAR:-dflt}"\n'),
        "tests/test.sh": grade("[ \"$(id -un) $(pwd) $A $B $C $D\" = 'nobody /app env verifier step dflt' ]"
                               .replace("verifier step", "step step")),
    })
    results, _ = run_episode(task, ":")
    assert results[0].record.reward == 1.0


# SPEC: VER-7, BUD-2
@pytest.mark.parametrize("backend", BACKENDS)
def test_ver_7_hanging_verifier_killed_at_budget(tmp_path, backend):
    body = 'name = "s1"\n[steps.verifier]\ntimeout_sec = 2\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": "#!/bin/bash\nsleep 300\n"})
    results, final = run_episode(task, ":", {"verifier_grace_s": 3}, backend=backend)
    rec = results[0].record
    assert rec.timings["verify"] < 10
    assert rec.reward_valid is False and rec.reward == 0.0 and final.graded  # RWD-6


# SPEC: VER-8
def test_ver_8_step_test_sh_wins_and_layers_merge(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "tests/test.sh": grade("[ -f /tests/base.txt ] && [ \"$(cat /tests/shared.txt)\" = base ]"),
        "tests/base.txt": "b\n",
        "tests/shared.txt": "base\n",
        "steps/s2/tests/test.sh": grade("[ -f /tests/base.txt ] && [ \"$(cat /tests/shared.txt)\" = step ]"),
        "steps/s2/tests/shared.txt": "step\n",
    })
    results, _ = run_episode(task, ":")
    assert [r.record.reward for r in results] == [1.0, 1.0]


# SPEC: VER-9
def test_ver_9_exit_code_never_changes_reward(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "tests/test.sh": "#!/bin/bash\necho 0.75 > /logs/verifier/reward.txt\nexit 7\n"})
    results, _ = run_episode(task, ":")
    assert results[0].record.reward == 0.75


# SPEC: VER-10
def test_ver_10_trajectory_json_is_this_turn_atif(tmp_path):
    class Agent:
        name, version, model_name = "tester", "2.0", "m-1"

        def run(self, turn):
            turn.exec("true")
            return AgentOutcome(trajectory=[{"source": "agent", "message": f"did {turn.step_name}",
                                             "model_name": "m-1"}], response=f"answer {turn.index}")

    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        "tests/test.sh": "#!/bin/bash\ncp /logs/agent/trajectory.json /app/traj-$(ls /app | wc -l).json\n"
                         "echo 1 > /logs/verifier/reward.txt\n",
    })
    logs = tmp_path / "logs"
    agent = Agent()
    results, final = run_episode(task, agent, {"logs_root": str(logs)}, agent=agent)
    from pathlib import Path
    doc = json.loads((Path(results[1].record.log_dir) / "agent" / "trajectory.json").read_text())
    validate_trajectory(doc)
    assert doc["agent"] == {"name": "tester", "version": "2.0", "model_name": "m-1"}
    assert [s["message"] for s in doc["steps"]] == ["Do step s2.\n", "did s2"]  # this turn only
    assert final.response == "answer 1"  # STOP-9


# SPEC: VER-11, RWD-9
def test_ver_11_missing_tool_masks_turn_and_episode(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]).replace('docker_image = "debian:bookworm-slim"\n', ""),
        "environment/Dockerfile": "FROM debian:bookworm-slim\nRUN rm -f /bin/gzip /usr/bin/gzip\nWORKDIR /app\n",
        "tests/test.sh": REWARD_1,
    })
    results, final = run_episode(task, ":")
    rec = results[0].record
    assert rec.masked and rec.mask_reason == "verifier_error" and rec.reward is None
    assert results[0].terminated and len(results) == 1  # STOP-1
    assert final.masked and final.reward is None

"""Issue 16 item 1 on real Docker sandboxes: reward values keep their JSON type under both semantics, a reward.json
without ``reward`` under Harbor semantics, and a missing reward file's own failure kind."""

import pytest

from harbor_gym import HarborEnv
from harbor_gym.episode._rewards import REWARD_FILE_NOT_FOUND_KIND
from harbor_gym.run.rows import rows_from_episode

from .conftest import run_episode, toml, write_task

pytestmark = pytest.mark.docker

SEMANTICS = ["seed", "harbor"]


def _json(payload: str) -> str:
    return f"#!/bin/bash\necho '{payload}' > /logs/verifier/reward.json\n"


def _two_steps(tmp_path, strategy: str, first: str, second: str):
    return write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"], top=f'multi_step_reward_strategy = "{strategy}"'),
        "steps/s1/tests/test.sh": _json(first),
        "steps/s2/tests/test.sh": _json(second),
    })


# SPEC: RWD-3, RWD-7 (issue 16: int rewards stay ints; a mean is a float)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_int_rewards_mean_task(tmp_path, semantics):
    task = _two_steps(tmp_path, "mean", '{"reward": 1, "n": 2}', '{"reward": 0, "n": 4}')
    results, final = run_episode(task, ":", {"semantics": semantics})
    first = results[0].record
    assert first.reward == 1 and type(first.reward) is int
    assert first.verifier_rewards == {"reward": 1, "n": 2}
    assert all(type(v) is int for v in first.verifier_rewards.values())
    assert type(final.reward) is float and final.reward == 0.5
    assert final.verifier_rewards == {"reward": 0.5, "n": 3.0} and type(final.verifier_rewards["n"]) is float
    row = rows_from_episode(final, task_id="t", rollout=0, seed=None, agent="x", duration_sec=1.0)
    assert type(row.reward) is float and type(row.turns[0].reward) is int
    assert type(row.turns[0].verifier_rewards["n"]) is int
    assert '"reward":1,' in row.turns[0].model_dump_json()


# SPEC: RWD-3, RWD-8 (issue 16: final passes the last dict through unchanged, ints included)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_int_rewards_final_task(tmp_path, semantics):
    task = _two_steps(tmp_path, "final", '{"reward": 0.5}', '{"reward": 1, "style": 3}')
    results, final = run_episode(task, ":", {"semantics": semantics})
    assert type(results[1].record.reward) is int and results[1].record.reward == 1
    assert final.reward == 1 and type(final.reward) is int
    assert final.verifier_rewards == {"reward": 1, "style": 3}
    assert all(type(v) is int for v in final.verifier_rewards.values())
    row = rows_from_episode(final, task_id="t", rollout=0, seed=None, agent="x", duration_sec=1.0)
    assert type(row.reward) is int and row.verifier_rewards == {"reward": 1, "style": 3}
    assert type(row.verifier_rewards["style"]) is int


# SPEC: RWD-3 (issue 16: a single-step episode passes the dict through unchanged)
def test_int_reward_single_step(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": _json('{"reward": 1}')})
    _, final = run_episode(task, ":")
    assert final.reward == 1 and type(final.reward) is int and final.verifier_rewards == {"reward": 1}


# SPEC: RWD-5 (issue 16: no reward key; Harbor: no turn reward, valid, no failure, no stop; Seed: 0.0)
def test_json_without_reward_key_seed_vs_harbor(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": _json('{"a": 1}')})
    h_res, harbor = run_episode(task, ":", {"semantics": "harbor"})
    s_res, seed = run_episode(task, ":", {"semantics": "seed"})
    assert len(h_res) == 2 and len(s_res) == 2  # no stop without a min_reward gate
    for rec in (h_res[0].record, h_res[1].record):
        assert rec.reward is None and rec.reward_valid and rec.failure_kind is None
        assert rec.verifier_rewards == {"a": 1}
    assert harbor.graded and harbor.reward is None and harbor.failure_kind is None
    for rec in (s_res[0].record, s_res[1].record):
        assert rec.reward == 0.0 and rec.reward_valid and rec.failure_kind is None
    assert seed.reward == 0.0 and seed.verifier_rewards == {"a": 1.0}


# SPEC: RWD-5, STOP-2 (issue 16: under Harbor a min_reward gate on a file without reward still stops)
def test_json_without_reward_key_harbor_min_reward_gate(tmp_path):
    steps = ['name = "s1"\nmin_reward = 0.5\n[steps.verifier]\ntimeout_sec = 10\n', "s2"]
    task = write_task(tmp_path, {"task.toml": toml(steps), "tests/test.sh": _json('{"a": 1}')})
    results, final = run_episode(task, ":", {"semantics": "harbor"})
    assert len(results) == 1 and results[0].record.min_reward_missed and results[0].terminated
    assert results[0].record.reward is None and results[0].record.failure_kind is None
    assert final.stopped_after_turn == "s1"


# SPEC: GYM-6 (issue 16: step() returns 0.0 when the turn has no reward)
def test_env_step_returns_zero_without_reward_key(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": _json('{"a": 1}')})
    env = HarborEnv(task, config={"backend": "docker", "semantics": "harbor"})
    try:
        env.reset()
        _, reward, terminated, _, info = env.step(":")
    finally:
        env.close()
    assert reward == 0.0 and type(reward) is float and terminated
    assert info["turn"].reward is None and info["turn"].reward_valid


# SPEC: RWD-1, RWD-6 (issue 16: a missing reward file has its own kind under both semantics; an invalid one not)
@pytest.mark.parametrize("semantics", SEMANTICS)
def test_missing_reward_file_kind(tmp_path, semantics):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": "#!/bin/bash\ntrue\n"})
    results, final = run_episode(task, ":", {"semantics": semantics})
    rec = results[0].record
    assert len(results) == 1 and not rec.reward_valid
    assert rec.failure_kind == REWARD_FILE_NOT_FOUND_KIND == final.failure_kind
    assert "/logs/verifier/reward.json" in rec.failure_message and "/logs/verifier/reward.txt" in rec.failure_message
    assert rec.reward == (0.0 if semantics == "seed" else None)
    bad = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": _json('{"reward": "x"}')}, name="bad")
    results, _ = run_episode(bad, ":", {"semantics": semantics})
    assert not results[0].record.reward_valid and results[0].record.failure_kind is None


# SPEC: DIFF-8 (a step name only Harbor accepts runs end to end under harbor semantics: its folders, env, logs)
def test_diff_8_harbor_step_name_runs(tmp_path):
    name = "step one (é)"
    body = f'name = "{name}"\n[steps.verifier]\ntimeout_sec = 10\n'
    task = write_task(tmp_path, {"task.toml": toml([body, "s2"]),
                                 f"steps/{name}/tests/test.sh": _json('{"reward": 1}'),
                                 "steps/s2/tests/test.sh": _json('{"reward": 0.5}')})
    results, final = run_episode(task, 'test "$HARBOR_STEP_NAME" = "step one (é)" || exit 3',
                                 {"semantics": "harbor"})
    assert [r.record.step_name for r in results] == [name, "s2"]
    assert results[0].record.reward == 1 and results[0].record.exit_code == 0 and final.reward == 0.75

"""RWD rules on real sandboxes: reward files, turn reward, roll-up with several keys, masking, mixed modes."""

import pytest

from .conftest import BACKENDS, REWARD_1, run_episode, toml, write_task

pytestmark = pytest.mark.docker


def _json_test(payload: str) -> str:
    return f"#!/bin/bash\ncat > /logs/verifier/reward.json <<'J'\n{payload}\nJ\necho 0 > /logs/verifier/reward.txt\n"


# SPEC: RWD-1, RWD-3
@pytest.mark.parametrize("backend", BACKENDS)
def test_rwd_1_reward_json_wins_over_txt(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": _json_test('{"reward": 0.6, "x": 2}')})
    results, _ = run_episode(task, ":", backend=backend)
    assert results[0].record.verifier_rewards == {"reward": 0.6, "x": 2.0} and results[0].record.reward == 0.6


# SPEC: RWD-1, RWD-6, STOP-1
def test_rwd_1_invalid_json_never_falls_back_and_stops(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": _json_test('{"reward": true}')})
    results, final = run_episode(task, ":")
    rec = results[0].record
    assert not rec.reward_valid and rec.reward == 0.0 and rec.verifier_rewards == {}
    assert len(results) == 1 and results[0].terminated and final.stopped_after_turn == "s1"


# SPEC: RWD-2
def test_rwd_2_reward_txt_whole_text_float(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "tests/test.sh": "#!/bin/bash\nprintf ' 0.25\\n' > /logs/verifier/reward.txt\n"})
    results, _ = run_episode(task, ":")
    assert results[0].record.verifier_rewards == {"reward": 0.25}


# SPEC: RWD-5
def test_rwd_5_json_without_reward_key_is_zero(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": _json_test('{"a": 1, "b": 0.5}')})
    results, final = run_episode(task, ":")
    assert results[0].record.reward == 0.0 and results[0].record.reward_valid
    assert final.verifier_rewards == {"a": 1.0, "b": 0.5}


# SPEC: RWD-6
def test_rwd_6_no_reward_file_is_measured_zero(tmp_path):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": "#!/bin/bash\ntrue\n"})
    results, final = run_episode(task, ":")
    assert results[0].record.reward == 0.0 and not results[0].record.reward_valid
    assert final.reward == 0.0 and final.graded


# SPEC: RWD-7
def test_rwd_7_mean_with_several_keys(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"], top='multi_step_reward_strategy = "mean"'),
        "steps/s1/tests/test.sh": _json_test('{"reward": 1, "style": 0.5}'),
        "steps/s2/tests/test.sh": _json_test('{"reward": 0.5, "speed": 1}'),
    })
    _, final = run_episode(task, ":")
    assert final.strategy == "mean" and final.reward == pytest.approx(0.75)
    assert final.verifier_rewards == pytest.approx({"reward": 0.75, "style": 0.25, "speed": 0.5})


# SPEC: RWD-8
def test_rwd_8_final_with_several_keys(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"], top='multi_step_reward_strategy = "final"'),
        "steps/s1/tests/test.sh": _json_test('{"reward": 1, "style": 0.5}'),
        "steps/s2/tests/test.sh": _json_test('{"reward": 0.5, "speed": 1}'),
    })
    _, final = run_episode(task, ":")
    assert final.strategy == "final" and final.reward == 0.5
    assert final.verifier_rewards == {"reward": 0.5, "speed": 1.0}


# SPEC: RWD-10
def test_rwd_10_mixed_verifier_modes(tmp_path):
    sep = 'name = "s2"\n[steps.verifier]\ntimeout_sec = 10\nenvironment_mode = "separate"\n'
    task = write_task(tmp_path, {"task.toml": toml(["s1", sep]), "tests/test.sh": REWARD_1})
    _, final = run_episode(task, ":")
    assert [t.verifier_mode for t in final.turns] == ["shared", "separate"] and final.verifier_mode == "mixed"


# SPEC: RWD-11
@pytest.mark.parametrize("strategy,expected", [("mean", 0.4), ("final", 0.0)])
def test_rwd_11_example(tmp_path, strategy, expected):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2", "s3"], top=f'multi_step_reward_strategy = "{strategy}"'),
        "steps/s1/tests/test.sh": "#!/bin/bash\necho 0.8 > /logs/verifier/reward.txt\n",
        "steps/s2/workdir/setup.sh": "exit 1\n",
        "tests/test.sh": REWARD_1,
    })
    results, final = run_episode(task, ":")
    assert final.reward == pytest.approx(expected)
    assert final.stopped_after_turn == "s2" and [t.step_name for t in final.turns] == ["s1", "s2"]

"""Reward-file parsing (SPEC RWD-1..5, DIFF-20): pure, no Docker."""

import pytest

from harbor_gym.episode._rewards import parse_reward_json, parse_reward_txt, read_reward_files, turn_reward


# SPEC: RWD-4
@pytest.mark.parametrize("text,value", [("1", 1.0), (" 0.5\n", 0.5), ("1e-3", 0.001)])
def test_rwd_4_valid_txt_vectors(text, value):
    assert parse_reward_txt(text) == value


# SPEC: RWD-4
@pytest.mark.parametrize("text", ["", "nan", "inf", "yes"])
def test_rwd_4_invalid_txt_vectors(text):
    assert parse_reward_txt(text) is None


# SPEC: RWD-4
@pytest.mark.parametrize("text,rewards", [('{"reward": 1}', {"reward": 1.0}), ('{"a": 0.2, "b": 1}', {"a": 0.2, "b": 1.0})])
def test_rwd_4_valid_json_vectors(text, rewards):
    assert parse_reward_json(text) == rewards


# SPEC: RWD-4
@pytest.mark.parametrize(
    "text", ["{}", "1", '{"reward": "1"}', '{"reward": true}', '{"reward": NaN}', '{"r": {"x": 1}}']
)
def test_rwd_4_invalid_json_vectors(text):
    assert parse_reward_json(text) is None


# SPEC: RWD-3
@pytest.mark.parametrize("text", ['{"r": 1e999}', '{"r": -Infinity}', '{"r": null}', '{"r": [1]}',
                                  '{"r": 1' + "0" * 400 + "}", "[1]", "not json"])
def test_rwd_3_refuses_non_finite_and_non_numbers(text):
    assert parse_reward_json(text) is None


# SPEC: DIFF-20
def test_diff_20_booleans_are_numbers_under_harbor():
    assert parse_reward_json('{"reward": true, "x": false}', booleans_are_numbers=True) == {"reward": 1.0, "x": 0.0}
    assert parse_reward_json('{"reward": true}') is None


# SPEC: RWD-1
def test_rwd_1_invalid_json_never_falls_back_to_txt():
    reading = read_reward_files('{"reward": "x"}', "1")
    assert not reading.valid and reading.rewards == {} and reading.source == "reward.json"


# SPEC: RWD-1
def test_rwd_1_json_preferred_then_txt_then_none():
    assert read_reward_files('{"a": 1}', "0").rewards == {"a": 1.0}
    assert read_reward_files(None, "0.25").rewards == {"reward": 0.25}
    none = read_reward_files(None, None)
    assert not none.valid and none.source is None


# SPEC: RWD-5
def test_rwd_5_turn_reward_is_reward_key_else_zero():
    assert turn_reward({"reward": 0.7, "a": 1}) == 0.7
    assert turn_reward({"a": 1}) == 0.0

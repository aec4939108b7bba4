"""Issue 16 item 1, the pure deciders: JSON types kept by the reward parser, the turn reward and the roll-up."""

from __future__ import annotations

from harbor_gym.episode._rewards import NO_REWARD_FILE_PROBLEM, parse_reward_json, read_reward_files, turn_reward
from harbor_gym.episode._rollup import ScoreKind, TurnScore, roll_up

V = ScoreKind.VERIFIED


def test_parse_keeps_json_types():
    # SPEC: RWD-3, DIFF-20
    got = parse_reward_json('{"reward": 1, "x": 0.5}')
    assert got == {"reward": 1, "x": 0.5} and type(got["reward"]) is int and type(got["x"]) is float
    assert parse_reward_json('{"reward": true}', booleans_are_numbers=True) == {"reward": 1}
    assert type(parse_reward_json('{"reward": true}', booleans_are_numbers=True)["reward"]) is int
    assert parse_reward_json('{"reward": 1e999}') is None


def test_turn_reward_types_and_missing_key():
    # SPEC: RWD-5 (issue 16: harbor semantics, no reward key = no turn reward)
    assert type(turn_reward({"reward": 1})) is int and turn_reward({"reward": 1}) == 1
    assert turn_reward({"a": 1}) == 0.0 and turn_reward({"a": 1}, harbor=True) is None


def test_missing_file_problem_names_the_paths():
    # SPEC: RWD-1 (issue 16: the message lists the paths looked at)
    reading = read_reward_files(None, None)
    assert not reading.valid and reading.source is None and reading.problem == NO_REWARD_FILE_PROBLEM
    assert "/logs/verifier/reward.json" in reading.problem and "/logs/verifier/reward.txt" in reading.problem


def test_roll_up_types():
    # SPEC: RWD-7, RWD-8 (issue 16: mean is a float; final and single-step pass the dict through)
    ints = [TurnScore(V, {"reward": 1, "n": 2}), TurnScore(V, {"reward": 1, "n": 2})]
    for harbor in (False, True):
        mean = roll_up(ints, "mean", harbor=harbor)
        assert type(mean.reward) is float and mean.reward == 1.0 and type(mean.verifier_rewards["n"]) is float
        final = roll_up(ints, "final", harbor=harbor)
        assert type(final.reward) is int and final.verifier_rewards == {"reward": 1, "n": 2}
        assert type(final.verifier_rewards["n"]) is int
        one = roll_up(ints[:1], "mean", harbor=harbor, single_step=True)
        assert type(one.reward) is int and type(one.verifier_rewards["n"]) is int
    assert roll_up([TurnScore(V, {"a": 1})], "final", harbor=True).reward is None
    assert roll_up([TurnScore(V, {"a": 1})], "final").reward == 0.0

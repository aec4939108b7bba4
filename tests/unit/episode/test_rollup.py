"""Roll-up of turns into the episode reward (SPEC RWD-6..11, DIFF-1/2/3): pure, no Docker."""

import pytest

from harbor_gym.episode._rollup import RollUp, ScoreKind, TurnScore, episode_verifier_mode, roll_up

V, N, P, M = ScoreKind.VERIFIED, ScoreKind.NO_RESULT, ScoreKind.PREP_FAILED, ScoreKind.MASKED


# SPEC: RWD-7
def test_rwd_7_mean_per_key_missing_key_is_zero():
    scores = [TurnScore(V, {"reward": 1.0, "a": 1.0}), TurnScore(V, {"reward": 0.5, "b": 1.0})]
    out = roll_up(scores, "mean")
    assert out.reward == pytest.approx(0.75)
    assert out.verifier_rewards == {"reward": 0.75, "a": 0.5, "b": 0.5}


# SPEC: RWD-7
def test_rwd_7_mean_counts_measured_zero():
    out = roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(N)], "mean")
    assert out.reward == 0.5 and out.verifier_rewards == {"reward": 0.5}


# SPEC: RWD-7
def test_rwd_7_none_strategy_is_mean():
    assert roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(V, {"reward": 0.0})], None).reward == 0.5


# SPEC: RWD-8
def test_rwd_8_final_is_last_turn_and_measured_zero_is_zero():
    assert roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(V, {"reward": 0.2, "k": 3})], "final") == RollUp(
        0.2, {"reward": 0.2, "k": 3.0})
    assert roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(N)], "final") == RollUp(0.0, {})


# SPEC: RWD-9
def test_rwd_9_masked_turn_masks_episode():
    out = roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(M)], "mean")
    assert out.masked and out.reward is None


# SPEC: RWD-11
def test_rwd_11_example_mean_and_final():
    scores = [TurnScore(V, {"reward": 0.8}), TurnScore(P)]
    assert roll_up(scores, "mean").reward == pytest.approx(0.4)
    assert roll_up(scores, "final").reward == 0.0


# SPEC: DIFF-1
def test_diff_1_harbor_leaves_failed_preparation_out():
    scores = [TurnScore(V, {"reward": 0.8}), TurnScore(P)]
    assert roll_up(scores, "mean", harbor=True).reward == pytest.approx(0.8)
    assert roll_up(scores, "mean").reward == pytest.approx(0.4)


# SPEC: DIFF-2
def test_diff_2_harbor_leaves_no_result_out_of_mean():
    scores = [TurnScore(V, {"reward": 1.0}), TurnScore(N)]
    assert roll_up(scores, "mean", harbor=True).reward == 1.0
    assert roll_up([TurnScore(N)], "mean", harbor=True).reward is None


# SPEC: DIFF-3
def test_diff_3_harbor_final_without_result_is_none():
    assert roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(N)], "final", harbor=True).reward is None
    assert roll_up([TurnScore(V, {"reward": 1.0}), TurnScore(N)], "final").reward == 0.0


# SPEC: RWD-10
def test_rwd_10_episode_verifier_mode():
    assert episode_verifier_mode([]) is None
    assert episode_verifier_mode(["shared", "shared"]) == "shared"
    assert episode_verifier_mode(["shared", "separate"]) == "mixed"

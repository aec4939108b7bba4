"""Row schema: graded episodes are rollout rows, ungraded or masked ones failure rows (STOP-5, RWD-9); seeds are
stable; the schema round-trips through JSON."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from harbor_gym.episode import EpisodeResult, TurnRecord
from harbor_gym.run import FailureRow, RolloutRow, episode_seed, rows_from_episode


def _turn(name: str, index: int, reward, *, failure=None, masked=False, valid=True) -> TurnRecord:
    return TurnRecord(task_id="t", step_name=name, index=index, instruction="do", reward=reward,
                      verifier_rewards={"reward": reward} if valid and reward is not None else {},
                      reward_valid=valid, masked=masked, verifier_mode="shared" if valid else None,
                      failure_kind=failure, min_reward_missed=False, agent_status="completed", exit_code=0,
                      output_tail="ok", log_dir="/logs/x", timings={"agent": 0.5, "turn": 1.0})


def _result(turns, *, reward, graded=True, masked=False, failure=None, retryable=False, stopped=None):
    return EpisodeResult(task_id="t", reward=reward, verifier_rewards={"reward": reward} if reward is not None else {},
                         strategy="mean", verifier_mode="shared", turns=tuple(turns), stopped_after_turn=stopped,
                         masked=masked, graded=graded, failure_kind=failure, retryable=retryable, log_dir="/logs")


KEY = dict(task_id="t", rollout=2, seed=11, agent="oracle", duration_sec=3.21)


def test_graded_episode_is_a_rollout_row_with_its_turns():
    # SPEC: GYM-8
    row = rows_from_episode(_result([_turn("a", 0, 1.0), _turn("b", 1, 0.0)], reward=0.5, stopped="b"), **KEY)
    assert isinstance(row, RolloutRow)
    assert row.reward == 0.5 and row.strategy == "mean" and row.stopped_after_turn == "b"
    assert [(t.step_name, t.reward, t.agent_exit_code) for t in row.turns] == [("a", 1.0, 0), ("b", 0.0, 0)]
    assert row.turns[0].durations_sec == {"agent": 0.5, "turn": 1.0}
    assert RolloutRow.model_validate_json(row.model_dump_json()) == row


def test_step_one_preparation_failure_is_a_failure_row():
    # SPEC: STOP-5
    turns = [_turn("a", 0, None, failure="harbor:step_setup_failed", valid=False)]
    row = rows_from_episode(_result(turns, reward=None, graded=False, failure="harbor:step_setup_failed"), **KEY)
    assert isinstance(row, FailureRow)
    assert row.failure_kind == "harbor:step_setup_failed" and not row.retryable
    assert "harbor:step_setup_failed" in row.reason and "'a'" in row.reason


def test_masked_episode_is_a_failure_row():
    # SPEC: RWD-9
    turns = [_turn("a", 0, None, masked=True, valid=False)]
    row = rows_from_episode(_result(turns, reward=None, masked=True), **KEY)
    assert isinstance(row, FailureRow) and row.masked and row.reason.startswith("masked")


def test_outage_row_is_retryable():
    # SPEC: STOP-8
    turns = [_turn("a", 0, None, failure="harbor_gym:sandbox_outage", valid=False)]
    row = rows_from_episode(_result(turns, reward=None, graded=False, failure="harbor_gym:sandbox_outage",
                                    retryable=True), **KEY)
    assert isinstance(row, FailureRow) and row.retryable


def test_rows_are_frozen_and_refuse_unknown_fields():
    row = rows_from_episode(_result([_turn("a", 0, 1.0)], reward=1.0), **KEY)
    with pytest.raises(ValidationError):
        RolloutRow.model_validate({**row.model_dump(), "extra": 1})
    with pytest.raises(ValidationError):
        row.reward = 0.0


def test_episode_seed_is_stable_and_distinct():
    assert episode_seed(0, "cake", 0) == episode_seed(0, "cake", 0)
    seeds = {episode_seed(s, t, k) for s in (0, 1) for t in ("cake", "gated-counter") for k in range(3)}
    assert len(seeds) == 12 and all(0 <= s < 2**31 for s in seeds)
    assert episode_seed(0, "cake", 0) == 403588438  # pinned: reruns on any machine get the same seeds


def test_failure_message_reaches_the_turn_row_and_the_reason():
    # SPEC: STOP-5 (the failure row names the task, the step and the cause)
    import dataclasses

    msg = "t: step a: setup.sh exited 3"
    turn = dataclasses.replace(_turn("a", 0, None, failure="harbor:step_setup_failed", valid=False),
                               failure_message=msg)
    result = dataclasses.replace(_result([turn], reward=None, graded=False, failure="harbor:step_setup_failed"),
                                 failure_message=msg)
    row = rows_from_episode(result, **KEY)
    assert isinstance(row, FailureRow) and row.turns[0].failure_message == msg
    assert "harbor:step_setup_failed" in row.reason and row.reason.endswith(msg)
    assert FailureRow.model_validate_json(row.model_dump_json()) == row
    graded = rows_from_episode(_result([_turn("a", 0, 1.0)], reward=1.0), **KEY)
    assert graded.turns[0].failure_message is None


def test_gym_12_agent_caused_outage_reaches_the_rows():
    # SPEC: GYM-12
    import dataclasses

    turn = dataclasses.replace(_turn("a", 0, None, failure="harbor_gym:sandbox_outage", valid=False),
                               reward=0.0, agent_caused=True, outage_cause="died (exit 137)")
    result = dataclasses.replace(_result([turn], reward=None, graded=False, failure="harbor_gym:sandbox_outage",
                                         retryable=True), agent_caused=True, outage_cause="died (exit 137)")
    row = rows_from_episode(result, **KEY)
    assert isinstance(row, FailureRow) and row.agent_caused and row.outage_cause == "died (exit 137)"
    assert row.retryable and row.schema_version == 2
    assert row.turns[0].agent_caused and row.turns[0].outage_cause == "died (exit 137)"
    assert FailureRow.model_validate_json(row.model_dump_json()) == row

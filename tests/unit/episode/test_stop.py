"""min_reward and stop deciders (SPEC STOP-1..9, BUD-8, DIFF-4): pure, no Docker."""

import pytest

from harbor_gym.episode._stop import TurnFault, decide_turn, min_reward_missed


# SPEC: STOP-2
def test_stop_2_number_gates_reward_key():
    assert not min_reward_missed({"reward": 0.5}, 0.5)
    assert min_reward_missed({"reward": 0.4}, 0.5)
    assert min_reward_missed({"a": 1.0, "b": 1.0}, 0.1)  # component keys only can never pass


# SPEC: STOP-3
def test_stop_3_table_gates_each_named_key():
    assert not min_reward_missed({"a": 1.0, "b": 0.5}, {"a": 1.0, "b": 0.5})
    assert min_reward_missed({"a": 1.0}, {"a": 1.0, "b": 0.0})
    assert min_reward_missed({"a": 0.9, "b": 1.0}, {"a": 1.0})


def test_min_reward_none_never_missed():
    assert not min_reward_missed({}, None)


# SPEC: STOP-1
@pytest.mark.parametrize("fault", [TurnFault.MASKED, TurnFault.NO_REWARD, TurnFault.MIN_REWARD])
def test_stop_1_graded_stops_terminate(fault):
    v = decide_turn(fault, is_first=False, is_last=False)
    assert v.ends and v.terminated and not v.truncated and v.graded


def test_stop_1_clean_turn_continues_until_last():
    assert not decide_turn(TurnFault.NONE, is_first=True, is_last=False).ends
    v = decide_turn(TurnFault.NONE, is_first=False, is_last=True)
    assert v.ends and v.terminated


# SPEC: STOP-5
def test_stop_5_step_1_preparation_failure_is_terminal_ungraded():
    v = decide_turn(TurnFault.PREP_FAILED, is_first=True, is_last=False, prep_kind="harbor:step_setup_failed")
    assert v.terminated and not v.graded and not v.retryable and v.failure_kind == "harbor:step_setup_failed"


# SPEC: DIFF-4
def test_diff_4_harbor_step_1_preparation_failure_retryable():
    v = decide_turn(TurnFault.PREP_FAILED, is_first=True, is_last=False, prep_kind="k", harbor=True)
    assert v.retryable and not v.graded


# SPEC: RWD-6
def test_rwd_6_later_preparation_failure_is_graded():
    v = decide_turn(TurnFault.PREP_FAILED, is_first=False, is_last=False, prep_kind="harbor:step_workdir_failed")
    assert v.ends and v.graded and v.failure_kind == "harbor:step_workdir_failed"


# SPEC: STOP-6
def test_stop_6_agent_retry_and_fail():
    r = decide_turn(TurnFault.AGENT_RETRY, is_first=True, is_last=False)
    f = decide_turn(TurnFault.AGENT_FAIL, is_first=True, is_last=False)
    assert (r.graded, r.retryable, r.failure_kind) == (False, True, "harbor_gym:agent_retry")
    assert (f.graded, f.retryable, f.failure_kind) == (False, False, "harbor_gym:agent_failed")


# SPEC: STOP-8
def test_stop_8_outage_truncates_retryable():
    v = decide_turn(TurnFault.OUTAGE, is_first=False, is_last=True)
    assert v.truncated and not v.terminated and v.retryable and v.failure_kind == "harbor_gym:sandbox_outage"


# SPEC: BUD-8
def test_bud_8_deadline_kinds():
    assert decide_turn(TurnFault.DEADLINE, is_first=True, is_last=False).failure_kind == "harbor:task_deadline"
    v = decide_turn(TurnFault.DEADLINE, is_first=True, is_last=False, deadline_enforced=False)
    assert v.failure_kind == "Episode timed out" and v.truncated and v.retryable


# SPEC: STOP-7
def test_stop_7_precedence_order():
    order = list(TurnFault)
    assert order.index(TurnFault.OUTAGE) < order.index(TurnFault.AGENT_RETRY) < order.index(TurnFault.MASKED)
    assert order.index(TurnFault.MASKED) < order.index(TurnFault.NO_REWARD) < order.index(TurnFault.MIN_REWARD)

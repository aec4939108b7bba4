"""`summarize`: per-task episodes, mean reward, per-step pass rate, early stops, failure kinds."""

from __future__ import annotations

from harbor_gym.run import summarize


def _turn(name, index, reward, failure=None):
    return {"step_name": name, "index": index, "reward": reward, "failure_kind": failure}


def test_summary_per_task():
    rollouts = [
        {"task_id": "b", "reward": 1.0, "stopped_after_turn": None, "turns": [_turn("s1", 0, 1.0), _turn("s2", 1, 1.0)]},
        {"task_id": "b", "reward": 0.5, "stopped_after_turn": "s2",
         "turns": [_turn("s1", 0, 1.0), _turn("s2", 1, 0.0, "harbor:step_setup_failed")]},
        {"task_id": "a", "reward": 0.0, "stopped_after_turn": None, "turns": [_turn("x", 0, 0.0)]},
    ]
    failures = [{"task_id": "b", "failure_kind": "harbor_gym:sandbox_outage"}]
    a, b = summarize(rollouts, failures)
    assert (a.task_id, a.episodes, a.graded, a.mean_reward, a.failed) == ("a", 1, 1, 0.0, 0)
    assert (b.episodes, b.graded, b.failed, b.mean_reward, b.early_stops) == (3, 2, 1, 0.75, 1)
    assert b.step_pass == {"s1": [2, 2], "s2": [1, 2]}
    assert b.step_pass_text() == "s1 2/2, s2 1/2"
    assert dict(b.failure_kinds) == {"harbor:step_setup_failed": 1, "harbor_gym:sandbox_outage": 1}


def test_gym_12_all_rollouts_mean_counts_failures_as_zero_and_agent_outages():
    # SPEC: GYM-12
    rollouts = [{"task_id": "t", "reward": 1.0, "turns": []}, {"task_id": "t", "reward": 1.0, "turns": []},
                {"task_id": "t", "reward": 0.0, "turns": []}]
    failures = [{"task_id": "t", "failure_kind": "harbor_gym:sandbox_outage", "agent_caused": True},
                {"task_id": "t", "failure_kind": "harbor_gym:sandbox_outage", "agent_caused": False}]
    (s,) = summarize(rollouts, failures)
    assert s.mean_reward == 2 / 3 and s.mean_reward_all == 2 / 5
    assert (s.episodes, s.graded, s.failed, s.agent_outages) == (5, 3, 2, 1)

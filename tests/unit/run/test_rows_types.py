"""Issue 16: reward values keep their JSON type in rows (an int stays an int through a JSON round trip), and rows
record the backend used."""

from __future__ import annotations

import json

from harbor_gym.config import EnvConfig
from harbor_gym.episode import EpisodeResult, TurnRecord
from harbor_gym.run import FailureRow, RolloutRow, rows_from_episode
from harbor_gym.run.runner import _Runner


def _turn(reward, rewards) -> TurnRecord:
    return TurnRecord(task_id="t", step_name="s1", index=0, instruction="do", reward=reward, verifier_rewards=rewards,
                      reward_valid=True, masked=False, verifier_mode="shared", failure_kind=None,
                      min_reward_missed=False, agent_status="completed", exit_code=0, output_tail="ok")


def _result(reward, rewards, *, graded=True) -> EpisodeResult:
    return EpisodeResult(task_id="t", reward=reward, verifier_rewards=rewards, strategy="final",
                         verifier_mode="shared", turns=(_turn(reward, rewards),), stopped_after_turn=None,
                         masked=False, graded=graded, failure_kind=None, retryable=False)


KEY = dict(task_id="t", rollout=0, seed=1, agent="oracle", duration_sec=1.0)


def test_int_rewards_stay_ints_through_json():
    # SPEC: RWD-3, RWD-8 (issue 16: "that object"; final passes ints through)
    row = rows_from_episode(_result(1, {"reward": 1, "x": 0.5}), **KEY)
    assert isinstance(row, RolloutRow) and type(row.reward) is int and type(row.verifier_rewards["reward"]) is int
    data = json.loads(row.model_dump_json())
    assert type(data["reward"]) is int and type(data["turns"][0]["reward"]) is int
    back = RolloutRow.model_validate_json(row.model_dump_json())
    assert type(back.reward) is int and type(back.verifier_rewards["x"]) is float and back == row


def test_turn_without_reward_key_keeps_none():
    # SPEC: RWD-5 (issue 16: Harbor semantics, a valid file without reward has no turn reward)
    row = rows_from_episode(_result(None, {"a": 1}), **KEY)
    assert isinstance(row, FailureRow) and row.turns[0].reward is None and row.turns[0].verifier_rewards == {"a": 1}


def test_rows_record_the_backend():
    # SPEC: GYM-8 (issue 16 item 5: the backend used is recorded in the rows)
    row = rows_from_episode(_result(1, {"reward": 1}), backend="local", **KEY)
    assert row.backend == "local" and json.loads(row.model_dump_json())["backend"] == "local"
    assert rows_from_episode(_result(1, {"reward": 1}), **KEY).backend is None


def test_runner_backend_is_the_decided_one():
    # SPEC: GYM-8 (issue 16 item 5: the CLI's auto fallback decides the backend before the run)
    class _Opts:
        def __init__(self, backend):
            self.config = EnvConfig(backend=backend)

    from harbor_gym.sandbox import choose_backend

    # auto is recorded as the process decides it for its sandboxes (docker when an engine answers, else local)
    for backend, want in (("docker", "docker"), ("local", "local"), ("auto", choose_backend("auto"))):
        runner = _Runner.__new__(_Runner)
        runner.opts = _Opts(backend)
        assert runner._backend() == want

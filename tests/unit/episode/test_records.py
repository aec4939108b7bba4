"""TurnRecord / EpisodeResult (SPEC GYM-8): frozen, picklable, JSON-able, exactly the announced fields."""

import dataclasses
import json
import pickle

import pytest

from harbor_gym.episode import EpisodeResult, ManifestEntry, TurnRecord, TurnResult


def _record():
    return TurnRecord(task_id="t", step_name="s", index=0, instruction="i", reward=1.0, verifier_rewards={"reward": 1.0},
                      reward_valid=True, masked=False, verifier_mode="shared", failure_kind=None,
                      min_reward_missed=False, agent_status="completed", exit_code=0, output_tail="",
                      manifest=(ManifestEntry("/logs/artifacts", "logs/artifacts", "directory", "empty",
                                              origin="convention"),), timings={"agent": 0.1})


# SPEC: GYM-8
def test_gym_8_record_fields():
    gym8 = {"step_name", "index", "reward", "verifier_rewards", "reward_valid", "masked", "verifier_mode",
            "failure_kind", "min_reward_missed", "agent_status", "exit_code", "output_tail", "manifest", "log_dir",
            "timings"}
    gym11_13 = {"outcome", "model_calls", "trainable", "agent_caused", "outage_cause", "freeze_exempt",
                "model_calls_refused"}  # issue 18
    assert {f.name for f in dataclasses.fields(TurnRecord)} == gym8 | gym11_13 | {"task_id", "instruction",
                                                                                  "mask_reason", "failure_message"}
    ep = {"reward", "verifier_rewards", "strategy", "verifier_mode", "turns", "stopped_after_turn", "masked",
          "graded", "failure_kind", "retryable", "response"}
    assert {f.name for f in dataclasses.fields(EpisodeResult)} == ep | {"task_id", "log_dir", "timings",
                                                                        "failure_message", "agent_caused",
                                                                        "outage_cause"}


# SPEC: GYM-8
def test_gym_8_frozen_picklable_jsonable():
    rec = _record()
    res = EpisodeResult(task_id="t", reward=1.0, verifier_rewards={"reward": 1.0}, strategy="mean",
                        verifier_mode="shared", turns=(rec,), stopped_after_turn=None, masked=False, graded=True,
                        failure_kind=None, retryable=False)
    with pytest.raises(dataclasses.FrozenInstanceError):
        rec.reward = 0.0
    assert pickle.loads(pickle.dumps(res)) == res
    data = json.loads(json.dumps(TurnResult(rec, True, False, res).to_dict()))
    assert data["episode"]["turns"][0]["manifest"][0]["origin"] == "convention"


# SPEC: STOP-8 (the cause reaches the user)
def test_failure_message_defaults_none_and_round_trips():
    assert _record().failure_message is None
    msg = "t: step s: sandbox hg-t-1a2b3c died: gone"
    rec = dataclasses.replace(_record(), failure_kind="harbor_gym:sandbox_outage", failure_message=msg)
    res = EpisodeResult(task_id="t", reward=None, verifier_rewards={}, strategy="mean", verifier_mode=None,
                        turns=(rec,), stopped_after_turn=None, masked=False, graded=False,
                        failure_kind="harbor_gym:sandbox_outage", retryable=True, failure_message=msg)
    assert pickle.loads(pickle.dumps(res)) == res
    data = json.loads(json.dumps(res.to_dict()))
    assert data["failure_message"] == msg and data["turns"][0]["failure_message"] == msg

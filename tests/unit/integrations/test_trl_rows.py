"""The TRL adapter's pure parts: rows from training records, prompt -> task routing, sampling parameters.

SPEC: GYM-13 (exact tokens; untrainable episodes marked, not faked).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from harbor_gym.integrations.trl import _prompt_task, episode_reward, rows, sampling_params
from harbor_gym.training import episode_samples, rollout_samples

from tests.unit.training.test_record import _call, _episode, _extending_episode, _turn


def test_rows_carry_exact_tokens_env_mask_and_reward():
    out = rows([episode_samples(_extending_episode())], placeholder_id=0)
    assert out["prompt_ids"] == [[1, 2, 3]]
    assert out["completion_ids"] == [[4, 5, 7, 8, 6, 9, 10, 11]]
    assert out["env_mask"] == [[1, 1, 0, 0, 1, 0, 1, 1]]
    assert out["episode_reward"] == [0.5]
    assert episode_reward(completions=[None], episode_reward=out["episode_reward"]) == [0.5]


def test_untrainable_and_empty_episodes_train_nothing_and_have_no_reward():
    masked = _episode([_turn(0, [_call([1], [2])], reward=None, masked=True)], reward=None, graded=False,
                      masked=True, failure_kind="harbor_gym:sandbox_outage")
    never = rollout_samples(SimpleNamespace(task_id="t", episode=None, failure_kind="harbor_gym:seed_failed"))
    out = rows([episode_samples(masked), never], placeholder_id=7)
    assert out["env_mask"] == [[0], [0]] and out["episode_reward"] == [None, None]
    assert out["prompt_ids"][1] == [7] and out["harbor_failure_kind"][1] == "harbor_gym:seed_failed"


def test_prompt_names_its_task_by_last_message():
    folders = {"a": "/x/a", "b": "/x/b"}
    assert _prompt_task([{"role": "user", "content": "b"}], folders) == "b"
    assert _prompt_task([{"role": "user", "content": "anything"}], {"a": "/x/a"}) == "a"
    with pytest.raises(ValueError, match="not among"):
        _prompt_task([{"role": "user", "content": "c"}], folders)


def test_sampling_params_from_trainer_args():
    trainer = SimpleNamespace(args=SimpleNamespace(temperature=0.7, top_p=0.9, max_completion_length=64))
    assert sampling_params(trainer) == {"temperature": 0.7, "top_p": 0.9, "max_tokens": 64}

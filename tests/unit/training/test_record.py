"""The neutral training record (harbor_gym.training) on synthetic EpisodeResults built from the real dataclasses.

SPEC: GYM-13 (exact tokens, no re-tokenising, trainable marking), GYM-12 (agent-caused outages train as 0.0).
"""

from __future__ import annotations

import pickle

import pytest

from harbor_gym.agents import ModelCall
from harbor_gym.episode import EpisodeResult, TurnRecord
from harbor_gym.training import (
    LayoutError,
    episode_samples,
    episode_trainable,
    rollout_samples,
    token_rewards,
)


def _call(prompt, completion, logprobs=None, **kw) -> ModelCall:
    if logprobs is None and completion is not None:
        logprobs = [-0.1 * (i + 1) for i in range(len(completion))]
    return ModelCall(prompt_token_ids=prompt, completion_token_ids=completion, logprobs=logprobs, **kw)


def _turn(index, calls, reward=1.0, masked=False, step=None, **kw) -> TurnRecord:
    return TurnRecord(task_id="t", step_name=step or f"step{index}", index=index, instruction="i", reward=reward,
                      verifier_rewards={}, reward_valid=reward is not None, masked=masked, verifier_mode="shared",
                      failure_kind=kw.pop("failure_kind", None), min_reward_missed=False, agent_status="completed",
                      exit_code=0, output_tail="", model_calls=tuple(calls), **kw)


def _episode(turns, reward=0.5, graded=True, masked=False, failure_kind=None, agent_caused=False) -> EpisodeResult:
    return EpisodeResult(task_id="t", reward=reward, verifier_rewards={}, strategy="mean", verifier_mode="shared",
                         turns=tuple(turns), stopped_after_turn=None, masked=masked, graded=graded,
                         failure_kind=failure_kind, retryable=False, agent_caused=agent_caused)


def _extending_episode() -> EpisodeResult:
    # turn 0: two calls, the second's prompt = first prompt + completion + tool output [7, 8]
    # turn 1: one call extending again with the next instruction [9]
    c0 = _call([1, 2, 3], [4, 5])
    c1 = _call([1, 2, 3, 4, 5, 7, 8], [6])
    c2 = _call([1, 2, 3, 4, 5, 7, 8, 6, 9], [10, 11])
    return _episode([_turn(0, [c0, c1], reward=0.0), _turn(1, [c2], reward=1.0)])


def test_extending_episode_is_one_sample_with_exact_tokens_mask_and_logprobs():
    """GYM-13: one sample per episode when every prompt extends the sequence; tool output and markup mask 0."""
    out = episode_samples(_extending_episode())
    assert out.layout == "episode" and len(out.samples) == 1
    s = out.samples[0]
    assert s.prompt_ids == (1, 2, 3)
    assert s.completion_ids == (4, 5, 7, 8, 6, 9, 10, 11)
    assert s.loss_mask == (1, 1, 0, 0, 1, 0, 1, 1)
    assert s.logprobs == pytest.approx((-0.1, -0.2, 0.0, 0.0, -0.1, 0.0, -0.1, -0.2))
    assert s.reward == 0.5 and s.trainable and s.graded and s.failure_kind is None
    assert s.step_names == ("step0", "step1")
    assert [(c.turn, c.call) for c in s.calls] == [(0, 0), (0, 1), (1, 0)]


def test_each_turn_reward_has_its_token_span():
    """Per-turn rewards carry the completion span their calls produced, so step rewards land on the right tokens."""
    s = episode_samples(_extending_episode()).samples[0]
    assert [(t.step_name, t.reward, t.start, t.end) for t in s.turns] == [("step0", 0.0, 0, 5), ("step1", 1.0, 5, 8)]
    assert token_rewards(s) == [0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 1.0]
    # turn 0's reward (0.0) sits on its last sampled token, index 4
    s2 = episode_samples(_episode([_turn(0, [_call([1], [2])], reward=0.25),
                                   _turn(1, [_call([1, 2, 3], [4])], reward=0.75)])).samples[0]
    assert token_rewards(s2) == [0.25, 0.0, 0.75]


def test_non_extending_prompt_gives_step_wise_samples_and_drops_no_token():
    """A re-rendered history (prompt does not extend) gives one sample per call under auto; every token kept."""
    c0 = _call([1, 2], [3])
    c1 = _call([1, 99, 2, 3, 5], [6, 7])  # the template re-rendered the history
    ep = _episode([_turn(0, [c0]), _turn(1, [c1], reward=0.0)])
    out = episode_samples(ep)
    assert out.layout == "call" and [s.index for s in out.samples] == [0, 1]
    assert all(s.count == 2 for s in out.samples)
    assert [(s.prompt_ids, s.completion_ids, s.loss_mask) for s in out.samples] == [
        ((1, 2), (3,), (1,)), ((1, 99, 2, 3, 5), (6, 7), (1, 1))]
    assert [t.start for t in out.samples[1].turns] == [None, 0]
    with pytest.raises(LayoutError, match=r"call 0 of step 'step1'.*layout='call'"):
        episode_samples(ep, layout="episode")


def test_turn_layout_one_sample_per_turn_and_refuses_a_split_turn():
    ep = _extending_episode()
    out = episode_samples(ep, layout="turn")
    assert [(s.prompt_ids, s.completion_ids, s.step_names) for s in out.samples] == [
        ((1, 2, 3), (4, 5, 7, 8, 6), ("step0",)), ((1, 2, 3, 4, 5, 7, 8, 6, 9), (10, 11), ("step1",))]
    split = _episode([_turn(0, [_call([1], [2]), _call([5], [6])])])
    with pytest.raises(LayoutError, match="step 'step0'"):
        episode_samples(split, layout="turn")
    assert len(episode_samples(split, layout="call").samples) == 2


def test_calls_without_tokens_are_listed_not_guessed():
    """GYM-13: a call the server gave no token ids for is in no sample and is named in untokenised_calls."""
    ep = _episode([_turn(0, [_call([1], [2]), ModelCall(response_text="hi"), _call([1, 2, 3], [4])])])
    out = episode_samples(ep)
    assert [(c.turn, c.call) for c in out.untokenised_calls] == [(0, 1)]
    assert out.samples[0].completion_ids == (2, 3, 4)


def test_missing_logprobs_make_the_sample_logprobs_none():
    ep = _episode([_turn(0, [ModelCall(prompt_token_ids=[1], completion_token_ids=[2], logprobs=[-1.0]),
                             ModelCall(prompt_token_ids=[1, 2], completion_token_ids=[3])])])
    assert episode_samples(ep).samples[0].logprobs is None


def test_ungraded_and_masked_episodes_are_marked_not_faked():
    """GYM-13: an ungraded/masked episode keeps reward None and trainable False; an agent-caused outage trains."""
    masked = _episode([_turn(0, [_call([1], [2])], reward=None, masked=True)], reward=None, graded=False,
                      masked=True, failure_kind="harbor_gym:sandbox_outage")
    out = episode_samples(masked)
    assert out.reward is None and not out.trainable and not out.graded
    s = out.samples[0]
    assert s.reward is None and not s.trainable and s.failure_kind == "harbor_gym:sandbox_outage"
    assert not s.turns[0].trainable
    caused = _episode([_turn(0, [_call([1], [2])], reward=0.0, agent_caused=True)], reward=0.0, graded=False,
                      failure_kind="harbor_gym:sandbox_outage", agent_caused=True)
    assert episode_trainable(caused) and episode_samples(caused).samples[0].trainable


def test_rollout_that_never_ran_has_no_samples():
    class Rollout:
        task_id, episode, failure_kind = "t", None, "harbor_gym:seed_failed"

    out = rollout_samples(Rollout())
    assert out.samples == () and not out.trainable and out.failure_kind == "harbor_gym:seed_failed"


def test_records_rebuilt_from_dicts_and_samples_pickle():
    """Records that crossed a process as dicts give the same samples; samples are plain picklable data."""
    ep = _extending_episode()
    rebuilt = _episode([TurnRecord(**t.to_dict()) for t in ep.turns])
    assert episode_samples(rebuilt) == episode_samples(ep)
    out = episode_samples(ep)
    assert pickle.loads(pickle.dumps(out)) == out


def test_unknown_layout_is_refused():
    with pytest.raises(ValueError, match="layout must be one of"):
        episode_samples(_extending_episode(), layout="rows")

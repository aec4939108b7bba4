"""The data plane's pure parts (SPEC GYM-13): ModelCall round trips, request deltas, token segments, the wire
parsing of vLLM's shapes, per-call seeds and the refused-option detection."""

from __future__ import annotations

import json
import pickle

import pytest

from harbor_gym.agents import AgentOutcome, ModelCall, TokenSegment, full_requests, token_segments
from harbor_gym.agents._chat_wire import call_seed, named_options, parse_response
from harbor_gym.agents._model_calls import message_delta
from harbor_gym.episode import TurnRecord


def call(prompt, completion, logprobs=None, **kw):
    return ModelCall(prompt_token_ids=prompt, completion_token_ids=completion,
                     logprobs=logprobs if logprobs is not None else [-0.5] * len(completion), **kw)


def test_segments_mask_is_one_exactly_on_completion_tokens():
    # SPEC: GYM-13 — a consistent conversation is one segment; prompt/tool tokens 0, completion tokens 1.
    calls = [call([1, 2, 3], [4, 5], [-0.1, -0.2]), call([1, 2, 3, 4, 5, 6, 7], [8], [-0.3])]
    [seg] = token_segments(calls)
    assert seg.token_ids == (1, 2, 3, 4, 5, 6, 7, 8)
    assert seg.loss_mask == (0, 0, 0, 1, 1, 0, 0, 1)
    assert seg.logprobs == (0.0, 0.0, 0.0, -0.1, -0.2, 0.0, 0.0, -0.3)
    assert seg.calls == (0, 1)


def test_an_inconsistent_prefix_starts_a_new_segment_never_splices():
    # SPEC: GYM-13 — the second prompt re-renders history (5 became 9): a new segment holding that call whole.
    calls = [call([1, 2, 3], [4, 5]), call([1, 2, 3, 4, 9, 6], [7]), call([1, 2, 3, 4, 9, 6, 7, 0], [8])]
    first, second = token_segments(calls)
    assert first.token_ids == (1, 2, 3, 4, 5) and first.loss_mask == (0, 0, 0, 1, 1)
    assert second.token_ids == (1, 2, 3, 4, 9, 6, 7, 0, 8)
    assert second.loss_mask == (0, 0, 0, 0, 0, 0, 1, 0, 1)
    assert second.calls == (1, 2)


def test_calls_without_tokens_are_skipped_and_break_the_segment():
    # SPEC: GYM-13 — no token ids: nothing is re-tokenised; the next call starts a new segment.
    calls = [call([1], [2]), ModelCall(response_text="x"), call([1, 2, 3], [4])]
    segs = token_segments(calls)
    assert [s.calls for s in segs] == [(0,), (2,)]
    no_logprobs = ModelCall(prompt_token_ids=[1], completion_token_ids=[2])
    assert token_segments([no_logprobs])[0].logprobs is None
    assert token_segments([ModelCall()]) == []


def test_request_deltas_rebuild_the_full_requests():
    # SPEC: GYM-13 — request_messages stored as a delta against the previous call; full_requests rebuilds them.
    sys_, user = {"role": "system", "content": "s"}, {"role": "user", "content": "u"}
    a1 = {"role": "assistant", "content": None, "tool_calls": [{"id": "c"}]}
    tool = {"role": "tool", "tool_call_id": "c", "content": "out"}
    r1, r2 = [sys_, user], [sys_, user, a1, tool]
    off1, d1 = message_delta(None, r1)
    off2, d2 = message_delta(r1, r2)
    assert (off1, d1) == (0, r1) and (off2, d2) == (2, [a1, tool])
    calls = [ModelCall(request_messages=d1, messages_offset=off1), ModelCall(request_messages=d2,
                                                                             messages_offset=off2)]
    assert full_requests(calls) == [r1, r2]
    assert full_requests([c.to_dict() for c in calls]) == [r1, r2]
    with pytest.raises(ValueError):
        full_requests([ModelCall(request_messages=d2, messages_offset=2)])


def test_model_calls_and_outcomes_round_trip_through_pickle_and_json():
    # SPEC: GYM-13 — plain picklable data; to_dict/from_dict give equal records (the Ray path).
    c = call([1, 2], [3], [-0.25], seed=5, usage={"completion_tokens": 1}, tool_calls=[{"id": "x", "name": "bash",
                                                                                        "arguments": "{}"}])
    assert pickle.loads(pickle.dumps(c)) == c
    assert ModelCall.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    o = AgentOutcome(status="completed", response="r", trajectory=[{"source": "agent", "message": "m"}],
                     metadata={"k": 1}, model_calls=[c])
    assert AgentOutcome.from_dict(json.loads(json.dumps(o.to_dict()))) == o


def record(**kw):
    base = dict(task_id="t", step_name="s", index=0, instruction="i", reward=0.0, verifier_rewards={},
                reward_valid=True, masked=False, verifier_mode="shared", failure_kind=None, min_reward_missed=False,
                agent_status="completed", exit_code=0, output_tail="")
    return TurnRecord(**{**base, **kw})


def test_trainable_is_false_for_masked_ungraded_and_outage_turns():
    # SPEC: GYM-13 — measured turns (0.0 included) train; masked, ungraded (no reward) and outages do not.
    assert record(reward=0.0).trainable is True
    assert record(reward=None, masked=True).trainable is False
    assert record(reward=None, failure_kind="harbor_gym:sandbox_outage").trainable is False
    assert record(reward=None, failure_kind="harbor_gym:agent_retry").trainable is False


def test_parse_accepts_both_token_id_shapes():
    # SPEC: GYM-13 — vLLM's return_token_ids (top-level prompt ids, choices[].token_ids) and "token_id:N" tokens.
    lp = {"content": [{"token": "token_id:11", "logprob": -0.5}, {"token": "token_id:12", "logprob": -1.25}]}
    msg = {"role": "assistant", "content": "hi"}
    a = parse_response({"choices": [{"message": msg, "logprobs": lp, "finish_reason": "stop"}]})
    assert a.completion_token_ids == [11, 12] and a.logprobs == [-0.5, -1.25] and a.prompt_token_ids is None
    b = parse_response({"prompt_token_ids": [1, 2], "choices": [{"message": msg, "token_ids": [7, 8],
                                                                 "logprobs": lp}]})
    assert b.prompt_token_ids == [1, 2] and b.completion_token_ids == [7, 8]
    c = parse_response({"choices": [{"message": msg, "logprobs": {"content": [{"token": "hi", "logprob": -1}]}}]})
    assert c.completion_token_ids is None and c.logprobs == [-1.0]  # text tokens: never re-tokenised
    d = parse_response({"choices": [{"message": {"role": "assistant", "content": None, "tool_calls": [
        {"id": "x", "type": "function", "function": {"name": "bash", "arguments": "{\"command\": \"ls\"}"}}]}}]})
    assert d.tool_calls == ({"id": "x", "name": "bash", "arguments": "{\"command\": \"ls\"}"},)
    assert d.logprobs is None and d.usage is None
    with pytest.raises(ValueError):
        parse_response({"choices": []})


def test_per_call_seeds_are_stable_and_distinct():
    # SPEC: GYM-13 — same inputs, same seed; rollouts, turns and calls differ; no base seed, no seed.
    assert call_seed(7, 0, 0, 0) == call_seed(7, 0, 0, 0)
    seeds = {call_seed(7, k, t, c) for k in range(4) for t in range(2) for c in range(3)}
    assert len(seeds) == 24 and all(0 <= s < 2**31 for s in seeds)
    assert call_seed(None, 0, 0, 0) is None


def test_a_400_names_the_refused_options():
    sent = {"logprobs", "return_token_ids", "return_tokens_as_token_ids"}
    assert named_options("Unsupported parameter: 'logprobs'", sent) == {"logprobs", "return_tokens_as_token_ids"}
    assert named_options("unknown field return_token_ids", sent) == {"return_token_ids"}
    assert named_options("top_logprobs must be <= 20", sent) == set()
    assert named_options("context length exceeded", sent) == set()


def test_token_segment_is_frozen():
    seg = TokenSegment((1,), (1,), (0.0,), (0,))
    with pytest.raises(Exception):
        seg.token_ids = ()  # type: ignore[misc]


def test_parse_stream_joins_chunks_with_their_token_data():
    # SPEC: GYM-13 — streamed chunks: prompt ids of the first chunk, token_ids and logprobs concatenated, tool-call
    # argument pieces joined, usage from the last chunk.
    from harbor_gym.agents._chat_wire import parse_stream

    chunks = [
        {"prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "id": "c1", "type": "function",
                                                             "function": {"name": "bash", "arguments": "{\"com"}}]},
                      "token_ids": [7, 8], "logprobs": {"content": [{"token": "a", "logprob": -0.5},
                                                                    {"token": "b", "logprob": -0.25}]}}]},
        {"choices": [{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": "mand\": \"ls\"}"}}]},
                      "token_ids": [9], "logprobs": {"content": [{"token": "c", "logprob": -2.0}]}}]},
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 3}},
    ]
    parsed = parse_stream(chunks)
    assert parsed.prompt_token_ids == [1, 2, 3] and parsed.completion_token_ids == [7, 8, 9]
    assert parsed.logprobs == [-0.5, -0.25, -2.0]
    assert parsed.tool_calls == ({"id": "c1", "name": "bash", "arguments": "{\"command\": \"ls\"}"},)
    assert parsed.finish_reason == "tool_calls" and parsed.usage["completion_tokens"] == 3
    ids_only = parse_stream([{"choices": [{"index": 0, "delta": {"content": "hi"},
                                           "logprobs": {"content": [{"token": "token_id:42", "logprob": -1.0}]}}]}])
    assert ids_only.completion_token_ids == [42] and ids_only.text == "hi"
    with pytest.raises(ValueError):
        parse_stream([{"choices": []}])

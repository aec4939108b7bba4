"""The capture proxy's pure parts: request rewrites and token options, stripping what the harness did not ask for,
the settings models, and the session's windows (issue 18 item 1; SPEC GYM-10, GYM-13)."""

from __future__ import annotations

import pickle

import pytest
from pydantic import ValidationError

from harbor_gym.agents import ModelCall
from harbor_gym.proxy import ModelUpstream, ProxyLimits, ProxyStateError
from harbor_gym.proxy._openai import BadRequest, prepare_request, strip_chunk, strip_response
from harbor_gym.proxy._session import ProxySession

MSGS = [{"role": "user", "content": "x"}]


def test_request_rewrites_and_token_options():
    body = {"model": "h", "messages": MSGS, "temperature": 1.0, "stream": True}
    sent, asked, added = prepare_request(body, model="forced", extra_body={"top_k": 5}, refused=frozenset())
    assert (sent["model"], sent["top_k"], sent["temperature"]) == ("forced", 5, 1.0)
    assert sent["logprobs"] is sent["return_token_ids"] is sent["return_tokens_as_token_ids"] is True
    assert sent["stream_options"] == {"include_usage": True}
    assert added == {"logprobs", "return_token_ids", "return_tokens_as_token_ids"} and not asked.usage
    assert body == {"model": "h", "messages": MSGS, "temperature": 1.0, "stream": True}  # not changed in place
    # options refused before are left out; logprobs asked by the harness: no token_id:N tokens
    sent, asked, added = prepare_request({"messages": MSGS, "logprobs": True}, model=None, extra_body={},
                                         refused=frozenset({"return_token_ids"}))
    assert "return_token_ids" not in sent and "return_tokens_as_token_ids" not in sent
    assert asked.logprobs and added == set()


@pytest.mark.parametrize("body", [[], {"messages": "x"}, {"messages": MSGS, "n": 2}])
def test_requests_the_proxy_cannot_record_are_refused(body):
    with pytest.raises(BadRequest):
        prepare_request(body, model=None, extra_body={}, refused=frozenset())


def test_strip_only_what_was_not_asked():
    _, nothing, _ = prepare_request({"messages": MSGS}, model=None, extra_body={}, refused=frozenset())
    data = {"prompt_token_ids": [1], "choices": [{"message": {"content": "a"}, "token_ids": [2],
                                                  "logprobs": {"content": [{"token": "token_id:2", "logprob": -1}]}}]}
    out = strip_response(data, nothing)
    assert out == {"choices": [{"message": {"content": "a"}, "logprobs": None}]}
    assert data["prompt_token_ids"] == [1]  # the record's copy is intact
    _, asked, _ = prepare_request({"messages": MSGS, "logprobs": True, "return_token_ids": True}, model=None,
                                  extra_body={}, refused=frozenset())
    assert strip_response(data, asked) == data
    assert strip_chunk({"choices": [], "usage": {"total_tokens": 3}}, nothing) is None
    chunk = {"prompt_token_ids": [1], "usage": None, "choices": [{"delta": {"content": "a"}, "token_ids": [2]}]}
    assert strip_chunk(chunk, nothing) == {"choices": [{"delta": {"content": "a"}}]}


def test_upstream_settings_are_checked():
    up = ModelUpstream(base_url="http://127.0.0.1:8000/v1/", model="p")
    assert up.base_url == "http://127.0.0.1:8000/v1" and up.api_key_env == "OPENAI_API_KEY"
    for bad in ({"base_url": "ftp://h/v1"}, {"base_url": "http://u:pw@h/v1"}, {"base_url": "http://h/v1?key=1"},
                {"base_url": "http://h/v1", "api_key_env": "sk-abc def"},
                {"base_url": "http://h/v1", "extra_body": {"messages": []}}):
        with pytest.raises(ValidationError):
            ModelUpstream(**bad)
    with pytest.raises(ValueError, match="max_request_bytes"):
        ProxyLimits(max_request_bytes=0)


def test_model_call_status_fields_default_for_old_records():
    # SPEC: GYM-13: records written before status/stream/api/error existed read back with their defaults.
    old = {"request_messages": MSGS, "response_text": "a"}
    call = ModelCall.from_dict(old)
    assert (call.status, call.stream, call.api, call.error) == ("ok", False, "openai", None)
    new = ModelCall(status="cancelled", stream=True, api="anthropic", error="cut")
    assert ModelCall.from_dict(new.to_dict()) == new
    with pytest.raises(ValueError, match="status"):
        ModelCall(status="maybe")


def _session(**limits) -> ProxySession:
    return ProxySession(port=9, label="t", limits=ProxyLimits(**limits), schedule_cancel=lambda calls: None,
                        on_close=lambda s: None)


def test_windows_admit_count_and_record_deltas():
    s = _session(max_calls_per_activation=2)
    assert s._admit() == ("outside", None) and s.refused_outside == 1
    with pytest.raises(ProxyStateError):
        s.end_activation()
    s.begin_activation(4)
    with pytest.raises(ProxyStateError):
        s.begin_activation(5)
    (_, a), (_, b), (state, _) = s._admit(), s._admit(), s._admit()
    assert state == "over_cap"
    s._record(a, ModelCall(response_text="1"), MSGS)
    s._record(b, ModelCall(response_text="2"), MSGS + [{"role": "user", "content": "y"}])
    s._record(b, ModelCall(response_text="again"), [])  # a call is recorded once
    result = s.end_activation()
    assert [c.response_text for c in result.calls] == ["1", "2"]
    assert [(c.messages_offset, len(c.request_messages)) for c in result.calls] == [(0, 1), (1, 1)]
    assert (result.turn_index, result.refused_outside, result.refused_over_cap) == (4, 1, 1)
    assert s.base_url_for("10.0.0.1:5") == "http://10.0.0.1:5/v1" and s.base_url_for("10.0.0.1") == \
        "http://10.0.0.1:9/v1"
    assert s.anthropic_base_url_for("fd00::1") == "http://[fd00::1]:9"
    s.close()
    assert s._admit() == ("closed", None) and s.token not in repr(s)
    with pytest.raises(TypeError):
        pickle.dumps(s)
    s.close()  # idempotent


def test_calls_not_recorded_in_time_are_recorded_cancelled_by_end_activation(monkeypatch):
    import harbor_gym.proxy._session as mod

    monkeypatch.setattr(mod, "_CANCEL_WAIT_S", 0.01)
    s = _session()
    s.begin_activation(0)
    _, call = s._admit()
    result = s.end_activation()  # nobody records the call: end_activation does, cancelled
    assert [c.status for c in result.calls] == ["cancelled"]
    s._record(call, ModelCall(response_text="late"), MSGS)  # a late record is dropped
    assert len(result.calls) == 1

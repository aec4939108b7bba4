"""The Anthropic Messages <-> OpenAI Chat Completions translation of the capture proxy (pure; issue 18 item 1)."""

from __future__ import annotations

import json

import pytest

from harbor_gym.proxy._anthropic import (
    StreamTranslator,
    TranslationError,
    error_body,
    to_anthropic_message,
    to_openai_request,
)

TOOL = {"name": "bash", "description": "run", "input_schema": {"type": "object", "properties": {}}}


def test_request_messages_system_tools_and_options():
    body = {"model": "m", "max_tokens": 64, "system": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            "temperature": 0.5, "top_k": 3, "stop_sequences": ["END"], "metadata": {"user_id": "u"},
            "tools": [TOOL], "tool_choice": {"type": "any", "disable_parallel_tool_use": True}, "stream": True,
            "messages": [
                {"role": "user", "content": "do it"},
                {"role": "assistant", "content": [{"type": "thinking", "thinking": "hm"},
                                                  {"type": "text", "text": "ok"},
                                                  {"type": "tool_use", "id": "t1", "name": "bash",
                                                   "input": {"command": "ls"}}]},
                {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1",
                                              "content": [{"type": "text", "text": "a.txt"}]},
                                             {"type": "tool_result", "tool_use_id": "t2", "content": "bad",
                                              "is_error": True},
                                             {"type": "text", "text": "next"}]}]}
    out = to_openai_request(body)
    assert out["messages"] == [
        {"role": "system", "content": "a\nb"},
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "ok", "tool_calls": [
            {"id": "t1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}}]},
        {"role": "tool", "tool_call_id": "t1", "content": "a.txt"},
        {"role": "tool", "tool_call_id": "t2", "content": "[error] bad"},
        {"role": "user", "content": "next"}]
    assert out["tools"] == [{"type": "function", "function": {"name": "bash", "parameters": TOOL["input_schema"],
                                                              "description": "run"}}]
    assert (out["tool_choice"], out["parallel_tool_calls"], out["stop"]) == ("required", False, ["END"])
    assert (out["max_tokens"], out["temperature"], out["top_k"], out["stream"]) == (64, 0.5, 3, True)
    assert "metadata" not in out and "system" not in out


def test_request_images_and_named_tool_choice():
    body = {"model": "m", "max_tokens": 8, "tool_choice": {"type": "tool", "name": "bash"}, "tools": [TOOL],
            "messages": [{"role": "user", "content": [
                {"type": "text", "text": "see"},
                {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "QUJD"}}]}]}
    out = to_openai_request(body)
    assert out["messages"][0]["content"] == [{"type": "text", "text": "see"}, {"type": "image_url", "image_url": {
        "url": "data:image/png;base64,QUJD"}}]
    assert out["tool_choice"] == {"type": "function", "function": {"name": "bash"}}


@pytest.mark.parametrize("body, field", [
    ({"max_tokens": 8, "messages": []}, "messages"),
    ({"messages": [{"role": "user", "content": "x"}]}, "max_tokens"),
    ({"max_tokens": 8, "messages": [{"role": "system", "content": "x"}]}, "messages[0].role"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": [{"type": "document"}]}]}, "messages[0].content[0]"),
    ({"max_tokens": 8, "messages": [{"role": "user", "content": "x"}],
      "tools": [{"type": "web_search_20250305", "name": "web_search"}]}, "tools[0]"),
])
def test_untranslatable_requests_are_refused_naming_the_field(body, field):
    with pytest.raises(TranslationError, match=field.replace("[", r"\[").replace("]", r"\]")):
        to_openai_request(body)


def test_answer_text_tool_use_stop_reasons_and_usage():
    data = {"choices": [{"message": {"role": "assistant", "content": "hi", "tool_calls": [
        {"id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"command": "ls"}'}},
        {"id": "c2", "type": "function", "function": {"name": "bash", "arguments": "not json"}}]},
        "finish_reason": "tool_calls"}], "usage": {"prompt_tokens": 5, "completion_tokens": 7}}
    msg = to_anthropic_message(data, model="m")
    assert msg["content"] == [{"type": "text", "text": "hi"},
                              {"type": "tool_use", "id": "c1", "name": "bash", "input": {"command": "ls"}},
                              {"type": "tool_use", "id": "c2", "name": "bash", "input": {}}]
    assert (msg["stop_reason"], msg["usage"], msg["model"], msg["type"]) == (
        "tool_use", {"input_tokens": 5, "output_tokens": 7}, "m", "message")
    for finish, matched, expected in (("stop", None, ("end_turn", None)), ("length", None, ("max_tokens", None)),
                                      ("stop", "END", ("stop_sequence", "END")),
                                      ("content_filter", None, ("refusal", None))):
        choice = {"message": {"content": "x"}, "finish_reason": finish, "stop_reason": matched}
        out = to_anthropic_message({"choices": [choice]}, model="m", stop_sequences=["END"])
        assert (out["stop_reason"], out["stop_sequence"]) == expected
    with pytest.raises(ValueError):
        to_anthropic_message({"choices": []}, model="m")


def _events(raw: list[bytes]) -> list[tuple[str, dict]]:
    out = []
    for item in raw:
        name, data = item.decode().strip().split("\n")
        out.append((name[len("event: "):], json.loads(data[len("data: "):])))
    return out


def test_stream_events_follow_anthropics_sequence():
    t = StreamTranslator(model="m")
    raw = t.feed({"prompt_token_ids": [1, 2, 3], "choices": [{"index": 0, "delta": {"role": "assistant",
                                                                                    "content": ""}}]})
    raw += t.feed({"choices": [{"index": 0, "delta": {"content": "Hel"}}]})
    raw += t.feed({"choices": [{"index": 0, "delta": {"content": "lo"}}]})
    raw += t.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "id": "c1", "type": "function", "function": {"name": "bash", "arguments": '{"comm'}}]}}]})
    raw += t.feed({"choices": [{"index": 0, "delta": {"tool_calls": [
        {"index": 0, "function": {"arguments": 'and": "ls"}'}}]}}]})
    raw += t.feed({"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
    raw += t.feed({"choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": 9}})
    raw += t.finish()
    events = _events(raw)
    assert [name for name, _ in events] == [
        "message_start", "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop",
        "content_block_start", "content_block_delta", "content_block_delta", "content_block_stop", "message_delta",
        "message_stop"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == 3
    assert events[5][1] == {"type": "content_block_start", "index": 1, "content_block": {
        "type": "tool_use", "id": "c1", "name": "bash", "input": {}}}
    assert "".join(d["delta"]["partial_json"] for n, d in events if d.get("index") == 1
                   and n == "content_block_delta") == '{"command": "ls"}'
    assert events[-2][1]["delta"]["stop_reason"] == "tool_use"
    assert events[-2][1]["usage"] == {"input_tokens": 3, "output_tokens": 9}
    assert all(n == d["type"] for n, d in events)


def test_error_bodies_have_anthropics_types():
    assert error_body(401, "no")["error"] == {"type": "authentication_error", "message": "no"}
    assert error_body(502, "down")["error"]["type"] == "api_error"
    name, data = _events([StreamTranslator.error(403, "cut")])[0]
    assert name == "error" and data["error"] == {"type": "permission_error", "message": "cut"}

"""The capture proxy records what the upstream sent and shows the harness only what it asked for (issue 18 item 1,
SPEC GYM-13): the ``openai`` client and the ``anthropic`` SDK act as harnesses, the scripted policy server is the
upstream; real HTTP on 127.0.0.1."""

from __future__ import annotations

import json
import threading

from policy_server import ROLE_IDS, logprob, render, render_message
from proxy_helpers import UPSTREAM_KEY, anthropic_client, openai_client

from harbor_gym.agents import full_requests

INSTRUCTION = "Make it so.\n$ echo alpha > /app/a.txt\n$ cat /app/a.txt\n"
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def expected_tokens(messages, answer_message, seed=None):
    """What the policy server sent for ``messages``: prompt ids, completion ids, logprobs."""
    prompt = render(messages) + [ROLE_IDS["assistant"]]
    completion = render_message(answer_message)[1:]
    return prompt, completion, [logprob(len(prompt) + i, seed) for i in range(len(completion))]


def test_tokens_recorded_as_sent_and_stripped_from_the_harness(session, proxy, upstream):
    # SPEC: GYM-13 (issue 18 item 1): token ids and logprobs in the record equal what the upstream sent; the
    # harness, which asked for none of them, sees none.
    client = openai_client(proxy, session.token)
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": INSTRUCTION}]
    raw = client.chat.completions.with_raw_response.create(model="policy", messages=messages, tools=[BASH], seed=7)
    seen = json.loads(raw.text)
    answer = seen["choices"][0]["message"]
    assert answer["tool_calls"][0]["function"]["arguments"] == json.dumps({"command": "echo alpha > /app/a.txt"})
    assert seen["choices"][0]["logprobs"] is None
    assert "prompt_token_ids" not in seen and "token_ids" not in seen["choices"][0]
    sent = upstream.requests[-1]  # the proxy asked the upstream for the token data
    assert sent["logprobs"] is True and sent["return_token_ids"] is True
    assert sent["return_tokens_as_token_ids"] is True

    follow = messages + [{"role": "assistant", "content": None, "tool_calls": answer["tool_calls"]},
                         {"role": "tool", "tool_call_id": answer["tool_calls"][0]["id"], "content": "[exit code 0]"}]
    client.chat.completions.create(model="policy", messages=follow, tools=[BASH], seed=8)
    result = session.end_activation()
    first, second = result.calls
    prompt, completion, lps = expected_tokens(messages, {"role": "assistant", "content": None,
                                                         "tool_calls": answer["tool_calls"]}, seed=7)
    assert (list(first.prompt_token_ids), list(first.completion_token_ids)) == (prompt, completion)
    assert list(first.logprobs) == lps
    assert (first.status, first.api, first.stream, first.seed, first.model) == ("ok", "openai", False, 7, "policy")
    assert first.tool_calls[0]["name"] == "bash" and first.params["tools"] == [BASH]
    # deltas: the first call of the window whole, the second only what it added
    assert (first.messages_offset, second.messages_offset) == (0, 2)
    assert full_requests(result.calls)[1] == follow
    assert list(second.prompt_token_ids[:len(prompt) + len(completion)]) == prompt + completion
    assert UPSTREAM_KEY not in json.dumps([c.to_dict() for c in result.calls])


def test_fields_the_harness_asked_for_are_kept(session, proxy, upstream):
    # issue 18 item 1: only what the harness did not ask for is stripped; logprobs it asked for keep their text
    # tokens (the proxy then does not ask for token_id:N tokens), and the record still gets the ids.
    client = openai_client(proxy, session.token)
    messages = [{"role": "user", "content": INSTRUCTION}]
    raw = client.chat.completions.with_raw_response.create(model="policy", messages=messages, logprobs=True)
    seen = json.loads(raw.text)
    content = seen["choices"][0]["logprobs"]["content"]
    assert content and not any(c["token"].startswith("token_id:") for c in content)
    assert "return_tokens_as_token_ids" not in upstream.requests[-1]
    (call,) = session.end_activation().calls
    assert list(call.logprobs) == [c["logprob"] for c in content]
    assert call.completion_token_ids is not None and len(call.completion_token_ids) == len(content)


def test_stream_recorded_whole_and_every_chunk_passed(session, proxy, upstream):
    # issue 18 item 1: a streamed answer reaches the harness chunk by chunk (stripped of the token data and the
    # usage chunk it did not ask for) and is recorded whole.
    client = openai_client(proxy, session.token)
    messages = [{"role": "user", "content": INSTRUCTION}]
    with client.chat.completions.with_streaming_response.create(model="policy", messages=messages, tools=[BASH],
                                                                stream=True) as response:
        events = [line[len("data: "):] for line in response.iter_lines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    # the policy server streams: role, 3 pieces, finish, usage: the harness gets all but the usage chunk
    assert len(chunks) == 5 and all(c["choices"] for c in chunks)
    assert not any("prompt_token_ids" in c or "usage" in c for c in chunks)
    assert not any(ch.get("logprobs") or "token_ids" in ch for c in chunks for ch in c["choices"])
    args = "".join(tc["function"].get("arguments") or "" for c in chunks for tc in c["choices"][0]["delta"].get(
        "tool_calls") or ())
    assert args == json.dumps({"command": "echo alpha > /app/a.txt"})
    (call,) = session.end_activation().calls
    answer = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "bash", "arguments": args}}]}
    prompt, completion, lps = expected_tokens(messages, answer)
    assert (call.status, call.stream) == ("ok", True)
    assert (list(call.prompt_token_ids), list(call.completion_token_ids), list(call.logprobs)) == (
        prompt, completion, lps)
    assert call.tool_calls[0]["arguments"] == args and call.usage["completion_tokens"] == len(completion)


def test_anthropic_sdk_as_harness_plain_and_streamed(session, proxy, upstream):
    # issue 18 item 1: Anthropic Messages translated to the OpenAI upstream: tool_use out, tool_result back, a
    # streamed answer in Anthropic's events; the records keep the upstream's token data and the OpenAI messages
    # the policy saw.
    client = anthropic_client(proxy, session.token)
    tools = [{"name": "bash", "description": "run", "input_schema": {
        "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}]
    messages = [{"role": "user", "content": INSTRUCTION}]
    first = client.messages.create(model="policy", max_tokens=256, system="sys", messages=messages, tools=tools)
    assert first.stop_reason == "tool_use"
    (use,) = [b for b in first.content if b.type == "tool_use"]
    assert (use.name, use.input) == ("bash", {"command": "echo alpha > /app/a.txt"})
    messages += [{"role": "assistant", "content": [b.model_dump(include={"type", "id", "name", "input"})
                                                   for b in first.content]},
                 {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id, "content": "ok"}]}]
    with client.messages.stream(model="policy", max_tokens=256, system="sys", messages=messages,
                                tools=tools) as stream:
        kinds = [event.type for event in stream]
        final = stream.get_final_message()
    assert kinds[0] == "message_start" and kinds[-1] == "message_stop"
    assert final.stop_reason == "tool_use" and final.content[-1].input == {"command": "cat /app/a.txt"}
    assert upstream.auth[-1] == f"Bearer {UPSTREAM_KEY}"
    one, two = session.end_activation().calls
    assert (one.api, one.stream, two.api, two.stream) == ("anthropic", False, "anthropic", True)
    sent = full_requests([one, two])
    assert sent[0] == [{"role": "system", "content": "sys"}, {"role": "user", "content": INSTRUCTION}]
    assert sent[1][-1] == {"role": "tool", "tool_call_id": use.id, "content": "ok"}
    assert sent[1] == upstream.requests[-1]["messages"]
    assert first.usage.input_tokens == len(one.prompt_token_ids)
    assert first.usage.output_tokens == len(one.completion_token_ids)
    assert list(two.prompt_token_ids) == render(sent[1]) + [ROLE_IDS["assistant"]]
    assert len(two.logprobs) == len(two.completion_token_ids) > 0


def test_two_concurrent_sessions_never_mix(proxy, upstream):
    # issue 18 (must hold): two sessions calling at the same time each get exactly their own calls.
    sessions = [proxy.open_session(label=f"s{i}") for i in range(2)]
    errors: list[BaseException] = []

    def harness(i: int) -> None:
        try:
            client = openai_client(proxy, sessions[i].token)
            for k in range(6):
                answer = client.chat.completions.create(model="policy", messages=[
                    {"role": "user", "content": f"session {i} call {k}\n$ echo s{i}"}], stream=k % 2 == 1)
                if k % 2:
                    list(answer)  # read the stream to its end
        except BaseException as exc:  # reported below
            errors.append(exc)

    try:
        for s in sessions:
            s.begin_activation(3)
        threads = [threading.Thread(target=harness, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        assert not errors
        results = [s.end_activation() for s in sessions]
    finally:
        for s in sessions:
            s.close()
    for i, result in enumerate(results):
        assert result.turn_index == 3 and len(result.calls) == 6
        texts = [m[-1]["content"] for m in full_requests(result.calls)]
        assert sorted(texts) == sorted(f"session {i} call {k}\n$ echo s{i}" for k in range(6))
        assert all(c.tool_calls and c.tool_calls[0]["arguments"] == json.dumps({"command": f"echo s{i}"})
                   for c in result.calls), [c.to_dict() for c in result.calls]


def test_model_list_forwarded_not_recorded(session, proxy, upstream):
    # issue 18 item 1: GET /v1/models is forwarded inside a window and is not a model call.
    client = openai_client(proxy, session.token)
    assert "policy" in [m.id for m in client.models.list()]
    assert session.end_activation().calls == ()


def test_one_port_on_every_address_and_one_shared_proxy_per_upstream(upstream):
    # issue 18 item 2: the proxy binds every address sandboxes reach it on, on one port; the process shares one
    # proxy per upstream and addresses.
    from harbor_gym.proxy import ModelUpstream, shared_proxy

    up = ModelUpstream(base_url=upstream.url, api_key_env=None)
    proxy = shared_proxy(up, addresses=("127.0.0.1", "127.0.0.2"))
    assert shared_proxy(up, addresses=("127.0.0.2", "127.0.0.1")) is proxy
    other = shared_proxy(up, addresses=("127.0.0.1",))
    assert other is not proxy
    session = proxy.open_session()
    session.begin_activation(0)
    for host in ("127.0.0.1", "127.0.0.2"):
        import openai

        client = openai.OpenAI(base_url=session.base_url_for(host), api_key=session.token, max_retries=0)
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi\n$ echo x"}])
    assert len(session.end_activation().calls) == 2
    session.close()
    assert upstream.auth == [None, None]  # api_key_env=None: no key is sent

"""Who the capture proxy refuses, what it cancels, and what never leaves it (issue 18 items 1, 2 and 4; SPEC
GYM-10): forged and dead tokens, calls outside a window, calls cut by the window's end, a failing upstream, the
upstream key. Real HTTP on 127.0.0.1; the ``openai`` client and the ``anthropic`` SDK as harnesses."""

from __future__ import annotations

import json
import secrets
import socket
import threading

import anthropic
import openai
import pytest

from proxy_helpers import UPSTREAM_KEY, anthropic_client, make_proxy, openai_client, wait_for

MESSAGES = [{"role": "user", "content": "hi\n$ echo x"}]


def test_forged_or_dead_token_is_401_counted_and_not_forwarded(proxy, upstream):
    # issue 18 item 2: the token is checked on every call; a forged one (or a closed session's) gets 401, is
    # counted on the proxy, and never reaches the upstream or a session's records.
    live = proxy.open_session(label="live")
    live.begin_activation(0)
    before = proxy.refused_unauthorized
    forged = secrets.token_urlsafe(32)
    with pytest.raises(openai.AuthenticationError):
        openai_client(proxy, forged).chat.completions.create(model="policy", messages=MESSAGES)
    with pytest.raises(anthropic.AuthenticationError):
        anthropic_client(proxy, live.token[:-1] + ("B" if live.token.endswith("A") else "A")).messages.create(model="policy", max_tokens=8,
                                                                       messages=MESSAGES)
    dead = proxy.open_session(label="dead")
    dead.begin_activation(0)
    dead.close()
    with pytest.raises(openai.AuthenticationError):
        openai_client(proxy, dead.token).chat.completions.create(model="policy", messages=MESSAGES)
    assert proxy.refused_unauthorized == before + 3
    assert upstream.requests == []
    assert live.end_activation().calls == ()
    live.close()


def test_call_outside_a_window_is_403_counted_never_recorded(proxy, upstream):
    # issue 18 item 1: a call with a valid token while no window is open (a leftover process between turns, or
    # during verification) is refused, counted on the session, never forwarded, never attributed to a turn.
    session = proxy.open_session(label="between")
    client = openai_client(proxy, session.token)
    try:
        with pytest.raises(openai.PermissionDeniedError):
            client.chat.completions.create(model="policy", messages=MESSAGES)  # before the first window
        session.begin_activation(0)
        client.chat.completions.create(model="policy", messages=MESSAGES)
        first = session.end_activation()
        for _ in range(2):  # between turns
            with pytest.raises(openai.PermissionDeniedError):
                client.chat.completions.create(model="policy", messages=MESSAGES)
        session.begin_activation(1)
        second = session.end_activation()
    finally:
        session.close()
    assert (len(first.calls), first.refused_outside) == (1, 1)
    assert (second.calls, second.refused_outside, second.refused) == ((), 2, 2)
    assert session.refused_outside == 3
    assert len(upstream.requests) == 1


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_call_in_flight_at_window_end_is_cancelled_upstream_and_recorded(proxy, upstream, stream):
    # issue 18 item 4: a call still in flight when the window ends (the turn's budget) is cut: the upstream
    # request is closed, the harness gets an error, the call is recorded "cancelled" with what had arrived.
    session = proxy.open_session(label="budget")
    session.begin_activation(2)
    outcome: dict = {}

    def harness() -> None:
        client = openai_client(proxy, session.token)
        try:
            if stream:
                for _ in client.chat.completions.create(model="policy-hang", messages=MESSAGES, stream=True):
                    outcome["chunks"] = outcome.get("chunks", 0) + 1
            else:
                client.chat.completions.create(model="policy-hang", messages=MESSAGES)
            outcome["error"] = None
        except Exception as exc:  # the harness must see an error
            outcome["error"] = exc

    thread = threading.Thread(target=harness)
    try:
        thread.start()
        wait_for(lambda: upstream.requests and (not stream or outcome.get("chunks")), what="the call upstream")
        result = session.end_activation()
        thread.join(60)
    finally:
        session.close()
    (call,) = result.calls
    assert (call.status, call.stream, result.cancelled) == ("cancelled", stream, 1)
    assert "activation window ended" in call.error
    assert call.messages_offset == 0 and list(call.request_messages) == MESSAGES
    assert isinstance(outcome["error"], openai.APIError)
    if stream:  # what had arrived: the first chunk's text and token data
        assert (call.response_text, call.prompt_token_ids, call.completion_token_ids) == ("partial", (2, 3), (7,))
    wait_for(lambda: upstream.disconnects, what="the upstream to see its request closed")
    assert upstream.disconnects == ["stream" if stream else "plain"]


def test_upstream_down_failing_or_redirecting_is_502_recorded_error(upstream):
    # issue 18 item 1: an upstream that is down, answers 5xx or redirects gives the harness a 502 with a short
    # reason; the call is recorded "error"; no redirect is followed.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead_port = s.getsockname()[1]  # closed again: nothing listens there
    down = make_proxy(f"http://127.0.0.1:{dead_port}/v1")
    live = make_proxy(upstream.url)
    try:
        results = []
        for proxy, model in ((down, "policy"), (live, "policy-500"), (live, "policy-redirect")):
            session = proxy.open_session()
            session.begin_activation(0)
            with pytest.raises(openai.InternalServerError) as info:
                openai_client(proxy, session.token).chat.completions.create(model=model, messages=MESSAGES)
            assert info.value.status_code == 502
            results.append((info.value.message, session.end_activation().calls))
            session.close()
    finally:
        down.close()
        live.close()
    reasons = ["cannot be reached", "upstream failed (HTTP 500)", "redirect (HTTP 307)"]
    for (message, calls), reason in zip(results, reasons):
        (call,) = calls
        assert reason in message and reason in call.error and call.status == "error"
    assert [r["model"] for r in upstream.requests] == ["policy-500", "policy-redirect"]  # nothing went to 192.0.2.1


def test_upstream_key_never_reaches_harness_or_records(session, proxy, upstream):
    # GYM-10 / issue 18 item 2: the key is sent to the upstream only; an upstream that echoes it back does not
    # get it to the harness or into the record; reprs never hold it; the session token never goes upstream.
    with pytest.raises(openai.BadRequestError) as info:
        openai_client(proxy, session.token).chat.completions.create(model="policy-echo-auth", messages=MESSAGES)
    assert upstream.auth == [f"Bearer {UPSTREAM_KEY}"]
    assert session.token not in json.dumps(upstream.requests)
    seen = info.value.response.text
    assert "[redacted]" in seen and UPSTREAM_KEY not in seen
    (call,) = session.end_activation().calls
    assert call.status == "error" and "[redacted]" in call.error
    text = json.dumps(call.to_dict()) + repr(proxy) + repr(proxy.upstream) + repr(session) + repr(call)
    assert UPSTREAM_KEY not in text and session.token not in repr(session)

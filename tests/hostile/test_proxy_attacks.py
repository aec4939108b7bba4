"""Hostile: a sandbox process attacking the capture proxy (GYM-10, GYM-13).

The attacker is a harness inside the sandbox: it holds its episode's session token, speaks raw HTTP to the proxy's
port and wants reward (forged token ids), the host's key, another upstream, another episode's records, or the
upstream's capacity. Each test mounts one attack class against a real proxy in front of the tests' policy server
on 127.0.0.1 and checks the defence; every test ends by checking that the proxy still serves an honest call.
"""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest

from policy_server import PolicyServer

from harbor_gym.agents._chat_wire import RefusedOptions
from harbor_gym.proxy import CaptureProxy, ModelUpstream, ProxyLimits

KEY = "sk-host-upstream-key-Vb91-never-in-a-sandbox"
KEY_ENV = "HG_TEST_HOSTILE_PROXY_KEY"
MESSAGES = [{"role": "user", "content": "$ echo hi"}]


@pytest.fixture(scope="module")
def upstream():
    server = PolicyServer().start()
    yield server
    server.stop()


@pytest.fixture
def make(upstream, monkeypatch):
    """``make(**limits) -> (proxy, session)``: a proxy with those caps and a session with turn 0's window open."""
    monkeypatch.setenv(KEY_ENV, KEY)
    upstream.requests.clear()
    RefusedOptions.forget(upstream.url)
    made: list[CaptureProxy] = []

    def build(**limits):
        proxy = CaptureProxy(ModelUpstream(base_url=upstream.url, api_key_env=KEY_ENV), limits=ProxyLimits(**limits))
        proxy.start()
        made.append(proxy)
        session = proxy.open_session(label="attacker")
        session.begin_activation(0)
        return proxy, session

    yield build
    for proxy in made:
        proxy.close()
    RefusedOptions.forget(upstream.url)


def _send(proxy: CaptureProxy, data: bytes, *, timeout: float = 30.0) -> bytes:
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=timeout) as sock:
        sock.sendall(data)
        out = b""
        while True:
            try:
                piece = sock.recv(65536)
            except (ConnectionResetError, socket.timeout):
                break
            if not piece:
                break
            out += piece
        return out


def _post(target: str, token: str, body: bytes, *, host: str = "proxy", extra: str = "") -> bytes:
    return (f"POST {target} HTTP/1.1\r\nhost: {host}\r\nauthorization: Bearer {token}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\nconnection: close\r\n{extra}\r\n"
            ).encode("latin-1") + body


def _status(answer: bytes) -> int:
    return int(answer.split(b" ", 2)[1]) if answer.startswith(b"HTTP/1.1 ") else 0


def _honest_call(proxy: CaptureProxy, token: str) -> dict:
    answer = _send(proxy, _post("/v1/chat/completions", token,
                                json.dumps({"model": "policy", "messages": MESSAGES}).encode()))
    assert _status(answer) == 200, answer[:300]
    return json.loads(answer.split(b"\r\n\r\n", 1)[1])


@pytest.mark.parametrize("target", [
    "http://127.0.0.1:9/v1/chat/completions",          # absolute form naming another host
    "//127.0.0.1:9/v1/chat/completions",               # scheme-relative
    "/v1/../admin/chat/completions",                   # dot segments
    "/v1/chat/completions/../../../admin",
    "/v1/%2e%2e/chat/completions",                     # encoded dot segments
    "/v1%2fchat%2fcompletions",                        # encoded slashes
    "/v1/chat/completions%00",                         # encoded NUL
    "/V1/CHAT/COMPLETIONS",                            # case games
    "*",
])
def test_gym_10_no_request_target_reaches_any_other_upstream_path(make, upstream, target):
    # SPEC: GYM-10: the proxy forwards to the configured upstream's one route and nothing else: every other
    # request target is refused 404 before the token or body matter, and the upstream sees nothing.
    proxy, session = make()
    body = json.dumps({"model": "policy", "messages": MESSAGES}).encode()
    answer = _send(proxy, _post(target, session.token, body))
    assert _status(answer) in (400, 404), answer[:300]
    assert upstream.requests == []
    assert KEY.encode() not in answer
    _honest_call(proxy, session.token)
    assert len(upstream.requests) == 1


def test_gym_10_host_header_never_chooses_the_upstream(make, upstream):
    # SPEC: GYM-10: a Host header (or X-Forwarded-Host) naming another host changes nothing: the call goes to the
    # configured upstream with the proxy's own headers, never the harness's.
    proxy, session = make()
    body = json.dumps({"model": "policy", "messages": MESSAGES}).encode()
    answer = _send(proxy, _post("/v1/chat/completions", session.token, body, host="169.254.169.254",
                                extra="x-forwarded-host: 169.254.169.254\r\nx-forwarded-for: 10.0.0.1\r\n"))
    assert _status(answer) == 200
    assert len(upstream.requests) == 1
    assert all(a == f"Bearer {KEY}" for a in upstream.auth[-1:])  # the proxy's key, not the harness's token


def test_gym_13_harness_cannot_forge_the_recorded_tokens(make, upstream):
    # SPEC: GYM-13: recorded token ids and logprobs are the upstream's answer: ids or logprobs the harness puts in
    # its request (or options turning them off) never reach the record.
    proxy, session = make()
    forged = {"model": "policy", "messages": MESSAGES, "logprobs": False, "return_token_ids": False,
              "prompt_token_ids": [7, 7, 7], "token_ids": [7, 7], "choices": [{"token_ids": [7]}]}
    _send(proxy, _post("/v1/chat/completions", session.token, json.dumps(forged).encode()))
    (call,) = session.end_activation().calls
    assert call.status == "ok"
    assert call.prompt_token_ids and call.prompt_token_ids != [7, 7, 7]
    assert call.completion_token_ids and call.completion_token_ids != [7, 7]
    assert call.logprobs and len(call.logprobs) == len(call.completion_token_ids)


def test_gym_10_one_episode_cannot_take_the_upstreams_capacity(make, upstream):
    # SPEC: GYM-10: calls of one session in flight at once are capped (429 past it, counted), while another
    # episode's session on the same proxy is served at the same time.
    proxy, session = make(max_concurrent_calls_per_session=2)
    hang = json.dumps({"model": "policy-hang", "messages": MESSAGES}).encode()
    held = []
    for _ in range(2):
        sock = socket.create_connection(("127.0.0.1", proxy.port), timeout=30)
        sock.sendall(_post("/v1/chat/completions", session.token, hang))
        held.append(sock)
    try:
        deadline = time.monotonic() + 30
        while len(upstream.requests) < 2 and time.monotonic() < deadline:
            time.sleep(0.02)
        third = _send(proxy, _post("/v1/chat/completions", session.token, hang))
        assert _status(third) == 429 and b"in flight" in third
        other = proxy.open_session(label="victim")
        other.begin_activation(0)
        _honest_call(proxy, other.token)
        (victim_call,) = other.end_activation().calls
        assert victim_call.status == "ok"
        other.close()
    finally:
        calls = session.end_activation()
        for sock in held:
            sock.close()
    assert calls.refused_over_cap == 1
    assert [c.status for c in calls.calls] == ["cancelled", "cancelled"]


def test_gym_10_one_token_writes_only_its_own_episodes_records(make, upstream):
    # SPEC: GYM-10: a call carrying episode A's token lands in A's window only; a token of a closed episode or a
    # guessed one is 401 and lands nowhere.
    proxy, a = make()
    b = proxy.open_session(label="b")
    b.begin_activation(0)
    _honest_call(proxy, a.token)
    dead = proxy.open_session(label="dead")
    dead_token = dead.token
    dead.close()
    for token in (dead_token, a.token[:-1] + ("A" if a.token[-1] != "A" else "B"), b.token.upper(), ""):
        answer = _send(proxy, _post("/v1/chat/completions", token,
                                    json.dumps({"model": "policy", "messages": MESSAGES}).encode()))
        assert _status(answer) == 401
    assert len(a.end_activation().calls) == 1
    assert b.end_activation().calls == ()
    b.close()


@pytest.mark.parametrize("body", [
    b"[" * 200_000,                                    # nesting deeper than the interpreter's stack
    b'{"messages": ' + b"[" * 50_000 + b"]" * 50_000 + b"}",
    b"\xff\xfe not utf-8",
    b'{"model": "policy", "messages": "not a list"}',
    b'{"model": "policy", "messages": [{"role": "user", "content": "x"}], "stream": "yes", "n": 1e400}',
    b"null",
], ids=["deep-array", "deep-messages", "not-utf8", "messages-not-list", "bad-types", "null"])
def test_gym_10_broken_bodies_are_http_errors_and_the_proxy_serves_on(make, upstream, body):
    # SPEC: GYM-10: whatever the body, the harness gets an HTTP error (4xx/5xx, JSON, no secret) and the proxy keeps
    # serving honest calls; nothing broken is forwarded.
    proxy, session = make()
    answer = _send(proxy, _post("/v1/chat/completions", session.token, body))
    assert 400 <= _status(answer) < 600 and _status(answer) != 500, answer[:300]
    assert KEY.encode() not in answer
    json.loads(answer.split(b"\r\n\r\n", 1)[1])
    assert upstream.requests == []
    _honest_call(proxy, session.token)


def test_gym_10_the_key_is_in_no_answer_error_or_record(make, upstream):
    # SPEC: GYM-10: an upstream that quotes the request's Authorization header in its error (plain and streamed)
    # and the model list never show the host's key to the harness or the record.
    proxy, session = make()
    seen = b""
    for stream in (False, True):
        seen += _send(proxy, _post("/v1/chat/completions", session.token, json.dumps(
            {"model": "policy-echo-auth", "messages": MESSAGES, "stream": stream}).encode()))
    seen += _send(proxy, (f"GET /v1/models HTTP/1.1\r\nhost: p\r\nauthorization: Bearer {session.token}\r\n"
                          "connection: close\r\n\r\n").encode())
    assert any(KEY in a for a in upstream.auth)  # the key did go upstream, so the upstream could echo it
    assert KEY.encode() not in seen
    calls = session.end_activation().calls
    assert KEY not in repr(calls) and KEY not in repr(proxy) and KEY not in repr(session)


def test_gym_10_many_connections_at_once_do_not_stop_the_proxy(make, upstream):
    # SPEC: GYM-10: a flood of half-open connections from the sandbox is capped per peer and timed out; the proxy
    # then serves again.
    proxy, session = make(max_connections_per_peer=8, header_timeout_s=1.0)
    socks = []
    try:
        for _ in range(20):
            try:
                s = socket.create_connection(("127.0.0.1", proxy.port), timeout=5)
                s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\n")
                socks.append(s)
            except OSError:
                break
        threading.Event().wait(2.5)  # the header timeout closes the half-open ones
    finally:
        for s in socks:
            s.close()
    deadline = time.monotonic() + 30
    while True:
        answer = _send(proxy, _post("/v1/chat/completions", session.token,
                                    json.dumps({"model": "policy", "messages": MESSAGES}).encode()))
        if _status(answer) == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert _status(answer) == 200
    assert proxy.refused_connections >= 1

"""GYM-10 caps of the capture proxy: model traffic from a sandbox is data, capped in real bytes and time; over a cap
the caller gets a clear HTTP error and the call is recorded (or counted). Small `ProxyLimits` per check; real HTTP
on 127.0.0.1 (the ``openai`` client and raw sockets as callers)."""

from __future__ import annotations

import socket

import openai
import pytest

from proxy_helpers import make_proxy, openai_client, raw_request, read_all, wait_for

MESSAGES = [{"role": "user", "content": "hi\n$ echo x"}]


@pytest.fixture
def capped(upstream):
    """``capped(**limits)``: a started proxy with those caps and a session with an open window."""
    made = []

    def make(**limits):
        proxy = make_proxy(upstream.url, **limits)
        session = proxy.open_session()
        session.begin_activation(0)
        made.append(proxy)
        return proxy, session

    yield make
    for proxy in made:
        proxy.close()


def status_of(response: bytes) -> int:
    return int(response.split(b" ", 2)[1])


def test_request_body_over_cap_is_413_and_recorded(capped):
    # SPEC: GYM-10: one request body is capped (said from Content-Length, or counted for a chunked body).
    proxy, session = capped(max_request_bytes=4096)
    client = openai_client(proxy, session.token)
    client.chat.completions.create(model="policy", messages=MESSAGES)  # under the cap: served
    with pytest.raises(openai.APIStatusError) as info:
        client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "x" * 8000}])
    assert info.value.status_code == 413
    chunk = b"y" * 3000
    chunked = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\nauthorization: Bearer " + session.token.encode()
               + b"\r\ntransfer-encoding: chunked\r\n\r\n" + (b"%x\r\n" % len(chunk) + chunk + b"\r\n") * 3)
    assert status_of(raw_request(proxy, chunked)) == 413
    ok, big, big_chunked = session.end_activation().calls
    assert ok.status == "ok"
    assert all(c.status == "error" and "cap of 4096 bytes" in c.error for c in (big, big_chunked))


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
def test_response_over_cap_is_an_error_and_recorded(capped, stream):
    # SPEC: GYM-10: one upstream answer is capped, streamed or not; the harness gets an error, the call is
    # recorded "error" (a stream with what had arrived).
    proxy, session = capped(max_response_bytes=1500)
    client = openai_client(proxy, session.token)
    with pytest.raises(openai.APIError) as info:
        answer = client.chat.completions.create(model="policy", messages=MESSAGES, stream=stream)
        if stream:
            list(answer)
    assert "over the proxy's cap of 1500 bytes" in str(info.value)
    (call,) = session.end_activation().calls
    assert (call.status, call.stream) == ("error", stream) and "cap of 1500 bytes" in call.error


def test_activation_traffic_and_call_count_caps(capped, upstream):
    # SPEC: GYM-10: the traffic of one window and its number of calls are capped: past the bytes cap a call is
    # refused 429 and recorded; past the calls cap calls are refused 429 and counted, not recorded.
    proxy, session = capped(max_activation_bytes=12000, max_calls_per_activation=6)
    client = openai_client(proxy, session.token)
    statuses = []
    for _ in range(8):
        try:
            client.chat.completions.create(model="policy", messages=MESSAGES)
            statuses.append(200)
        except openai.APIStatusError as exc:
            statuses.append(exc.status_code)
            assert exc.status_code == 429
    result = session.end_activation()
    assert statuses[0] == 200 and statuses[-2:] == [429, 429]
    assert len(result.calls) == 6 and result.refused_over_cap == 2
    over = [c for c in result.calls if c.status == "error"]
    assert over and all("traffic cap of 12000 bytes" in c.error for c in over)
    assert len(upstream.requests) < 6  # calls past the traffic cap were not forwarded
    session.begin_activation(1)  # a new window starts from zero
    client.chat.completions.create(model="policy", messages=MESSAGES)
    assert [c.status for c in session.end_activation().calls] == ["ok"]


def test_connections_per_peer_capped(capped):
    # SPEC: GYM-10: open connections per peer address are capped; past it the connection gets 503 and is closed.
    proxy, _ = capped(max_connections_per_peer=2)
    held = [socket.create_connection(("127.0.0.1", proxy.port), timeout=30) for _ in range(2)]
    try:
        third = raw_request(proxy, b"")
        assert status_of(third) == 503 and b"too many open connections" in third
        assert proxy.refused_connections == 1
    finally:
        for sock in held:
            sock.close()
    wait_for(lambda: status_of(raw_request(proxy, b"GET /v1/models HTTP/1.1\r\nhost: p\r\n\r\n")) == 401,
             what="the held connections to be released")


def test_headers_and_slow_requests_capped(capped):
    # SPEC: GYM-10: oversized headers get 431; a request head that trickles in (slowloris) or a body that stalls
    # gets 408; an idle kept-alive connection is closed.
    proxy, session = capped(max_header_bytes=1024, header_timeout_s=1.0, request_timeout_s=2.0, idle_timeout_s=1.0)
    big = b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\nx-pad: " + b"a" * 4096 + b"\r\n\r\n"
    assert status_of(raw_request(proxy, big)) == 431
    trickle = raw_request(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\n")  # never ends its head
    assert status_of(trickle) == 408
    stalled = raw_request(proxy, b"POST /v1/chat/completions HTTP/1.1\r\nhost: p\r\nauthorization: Bearer "
                          + session.token.encode() + b"\r\ncontent-length: 100\r\n\r\n{\"messages\"")
    assert status_of(stalled) == 408
    with socket.create_connection(("127.0.0.1", proxy.port), timeout=30) as idle:
        assert read_all(idle) == b""  # closed by the proxy, nothing said
    (call,) = session.end_activation().calls
    assert call.status == "error" and "request stalled for over 1 s" in call.error

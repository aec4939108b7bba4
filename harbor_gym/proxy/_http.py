"""The server side of one HTTP/1.1 connection of the capture proxy: h11 over asyncio streams, with GYM-10's header,
body and time caps (`ProxyLimits`). Holds no policy: `_server` decides what to answer.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any, Iterable

import h11

__all__ = ["HttpConnection", "ClientGone", "RequestRefused", "json_bytes"]

_READ_SIZE = 65536
#: A refused request's unread body is drained for at most this long / this many bytes before the close.
_LINGER_S = 0.5
_LINGER_BYTES = 1024 * 1024
_HEADERS_OVER_CAP = "the request headers are over the proxy's cap (GYM-10)"


class ClientGone(Exception):
    """The client closed the connection, stalled past a timeout, or broke the protocol: nothing more can be said
    to it."""


class _Stalled(ClientGone):
    """No byte arrived within the time allowed."""


class RequestRefused(Exception):
    """A request that must be answered with ``status`` and then the connection closed (its body was not read
    whole). ``reason`` is one short line for the caller."""

    def __init__(self, status: int, reason: str) -> None:
        super().__init__(reason)
        self.status = status
        self.reason = reason


def json_bytes(data: Any) -> bytes:
    """Compact UTF-8 JSON."""
    return json.dumps(data, separators=(",", ":"), ensure_ascii=False).encode("utf-8")


class HttpConnection:
    """One accepted connection (see the module docstring)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, limits: Any) -> None:
        self._reader = reader
        self._writer = writer
        self._limits = limits
        self._h11 = h11.Connection(h11.SERVER, max_incomplete_event_size=limits.max_header_bytes)
        self.request_started = 0.0

    # --- reading -------------------------------------------------------------------------------------------
    async def _receive(self, timeout: float) -> None:
        try:
            async with asyncio.timeout(max(timeout, 0.001)):
                data = await self._reader.read(_READ_SIZE)
        except TimeoutError as exc:
            raise _Stalled("read timed out") from exc
        except (ConnectionError, OSError) as exc:
            raise ClientGone(str(exc)) from exc
        self._h11.receive_data(data)

    def _next_event(self) -> Any:
        try:
            return self._h11.next_event()
        except h11.RemoteProtocolError as exc:
            raise RequestRefused(exc.error_status_hint, _protocol_reason(exc)) from exc

    async def next_request(self) -> h11.Request | None:
        """The next request's head, or ``None`` when the client closed or stayed idle past ``idle_timeout_s``
        between requests.

        Raises:
            RequestRefused: a malformed head (400) or headers over ``max_header_bytes`` (431); a head that took
                longer than ``header_timeout_s`` (408).
        """
        if self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE:
            self._h11.start_next_cycle()
        first = True
        deadline = 0.0
        while True:
            event = self._next_event()
            if isinstance(event, h11.Request):
                # h11 caps only a head still incomplete; one that arrived whole in a read is measured here
                size = len(event.method) + len(event.target) + sum(len(n) + len(v) + 4 for n, v in event.headers)
                if size > self._limits.max_header_bytes:
                    raise RequestRefused(431, _HEADERS_OVER_CAP)
                return event
            if isinstance(event, h11.ConnectionClosed) or event is h11.PAUSED:
                return None
            if event is not h11.NEED_DATA:
                raise RequestRefused(400, "unexpected data before a request")
            if first:
                try:
                    await self._receive(self._limits.idle_timeout_s)
                except ClientGone:
                    return None
                first = False
                self.request_started = time.monotonic()
                deadline = self.request_started + self._limits.header_timeout_s
                continue
            try:
                await self._receive(deadline - time.monotonic())
            except _Stalled as exc:  # the wait was bounded by the head's deadline
                raise RequestRefused(408, f"the request headers did not arrive within "
                                          f"{self._limits.header_timeout_s:g} s (GYM-10)") from exc

    async def read_body(self, request: h11.Request, cap: int) -> bytes:
        """The request's whole body, at most ``cap`` bytes, within ``request_timeout_s`` of the request's start.

        Raises:
            RequestRefused: over ``cap`` (413: said before reading, from Content-Length, when it can be), or too
                slow (408).
            ClientGone: the client went away.
        """
        declared = _content_length(request.headers)
        if declared is not None and declared > cap:
            raise RequestRefused(413, f"the request body ({declared} bytes) is over the proxy's cap of {cap} bytes "
                                      "(GYM-10)")
        if self._h11.they_are_waiting_for_100_continue:
            await self._send(h11.InformationalResponse(status_code=100, headers=[]))
        parts: list[bytes] = []
        size = 0
        deadline = self.request_started + self._limits.request_timeout_s
        while True:
            event = self._next_event()
            if isinstance(event, h11.Data):
                size += len(event.data)
                if size > cap:
                    raise RequestRefused(413, f"the request body is over the proxy's cap of {cap} bytes (GYM-10)")
                parts.append(bytes(event.data))
            elif isinstance(event, h11.EndOfMessage):
                return b"".join(parts)
            elif event is h11.NEED_DATA:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise RequestRefused(408, f"the request did not arrive within "
                                              f"{self._limits.request_timeout_s:g} s (GYM-10)")
                try:
                    await self._receive(min(left, self._limits.idle_timeout_s))
                except _Stalled as exc:
                    if time.monotonic() >= deadline:
                        raise RequestRefused(408, f"the request did not arrive within "
                                                  f"{self._limits.request_timeout_s:g} s (GYM-10)") from exc
                    raise RequestRefused(408, f"the request stalled for over {self._limits.idle_timeout_s:g} s "
                                              "(GYM-10)") from exc
            else:
                raise ClientGone("the connection closed during the request body")

    # --- writing -------------------------------------------------------------------------------------------
    @property
    def response_started(self) -> bool:
        """True once a response's head was sent for the current request."""
        return self._h11.our_state in (h11.SEND_BODY, h11.DONE, h11.MUST_CLOSE, h11.CLOSED)

    @property
    def can_send(self) -> bool:
        """True while a (whole or streamed) response can still be sent or continued."""
        return self._h11.our_state in (h11.SEND_RESPONSE, h11.SEND_BODY)

    @property
    def reusable(self) -> bool:
        """True when the next request may follow on this connection."""
        return self._h11.our_state is h11.DONE and self._h11.their_state is h11.DONE

    async def _send(self, event: Any) -> None:
        try:
            data = self._h11.send(event)
        except h11.LocalProtocolError as exc:
            raise ClientGone(f"cannot send: {exc}") from exc
        if data:
            await self._write(data)

    async def _write(self, data: bytes) -> None:
        try:
            self._writer.write(data)
            async with asyncio.timeout(self._limits.idle_timeout_s):
                await self._writer.drain()
        except TimeoutError as exc:
            raise ClientGone("write timed out") from exc
        except (ConnectionError, OSError, RuntimeError) as exc:
            raise ClientGone(str(exc)) from exc

    async def send_response(self, status: int, body: bytes, *, content_type: str = "application/json",
                            close: bool = False, extra_headers: Iterable[tuple[str, str]] = ()) -> None:
        """A whole response; ``close``: ``Connection: close`` and no next request."""
        headers = [("content-type", content_type), ("content-length", str(len(body))), *extra_headers]
        if close:
            headers.append(("connection", "close"))
        data = self._h11.send(h11.Response(status_code=status, headers=headers))
        data += self._h11.send(h11.Data(data=body)) if body else b""
        data += self._h11.send(h11.EndOfMessage())
        await self._write(data)

    async def start_stream(self, status: int, content_type: str = "text/event-stream") -> None:
        """A streamed (chunked) response's head."""
        await self._send(h11.Response(status_code=status, headers=[
            ("content-type", content_type), ("cache-control", "no-cache"), ("transfer-encoding", "chunked")]))

    async def send_chunk(self, data: bytes) -> None:
        """One piece of a streamed response."""
        if data:
            await self._send(h11.Data(data=data))

    async def end_stream(self) -> None:
        """The end of a streamed response."""
        await self._send(h11.EndOfMessage())

    async def close(self) -> None:
        """Close the connection (idempotent; never raises). A request whose body was not read (refused before it)
        is drained a little first, bounded in bytes and time, so that the refusal is not lost to a TCP reset."""
        try:
            if self._h11.their_state is h11.SEND_BODY and self._h11.our_state is not h11.CLOSED:
                self._writer.write_eof()
                async with asyncio.timeout(_LINGER_S):
                    drained = 0
                    while drained < _LINGER_BYTES:
                        piece = await self._reader.read(_READ_SIZE)
                        if not piece:
                            break
                        drained += len(piece)
        except (Exception, TimeoutError):  # a peer that keeps sending or went away: close now
            pass
        try:
            self._writer.close()
            async with asyncio.timeout(1.0):
                await self._writer.wait_closed()
        except Exception:  # closing a broken socket: nothing left to do
            pass


def _content_length(headers: Iterable[tuple[bytes, bytes]]) -> int | None:
    for name, value in headers:
        if name.lower() == b"content-length":
            try:
                return int(value)
            except ValueError:
                return None
    return None


def _protocol_reason(exc: h11.RemoteProtocolError) -> str:
    if exc.error_status_hint == 431:
        return _HEADERS_OVER_CAP
    return "malformed HTTP request"

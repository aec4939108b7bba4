"""`CaptureProxy`: the host-side HTTP server that sandboxes' harnesses call as their model (issue 18 item 1), and
`shared_proxy`, the process's proxy per upstream and addresses.

It runs its own asyncio loop in a daemon thread (the public API is sync). Routes: ``POST /v1/chat/completions``
(also ``/chat/completions``), ``POST /v1/messages`` (also ``/messages``; a query such as ``?beta=true`` is ignored)
and ``GET /v1/models`` (``/models``, forwarded, not recorded). Every request must carry a live session token, as
``Authorization: Bearer <token>`` or ``x-api-key: <token>``:

- unknown or closed token -> 401, counted on the proxy (`CaptureProxy.refused_unauthorized`);
- valid token, no activation window open -> 403, counted on the session (`ProxySession.refused_outside`), never
  forwarded, never recorded;
- past ``max_calls_per_activation``, or with ``max_concurrent_calls_per_session`` calls of the session in
  flight -> 429, counted on the window;
- otherwise the call is forwarded (`_exchange`) and recorded in the window, whatever its end (``ok``, ``error``,
  ``cancelled``).

The token is checked before the body is read, so a refused caller never gets to send its body (the connection is
closed). Tokens are looked up by their SHA-256 digest and compared in constant time. Connections per peer address
are capped (503 and closed past it, `CaptureProxy.refused_connections`). The proxy writes no files and logs nothing.
"""

from __future__ import annotations

import asyncio
import atexit
import errno
import hmac
import os
import threading
from collections import Counter
from enum import Enum
from typing import Any, Sequence

from harbor_gym.proxy._config import ModelUpstream, ProxyLimits
from harbor_gym.proxy._exchange import Exchange, UpstreamContext, error_payload, httpx
from harbor_gym.proxy._http import ClientGone, HttpConnection, RequestRefused, json_bytes
from harbor_gym.proxy._session import ProxyError, ProxySession, ProxyStateError, _Call, token_digest

__all__ = ["CaptureProxy", "shared_proxy"]

_ROUTES = {"/v1/chat/completions": "chat", "/chat/completions": "chat", "/v1/messages": "messages",
           "/messages": "messages", "/v1/models": "models", "/models": "models"}
_METHODS = {"chat": b"POST", "messages": b"POST", "models": b"GET"}
_START_TIMEOUT_S = 30.0
_CLOSE_TIMEOUT_S = 15.0


class _State(Enum):
    UNOPENED = "unopened"
    OPEN = "open"
    CLOSED = "closed"


class CaptureProxy:
    """The capture proxy of one upstream on one port of one or more host addresses (see the module docstring).

    A context manager: ``with CaptureProxy(upstream) as proxy`` starts it and closes it. Thread-safe.

    Args:
        upstream: where calls are forwarded.
        addresses: the host addresses to listen on, all on the same port (e.g.
            ``host_route.listen_addresses(backend)``).
        port: the port; ``0``: one that is free on every address.
        limits: the GYM-10 caps.

    Attributes:
        port: the port listened on (after `start`; before it, the port asked for).
        addresses: the addresses listened on.
    """

    def __init__(self, upstream: ModelUpstream, *, addresses: Sequence[str] = ("127.0.0.1",), port: int = 0,
                 limits: ProxyLimits = ProxyLimits()) -> None:
        if not isinstance(upstream, ModelUpstream):
            upstream = ModelUpstream.model_validate(upstream)
        if isinstance(addresses, str) or not addresses:
            raise ProxyError("addresses must be a non-empty sequence of host addresses", field="CaptureProxy.addresses")
        self.upstream = upstream
        self.addresses = tuple(dict.fromkeys(str(a) for a in addresses))
        self.port = int(port)
        self.limits = limits
        self._state = _State.UNOPENED
        self._lock = threading.Lock()
        self._sessions: dict[bytes, ProxySession] = {}
        self._counts_lock = threading.Lock()
        self._refused_unauthorized = 0
        self._refused_connections = 0
        self._peers: Counter[str] = Counter()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.Server] = []
        self._connections: set[asyncio.Task[Any]] = set()
        self._ctx: UpstreamContext | None = None
        self._pid = os.getpid()

    def __repr__(self) -> str:
        return (f"CaptureProxy(upstream={self.upstream.base_url!r}, addresses={list(self.addresses)}, "
                f"port={self.port}, state={self._state.value})")

    # --- counters ----------------------------------------------------------------------------------------
    @property
    def refused_unauthorized(self) -> int:
        """Requests refused 401 (no, an unknown or a closed session token)."""
        with self._counts_lock:
            return self._refused_unauthorized

    @property
    def refused_connections(self) -> int:
        """Connections refused 503 because their peer address had ``max_connections_per_peer`` open."""
        with self._counts_lock:
            return self._refused_connections

    @property
    def is_open(self) -> bool:
        """True between `start` and `close`."""
        return self._state is _State.OPEN

    # --- lifecycle ---------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind every address on one port and serve. After return, `port` is the port.

        Raises:
            ProxyStateError: started before, or closed.
            ProxyError: an address cannot be bound (retryable when the port was taken).
        """
        with self._lock:
            if self._state is not _State.UNOPENED:
                raise ProxyStateError(f"the capture proxy is {self._state.value}; make a new one",
                                      field="CaptureProxy.start")
            loop = asyncio.new_event_loop()
            # the proxy logs nothing: every fault of a call is answered and recorded where it happens
            loop.set_exception_handler(lambda _loop, _context: None)
            thread = threading.Thread(target=loop.run_forever, name="harbor-gym-capture-proxy", daemon=True)
            thread.start()
            try:
                asyncio.run_coroutine_threadsafe(self._astart(), loop).result(_START_TIMEOUT_S)
            except BaseException:
                self._stop_loop(loop, thread)
                self._state = _State.CLOSED
                raise
            self._loop, self._thread = loop, thread
            self._state = _State.OPEN

    def __enter__(self) -> "CaptureProxy":
        if self._state is _State.UNOPENED:
            self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every session (their in-flight calls are cut), every connection and the listeners, then stop the
        loop thread. Idempotent."""
        with self._lock:
            if self._state is _State.CLOSED:
                return
            was_open = self._state is _State.OPEN
            self._state = _State.CLOSED
            sessions = list(self._sessions.values())
        for session in sessions:
            session.close()
        if not was_open or self._loop is None or self._thread is None:
            return
        if os.getpid() != self._pid:  # a forked copy: the loop thread is the parent's
            return
        try:
            asyncio.run_coroutine_threadsafe(self._aclose(), self._loop).result(_CLOSE_TIMEOUT_S)
        except Exception:  # the loop is stopped below whatever happened to its clean-up
            pass
        finally:
            self._stop_loop(self._loop, self._thread)

    @staticmethod
    def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(_CLOSE_TIMEOUT_S)
        if not thread.is_alive():
            loop.close()

    async def _astart(self) -> None:
        timeout = httpx.Timeout(self.upstream.timeout_s, connect=min(self.upstream.timeout_s, 30.0))
        client = httpx.AsyncClient(timeout=timeout, follow_redirects=False, trust_env=False,
                                   limits=httpx.Limits(max_connections=None, max_keepalive_connections=64))
        self._ctx = UpstreamContext(upstream=self.upstream, limits=self.limits, client=client)
        try:
            self._servers = await self._bind()
        except BaseException:
            await client.aclose()
            raise
        self.port = self._servers[0].sockets[0].getsockname()[1]

    async def _bind(self) -> list[asyncio.Server]:
        for _ in range(64 if self.port == 0 else 1):
            servers: list[asyncio.Server] = []
            port = self.port
            try:
                for address in self.addresses:
                    server = await asyncio.start_server(self._serve, host=address, port=port, reuse_address=True,
                                                        backlog=512)
                    servers.append(server)
                    port = server.sockets[0].getsockname()[1]
                return servers
            except OSError as exc:
                for server in servers:
                    server.close()
                if self.port == 0 and exc.errno == errno.EADDRINUSE and servers:
                    continue  # the port picked on the first address is taken on another: pick again
                raise ProxyError(f"cannot listen on {address}:{port}: {exc.strerror or exc}",
                                 field="CaptureProxy.addresses",
                                 retryable=exc.errno == errno.EADDRINUSE) from exc
        raise ProxyError(f"no port is free on every address of {list(self.addresses)}", field="CaptureProxy.port",
                         retryable=True)

    async def _aclose(self) -> None:
        for server in self._servers:
            server.close()
        for task in list(self._connections):
            task.cancel()
        if self._connections:
            await asyncio.wait(list(self._connections), timeout=_CLOSE_TIMEOUT_S / 2)
        for server in self._servers:
            try:
                async with asyncio.timeout(2.0):
                    await server.wait_closed()
            except TimeoutError:
                pass
        if self._ctx is not None:
            await self._ctx.client.aclose()

    # --- sessions ----------------------------------------------------------------------------------------
    def open_session(self, *, label: str = "") -> ProxySession:
        """A new session with a fresh token (see `ProxySession`).

        Raises:
            ProxyStateError: the proxy is not started, or closed.
        """
        with self._lock:
            if self._state is not _State.OPEN:
                raise ProxyStateError(f"the capture proxy is {self._state.value}: start() it first"
                                      if self._state is _State.UNOPENED else "the capture proxy is closed",
                                      field="CaptureProxy.open_session")
            session = ProxySession(port=self.port, label=label, limits=self.limits,
                                   schedule_cancel=self._schedule_cancel, on_close=self._forget)
            self._sessions[session.digest] = session
            return session

    def _forget(self, session: ProxySession) -> None:
        with self._lock:
            self._sessions.pop(session.digest, None)

    def _lookup(self, token: str | None) -> ProxySession | None:
        if not token:
            return None
        digest = token_digest(token)
        with self._lock:
            session = self._sessions.get(digest)
        if session is None or not hmac.compare_digest(session.digest, digest):
            return None
        return session

    def _schedule_cancel(self, calls: Sequence[_Call]) -> None:
        loop = self._loop
        if loop is None or loop.is_closed():
            return

        def cancel() -> None:
            for call in calls:
                if call.task is not None and not call.task.done():
                    call.task.cancel()

        if threading.current_thread() is self._thread:
            raise ProxyStateError("end_activation() must not be called from the proxy's own thread",
                                  field="ProxySession.end_activation")
        loop.call_soon_threadsafe(cancel)

    # --- serving (the loop thread) ------------------------------------------------------------------------
    def _count(self, name: str) -> None:
        with self._counts_lock:
            setattr(self, name, getattr(self, name) + 1)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        peer = writer.get_extra_info("peername")
        ip = str(peer[0]) if peer else "?"
        conn = HttpConnection(reader, writer, self.limits)
        if self._peers[ip] >= self.limits.max_connections_per_peer:
            self._count("_refused_connections")
            try:
                await conn.send_response(503, json_bytes(error_payload(
                    "openai", 503, f"too many open connections from {ip} (the cap is "
                                   f"{self.limits.max_connections_per_peer}, GYM-10)")), close=True)
            except ClientGone:
                pass
            await conn.close()
            return
        self._peers[ip] += 1
        if task is not None:
            self._connections.add(task)
        try:
            while True:
                try:
                    request = await conn.next_request()
                except RequestRefused as refused:
                    await conn.send_response(refused.status, json_bytes(error_payload(
                        "openai", refused.status, refused.reason)), close=True)
                    break
                if request is None:
                    break
                await self._handle(conn, request)
                if not conn.reusable:
                    break
        except ClientGone:
            pass
        except asyncio.CancelledError:  # the proxy closes: this connection task ends here (its call was recorded)
            pass
        finally:
            self._peers[ip] -= 1
            if self._peers[ip] <= 0:
                del self._peers[ip]
            if task is not None:
                self._connections.discard(task)
            await conn.close()

    async def _handle(self, conn: HttpConnection, request: Any) -> None:
        target = request.target.decode("latin-1")
        route = _ROUTES.get(target.split("?", 1)[0].rstrip("/") or "/")
        api = "anthropic" if route == "messages" else "openai"

        async def refuse(status: int, message: str) -> None:
            await conn.send_response(status, json_bytes(error_payload(api, status, message)), close=True)

        if route is None:
            return await refuse(404, "no such route on the capture proxy: use /v1/chat/completions, "
                                     "/v1/messages or /v1/models")
        if request.method != _METHODS[route]:
            return await refuse(405, f"{route} takes {_METHODS[route].decode()}")
        session = self._lookup(_token(request.headers))
        if session is None:
            self._count("_refused_unauthorized")
            return await refuse(401, "unknown or expired session token")
        state, call = session._admit(recorded=route != "models")
        if state == "closed":
            self._count("_refused_unauthorized")
            return await refuse(401, "unknown or expired session token")
        if state == "outside":
            return await refuse(403, "no activation window is open for this session: model calls are accepted only "
                                     "while the turn's agent runs")
        if state == "over_cap":
            return await refuse(429, f"this activation made {self.limits.max_calls_per_activation} model calls, "
                                     "the cap (GYM-10)")
        if state == "too_many":
            return await refuse(429, f"this session has {self.limits.max_concurrent_calls_per_session} model calls "
                                     "in flight, the cap (GYM-10): wait for one to end")
        if call is None:  # admitted, not recorded: the model list
            return await self._models(conn, api)
        await self._call(conn, request, session, call, api)

    async def _call(self, conn: HttpConnection, request: Any, session: ProxySession, call: _Call, api: str) -> None:
        ctx = self._ctx
        exchange = Exchange(ctx=ctx, conn=conn, request=request, api=api,
                            charge=lambda n: session._charge(call, n))
        task = asyncio.get_running_loop().create_task(exchange.run())
        call.task = task
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:  # the proxy closes: cut the call too
            task.cancel()
            await asyncio.wait([task], timeout=2.0)
            session._record(call, *exchange.cut("cancelled: the capture proxy closed"))
            raise
        if task.cancelled():
            reason = call.cut_reason or "cancelled"
            session._record(call, *exchange.cut(reason))
            await exchange.answer_error(403, reason)
            return
        exc = task.exception()
        if isinstance(exc, ClientGone):
            session._record(call, *exchange.cut("cancelled: the harness closed the connection"))
            return
        if exc is not None:  # a fault of the proxy itself: the harness and the record say so, the proxy serves on
            session._record(call, *exchange.failed(f"internal error of the capture proxy ({type(exc).__name__})"))
            await exchange.answer_error(500, "internal error of the capture proxy")
            return
        session._record(call, *task.result())

    async def _models(self, conn: HttpConnection, api: str) -> None:
        ctx = self._ctx
        headers = {"accept": "application/json"}
        key = ctx.key()
        if key:
            headers["authorization"] = f"Bearer {key}"
        try:
            response = await ctx.client.get(self.upstream.base_url + "/models", headers=headers)
        except httpx.HTTPError as exc:
            await conn.send_response(502, json_bytes(error_payload(
                api, 502, f"the upstream cannot be reached ({type(exc).__name__})")))
            return
        body = response.content
        if response.status_code != 200 or len(body) > self.limits.max_response_bytes:
            await conn.send_response(502, json_bytes(error_payload(
                api, 502, f"the upstream's model list failed (HTTP {response.status_code})")))
            return
        await conn.send_response(200, ctx.scrub_bytes(body))


def _token(headers: Sequence[tuple[bytes, bytes]]) -> str | None:
    bearer = api_key = None
    for name, value in headers:
        lname = name.lower()
        if lname == b"authorization":
            text = value.decode("latin-1").strip()
            if text[:7].lower() == "bearer ":
                bearer = text[7:].strip()
        elif lname == b"x-api-key":
            api_key = value.decode("latin-1").strip()
    return bearer or api_key


# --- the process's proxies ---------------------------------------------------------------------------------------
_shared_lock = threading.Lock()
_shared: dict[tuple[str, tuple[str, ...]], CaptureProxy] = {}


def shared_proxy(upstream: ModelUpstream, *, addresses: Sequence[str] = ("127.0.0.1",),
                 limits: ProxyLimits = ProxyLimits()) -> CaptureProxy:
    """The process's started proxy for ``upstream`` on ``addresses`` (made on first use, kept until the process
    exits; a forked child gets its own). Sessions of different episodes share it; their tokens keep them apart.

    Raises:
        ProxyError: the proxy cannot start (see `CaptureProxy.start`).
    """
    if not isinstance(upstream, ModelUpstream):
        upstream = ModelUpstream.model_validate(upstream)
    key = (upstream.model_dump_json() + repr(limits), tuple(sorted(dict.fromkeys(str(a) for a in addresses))))
    with _shared_lock:
        proxy = _shared.get(key)
        if proxy is not None and proxy.is_open:
            return proxy
        proxy = CaptureProxy(upstream, addresses=key[1], limits=limits)
        proxy.start()
        _shared[key] = proxy
        return proxy


def _close_shared() -> None:
    with _shared_lock:
        proxies = list(_shared.values())
        _shared.clear()
    for proxy in proxies:
        proxy.close()


def _forget_shared_after_fork() -> None:
    global _shared_lock
    _shared_lock = threading.Lock()
    _shared.clear()  # the parent's proxies serve the parent; a child starts its own


atexit.register(_close_shared)
os.register_at_fork(after_in_child=_forget_shared_after_fork)

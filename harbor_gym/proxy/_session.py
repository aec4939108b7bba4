"""`ProxySession`: one episode's token and activation windows on the capture proxy, and `ActivationCalls`, what one
window recorded (SPEC GYM-10, GYM-13; issue 18).

Threads: the session's public methods are called from the episode's thread; the proxy's loop thread admits and
records calls. Both meet under the session's lock; cancelling in-flight calls is handed to the loop thread.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from harbor_gym.agents._model_calls import ModelCall, message_delta
from harbor_gym.errors import HarborGymError

if TYPE_CHECKING:  # pragma: no cover
    import asyncio

__all__ = ["ProxySession", "ActivationCalls", "ProxyError", "ProxyStateError", "token_digest"]

#: How long `ProxySession.end_activation` waits for cancelled calls to record themselves before recording them
#: itself (they normally do within milliseconds: recording comes before answering the harness).
_CANCEL_WAIT_S = 10.0


class ProxyError(HarborGymError):
    """The capture proxy could not do what was asked (e.g. bind its addresses)."""


class ProxyStateError(ProxyError, RuntimeError):
    """A capture-proxy object used out of order (a second window opened, a closed session or proxy used)."""


def token_digest(token: str) -> bytes:
    """The SHA-256 digest sessions are looked up by (the token itself is never kept in a table)."""
    return hashlib.sha256(token.encode("utf-8", "surrogateescape")).digest()


@dataclass(frozen=True)
class ActivationCalls:
    """What one activation window of a `ProxySession` recorded. Frozen, picklable.

    Attributes:
        turn_index: the turn the window was opened for (`ProxySession.begin_activation`).
        calls: the window's model calls, in the order they ended (for a harness that makes one call at a time:
            the order it made them). Request messages as deltas: the first call holds its whole request
            (``messages_offset == 0``), each later one the delta against the call before it (GYM-13). Calls cut by
            `ProxySession.end_activation` are ``status="cancelled"``, holding what had arrived.
        refused_outside: calls made with the session's token *before* this window opened and after the previous
            one ended (or the session opened): answered 403, never forwarded, never recorded.
        refused_over_cap: calls refused inside this window because it had reached
            ``ProxyLimits.max_calls_per_activation``, or had ``ProxyLimits.max_concurrent_calls_per_session``
            calls in flight (answered 429, not recorded).
    """

    turn_index: int
    calls: tuple[ModelCall, ...] = ()
    refused_outside: int = 0
    refused_over_cap: int = 0

    @property
    def refused(self) -> int:
        """Every call refused between the previous window's end and this window's end."""
        return self.refused_outside + self.refused_over_cap

    @property
    def cancelled(self) -> int:
        """How many recorded calls were cut by the window's end."""
        return sum(1 for c in self.calls if c.status == "cancelled")


@dataclass(eq=False)
class _Call:
    """One admitted call in flight (loop-thread side; see `_server`)."""

    window: "_Window"
    seq: int
    started: float = field(default_factory=time.monotonic)
    task: "asyncio.Task[Any] | None" = None
    #: set by `ProxySession._cancel_window` before it cancels the task: why the call was cut
    cut_reason: str | None = None
    done: threading.Event = field(default_factory=threading.Event)


@dataclass(eq=False)
class _Window:
    turn_index: int
    refused_outside: int
    records: list[ModelCall] = field(default_factory=list)
    inflight: set[_Call] = field(default_factory=set)
    admitted: int = 0
    bytes_used: int = 0
    refused_over_cap: int = 0
    previous_full: list[dict[str, Any]] | None = None
    ended: bool = False


class ProxySession:
    """One episode's access to a `CaptureProxy` (made by `CaptureProxy.open_session`; never built directly).

    The sandbox gets ``token`` as its API key and `base_url_for` as its base URL. Calls carrying the token are
    accepted only inside an activation window (`begin_activation` .. `end_activation`) and recorded in that window;
    outside one they are answered 403 and counted (`refused_outside`); after `close` the token is unknown (401).

    Attributes:
        token: the session's secret (``secrets.token_urlsafe(32)``: 256 random bits). Never in ``repr``.
        label: a free label for ``repr`` (e.g. the task id).
    """

    def __init__(self, *, port: int, label: str, limits: Any,
                 schedule_cancel: Callable[[Sequence[_Call]], None],
                 on_close: Callable[["ProxySession"], None]) -> None:
        self.token = secrets.token_urlsafe(32)
        self.digest = token_digest(self.token)
        self.label = str(label)
        self.port = int(port)
        self._limits = limits
        self._schedule_cancel = schedule_cancel
        self._on_close = on_close
        self._lock = threading.Lock()
        self._window: _Window | None = None
        self._closed = False
        self._refused_outside = 0
        self._refused_at_last_end = 0
        self._seq = 0

    def __repr__(self) -> str:
        state = "closed" if self._closed else ("active" if self._window is not None else "idle")
        return f"ProxySession(label={self.label!r}, port={self.port}, state={state})"

    def __reduce__(self):  # a session is bound to its process's proxy: it never pickles (and never leaks its token)
        raise TypeError("ProxySession cannot be pickled: it belongs to this process's capture proxy")

    # --- what the sandbox is told --------------------------------------------------------------------------
    def base_url_for(self, address: str) -> str:
        """The OpenAI base URL (``http://ADDR/v1``) at ``address``: ``"IP:PORT"`` as the sandbox reaches the
        proxy (e.g. ``Sandbox.host_service_address``), or a bare IP (the proxy's port is added)."""
        return f"http://{self._host_port(address)}/v1"

    def anthropic_base_url_for(self, address: str) -> str:
        """The Anthropic base URL (``http://ADDR``, the SDK adds ``/v1/messages``) at ``address`` (as
        `base_url_for`)."""
        return f"http://{self._host_port(address)}"

    def _host_port(self, address: str) -> str:
        address = str(address).strip()
        if address.startswith("["):
            return address if "]:" in address else f"{address}:{self.port}"
        if address.count(":") == 1:
            return address
        if address.count(":") > 1:  # a bare IPv6 address
            return f"[{address}]:{self.port}"
        return f"{address}:{self.port}"

    # --- windows -------------------------------------------------------------------------------------------
    @property
    def refused_outside(self) -> int:
        """Calls made with this token while no window was open, since the session opened (403, never forwarded,
        never attributed to a turn). A running total: diff two readings for a span."""
        with self._lock:
            return self._refused_outside

    @property
    def is_active(self) -> bool:
        """True while an activation window is open."""
        with self._lock:
            return self._window is not None

    @property
    def is_closed(self) -> bool:
        """True once `close` ran (the token is dead)."""
        with self._lock:
            return self._closed

    def begin_activation(self, turn_index: int) -> None:
        """Open an activation window for turn ``turn_index``: calls with the token are accepted from now and
        recorded in this window.

        Raises:
            ProxyStateError: a window is already open, or the session is closed.
        """
        with self._lock:
            if self._closed:
                raise ProxyStateError("the proxy session is closed", field="ProxySession.begin_activation")
            if self._window is not None:
                raise ProxyStateError(f"an activation window (turn {self._window.turn_index}) is already open; "
                                      "end_activation() it first", field="ProxySession.begin_activation")
            self._window = _Window(turn_index=int(turn_index),
                                   refused_outside=self._refused_outside - self._refused_at_last_end)

    def end_activation(self) -> ActivationCalls:
        """Close the window: calls are refused (403) from now; every call still in flight is cancelled at once
        (its upstream request closed, the harness answered with an error if still connected) and recorded
        ``cancelled`` with what had arrived.

        Returns:
            The window's calls in order and its refused counts (`ActivationCalls`).

        Raises:
            ProxyStateError: no window is open.
        """
        with self._lock:
            window = self._window
            if window is None:
                raise ProxyStateError("no activation window is open", field="ProxySession.end_activation")
            self._window = None
            self._refused_at_last_end = self._refused_outside
            inflight = list(window.inflight)
        self._cut(window, inflight, "cancelled: the activation window ended (the turn's budget or its end)")
        with self._lock:
            window.ended = True
            return ActivationCalls(turn_index=window.turn_index, calls=tuple(window.records),
                                   refused_outside=window.refused_outside, refused_over_cap=window.refused_over_cap)

    def close(self) -> None:
        """The token is dead from now (401); an open window is ended and its calls dropped. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            window, self._window = self._window, None
        self._on_close(self)
        if window is not None:
            with self._lock:
                inflight = list(window.inflight)
            self._cut(window, inflight, "cancelled: the proxy session closed")
            with self._lock:
                window.ended = True

    def __enter__(self) -> "ProxySession":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _cut(self, window: _Window, inflight: list[_Call], reason: str) -> None:
        if not inflight:
            return
        for call in inflight:
            call.cut_reason = reason
        self._schedule_cancel(inflight)
        deadline = time.monotonic() + _CANCEL_WAIT_S
        for call in inflight:
            call.done.wait(max(0.0, deadline - time.monotonic()))
        with self._lock:
            for call in inflight:
                if not call.done.is_set():  # the loop did not get to it: record it here, later records are dropped
                    self._append(window, call, ModelCall(status="cancelled", error=reason,
                                                         latency_s=time.monotonic() - call.started), None)

    # --- the loop thread's side ----------------------------------------------------------------------------
    def _admit(self, *, recorded: bool = True) -> tuple[str, _Call | None]:
        """Admit one request: ``("ok", call)`` (``call`` is ``None`` for a request that is not recorded, e.g. the
        model list), or ``("closed" | "outside" | "over_cap" | "too_many", None)`` (``too_many``: the session
        has ``max_concurrent_calls_per_session`` calls in flight)."""
        with self._lock:
            if self._closed:
                return "closed", None
            window = self._window
            if window is None:
                self._refused_outside += 1
                return "outside", None
            if not recorded:
                return "ok", None
            if window.admitted >= self._limits.max_calls_per_activation:
                window.refused_over_cap += 1
                return "over_cap", None
            if len(window.inflight) >= self._limits.max_concurrent_calls_per_session:
                window.refused_over_cap += 1
                return "too_many", None
            window.admitted += 1
            self._seq += 1
            call = _Call(window=window, seq=self._seq)
            window.inflight.add(call)
            return "ok", call

    def _charge(self, call: _Call, nbytes: int) -> bool:
        """Count ``nbytes`` of traffic against the call's window; False once the window's byte cap is passed."""
        with self._lock:
            call.window.bytes_used += nbytes
            return call.window.bytes_used <= self._limits.max_activation_bytes

    def _record(self, call: _Call, record: ModelCall, full_messages: list[dict[str, Any]] | None) -> None:
        """Record the call's `ModelCall` in its window (``request_messages`` of ``record`` are replaced by the
        delta of ``full_messages`` against the window's previous call). A call recorded already is left alone."""
        with self._lock:
            if not call.done.is_set():
                self._append(call.window, call, record, full_messages)

    def _append(self, window: _Window, call: _Call, record: ModelCall,
                full_messages: list[dict[str, Any]] | None) -> None:
        window.inflight.discard(call)
        call.done.set()
        if window.ended:
            return
        messages = full_messages or []
        offset, delta = message_delta(window.previous_full, messages)
        window.previous_full = messages
        window.records.append(_replace(record, request_messages=delta, messages_offset=offset))


def _replace(record: ModelCall, **changes: Any) -> ModelCall:
    from dataclasses import replace

    return replace(record, **changes)

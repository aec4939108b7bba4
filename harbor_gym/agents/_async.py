"""Async agents (issue 15): ``async def run(turn)`` using ``await turn.aexec(...)``, driven by the sync engine.

The engine calls an agent's ``run`` in a worker thread of its own (GYM-5). `AsyncAgentBridge` is the sync face of
an async agent for that thread:

- with an event loop (``env.astep`` passes the running one), the agent's coroutine runs ON that loop (its model
  calls, timers and locks live where the trainer's do) while the engine's thread waits and serves the turn's
  ``aexec`` requests itself: a sandbox command never runs on the loop and needs no pool thread (so a bounded pool
  can never deadlock on its own agents); the turn's ``aexec`` calls run one at a time, in order of arrival;
- without a loop (a sync ``env.step`` with an async agent), the coroutine runs in a private loop of that thread
  (``asyncio.run``) and each ``aexec`` in a short-lived thread of its own.

When the engine stops the activation (budget spent, GYM-5) or the turn is cancelled (``cancel()``), the agent's
coroutine is cancelled. Attributes the engine reads (``name``, ``version``, ``supports_continue``, ``timeout_sec``,
...) are the agent's own.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import inspect
import queue
import threading
from typing import Any, Callable

__all__ = ["AsyncAgentBridge", "is_async_agent", "bridge_for", "ExecChannel"]

_METHODS = ("run", "start", "continue_turn")
#: How often the waiting engine thread looks at the turn's expiry (seconds).
_POLL_S = 0.2
_DONE = object()


def is_async_agent(obj: Any) -> bool:
    """True iff ``run`` (or a `HarnessSession` method) of ``obj`` is a coroutine function."""
    return any(inspect.iscoroutinefunction(getattr(obj, m, None)) for m in _METHODS)


class ExecChannel:
    """Sandbox calls handed from the agent's coroutine (on the loop) to the engine's waiting thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._queue: "queue.Queue[Any]" = queue.Queue()

    async def submit(self, call: Callable[[], Any]) -> Any:
        """Run ``call`` on the serving thread; the loop is never blocked."""
        future = self._loop.create_future()
        self._queue.put((call, future))
        return await future

    def done(self) -> None:
        self._queue.put(_DONE)

    def serve(self, finished: Callable[[], bool], should_cancel: Callable[[], bool], cancel: Callable[[], None]) -> None:
        """Serve calls until ``finished()``; calls ``cancel()`` once ``should_cancel()`` turns true."""
        cancelled = False
        while not finished():
            try:
                item = self._queue.get(timeout=_POLL_S)
            except queue.Empty:
                item = None
            if item is _DONE:
                continue
            if item is not None:
                call, future = item
                try:
                    value, error = call(), None
                except BaseException as exc:  # handed to the awaiting coroutine, as a direct call would raise it
                    value, error = None, exc
                self._loop.call_soon_threadsafe(_settle, future, value, error)
            if not cancelled and should_cancel():
                cancelled = True
                cancel()


def _settle(future: asyncio.Future, value: Any, error: BaseException | None) -> None:
    if future.done():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(value)


class AsyncAgentBridge:
    """The sync face of an async agent (see the module docstring). One bridge per agent object and env, so that a
    continued session (SES-3) sees the same action object every turn."""

    def __init__(self, agent: Any) -> None:
        self._agent = agent
        self.loop: asyncio.AbstractEventLoop | None = None
        self._lock = threading.Lock()
        self._running: list[Any] = []  # concurrent futures of the coroutines in flight
        self._cancelled = False
        if not isinstance(getattr(agent, "name", None), str):
            self.name = type(agent).__name__

    @property
    def agent(self) -> Any:
        """The wrapped agent."""
        return self._agent

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("_agent",):
            raise AttributeError(name)
        return getattr(self._agent, name)

    def run(self, turn: Any) -> Any:
        return self._drive(self._agent.run, turn)

    def cancel(self) -> None:
        """Cancel the coroutine(s) in flight (the turn was cancelled); later activations start normally."""
        with self._lock:
            self._cancelled = True
            running = list(self._running)
        for fut in running:
            fut.cancel()

    def rearm(self) -> None:
        """Clear a previous ``cancel`` (a new episode)."""
        with self._lock:
            self._cancelled = False

    def _drive(self, method: Callable[[Any], Any], turn: Any) -> Any:
        if not inspect.iscoroutinefunction(method):
            return method(turn)
        loop = self.loop
        if loop is None or loop.is_closed() or not loop.is_running():
            try:
                return _run_private(_expiring(method(turn), turn))
            except (asyncio.CancelledError, concurrent.futures.CancelledError):
                return _cancelled_outcome(turn)
        channel = ExecChannel(loop)
        object.__setattr__(turn, "_channel", channel)
        fut = asyncio.run_coroutine_threadsafe(method(turn), loop)
        fut.add_done_callback(lambda _f: channel.done())
        with self._lock:
            self._running.append(fut)
            if self._cancelled:
                fut.cancel()
        try:
            channel.serve(fut.done, lambda: bool(turn.is_expired or self._cancelled), fut.cancel)
            try:
                return fut.result()
            except (asyncio.CancelledError, concurrent.futures.CancelledError):
                return _cancelled_outcome(turn)
        finally:
            object.__setattr__(turn, "_channel", None)
            with self._lock:
                self._running.remove(fut)


class _SessionBridge(AsyncAgentBridge):
    """A bridge for an agent implementing `HarnessSession` (SES-3): ``start``/``continue_turn``/``close``."""

    def start(self, turn: Any) -> Any:
        return self._drive(self._agent.start, turn)

    def continue_turn(self, turn: Any) -> Any:
        return self._drive(self._agent.continue_turn, turn)

    def close(self) -> None:
        close = self._agent.close
        if inspect.iscoroutinefunction(close):
            loop = self.loop
            if loop is not None and loop.is_running() and not _on_loop(loop):
                asyncio.run_coroutine_threadsafe(close(), loop).result(60)
            else:
                _run_private(close())
            return
        close()


def _cancelled_outcome(turn: Any) -> Any:
    """The outcome of a coroutine the engine (budget) or the trainer (cancel) stopped."""
    from harbor_gym.agents._outcome import AgentOutcome, AgentStatus

    status = AgentStatus.TIMEOUT if turn.is_expired else AgentStatus.ERROR
    return AgentOutcome(status=status, output_tail="harbor_gym: the async agent's coroutine was cancelled")


def _on_loop(loop: asyncio.AbstractEventLoop) -> bool:
    try:
        return asyncio.get_running_loop() is loop
    except RuntimeError:
        return False


def _run_private(coro: Any) -> Any:
    """Run ``coro`` to completion in a private loop (in a thread of its own if this thread already runs one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(coro)
    box: list[Any] = []
    worker = threading.Thread(target=lambda: box.append(asyncio.run(coro)), daemon=True)
    worker.start()
    worker.join()
    return box[0] if box else None


async def _expiring(coro: Any, turn: Any) -> Any:
    """``coro`` cancelled once ``turn`` expires (the private-loop case)."""
    task = asyncio.ensure_future(coro)
    while not task.done():
        await asyncio.wait({task}, timeout=_POLL_S)
        if not task.done() and turn.is_expired:
            task.cancel()
    return task.result()


def bridge_for(agent: Any, cache: dict[int, AsyncAgentBridge], loop: asyncio.AbstractEventLoop | None) -> Any:
    """``agent`` itself when it is not async, else its bridge from ``cache`` (made once), bound to ``loop``."""
    if isinstance(agent, AsyncAgentBridge):
        agent.loop = loop
        return agent
    if agent is None or not is_async_agent(agent):
        return agent
    bridge = cache.get(id(agent))
    if bridge is None or bridge.agent is not agent:
        has_session = all(callable(getattr(agent, m, None)) for m in ("start", "continue_turn", "close"))
        bridge = (_SessionBridge if has_session else AsyncAgentBridge)(agent)
        cache[id(agent)] = bridge
    bridge.loop = loop
    return bridge

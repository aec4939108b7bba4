"""`SessionDriver`: the harness sessions of one episode (SPEC SES-1..4) — which session an activation belongs to,
which protocol call runs it (``run``, ``start``, ``continue_turn``), and when a session closes."""

from __future__ import annotations

import logging
import threading
from typing import Any

from harbor_gym.agents import AgentOutcome, Session, Turn, is_harness_session
from harbor_gym.config import TurnSessions
from harbor_gym.errors import SessionMismatchError

__all__ = ["SessionDriver"]

_log = logging.getLogger("harbor_gym.episode")

#: Bound of one ``close()`` call of a harness session; an overrun is logged and the episode goes on.
CLOSE_BOUND_S = 120.0


class SessionDriver:
    """The sessions of one episode.

    ``fresh`` (SES-2): every activation gets a new `Session`; a `HarnessSession` agent gets ``start(turn)`` and,
    right after it, ``close()``; any other agent gets ``run(turn)``. More than one session ran → the episode's
    cumulative session (``session``) is ``None`` and its transcript empty.

    ``continue`` (SES-3): one `Session` for the episode, bound to the agent announced at ``start`` (GYM-4); every
    turn's action must be that very object (`check`). A `HarnessSession` agent gets ``start(turn)`` on the first
    activation, ``continue_turn(turn)`` on later ones and ``close()`` exactly once: after the last activation and
    before its verifier, or when the episode stops early or is closed (`close`). An agent with only ``run(turn)``
    gets ``run`` every turn with the same ``turn.session`` (``activations``, ``state``) carrying the continuation;
    nothing is called on it at the end, the session is only marked closed.

    ``close()`` is called only for a session whose ``start`` was called (even if ``start`` failed); an exception
    or overrun (`CLOSE_BOUND_S`) of ``close()`` is logged and changes no turn's outcome.
    """

    def __init__(self, mode: TurnSessions | str, agent: Any) -> None:
        self.mode = TurnSessions(mode)
        self.agent = agent
        self._current: Session | None = None
        self._current_agent: Any = None
        self._current_started = False
        self._sessions_run = 0
        self._last: Session | None = None

    @property
    def continued(self) -> bool:
        """True under ``turn_sessions = "continue"`` (SES-3)."""
        return self.mode is TurnSessions.CONTINUE

    @property
    def session(self) -> Session | None:
        """The episode's cumulative session: the continued one (SES-3), or the only fresh one if exactly one ran
        (SES-2); ``None`` before any activation and when more than one fresh session ran."""
        return self._last if self._sessions_run == 1 or (self.continued and self._sessions_run) else None

    def check(self, action: Any, *, index: int, step_name: str) -> None:
        """SES-3: under ``continue`` the action must be the announced agent object; nothing runs otherwise.

        A pickled copy of the announced agent counts as it when its class defines value equality (`_same_by_value`).

        Raises:
            SessionMismatchError: (a ``ValueError``) a different object; no side effect.
        """
        if self.continued and action is not self.agent and not _same_by_value(action, self.agent):
            raise SessionMismatchError(
                f"turn_sessions='continue': turn {index} (step {step_name!r}) got a {type(action).__name__} that is "
                f"not the agent object announced at reset ({type(self.agent).__name__}); pass the same object "
                "every turn", field="action", rule="SES-3")

    def session_for_activation(self, agent: Any) -> Session:
        """The session the next activation of ``agent`` belongs to: a new one under ``fresh`` (the previous one is
        closed first, should it still be open) and for the first activation under ``continue``."""
        if self.continued and self._current is not None and not self._current.closed:
            return self._current
        self.close()
        self._current = Session(mode=self.mode.value)
        self._current_agent, self._current_started = agent, False
        return self._current

    def invoke(self, agent: Any, turn: Turn) -> Any:
        """Run one activation with the call SES-3 prescribes (``start``/``continue_turn`` for a `HarnessSession`
        agent, else ``run``); returns what the agent returned, raises what it raised."""
        if not is_harness_session(agent):
            return agent.run(turn)
        if not self._current_started:
            self._current_started = True  # set before the call: a failed start still gets its close()
            return agent.start(turn)
        return agent.continue_turn(turn)

    def after_activation(self, turn: Turn, outcome: AgentOutcome, *, is_last_step: bool) -> None:
        """Record the activation in its session (transcript, response, count); close the session when that was its
        last activation (``fresh``: always; ``continue``: on the last step), before the turn's verifier."""
        session = turn.session
        if not isinstance(session, Session):
            return
        if session.activations == 0:
            self._sessions_run += 1
            self._last = session
        for step in [{"source": "user", "message": turn.instruction}, *(dict(s) for s in outcome.trajectory or ())]:
            step["step_id"] = len(session.transcript) + 1
            session.transcript.append(step)
        session.response = outcome.response
        session.activations += 1
        if not self.continued or is_last_step:
            self.close()

    def close(self) -> None:
        """End the current session (idempotent): ``close()`` on its `HarnessSession` agent if it was started,
        exactly once per session."""
        session, agent, started = self._current, self._current_agent, self._current_started
        self._current, self._current_agent, self._current_started = None, None, False
        if session is None or session.closed:
            return
        session.closed = True
        if started and is_harness_session(agent):
            _bounded_close(agent)


def _same_by_value(action: Any, agent: Any) -> bool:
    """SES-3 across a process boundary: an action that is a copy of the announced agent (``AsyncVectorEnv`` and Ray
    ship actions pickled) counts as the same object when its class defines value equality (``__eq__`` of its own,
    e.g. `ChatAgent`, whose conversation lives in ``turn.session``) and it compares equal."""
    cls = type(agent)
    return type(action) is cls and cls.__eq__ is not object.__eq__ and bool(action == agent)


def _bounded_close(agent: Any) -> None:
    box: list[BaseException] = []

    def work() -> None:
        try:
            agent.close()
        except BaseException as exc:  # the agent's own defect: logged, never the turn's outcome
            box.append(exc)

    worker = threading.Thread(target=work, daemon=True, name="harbor-gym-session-close")
    worker.start()
    worker.join(CLOSE_BOUND_S)
    if worker.is_alive():
        _log.warning("close() of the harness session overran %.0f s (SES-3); going on", CLOSE_BOUND_S)
    elif box:
        _log.warning("close() of the harness session failed (SES-3): %r", box[0])

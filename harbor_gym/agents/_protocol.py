"""The `Agent` protocol (anything with ``run(turn) -> AgentOutcome``) and the harness session protocol (SES-3)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    from harbor_gym.agents._outcome import AgentOutcome
    from harbor_gym.agents._turn import Turn

__all__ = ["Agent", "HarnessSession", "is_agent", "is_harness_session", "supports_continue", "agent_timeout_cap",
           "agent_identity"]


@runtime_checkable
class Agent(Protocol):
    """GYM-4: an action object. ``run`` is called once per turn and returns an `AgentOutcome`.

    Optional attributes the engine reads: ``supports_continue`` (bool, SES-3/LOAD-22), ``timeout_sec`` (the
    harness cap of BUD-1), ``name`` and ``version`` (the ATIF ``agent`` block, VER-10), ``model_name``.
    """

    def run(self, turn: "Turn") -> "AgentOutcome": ...


@runtime_checkable
class HarnessSession(Protocol):
    """SES-3: one conversation kept across the turns of a continued episode.

    ``start`` runs the first activation, ``continue_turn`` each later one (the conversation, kept on disk inside the
    sandbox, goes on), ``close`` ends it after the last activation and before its verifier. An object implementing
    all three is driven by them in both modes (it needs no ``run``): under ``turn_sessions = "continue"``
    ``start`` once, ``continue_turn`` on every later turn and ``close`` exactly once, after the last activation
    and before its verifier, or when the episode stops early or is closed; under ``"fresh"`` (SES-2) ``start``
    then ``close`` around every turn's activation. ``close`` is only called for a session that was started.
    """

    def start(self, turn: "Turn") -> "AgentOutcome": ...

    def continue_turn(self, turn: "Turn") -> "AgentOutcome": ...

    def close(self) -> None: ...


def is_agent(obj: Any) -> bool:
    """True iff ``obj`` can act as an agent: it has a callable ``run`` or implements `HarnessSession`."""
    return callable(getattr(obj, "run", None)) or is_harness_session(obj)


def is_harness_session(obj: Any) -> bool:
    """SES-3: True iff ``obj`` has callable ``start``, ``continue_turn`` and ``close`` (the `HarnessSession`
    protocol); such an agent is driven by them instead of ``run``."""
    return all(callable(getattr(obj, name, None)) for name in ("start", "continue_turn", "close"))


def supports_continue(obj: Any) -> bool:
    """LOAD-22: True iff the agent declares ``supports_continue = True``."""
    return bool(getattr(obj, "supports_continue", False))


def agent_timeout_cap(obj: Any) -> float | None:
    """BUD-1: the agent's own time limit (its ``timeout_sec``, else ``timeout``), if a positive number."""
    for attr in ("timeout_sec", "timeout"):
        value = getattr(obj, attr, None)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0:
            return float(value)
    return None


def agent_identity(obj: Any) -> dict[str, str]:
    """VER-10: the ATIF ``agent`` block ``{name, version[, model_name]}`` of ``obj``."""
    name = getattr(obj, "name", None)
    if not isinstance(name, str) or not name:
        name = type(obj).__name__
    version = getattr(obj, "version", None)
    ident = {"name": name, "version": str(version) if version else "unknown"}
    model = getattr(obj, "model_name", None)
    if isinstance(model, str) and model:
        ident["model_name"] = model
    return ident

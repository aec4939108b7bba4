"""`Session`: the harness session an activation belongs to (``Turn.session``; SPEC SES-1..4)."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any

__all__ = ["Session"]


@dataclass(eq=False)
class Session:
    """One harness session (SES-2/3), handed to every activation of it as ``turn.session``.

    With ``turn_sessions = "fresh"`` (SES-2) each turn gets a new `Session` whose only input is its instruction;
    with ``"continue"`` (SES-3) every turn of the episode gets the same object, so an agent that only has
    ``run(turn)`` can tell a first activation (``activations == 0``) from a later one and keep its own state in
    ``state`` (the conversation itself stays on disk inside the sandbox; the env never touches it, TURN-6).
    The engine updates ``activations``, ``transcript``, ``response`` and ``closed``; agents only read them.

    Attributes:
        mode: ``"fresh"`` or ``"continue"``.
        id: a unique id of the session (hex).
        activations: how many activations of this session ended before the current one.
        state: free for the agent; kept across the activations of a continued session.
        transcript: the cumulative ATIF steps of the session (each activation's ``user`` step with its instruction,
            then its agent's trajectory steps; ``step_id`` numbered 1, 2, … across the session).
        response: the last activation's response (SES-3, STOP-9).
        closed: the session has ended (after its last activation, before that activation's verifier).
    """

    mode: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    activations: int = 0
    state: dict[str, Any] = field(default_factory=dict)
    transcript: list[dict[str, Any]] = field(default_factory=list)
    response: str | None = None
    closed: bool = False

    @property
    def is_continued(self) -> bool:
        """True iff an earlier activation of this session already ran (the next call is a ``continue_turn``)."""
        return self.activations > 0

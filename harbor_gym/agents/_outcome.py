"""`AgentOutcome`: what one agent activation reports back to the turn engine (SPEC GYM-5, STOP-6)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from harbor_gym.config import AgentOutcomePolicy

__all__ = ["AgentOutcome", "AgentStatus", "AgentOutcomePolicy"]


class AgentStatus(str, enum.Enum):
    """GYM-5: how an activation ended. ``timeout`` is graded; ``error`` follows its policy (STOP-6)."""

    COMPLETED = "completed"
    TIMEOUT = "timeout"
    ERROR = "error"


@dataclass(frozen=True)
class AgentOutcome:
    """The result of ``agent.run(turn)`` (GYM-5). Frozen and picklable.

    Attributes:
        status: ``completed``, ``timeout`` or ``error`` (a `str` is accepted and converted).
        policy: for ``error`` only: ``grade`` (verify as usual), ``retry`` or ``fail`` (end ungraded, STOP-6);
            ``None`` means the env's ``agent_outcome_policy``.
        trajectory: ATIF steps of this activation (dicts, VER-10), without the leading user step; ``None``: none.
        response: the agent's final answer, if any (STOP-9: the episode's response is the last one).
        exit_code: the exit code of the command the agent ran, if it ran one.
        output_tail: the end of the agent's output, for logs and ``info``.
    """

    status: AgentStatus = AgentStatus.COMPLETED
    policy: AgentOutcomePolicy | None = None
    trajectory: tuple[Mapping[str, Any], ...] | None = None
    response: str | None = None
    exit_code: int | None = None
    output_tail: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        try:
            object.__setattr__(self, "status", AgentStatus(self.status))
            if self.policy is not None:
                object.__setattr__(self, "policy", AgentOutcomePolicy(self.policy))
        except ValueError as exc:
            raise ValueError(f"AgentOutcome: {exc} (GYM-5)") from exc
        if self.trajectory is not None:
            object.__setattr__(self, "trajectory", tuple(dict(s) for s in self.trajectory))
        object.__setattr__(self, "metadata", dict(self.metadata))

    def effective_policy(self, default: AgentOutcomePolicy) -> AgentOutcomePolicy | None:
        """STOP-6: the policy in force for an ``error`` outcome (its own, else ``default``); ``None`` otherwise."""
        if self.status is not AgentStatus.ERROR:
            return None
        return self.policy if self.policy is not None else AgentOutcomePolicy(default)

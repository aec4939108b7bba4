"""`AgentOutcome`: what one agent activation reports back to the turn engine (SPEC GYM-5, STOP-6)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Any, Mapping

from harbor_gym.agents._model_calls import ModelCall
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
        metadata: free, plain data (JSON-able, so that it crosses to Ray callers and rollout files).
        model_calls: the activation's model calls (GYM-13) for agents that hand them over at the end; an agent may
            instead record them as they happen with ``turn.record_model_call``. The turn record holds both.
        failure_kind: for an ``error`` ending the turn (policy ``retry``/``fail``) only: the agent's own kind
            (``namespace:name``, e.g. ``harbor_gym:model_unreachable``), recorded instead of
            ``harbor_gym:agent_retry``/``agent_failed``; ``output_tail`` then says why in its first line.
    """

    status: AgentStatus = AgentStatus.COMPLETED
    policy: AgentOutcomePolicy | None = None
    trajectory: tuple[Mapping[str, Any], ...] | None = None
    response: str | None = None
    exit_code: int | None = None
    output_tail: str | None = None
    metadata: Mapping[str, Any] = field(default_factory=dict)
    model_calls: tuple[ModelCall, ...] = ()
    failure_kind: str | None = None

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
        object.__setattr__(self, "model_calls", tuple(ModelCall.coerce(c) for c in self.model_calls))

    def to_dict(self) -> dict[str, Any]:
        """GYM-13: JSON-able data of every field (enums as their values, calls as dicts)."""
        return {"status": self.status.value, "policy": self.policy.value if self.policy else None,
                "trajectory": None if self.trajectory is None else [dict(s) for s in self.trajectory],
                "response": self.response, "exit_code": self.exit_code, "output_tail": self.output_tail,
                "metadata": dict(self.metadata), "model_calls": [c.to_dict() for c in self.model_calls],
                "failure_kind": self.failure_kind}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "AgentOutcome":
        """The inverse of `to_dict`."""
        return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})

    @classmethod
    def coerce(cls, value: "AgentOutcome | Mapping[str, Any] | None") -> "AgentOutcome | None":
        """``value`` itself (or ``None``), or an `AgentOutcome` rebuilt from its `to_dict` form."""
        if value is None or isinstance(value, AgentOutcome):
            return value
        return cls.from_dict(value)

    def effective_policy(self, default: AgentOutcomePolicy) -> AgentOutcomePolicy | None:
        """STOP-6: the policy in force for an ``error`` outcome (its own, else ``default``); ``None`` otherwise."""
        if self.status is not AgentStatus.ERROR:
            return None
        return self.policy if self.policy is not None else AgentOutcomePolicy(default)

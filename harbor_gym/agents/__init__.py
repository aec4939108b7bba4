"""harbor_gym.agents: what an action can be — a bash script (``str``), the `Oracle`, or any object with
``run(turn) -> AgentOutcome`` (SPEC GYM-4, GYM-5, ORACLE-1/2), the ATIF trajectory document (VER-10), the model-call
records of the data plane with their token segments, `ChatAgent`, an agent over an OpenAI-compatible endpoint
(GYM-13), and `CommandAgent`, an installed harness run as one command line in the sandbox (issue 18)."""

from harbor_gym.agents._atif import ATIF_VERSION, TrajectoryError, build_trajectory, validate_trajectory
from harbor_gym.agents._chat import ChatAgent
from harbor_gym.agents._command import CommandAgent
from harbor_gym.agents._model_calls import ModelCall, full_requests
from harbor_gym.agents._oracle import Oracle
from harbor_gym.agents._outcome import AgentOutcome, AgentOutcomePolicy, AgentStatus
from harbor_gym.agents._protocol import (
    Agent,
    HarnessSession,
    agent_identity,
    agent_timeout_cap,
    is_agent,
    is_harness_session,
    supports_continue,
)
from harbor_gym.agents._script import ScriptAgent
from harbor_gym.agents._segments import TokenSegment, token_segments
from harbor_gym.agents._session import Session
from harbor_gym.agents._turn import Turn

__all__ = [
    "Agent",
    "AgentOutcome",
    "AgentOutcomePolicy",
    "AgentStatus",
    "ChatAgent",
    "CommandAgent",
    "ModelCall",
    "TokenSegment",
    "full_requests",
    "token_segments",
    "HarnessSession",
    "Oracle",
    "ScriptAgent",
    "Session",
    "Turn",
    "ATIF_VERSION",
    "TrajectoryError",
    "build_trajectory",
    "validate_trajectory",
    "agent_identity",
    "agent_timeout_cap",
    "is_agent",
    "is_harness_session",
    "supports_continue",
    "as_agent",
]


def as_agent(action: object) -> Agent:
    """GYM-4: the agent an action stands for (a ``str`` becomes a `ScriptAgent`).

    Raises:
        TypeError: ``action`` is neither a ``str`` nor an object with a callable ``run`` nor a `HarnessSession`
            (``start``/``continue_turn``/``close``, SES-3).
    """
    if isinstance(action, str):
        return ScriptAgent(action)
    if is_agent(action):
        return action  # type: ignore[return-value]
    raise TypeError("an action must be a str, Oracle(), an object with run(turn) or a HarnessSession; got "
                    f"{type(action).__name__} (GYM-4)")

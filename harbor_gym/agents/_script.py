"""`ScriptAgent`: a ``str`` action is a bash script run in the workdir as the turn's agent user (GYM-4)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping

from harbor_gym.agents._outcome import AgentOutcome, AgentStatus
from harbor_gym.agents._turn import Turn

__all__ = ["ScriptAgent", "tail", "run_bash"]

#: How much of an activation's output the records keep (``output_tail``).
TAIL_CHARS = 4096


def tail(text: str, limit: int = TAIL_CHARS) -> str:
    """The last ``limit`` characters of ``text``."""
    return text if len(text) <= limit else text[-limit:]


@dataclass(frozen=True)
class ScriptAgent:
    """GYM-4: runs ``script`` with ``bash -c`` as the turn's user, in the workdir, under the turn's budget.

    The environment holds ``HARBOR_STEP_NAME``, ``HARBOR_STEP_INDEX`` (0-based) and ``HARBOR_NUM_STEPS``. The exit
    code is recorded, never a failure; overrunning the budget gives ``status = timeout``.
    """

    script: str
    name: str = "script"
    version: str = "1"

    def run(self, turn: Turn) -> AgentOutcome:
        """Run the script once and report its exit code and output tail (GYM-4)."""
        return run_bash(turn, self.script)


def run_bash(turn: Turn, script: str, *, env: Mapping[str, str] | None = None) -> AgentOutcome:
    """GYM-4: run ``script`` once with ``bash -c`` through ``turn.exec`` (the turn's user, workdir and budget), with
    ``HARBOR_STEP_NAME``, ``HARBOR_STEP_INDEX`` (0-based), ``HARBOR_NUM_STEPS`` and then ``env`` over the turn's
    variables; the outcome holds the exit code (``None`` on a timeout, whose status is ``timeout``) and the tail
    of stdout then stderr."""
    step_env = {
        "HARBOR_STEP_NAME": turn.step_name,
        "HARBOR_STEP_INDEX": str(turn.index),
        "HARBOR_NUM_STEPS": str(turn.num_steps),
        **(env or {}),
    }
    result = turn.exec(["bash", "-c", script], env=step_env)
    output = result.stdout + (("\n" + result.stderr) if result.stderr else "")
    status = AgentStatus.TIMEOUT if result.timed_out else AgentStatus.COMPLETED
    return AgentOutcome(status=status, exit_code=None if result.timed_out else result.exit_code,
                        output_tail=tail(output))

"""`Oracle`: the action that runs each step's reference solution (SPEC ORACLE-1, ORACLE-2)."""

from __future__ import annotations

from harbor_gym.agents._outcome import AgentOutcome, AgentStatus
from harbor_gym.agents._script import tail
from harbor_gym.agents._turn import Turn

__all__ = ["Oracle", "ORACLE_LOG", "ORACLE_RUN"]

#: ORACLE-2: where the oracle's output goes inside the sandbox.
ORACLE_LOG = "/logs/agent/oracle.txt"

# Make solve.sh executable and run it directly (its shebang picks the interpreter), output to the log; print the
# log's tail so the host gets it without another round trip.
ORACLE_RUN = (
    "chmod +x /solution/solve.sh 2>/dev/null; mkdir -p /logs/agent 2>/dev/null; rm -f " + ORACLE_LOG + " 2>/dev/null; "
    "/solution/solve.sh > " + ORACLE_LOG + " 2>&1"
)
_RUN = ORACLE_RUN + "; rc=$?; tail -c 4096 " + ORACLE_LOG + " 2>/dev/null; exit $rc"


class Oracle:
    """ORACLE-1/2: before each activation the engine empties ``/solution`` and fills it with the step's solution
    folder (``steps/<name>/solution/`` if it exists, else ``solution/``); ``run`` then makes ``/solution/solve.sh``
    executable and runs it directly as the step's agent user under the agent budget, with ``[solution].env`` and
    ``DEBIAN_FRONTEND=noninteractive``, output to ``/logs/agent/oracle.txt``. A non-zero exit is only recorded.
    """

    name = "oracle"
    version = "1"
    supports_continue = False

    def run(self, turn: Turn) -> AgentOutcome:
        """Run ``/solution/solve.sh`` once (ORACLE-2)."""
        env = {**turn.solution_env, "DEBIAN_FRONTEND": "noninteractive"}
        result = turn.exec(["bash", "-c", _RUN], env=env)
        status = AgentStatus.TIMEOUT if result.timed_out else AgentStatus.COMPLETED
        return AgentOutcome(status=status, exit_code=None if result.timed_out else result.exit_code,
                            output_tail=tail(result.stdout + result.stderr))

    def __repr__(self) -> str:
        return "Oracle()"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Oracle)

    def __hash__(self) -> int:
        return hash(Oracle)

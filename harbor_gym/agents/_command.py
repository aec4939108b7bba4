"""`CommandAgent`: an installed harness run as the turn's agent — one command line in the sandbox (issue 18 item 3).

The harness is a program inside the sandbox (a coding CLI, Harbor's installed agents, a script of your own) that
calls its model itself, over HTTP, through ``OPENAI_BASE_URL`` / ``ANTHROPIC_BASE_URL``. When the env has a
``model_upstream`` (`harbor_gym.config.EnvConfig`), every command of the activation gets those variables pointing
at the episode's capture proxy, and the calls it makes during the activation land in ``info["turn"].model_calls``
(GYM-13); ``CommandAgent`` itself only runs the command.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from typing import Mapping

from harbor_gym.agents._outcome import AgentOutcome
from harbor_gym.agents._script import run_bash
from harbor_gym.agents._turn import Turn

__all__ = ["CommandAgent", "INSTRUCTION_FILE", "PLACEHOLDER"]

#: Where the turn's instruction is written, as the turn's agent user, before the command runs.
INSTRUCTION_FILE = "/logs/agent/instruction.md"
#: Replaced, in the command line, by the shell-quoted instruction.
PLACEHOLDER = "{instruction}"


@dataclass(frozen=True)
class CommandAgent:
    """Runs ``command`` with ``bash -c`` as the turn's agent user, in the workdir, under the turn's budget.

    Every ``{instruction}`` in ``command`` is replaced by the turn's instruction quoted for the shell (one word,
    whatever it holds); no other brace is touched. Before the command runs, the instruction is written to
    `INSTRUCTION_FILE` (``/logs/agent/instruction.md``, exactly its text). The command's environment holds the
    turn's variables (``HARBOR_STEP_NAME``, ``HARBOR_STEP_INDEX``, ``HARBOR_NUM_STEPS``; with a model upstream
    configured, the proxy's base URLs and session token, see README "Training installed harnesses"), then ``env``
    over them.

    The outcome carries the command's exit code (recorded, never a failure) and the tail of its output; a command
    still running at the end of the budget is killed (its whole process group) and the outcome is ``timeout``.
    Frozen and picklable (it crosses to vector env workers and Ray as an action).

    Args:
        command: the command line, e.g. ``"my-harness --task {instruction}"``.
        env: extra variables of the command (over the turn's; never secrets of the host, they are data of the
            sandbox from here on).

    Raises:
        ValueError: ``command`` is empty, or ``env`` holds a name that is not a variable name.
    """

    command: str
    env: Mapping[str, str] = field(default_factory=dict)
    name: str = "command"
    version: str = "1"
    supports_continue = False

    def __post_init__(self) -> None:
        if not isinstance(self.command, str) or not self.command.strip():
            raise ValueError("CommandAgent: the command line is empty (issue 18)")
        env = dict(self.env or {})
        for key, value in env.items():
            if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, str):
                raise ValueError(f"CommandAgent: env entry {key!r} must be a variable name with a str value")
        object.__setattr__(self, "env", env)

    def __hash__(self) -> int:
        return hash((self.command, tuple(sorted(self.env.items()))))

    def command_line(self, instruction: str) -> str:
        """The command as it runs for ``instruction``: `PLACEHOLDER` replaced by its shell quoting."""
        return self.command.replace(PLACEHOLDER, shlex.quote(instruction))

    def run(self, turn: Turn) -> AgentOutcome:
        """Write the instruction file, then run the command once; report its exit code and output tail."""
        script = (f"printf '%s' {shlex.quote(turn.instruction)} > {INSTRUCTION_FILE} || "
                  f"echo 'harbor_gym: cannot write {INSTRUCTION_FILE}' >&2\n"
                  + self.command_line(turn.instruction))
        return run_bash(turn, script, env=self.env)

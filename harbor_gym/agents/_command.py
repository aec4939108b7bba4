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

from harbor_gym.agents._outcome import AgentOutcome, AgentOutcomePolicy, AgentStatus
from harbor_gym.agents._script import run_bash
from harbor_gym.agents._turn import Turn

__all__ = ["CommandAgent", "INSTRUCTION_FILE", "PLACEHOLDER", "INSTRUCTION_HAS_NUL"]

#: Where the turn's instruction is written, as the turn's agent user, before the command runs.
INSTRUCTION_FILE = "/logs/agent/instruction.md"
#: Replaced, in the command line, by the shell-quoted instruction.
PLACEHOLDER = "{instruction}"
#: The failure kind of a turn whose instruction holds a NUL byte (no program argument can hold one).
INSTRUCTION_HAS_NUL = "harbor_gym:instruction_has_nul"


def _placeholder_contexts(command: str) -> list[tuple[int, str]]:
    """``(offset, context)`` of each `PLACEHOLDER` in ``command``: ``"plain"``, ``"double"``, ``"single"``,
    ``"ansi"`` (``$'...'``) or ``"backtick"``, read with bash's quoting rules (command substitutions ``$(...)``
    open a plain context, also inside double quotes)."""
    out: list[tuple[int, str]] = []
    stack = ["plain"]
    i, n = 0, len(command)
    while i < n:
        ctx = stack[-1]
        if command.startswith(PLACEHOLDER, i):
            out.append((i, ctx))
            i += len(PLACEHOLDER)
            continue
        ch = command[i]
        if ctx == "single":
            if ch == "'":
                stack.pop()
        elif ctx == "ansi":
            if ch == "\\":
                i += 1
            elif ch == "'":
                stack.pop()
        elif ch == "\\":
            i += 1
        elif ctx == "double":
            if ch == '"':
                stack.pop()
            elif command.startswith("$(", i):
                stack.append("plain")
                i += 1
            elif ch == "`":
                stack.append("backtick")
        elif ctx == "backtick":
            if ch == "`":
                stack.pop()
        else:  # plain (the top level, or inside $(...))
            if ch == "'":
                stack.append("single")
            elif command.startswith("$'", i):
                stack.append("ansi")
                i += 1
            elif ch == '"':
                stack.append("double")
            elif ch == "`":
                stack.append("backtick")
            elif command.startswith("$(", i) or ch == "(":
                stack.append("plain")
                i += 1 if ch == "$" else 0
            elif ch == ")" and len(stack) > 1:
                stack.pop()
        i += 1
    return out


def _quote_for(context: str, text: str) -> str:
    """``text`` as one word's worth of characters in ``context`` (see `_placeholder_contexts`)."""
    if context == "double":
        return "".join("\\" + c if c in '\\$`"' else c for c in text)
    if context == "single":
        return text.replace("'", "'\\''")
    if context == "ansi":
        return text.replace("\\", "\\\\").replace("'", "\\'")
    return shlex.quote(text)


@dataclass(frozen=True)
class CommandAgent:
    """Runs ``command`` with ``bash -c`` as the turn's agent user, in the workdir, under the turn's budget.

    Every ``{instruction}`` in ``command`` is replaced by the turn's instruction quoted for the shell context it
    stands in (unquoted, inside ``"..."``, inside ``'...'``, inside ``$'...'`` or a ``$(...)``), so it is one word
    holding exactly the instruction, whatever it holds, and nothing of it runs; no other brace is touched. A
    placeholder in a context where no quoting holds (inside backticks, or in a template with a here-document, whose
    body expands ``$(...)``) is refused when the agent is made. The substitution is done once: a ``{instruction}``
    inside the instruction stays text. An instruction holding a NUL byte cannot be an argument of any program;
    the turn then ends as an error (policy ``fail``, `INSTRUCTION_HAS_NUL`) without running the command. No host
    shell is involved anywhere: the command line runs in the sandbox. Before the command runs, the instruction is written to
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
            raise ValueError("CommandAgent: the command line is empty")
        contexts = _placeholder_contexts(self.command)
        if any(ctx == "backtick" for _, ctx in contexts):
            raise ValueError("CommandAgent: {instruction} inside backticks cannot be quoted safely; write it outside "
                             "them or use $(...)")
        if contexts and "<<" in self.command.replace("<<<", ""):
            raise ValueError("CommandAgent: a command line with a here-document cannot take {instruction} (its body "
                             f"expands $(...)); read the instruction from {INSTRUCTION_FILE} instead")
        env = dict(self.env or {})
        for key, value in env.items():
            if not isinstance(key, str) or not key.isidentifier() or not isinstance(value, str):
                raise ValueError(f"CommandAgent: env entry {key!r} must be a variable name with a str value")
        object.__setattr__(self, "env", env)

    def __hash__(self) -> int:
        return hash((self.command, tuple(sorted(self.env.items()))))

    def command_line(self, instruction: str) -> str:
        """The command as it runs for ``instruction``: each `PLACEHOLDER` replaced by the instruction quoted for
        its context, in one pass (a placeholder inside the instruction stays text)."""
        parts, last = [], 0
        for offset, ctx in _placeholder_contexts(self.command):
            parts += [self.command[last:offset], _quote_for(ctx, instruction)]
            last = offset + len(PLACEHOLDER)
        return "".join(parts) + self.command[last:]

    def run(self, turn: Turn) -> AgentOutcome:
        """Write the instruction file, then run the command once; report its exit code and output tail."""
        if "\x00" in turn.instruction:
            return AgentOutcome(status=AgentStatus.ERROR, policy=AgentOutcomePolicy.FAIL,
                                failure_kind=INSTRUCTION_HAS_NUL,
                                output_tail="the instruction holds a NUL byte, which no program argument can hold; "
                                            "the command did not run")
        script = (f"printf '%s' {shlex.quote(turn.instruction)} > {INSTRUCTION_FILE} || "
                  f"echo 'harbor_gym: cannot write {INSTRUCTION_FILE}' >&2\n"
                  + self.command_line(turn.instruction))
        return run_bash(turn, script, env=self.env)

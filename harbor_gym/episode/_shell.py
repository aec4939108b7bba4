"""Shell fragments the engine runs inside sandboxes, and how their results come back (SPEC GYM-10).

A `Script` reports in two ways, kept apart on purpose:

- **Decisions** (an outage, a missing verifier tool, a failed workdir merge, a missing workdir, a timed-out
  ``test.sh``) travel in the exec's *exit status*: the script ends with ``exit $((64 + bits))``, each decision word owning one bit. The exit
  status comes from the engine (the exec wrapper's trailer, else the engine's own inspect), not from any text a
  sandbox process can print, so no process of the sandbox (a leftover of the agent, a program ``test.sh`` runs)
  can forge one that masks a turn, turns a failure into a retryable outage or skips the TURN-2 clean-up. An exit
  status outside 64..127 means the script did not reach its end (killed, timed out): `Outcome.finished` is false.
  Residual (out of GYM-10's promise, as README states for shared mode): a process running as the exec's own user
  (root for housekeeping) can open the exec's pipes through ``/proc/<pid>/fd`` or replace ``/bin/sh``; a root
  agent in shared mode is answered by the freeze (GYM-11) and by separate verification.
- **Notes** (``<marker> word args`` lines on stdout: a missing tool's name, ``test.sh``'s exit code, ``thawed``)
  are data for messages and logs only. The marker sits in the exec's command line, so any sandbox process may read
  it and print such lines; nothing that changes a reward or erases a failure is ever decided from them.

Files never come back through exec output: they cross only through `Sandbox.copy_out` (the trusted channel).
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass, field

from harbor_gym.sandbox.base import ExecResult

__all__ = ["Script", "Parsed", "Outcome", "parse", "q", "DECISIONS"]

q = shlex.quote

#: Decision words and their exit-status bits (see the module docstring).
DECISIONS = {"failed": 1, "outage": 2, "missing": 4, "workdir_failed": 8, "vtimeout": 16, "workdir_missing": 32}
_BASE = 64


class Script:
    """A shell script built from fragments, with its own random marker; it exits ``64 + <decision bits>``."""

    def __init__(self) -> None:
        self.marker = "@@HG" + uuid.uuid4().hex[:12]
        self.parts: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.parts)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def flag(self, word: str, *args: str) -> str:
        """A command recording the decision ``word`` (a key of `DECISIONS`: its bit in the exit status, and a
        note line with ``args`` for messages); also sets ``HGFAIL``."""
        bit = DECISIONS[word]
        rest = " ".join(args)
        return (f"{{ HGX=$((HGX | {bit})); echo {q(self.marker)} {word}{(' ' + rest) if rest else ''}; "
                "HGFAIL=1; }")

    def note(self, word: str, *args: str) -> str:
        """A command printing the note line ``word args`` (information only, never a decision)."""
        rest = " ".join(args)
        return f"echo {q(self.marker)} {word}{(' ' + rest) if rest else ''}"

    def stop_if_failed(self) -> str:
        """A command ending the script (with its decision bits) when a flag was recorded."""
        return f'[ -z "$HGFAIL" ] || exit $(({_BASE} + HGX))'

    def text(self) -> str:
        return "HGX=0\n" + "\n".join(self.parts) + f"\nexit $(({_BASE} + HGX))\n"

    def outcome(self, res: ExecResult) -> "Outcome":
        """Decode ``res`` (the exec of `text`): decisions from its exit status, notes from its stdout."""
        code = res.exit_code
        finished = not res.timed_out and _BASE <= code < 2 * _BASE
        return Outcome(finished=finished, bits=(code - _BASE) if finished else 0, notes=parse(res.stdout, self.marker))


@dataclass
class Parsed:
    """Note lines: word -> list of argument lists. Forgeable by any sandbox process; information only."""

    flags: dict[str, list[list[str]]] = field(default_factory=dict)

    def has(self, word: str) -> bool:
        return word in self.flags

    def first(self, word: str) -> list[str] | None:
        got = self.flags.get(word)
        return got[0] if got else None


@dataclass(frozen=True)
class Outcome:
    """A script's result: ``finished`` (it reached its end), the decision ``bits``, and its ``notes``."""

    finished: bool
    bits: int
    notes: Parsed

    def has(self, word: str) -> bool:
        """A decision word: its bit in the exit status. Any other word: a note line (information only)."""
        if word in DECISIONS:
            return bool(self.bits & DECISIONS[word])
        return self.notes.has(word)

    def first(self, word: str) -> list[str] | None:
        """The arguments of the first note line ``word`` (information only)."""
        return self.notes.first(word)

    @property
    def flags(self) -> dict[str, list[list[str]]]:
        """Note lines of the decisions that the exit status confirms, and every other note (for messages)."""
        return {w: args for w, args in self.notes.flags.items() if w not in DECISIONS or self.has(w)}


def parse(stdout: str, marker: str) -> Parsed:
    """The note lines of the output of a `Script` run with ``marker``."""
    out = Parsed()
    for m in re.finditer(re.escape(marker) + r" (\S+)(?: (.*))?$", stdout, re.MULTILINE):
        out.flags.setdefault(m.group(1), []).append((m.group(2) or "").split())
    return out

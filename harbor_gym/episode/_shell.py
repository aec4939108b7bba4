"""Shell fragments the engine runs inside sandboxes, and the parser of their marked output.

Fragments are POSIX ``sh``; they report through lines ``<marker> <word> ...`` with a per-call random marker, so
several results (exit code, reward files, log tails) come back from one exec (one round trip).
"""

from __future__ import annotations

import re
import shlex
import uuid
from dataclasses import dataclass, field

__all__ = ["Script", "Parsed", "parse", "q"]

q = shlex.quote


class Script:
    """A shell script built from fragments, with its own random marker."""

    def __init__(self) -> None:
        self.marker = "@@HG" + uuid.uuid4().hex[:12]
        self.parts: list[str] = []

    def __bool__(self) -> bool:
        return bool(self.parts)

    def add(self, text: str) -> None:
        self.parts.append(text)

    def flag(self, word: str, *args: str) -> str:
        """A command printing the marker line ``word args``."""
        rest = " ".join(args)
        return f"{{ echo {q(self.marker)} {word}{(' ' + rest) if rest else ''}; HGFAIL=1; }}"

    def note(self, word: str, *args: str) -> str:
        """Like `flag` but not a failure (``HGFAIL`` untouched)."""
        rest = " ".join(args)
        return f"echo {q(self.marker)} {word}{(' ' + rest) if rest else ''}"

    def emit_file(self, path: str, name: str, cap: int) -> None:
        """Print the file ``path`` (first ``cap`` bytes) between marker lines when it exists."""
        self.add(
            f"if [ -f {q(path)} ]; then printf '%s file {name} %s\\n' {q(self.marker)} \"$(wc -c < {q(path)})\"; "
            f"head -c {cap} {q(path)}; printf '\\n%s end\\n' {q(self.marker)}; fi"
        )

    def text(self) -> str:
        return "\n".join(self.parts) + "\n"


@dataclass
class Parsed:
    """Marker lines (word -> list of argument lists) and files (name -> (size, text))."""

    flags: dict[str, list[list[str]]] = field(default_factory=dict)
    files: dict[str, tuple[int, str]] = field(default_factory=dict)

    def has(self, word: str) -> bool:
        return word in self.flags

    def first(self, word: str) -> list[str] | None:
        got = self.flags.get(word)
        return got[0] if got else None


def parse(stdout: str, marker: str) -> Parsed:
    """Parse the output of a `Script` run with ``marker``."""
    out = Parsed()
    pos = 0
    header = re.compile(re.escape(marker) + r" (\S+)(?: (.*))?\n")
    end = "\n" + marker + " end\n"
    while True:
        m = header.search(stdout, pos)
        if m is None:
            break
        word, rest = m.group(1), (m.group(2) or "")
        if word == "file":
            name, _, size = rest.partition(" ")
            stop = stdout.find(end, m.end())
            if stop < 0:
                out.files[name] = (int(size or 0), stdout[m.end():])
                break
            out.files[name] = (int(size.strip() or 0), stdout[m.end():stop])
            pos = stop + len(end)
            continue
        out.flags.setdefault(word, []).append(rest.split())
        pos = m.end()
    return out

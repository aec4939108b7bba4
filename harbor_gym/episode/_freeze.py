"""``EnvConfig.freeze_agent_during_verify``: the processes agent activations left behind are stopped (SIGSTOP)
for the duration of each shared-mode verifier run and resumed (SIGCONT) after it.

Which processes: every process alive right after an activation and not alive right before it (identified by pid
and start time, so a reused pid never counts), tracked across the episode's turns, together with all their
descendants at freeze time. Processes that preparation started (``setup.sh``, healthchecks, the engine's own
housekeeping) are alive before the next activation, hence never tracked and never touched.

How (Linux, inside the sandbox): before and after each activation one root exec lists ``/proc/*/stat`` (two extra
engine requests per exec, none when the option is off); the freeze and the thaw are shell fragments folded into
the verifier's own root exec. The freeze stops the tracked processes, then repeatedly stops every process whose
parent is stopped until a whole pass finds no new one, so a loop forking fresh children cannot slip through.
Limit: a child that a tracked process spawned and then orphaned (re-parented to PID 1) before the freeze is not
recognised. Separate-mode turns need none of this: their verifier runs in a fresh sandbox.
"""

from __future__ import annotations

from dataclasses import dataclass

from harbor_gym.episode._shell import Script
from harbor_gym.episode._staging import STAGE_DIR

__all__ = ["AgentProcesses", "LIST_SCRIPT", "parse_listing", "ProcEntry"]

#: Lists the sandbox's processes; the first line names the listing shell itself (excluded with its kin).
LIST_SCRIPT = 'echo "me $$"; cat /proc/[0-9]*/stat 2>/dev/null; :'
_FROZEN = f"{STAGE_DIR}/frozen"


@dataclass(frozen=True)
class ProcEntry:
    """One process of a listing: pid, parent pid and start time (clock ticks since boot, as text)."""

    pid: int
    ppid: int
    start: str

    @property
    def key(self) -> str:
        return f"{self.pid}:{self.start}"


def parse_listing(text: str) -> dict[int, ProcEntry]:
    """The processes of a `LIST_SCRIPT` output, without the listing's own shell, its ancestors and children."""
    me: int | None = None
    procs: dict[int, ProcEntry] = {}
    for line in text.splitlines():
        if line.startswith("me "):
            me = int(line[3:].strip() or 0)
            continue
        head, sep, rest = line.rpartition(") ")
        if not sep:
            continue
        pid_text = head.split(" ", 1)[0]
        fields = rest.split()
        if not pid_text.isdigit() or len(fields) < 20:
            continue
        procs[int(pid_text)] = ProcEntry(int(pid_text), int(fields[1]), fields[19])
    if me is not None:
        kin = {me}
        up = procs.get(me)
        while up is not None and up.ppid not in kin and up.ppid > 1:
            kin.add(up.ppid)
            up = procs.get(up.ppid)
        kin.update(p.pid for p in procs.values() if p.ppid == me)
        for pid in kin:
            procs.pop(pid, None)
    return procs


class AgentProcesses:
    """The processes of one episode's agent activations (see the module docstring). Not thread-safe; one per
    episode."""

    def __init__(self) -> None:
        self._before: set[str] = set()
        self._agent: set[str] = set()

    @property
    def tracked(self) -> frozenset[str]:
        """``pid:start`` keys of every process attributed to an activation so far."""
        return frozenset(self._agent)

    def before_activation(self, listing: str) -> None:
        """Remember what is alive right before an activation."""
        self._before = {p.key for p in parse_listing(listing).values()}

    def after_activation(self, listing: str) -> None:
        """Attribute to the agent what appeared during the activation, and the descendants of its processes."""
        procs = parse_listing(listing)
        keys = {p.key for p in procs.values()}
        # A new child of a process that was alive before and is not the agent's (a setup.sh ticker's `sleep`) is
        # not the agent's, nor are its descendants; orphans re-parented to PID 1 are.
        others = {p.pid for p in procs.values() if p.key in self._before and p.key not in self._agent and p.pid > 1}
        grown = True
        while grown:
            grown = False
            for p in procs.values():
                if p.ppid in others and p.pid not in others and p.key not in self._before:
                    others.add(p.pid)
                    grown = True
        agent = (self._agent & keys) | {p.key for p in procs.values()
                                         if p.key not in self._before and p.pid not in others}
        pids = {int(k.split(":")[0]) for k in agent}
        grown = True
        while grown:
            grown = False
            for p in procs.values():
                if p.ppid in pids and p.pid not in pids:
                    pids.add(p.pid)
                    agent.add(p.key)
                    grown = True
        self._agent = agent

    def freeze_fragment(self, script: Script) -> None:
        """Add to a root script: stop the tracked processes and, pass after pass, every child of a stopped one;
        the stopped pids go to a root-only file for `thaw_fragment`."""
        keys = " ".join(sorted(self._agent))
        script.add(
            "( fz=' '; "
            f"for e in {keys or ':'}; do p=${{e%%:*}}; st=${{e#*:}}; [ \"$p\" = : ] && continue; "
            "read -r s 2>/dev/null < /proc/$p/stat || continue; s=${s##*) }; set -- $s; "
            "[ \"${20}\" = \"$st\" ] || continue; kill -STOP $p 2>/dev/null && fz=\"$fz$p \"; done; "
            "if [ \"$fz\" != ' ' ]; then while :; do n=0; for f in /proc/[0-9]*/stat; do "
            "read -r s 2>/dev/null < $f || continue; p=${s%% *}; s=${s##*) }; set -- $s; "
            "case \"$fz\" in *\" $p \"*) continue;; esac; "
            "case \"$fz\" in *\" $2 \"*) kill -STOP $p 2>/dev/null; fz=\"$fz$p \"; n=1;; esac; done; "
            "[ $n = 0 ] && break; done; fi; "
            f"echo \"$fz\" > {_FROZEN} )")

    @staticmethod
    def thaw_fragment(script: Script) -> None:
        """Add to a root script: resume what `freeze_fragment` stopped (idempotent) and note ``thawed``."""
        script.add(f"for p in $(cat {_FROZEN} 2>/dev/null); do kill -CONT $p 2>/dev/null; done; rm -f {_FROZEN}; "
                   + script.note("thawed"))

"""``EnvConfig.freeze_agent_during_verify`` (SPEC GYM-11): while a verifier runs in the agent's sandbox, every other
process in it is stopped (SIGSTOP) as the kernel sees it, and only what was stopped is resumed (SIGCONT) after it.

The freeze is a bash helper (`freeze_fragment`) that runs as root inside the verifier's own exec, before anything of
the verifier (VER-11 already requires bash and find in a verifying image). It reads only what the kernel writes:

1. one scan of ``/proc/<pid>/stat`` (each file read whole, its fields taken after the LAST ``)`` so a process name
   holding ``)``, spaces, newlines or a fake stat line changes nothing); processes already stopped are remembered
   and never resumed later;
2. the exempt set: PID 1, the sandbox's main process (the oldest child of PID 1: every sandbox runs under an init,
   Docker's or bubblewrap's, which forks it before any command can run; e.g. the lease loop) and its direct
   children, the helper itself, its ancestors and its
   descendants (the verifier) and, under ``"auto"``, every process holding a listening socket (TCP LISTEN or bound
   UDP in ``/proc/net/{tcp,udp}{,6}``, matched by socket inode to ``/proc/<pid>/fd`` links) with its descendants
   (services);
3. ``kill -STOP -1`` (the bash builtin: ``kill(-1, SIGSTOP)``), which the kernel delivers to every process of the
   sandbox's PID namespace but PID 1 and the caller, atomically with respect to fork, so a writer that keeps
   re-spawning itself, double-forks into a new session or waits for test.sh cannot slip through. The helper acts
   only when its ancestry ends at a process entered from outside the namespace (PPID 0: a Docker exec, the local
   backend's launcher); anywhere else (a host) it stops nothing and notes ``freeze_unavailable``;
4. an immediate SIGCONT to the exempt processes (which also drops their pending stop), then passes over every
   process until each non-exempt one (every thread of it) is in state T/t (or is a zombie), re-sending SIGSTOP to
   any straggler, for at most ``_CONVERGE_S`` seconds;
5. the stopped set (pid and start time) is appended to a root-only record. `thaw_fragment` resumes it (checking
   each start time, so a reused pid is left alone) and removes the record; it runs first in the next turn's
   preparation exec, i.e. after the verifier's files were copied out and before setup.sh or the next activation,
   also when the host had to kill the verifier's exec (timeout). A record a failed thaw left is kept and merged,
   so those processes are resumed by the next thaw. An episode that ends stops its sandbox instead.

Its output is marker lines only: ``exempt <pid> <executable path>`` per service exempted (non-printable bytes shown
as ``?``), ``frozen <count>``, and ``freeze_incomplete <pids>`` when a process did not reach state T in time. The
engine parses them with `parse_exempt`, which never raises. Separate-mode turns need no freeze: their verifier runs
in a fresh sandbox.
"""

from __future__ import annotations

from typing import Any

from harbor_gym.episode._records import ExemptProcess
from harbor_gym.episode._shell import Script, q
from harbor_gym.episode._staging import STAGE_DIR

__all__ = ["freeze_mode", "freeze_fragment", "thaw_fragment", "parse_exempt", "FREEZE_SCRIPT", "THAW_SCRIPT"]

#: The root-only record of what the freeze stopped (``pid:start`` lines).
RECORD = f"{STAGE_DIR}/frozen"
#: Bound of the convergence passes (a vfork parent whose child is stopped never reaches T: it is frozen anyway).
_CONVERGE_S = 5

#: $1 mode (auto|strict), $2 record path, $3 marker. Bash builtins only, plus `find` for the socket and exe scans.
FREEZE_SCRIPT = r"""mode=$1; rec=$2; mk=$3
shopt -s nullglob; LC_ALL=C; me=$$
declare -a PP ST SS CH PRE SVC LSN
scan() {
  PP=(); ST=(); SS=()
  local f p s r
  for f in /proc/[0-9]*/stat; do
    s=; read -r -d '' s 2>/dev/null <"$f"
    r=${s##*) }; [ "$r" != "$s" ] || continue
    set -- $r; [ -n "${20}" ] || continue
    p=${f#/proc/}; p=${p%/stat}
    SS[p]=$1; PP[p]=$2; ST[p]=${20}
  done
}
# 0: exempt; sets WHY=svc when exempt as a service (or a service's descendant)
exempt() {
  local p=$1 q=$1 n=0
  WHY=
  [ "$p" = 1 ] && return 0
  [ -n "${CH[p]}" ] && return 0
  [ -n "$main" ] && { [ "$p" = "$main" ] || [ "${PP[p]}" = "$main" ]; } && return 0
  while [ -n "$q" ] && [ "$q" -gt 1 ] && [ $n -lt 256 ]; do
    [ "$q" = "$me" ] && return 0
    if [ -n "${SVC[q]}" ] && [ "${SVC[q]}" = "${ST[q]}" ]; then WHY=svc; return 0; fi
    q=${PP[q]}; n=$((n+1))
  done
  return 1
}
scan
# the helper, its ancestors (up to the process entered from outside the namespace: PPID 0)
CH[me]=1; a=$me; top=; n=0
while [ -n "${PP[a]}" ] && [ $n -lt 256 ]; do
  if [ "${PP[a]}" = 0 ]; then top=$a; break; fi
  [ "${PP[a]}" = 1 ] && break
  a=${PP[a]}; CH[a]=1; n=$((n+1))
done
# not entered from outside a PID namespace (a host, or a sandbox without its own): touch nothing
if [ -z "$top" ]; then echo "$mk freeze_unavailable"; exit 0; fi
# the sandbox's main process: the oldest child of PID 1 (the init forks it before any command can run)
main=; best=
for p in "${!PP[@]}"; do
  [ "${PP[p]}" = 1 ] || continue
  if [ -z "$best" ] || [ "${ST[p]}" -lt "$best" ]; then main=$p; best=${ST[p]}; fi
done
for p in "${!SS[@]}"; do case "${SS[p]}" in T|t) PRE[p]=${ST[p]};; esac; done
if [ "$mode" = auto ]; then
  for f in /proc/net/tcp /proc/net/tcp6 /proc/net/udp /proc/net/udp6; do
    [ -r "$f" ] || continue
    while read -r sl la ra st x1 x2 x3 x4 x5 ino rest; do
      case "$st$f" in 0A*) ;; 07*udp*) [ "${ra##*:}" = 0000 ] && [ "${la##*:}" != 0000 ] || continue;; *) continue;; esac
      case "$ino" in ''|*[!0-9]*) continue;; esac
      [ "$ino" != 0 ] && LSN[ino]=1
    done <"$f"
  done
  if [ ${#LSN[@]} -gt 0 ]; then
    while read -r h l; do
      p=${h#/proc/}; p=${p%/fd}; i=${l#socket:[}; i=${i%]}
      case "$p$i" in ''|*[!0-9]*) continue;; esac
      [ -n "${LSN[i]}" ] && [ -n "${ST[p]}" ] && SVC[p]=${ST[p]}
    done < <(find /proc/[0-9]*/fd -lname 'socket:\[*' -printf '%h %l\n' 2>/dev/null)
  fi
fi
kill -STOP -1 2>/dev/null
scan
for p in "${!PP[@]}"; do
  exempt "$p" || continue
  [ -n "${PRE[p]}" ] && [ "${PRE[p]}" = "${ST[p]}" ] && continue
  kill -CONT "$p" 2>/dev/null
done
end=$((SECONDS + __CONVERGE__)); left=
while :; do
  scan; left=
  for p in "${!PP[@]}"; do
    exempt "$p" && continue
    for t in /proc/$p/task/[0-9]*/stat; do
      s=; read -r -d '' s 2>/dev/null <"$t"; r=${s##*) }
      case "${r%% *}" in T|t|Z|X|'') ;; *) left="$left $p"; kill -STOP "$p" 2>/dev/null; break;; esac
    done
  done
  [ -z "$left" ] && break
  [ $SECONDS -ge $end ] && break
  sleep 0.01 2>/dev/null
done
c=0; ex=; mkdir -p "${rec%/*}" 2>/dev/null
for p in "${!PP[@]}"; do
  if exempt "$p"; then [ "$WHY" = svc ] && ex="$ex /proc/$p/exe"; continue; fi
  [ -n "${PRE[p]}" ] && [ "${PRE[p]}" = "${ST[p]}" ] && continue
  echo "$p:${ST[p]}" >>"$rec"; c=$((c+1))
done
if [ -n "$ex" ]; then
  while IFS= read -r -d '' l; do
    h=${l%% *}; e=${l#* }; p=${h#/proc/}; e=${e//[^[:print:]]/?}
    echo "$mk exempt $p ${e:-?}"
  done < <(find $ex -maxdepth 0 -printf '%h %l\0' 2>/dev/null)
fi
echo "$mk frozen $c"
[ -n "$left" ] && echo "$mk freeze_incomplete$left"
:
""".replace("__CONVERGE__", str(_CONVERGE_S))

#: $1 record path: resume each recorded process whose start time still matches (a reused pid is left alone).
THAW_SCRIPT = r"""rec=$1
[ -f "$rec" ] || exit 0
while IFS=: read -r p st; do
  case "$p$st" in ''|*[!0-9]*) continue;; esac
  s=; read -r -d '' s 2>/dev/null </proc/$p/stat; r=${s##*) }
  [ "$r" != "$s" ] || continue
  set -- $r
  [ "${20}" = "$st" ] && kill -CONT "$p" 2>/dev/null
done <"$rec"
rm -f "$rec"
:
"""


def freeze_mode(option: Any) -> str | None:
    """GYM-11: ``"auto"`` (services exempt), ``"strict"`` (``True``) or ``None`` (``False``: no freeze)."""
    if option is True:
        return "strict"
    if option == "auto":
        return "auto"
    return None


def freeze_fragment(script: Script, mode: str) -> None:
    """Add to a root script: the freeze helper (see the module docstring), run by bash as a child of the script so
    that the script and everything it starts afterwards (the verifier) are exempt. Without bash nothing is frozen
    (VER-11 masks that turn anyway: the tool check follows)."""
    script.add(f"if command -v bash >/dev/null 2>&1; then bash -c {q(FREEZE_SCRIPT)} hg-freeze {q(mode)} "
               f"{q(RECORD)} {q(script.marker)}; fi")


def thaw_fragment(script: Script) -> None:
    """Add to a root script: resume what `freeze_fragment` stopped (idempotent) and note ``thawed``."""
    script.add(f"if [ -f {q(RECORD)} ] && command -v bash >/dev/null 2>&1; then bash -c {q(THAW_SCRIPT)} hg-thaw "
               f"{q(RECORD)}; fi; rm -f {q(RECORD)}; " + script.note("thawed"))


def parse_exempt(flags: Any) -> tuple[ExemptProcess, ...]:
    """The ``exempt`` marker lines of a freeze as `ExemptProcess` entries; malformed lines are skipped (never
    raises)."""
    out: list[ExemptProcess] = []
    for args in getattr(flags, "flags", {}).get("exempt", []):
        if not args or not args[0].isdigit():
            continue
        out.append(ExemptProcess(pid=int(args[0]), exe=" ".join(args[1:]) or "?"))
    return tuple(out)

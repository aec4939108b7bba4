"""`Turn`: what an agent receives for one activation — the instruction, its user, budget and a bound ``exec``."""

from __future__ import annotations

import shlex
import time
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Callable, Mapping, Sequence

from harbor_gym.agents._model_calls import ModelCall
from harbor_gym.sandbox.base import ExecResult

__all__ = ["Turn", "ExecFn", "ARGV_LIMIT_BYTES"]

#: ``exec(command, *, timeout, user, env, cwd, stdin) -> ExecResult``: a `Sandbox.exec`-shaped callable.
ExecFn = Callable[..., ExecResult]

#: A command longer than this (bytes, UTF-8; argv items summed) travels on stdin, not argv (Linux caps one argv
#: string at 128 KiB, MAX_ARG_STRLEN).
ARGV_LIMIT_BYTES = 128 * 1024

# Read the script from stdin into a private file, run it with the shell, remove it, keep its exit code.
_FROM_STDIN = ('f=$(mktemp "${{TMPDIR:-/tmp}}/harbor-gym-cmd.XXXXXX") || exit 126; cat > "$f"; '
               '{shell} "$f" "$@"; rc=$?; rm -f "$f"; exit $rc')
# Store the script from stdin in a private file and print its path (the run then gets the caller's stdin).
_STORE = 'f=$(mktemp "${TMPDIR:-/tmp}/harbor-gym-cmd.XXXXXX") || exit 126; cat > "$f" && printf %s "$f"'
_RUN_STORED = 'f=$1; shift; {shell} "$f" "$@"; rc=$?; rm -f "$f"; exit $rc'
_SHELLS = {"sh", "bash", "/bin/sh", "/bin/bash", "/usr/bin/bash", "dash", "/bin/dash"}


@dataclass(frozen=True, eq=False)
class Turn:
    """One activation's view of the episode (GYM-4). Built by the turn engine, never by users.

    Attributes:
        step_name: the step this turn runs.
        index: 0-based turn index.
        num_steps: how many steps the task declares.
        instruction: exactly what the agent receives (TURN-9).
        user: the step's agent user (USR-1); ``None``: the image's default user.
        budget_sec: the turn's agent budget (BUD-1); ``None``: unbounded.
        workdir: the working folder of every command.
        session: the `Session` this activation belongs to: a new one per turn (SES-2, ``fresh``) or the
            episode's one continued session (SES-3); ``None`` only for a `Turn` built outside the engine.
        solution_env: ``[solution].env`` (FMT-15 applied) for the oracle (ORACLE-2); secrets: never logged.
        env: variables every command of this turn gets (e.g. ``HARBOR_STEP_NAME``).
        seed: the episode's reset seed (``None``: reset without a seed); agents derive their sampling seeds from it.
        rollout: the rollout index the runner gave at reset (``reset(options={"rollout": k})``), else ``None``.
        prior_trajectory: DIFF-10, ``semantics="harbor"`` only: the first step's ``steps/<first>/trajectory.json``
            (parsed JSON) on turn 0, the prior context Harbor gives ATIF-loading agents; ``None`` otherwise.
    """

    step_name: str
    index: int
    num_steps: int
    instruction: str
    user: str | None
    budget_sec: float | None
    workdir: str
    _exec_fn: ExecFn = field(repr=False)
    _deadline: float | None = field(repr=False, default=None)
    session: Any = None
    solution_env: Mapping[str, str] = field(default_factory=dict, repr=False)
    env: Mapping[str, str] = field(default_factory=dict)
    _expired: list = field(default_factory=list, repr=False)
    seed: int | None = None
    rollout: int | None = None
    prior_trajectory: Any = field(default=None, repr=False)
    _model_calls: list = field(default_factory=list, repr=False)
    #: issue 15: set by `harbor_gym.agents._async.AsyncAgentBridge` while an async activation runs on a loop
    _channel: Any = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "solution_env", MappingProxyType(dict(self.solution_env)))
        object.__setattr__(self, "env", MappingProxyType(dict(self.env)))

    @property
    def time_left_sec(self) -> float | None:
        """Seconds left of the agent budget (never negative); ``None`` when unbounded."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    @property
    def is_expired(self) -> bool:
        """True once the budget is spent or the engine has stopped this activation (GYM-5)."""
        if self._expired:
            return True
        left = self.time_left_sec
        return left is not None and left <= 0.0

    def expire(self) -> None:
        """Engine-side: stop this activation; later `exec` calls return a timed-out result at once."""
        self._expired.append(True)

    def record_model_call(self, call: ModelCall | Mapping[str, Any]) -> None:
        """GYM-13: hand one model call of this activation to the engine (it lands in ``info["turn"].model_calls``,
        in the order recorded, even if the activation later overruns its budget)."""
        self._model_calls.append(ModelCall.coerce(call))

    @property
    def model_calls(self) -> tuple[ModelCall, ...]:
        """The calls recorded so far with `record_model_call`."""
        return tuple(self._model_calls)

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """Run ``command`` in the sandbox as the turn's agent user, bounded by ``timeout`` and the time left.

        A ``str`` runs through ``/bin/sh -c``; a sequence is argv. ``env`` is laid over the turn's ``env``.
        A command of any length runs: one over `ARGV_LIMIT_BYTES` is sent on stdin to a small reader that stores it
        in a private temporary file and runs that file with ``sh`` (a ``[shell, "-c", script, *args]`` argv: with
        its shell and arguments; ``$0`` is then the file), then removes it. The command's own stdin is then empty,
        or, when ``stdin`` is given, a second exec runs the stored file with ``stdin``. Another argv is run as a
        quoted ``sh`` line, so each of its items must stay under 128 KiB (a kernel limit).

        Returns:
            The `ExecResult`; ``timed_out`` is set when the command hit its bound (or the budget was already
            spent, without running anything).

        Raises:
            SandboxError: the sandbox is out (the engine turns this into an outage, STOP-8).
        """
        if self.is_expired:
            return ExecResult(exit_code=-1, stderr="harbor_gym: agent budget spent", timed_out=True)
        left = self.time_left_sec
        bound = timeout if left is None else (left if timeout is None else min(timeout, left))
        merged = {**self.env, **(env or {})}
        run = dict(timeout=bound, user=self.user, env=merged, cwd=cwd or self.workdir)
        if _size(command) <= ARGV_LIMIT_BYTES:
            return self._exec_fn(command, stdin=stdin, **run)
        shell, script, args = _as_script(command)
        if stdin is None:
            return self._exec_fn([shell, "-c", _FROM_STDIN.format(shell=shell), *args], stdin=script.encode(), **run)
        stored = self._exec_fn(["sh", "-c", _STORE], stdin=script.encode(), **run)
        if stored.exit_code != 0 or stored.timed_out or not stored.stdout.strip():
            return stored
        left = self.time_left_sec
        run["timeout"] = timeout if left is None else (left if timeout is None else min(timeout, left))
        return self._exec_fn([shell, "-c", _RUN_STORED.format(shell=shell), args[0], stored.stdout.strip(),
                              *args[1:]], stdin=stdin, **run)


    async def aexec(
        self,
        command: str | Sequence[str],
        *,
        timeout: float | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdin: bytes | None = None,
    ) -> ExecResult:
        """`exec` for an async agent (``async def run(turn)``): the same command, bounds and result, awaited
        without blocking the event loop.

        Inside ``env.astep`` the command runs on the engine's thread of this turn (which waits for the agent
        anyway), so no pool thread is taken; the turn's ``aexec`` calls run one at a time, in order. Elsewhere
        (a sync ``env.step`` with an async agent, or a `Turn` used outside the engine) each call runs in a
        short-lived thread of its own. Never the default executor of ``asyncio.to_thread``.

        Raises:
            SandboxError: the sandbox is out (as `exec`).
        """
        import functools

        call = functools.partial(self.exec, command, timeout=timeout, env=env, cwd=cwd, stdin=stdin)
        channel = self._channel
        if channel is not None:
            return await channel.submit(call)
        return await _in_own_thread(call)


async def _in_own_thread(call: Callable[[], ExecResult]) -> ExecResult:
    """``call()`` in a daemon thread of its own, awaited on the running loop."""
    import asyncio
    import threading

    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, error: BaseException | None) -> None:
        if not future.done():
            future.set_exception(error) if error is not None else future.set_result(value)

    def work() -> None:
        try:
            value, error = call(), None
        except BaseException as exc:  # handed to the awaiting coroutine
            value, error = None, exc
        loop.call_soon_threadsafe(settle, value, error)

    threading.Thread(target=work, daemon=True, name="harbor-gym-aexec").start()
    return await future


def _as_script(command: str | Sequence[str]) -> tuple[str, str, list[str]]:
    """``(shell, script, [$0, $1, ...])`` running ``command`` as a script file: a ``str`` with ``sh``; a
    ``[shell, "-c", script, *args]`` argv with its own shell and arguments; any other argv as a quoted ``sh``
    line (each of its items must then fit in argv)."""
    if isinstance(command, str):
        return "sh", command, ["sh"]
    argv = [str(a) for a in command]
    if len(argv) >= 3 and argv[0] in _SHELLS and argv[1] == "-c":
        return argv[0], argv[2], (argv[3:] or [argv[0]])
    return "sh", shlex.join(argv), ["sh"]


def _size(command: str | Sequence[str]) -> int:
    if isinstance(command, str):
        return len(command.encode())
    return sum(len(str(a).encode()) + 1 for a in command)

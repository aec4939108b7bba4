"""The agent activation of a turn (TURN-9/10, GYM-4/5, BUD-1, ORACLE-2)."""

from __future__ import annotations

import dataclasses
import json
import logging
import threading
import time
import traceback
from typing import Any

from harbor_gym.agents import AgentOutcome, AgentStatus, CommandAgent, Oracle, ScriptAgent, Turn, agent_timeout_cap
from harbor_gym.agents._oracle import ORACLE_LOG, ORACLE_RUN
from harbor_gym.episode._budgets import agent_budget
from harbor_gym.episode._outage import WatchedExec
from harbor_gym.episode._proxy import ProxyEnvExec
from harbor_gym.episode._shell import q
from harbor_gym.episode._turnstate import WORKDIR_FAILED, _Turn, workdir_cause
from harbor_gym.errors import SandboxError
from harbor_gym.task import Step

__all__: list[str] = []

_log = logging.getLogger("harbor_gym.episode")


class _ActivatePhase:
    """Mixin of `Episode`: builds the `Turn`, runs the agent under its budget and records its outcome."""

    # --- the agent (TURN-9/10, GYM-4/5, BUD-1) -------------------------------------------------------------
    def _agent_budget(self, step: Step) -> float | None:
        return agent_budget(step.agent_timeout_sec, None, self._multiplier, agent_timeout_cap(self.agent))

    def _prior_trajectory(self, t: _Turn) -> Any:
        """DIFF-10: under Harbor semantics the first step's ``trajectory.json`` (parsed) reaches turn 0's agent;
        ``None`` otherwise (Seed refuses it at seed but for the oracle, LOAD-20)."""
        path = self.task.first_step_trajectory
        if t.index != 0 or path is None or not self._harbor:
            return None
        try:
            return json.loads(path.read_text(encoding="utf-8", errors="replace"))
        except (OSError, ValueError, RecursionError) as exc:
            _log.warning("%s: not readable JSON (%s); turn 0 gets no prior_trajectory (DIFF-10)", path, exc)
            return None

    def _activate(self, t: _Turn) -> AgentOutcome:
        sb, step = self._sandbox, t.step
        budget = agent_budget(step.agent_timeout_sec, None, self._multiplier, agent_timeout_cap(t.agent))
        bounded = self._clock.bound(budget)
        watched = WatchedExec(sb.exec)  # GYM-12: did a command of the activation lose the harness's wrapper?
        exec_fn: Any = watched
        if self._proxy is not None:  # issue 18: the proxy's variables reach this activation's commands only
            exec_fn = ProxyEnvExec(watched, self._proxy.env_for(getattr(sb, "host_service_address", None)))
        self._activated = True  # GYM-12: from here on, a sandbox the agent breaks is an agent-caused outage
        turn = Turn(step_name=step.name, index=t.index, num_steps=len(self.task.steps), instruction=t.instruction,
                    user=self._user_in_place, budget_sec=budget, workdir=sb.workdir, _exec_fn=exec_fn,
                    _deadline=None if bounded is None else time.monotonic() + bounded,
                    solution_env=self._solution_env if isinstance(t.agent, Oracle) else {},
                    session=self._sessions.session_for_activation(t.agent),
                    seed=self.seed, rollout=self.rollout, prior_trajectory=self._prior_trajectory(t))
        if self._proxy is not None:  # issue 18: the window spans exactly the agent's activation
            self._proxy.begin(t.index)
        try:
            if t.prelude is not None:
                outcome = self._run_folded_oracle(t, turn)
            elif isinstance(t.agent, (ScriptAgent, CommandAgent, Oracle)):  # one bounded exec: no thread needed
                outcome = self._call_agent(t.agent, turn)
            else:
                outcome = self._call_in_thread(t.agent, turn, bounded)
        finally:
            if self._proxy is not None:  # cancels a call still in flight (a turn cut at its budget): `cancelled`
                t.proxy_calls, t.proxy_refused = self._proxy.end()
        if outcome is None:  # the housekeeping folded into the oracle's exec failed (TURN-8)
            return None
        t.harness_killed = watched.wrapper_lost
        if turn.model_calls:  # GYM-13: calls recorded on the turn come first, then the outcome's own
            outcome = dataclasses.replace(outcome, model_calls=turn.model_calls + outcome.model_calls)
        self._response = outcome.response  # STOP-9: the last turn whose agent ran (SES-3: the last activation)
        # SES-2/3: the session records the activation and, after its last one, closes before the verifier.
        self._sessions.after_activation(turn, outcome, is_last_step=t.index == len(self.task.steps) - 1)
        if outcome.status is AgentStatus.TIMEOUT:
            self._clock.check()
        name = "oracle.txt" if isinstance(t.agent, Oracle) else "output.txt"
        (t.dirs.agent / name).write_text(outcome.output_tail or "")
        (t.dirs.agent / "outcome.json").write_text(json.dumps({
            "status": outcome.status.value, "policy": outcome.policy.value if outcome.policy else None,
            "exit_code": outcome.exit_code, "response": outcome.response}, indent=2))
        return outcome

    def _run_folded_oracle(self, t: _Turn, turn: Turn) -> AgentOutcome | None:
        """ORACLE-1/2 with their preparation in one exec (root agent user): the housekeeping prelude, then, if it
        succeeded, ``/solution/solve.sh`` under the agent budget. ``None``: the prelude failed (TURN-8)."""
        script = t.prelude
        script.add(script.stop_if_failed())
        # the log's tail follows the rc note: it is the activation's output (data under a fixed name, like any
        # agent's output tail); no file name or file content is ever taken from marked blocks (GYM-10)
        script.add(f"cd {q(turn.workdir)} 2>/dev/null; {ORACLE_RUN}; hgrc=$?; {script.note('rc', '$hgrc')}; "
                   f"tail -c 4096 {ORACLE_LOG} 2>/dev/null")
        env = {**turn.solution_env, "DEBIAN_FRONTEND": "noninteractive"}
        # in /: the housekeeping comes first and the workdir may be missing (issue 16); solve.sh runs after the cd
        res = turn.exec(["sh", "-c", script.text()], env=env, stdin=t.prelude_stdin, cwd="/")
        flags = script.outcome(res)  # outage / workdir_* from the exit status, not printed lines
        if flags.has("outage"):
            raise SandboxError(f"housekeeping failed ({' '.join(flags.first('outage') or [])})", field=t.step.name,
                               rule="TURN-8", retryable=True)
        if flags.has("workdir_missing"):
            self._workdir_gone(t)
            return None
        if flags.has("workdir_failed"):
            t.prep_kind = WORKDIR_FAILED
            t.cause = workdir_cause(turn.workdir, res.stdout, script.marker)
            return None
        rc = flags.first("rc")
        cut = res.stdout.find(f"{script.marker} rc ")
        tail = res.stdout[res.stdout.find("\n", cut) + 1:] if cut >= 0 else ""
        if res.timed_out or not flags.finished:
            return AgentOutcome(status=AgentStatus.TIMEOUT, output_tail=tail or res.stderr[-4096:])
        code = int(rc[0]) if rc and rc[0].lstrip("-").isdigit() else None
        return AgentOutcome(status=AgentStatus.COMPLETED, exit_code=code, output_tail=tail[-4096:])

    def _call_agent(self, agent: Any, turn: Turn) -> AgentOutcome:
        try:
            outcome = self._sessions.invoke(agent, turn)  # run(), or start()/continue_turn() (SES-3)
        except SandboxError as exc:
            # A retryable one is the engine's or the sandbox's (an exec that could not start, stdin that could not
            # be sent): an outage, which GYM-12 then judges agent-caused or not, never a graded 0.0 of the agent's.
            if exc.retryable or self._sandbox is None or not self._sandbox.is_alive():
                raise
            return AgentOutcome(status=AgentStatus.ERROR, output_tail=traceback.format_exc()[-4096:])
        except Exception:  # an agent's own defect is its error outcome (GYM-5), not the engine's
            return AgentOutcome(status=AgentStatus.ERROR, output_tail=traceback.format_exc()[-4096:])
        if not isinstance(outcome, AgentOutcome):
            return AgentOutcome(status=AgentStatus.ERROR,
                                output_tail=f"the agent returned {type(outcome).__name__}, not AgentOutcome (GYM-5)")
        return outcome

    def _call_in_thread(self, agent: Any, turn: Turn, bounded: float | None) -> AgentOutcome:
        """GYM-5: a ``run()`` still busy at the end of its budget is stopped (its execs end) and is a timeout."""
        box: list[Any] = []

        def work() -> None:
            try:
                box.append(self._call_agent(agent, turn))
            except BaseException as exc:  # an outage inside the agent: handed to the engine's thread
                box.append(exc)

        worker = threading.Thread(target=work, daemon=True, name=f"harbor-gym-agent-{turn.step_name}")
        worker.start()
        worker.join(None if bounded is None else bounded + 0.5)
        if worker.is_alive():
            turn.expire()
            return AgentOutcome(status=AgentStatus.TIMEOUT, output_tail="harbor_gym: run() overran its budget")
        if box and isinstance(box[0], BaseException):
            raise box[0]
        return box[0] if box else AgentOutcome(status=AgentStatus.ERROR)

"""The preparation phase of a turn (TURN-2..8, USR-2, ORACLE-1)."""

from __future__ import annotations

import logging

from harbor_gym.agents import Oracle
from harbor_gym.episode._budgets import setup_bound
from harbor_gym.episode._freeze import thaw_fragment
from harbor_gym.episode._healthcheck import poll_healthcheck
from harbor_gym.episode._shell import Script, q
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._stop import WORKDIR_DELETED_KIND, WORKDIR_MISSING_KIND
from harbor_gym.episode._turnstate import (
    _HOUSEKEEPING_S,
    HEALTHCHECK_FAILED,
    SETUP_FAILED,
    WORKDIR_FAILED,
    _is_root,
    _Turn,
    one_line,
    workdir_cause,
)
from harbor_gym.errors import SandboxError
from harbor_gym.task import Step

__all__: list[str] = []

_log = logging.getLogger("harbor_gym.episode")


class _PreparePhase:
    """Mixin of `Episode`: clean-up, user switch, workdir merge, setup.sh, step healthcheck and the
    oracle's solution."""

    # --- prepare (TURN-2..8, USR-2, ORACLE-1) ------------------------------------------------------------
    def _agent_user(self, step: Step) -> str:
        """USR-1: the step's agent user, else the image's default user."""
        return step.agent_user or self._sandbox.default_user

    def _cleanup_fragment(self, script: Script) -> None:
        """TURN-2 (Harbor: also empties /logs/agent, DIFF-6)."""
        text = ("find /tests /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; "
                "chmod 0777 /logs/verifier && rm -f /logs/agent/trajectory.json")
        script.add(f"{{ {text} ; }} || {script.flag('outage', 'cleanup')}")

    def _solution_fragment(self, script: Script, user: str) -> None:
        """ORACLE-1 (Harbor: merged over earlier files, DIFF-19) from the staged ``sol`` folder."""
        parts = [] if self._harbor else ["rm -rf /solution"]
        parts += ["mkdir -p /solution",
                  f"{{ [ ! -d {STAGE_DIR}/sol ] || cp -a {STAGE_DIR}/sol/. /solution/ ; }}",
                  f"rm -rf {STAGE_DIR}/sol"]
        if not _is_root(user):
            parts.append(f"chown -R {q(user)} /solution")
        script.add("{ " + " && ".join(parts) + " ; } || " + script.flag("outage", "solution"))

    def _prepare(self, t: _Turn) -> str | None:
        """TURN-3: clean-up (TURN-2), user switch (USR-2), the workdir's presence (issue 16), workdir merge (TURN-4),
        setup.sh (TURN-5), healthcheck (TURN-7), the oracle's solution (ORACLE-1). Returns a TURN-8 failure kind
        (or `WORKDIR_MISSING_KIND` / `WORKDIR_DELETED_KIND`), or ``None``.

        Raises:
            SandboxError: an outage (clean-up, user switch or solution placement could not run; TURN-8).
        """
        sb, step = self._sandbox, t.step
        workdir = sb.workdir
        user = self._agent_user(step)
        is_oracle = isinstance(t.agent, Oracle)
        script, builder = Script(), ArchiveBuilder()
        if self._frozen_pending:  # GYM-11: resume what the last verifier's freeze stopped, before anything runs
            thaw_fragment(script)
            self._frozen_pending = False
        if self._cleanup_pending:
            self._cleanup_fragment(script)
        if self._harbor and t.index > 0 and not self._sessions.continued:
            # DIFF-6: Harbor empties /logs/agent before a step unless resuming (a continued session, SES-3).
            script.add("find /logs/agent -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; chmod 0777 /logs/agent")
        self._workdir_fragment(script, t, workdir)
        if user != self._user_in_place and not self._harbor and workdir != "/":
            script.add(f"chown {q(user)} {q(workdir)} || {script.flag('outage', 'user')}")
        if step.workdir_dir is not None:
            builder.add_tree(step.workdir_dir, workdir, honour_ignore=False, root=self.task.path)
        has_workdir = bool(builder)
        solution_now = is_oracle and step.setup_script is None and step.healthcheck is None
        if is_oracle and step.solution_dir is not None:
            builder.add_tree(step.solution_dir, f"{STAGE_DIR}/sol", honour_ignore=True, root=self.task.path)
        stdin: bytes | None = None
        if builder:
            stdin = builder.render()  # on the exec's stdin: one round trip for staging and housekeeping
            fail = script.flag("workdir_failed") if has_workdir else script.flag("outage", "stage")
            script.add(f"tar -xpf - -C / 2>&1 || {fail}")
        if solution_now:
            self._solution_fragment(script, user)
        if solution_now and _is_root(user):
            # One round trip: the oracle's activation runs right after this housekeeping, in the same exec.
            t.prelude, t.prelude_stdin = script, stdin
            self._cleanup_pending = False
            self._user_in_place = user
            return None
        if script:
            self._run_root(script, t, stdin)
            self._cleanup_pending = False
            if t.prep_kind is not None:
                return t.prep_kind
        self._user_in_place = user
        if step.setup_script is not None:
            bound = setup_bound(self.config.step_setup_timeout_s, self._agent_budget(step), harbor=self._harbor)
            res = self._exec(sb, ["bash", f"{workdir.rstrip('/')}/setup.sh"], timeout=bound, user=user, cwd=workdir)
            (t.dirs.agent / "setup.txt").write_text(res.stdout + res.stderr)
            if not res.ok:
                _log.info("setup.sh of %s failed (exit %s, timed out %s)", step.name, res.exit_code, res.timed_out)
                t.cause = (f"setup.sh overran its {bound:g} s bound" if res.timed_out
                           else f"setup.sh exited {res.exit_code}")
                return SETUP_FAILED
        if step.healthcheck is not None:
            passed, attempts = poll_healthcheck(
                step.healthcheck,
                lambda cmd, tmo: self._exec(sb, ["bash", "-c", cmd], timeout=tmo, user=user, cwd=workdir),
                on_tick=self._clock.check)
            if not passed:
                t.cause = (f"healthcheck `{one_line(step.healthcheck.command, 120)}` failed "
                           f"{max(1, int(step.healthcheck.retries))} counted time(s) ({attempts} attempt(s))")
                return HEALTHCHECK_FAILED
        if is_oracle and not solution_now:
            script = Script()
            self._solution_fragment(script, user)
            self._run_root(script, t)
        return None

    def _workdir_fragment(self, script: Script, t: _Turn, workdir: str) -> None:
        """Issue 16: the workdir must exist when a step starts, checked before its ``workdir/`` merge (Harbor asks
        ``pwd`` there first, harbor/trial/multi_step.py) and decided by the exit status (GYM-10). Skipped where it
        cannot be missing: ``/``, and the first step of a sandbox that created it at start (Seed semantics)."""
        spec = self._agent_spec
        if workdir == "/" or (t.index == 0 and (spec is None or spec.create_workdir)):
            return
        script.add(f"[ -d {q(workdir)} ] || {script.flag('workdir_missing')}")
        script.add(script.stop_if_failed())  # nothing of the step (its merge would create the folder) runs

    def _workdir_gone(self, t: _Turn) -> None:
        """Issue 16, GYM-12: the workdir is missing at this step's start. At the first step nothing of the agent ran
        yet: the task's fault, `WORKDIR_MISSING_KIND` (ungraded, not retryable). Later it existed at an earlier
        step's start (or the episode would have ended there), so something since the first activation deleted it:
        agent-caused, `WORKDIR_DELETED_KIND`, reward 0.0 and trainable, so that no policy dodges a graded 0.0 by
        deleting its workdir before the next step."""
        workdir = self._sandbox.workdir
        if t.index == 0:
            t.prep_kind = WORKDIR_MISSING_KIND
            t.cause = (f"the workdir {workdir} does not exist: the image lacks it and nothing of the task creates it "
                       "(under Harbor semantics harbor_gym does not create it; Harbor fails such a step)")
        else:
            t.prep_kind = WORKDIR_DELETED_KIND
            t.agent_caused, t.outage_cause = True, "workdir_deleted"
            t.cause = f"the workdir {workdir} existed at an earlier step and is gone at this step's start"

    def _run_root(self, script: Script, t: _Turn, stdin: bytes | None = None) -> None:
        """Run a housekeeping script as root in ``/``; map its flags: ``outage`` raises, ``workdir_missing``
        (`_workdir_gone`) and ``workdir_failed`` set the turn's failure kind (TURN-8)."""
        res = self._exec(self._sandbox, script.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin, cwd="/")
        flags = script.outcome(res)  # decisions from the exit status (GYM-10), never from printed lines
        if flags.has("outage") or not flags.finished:
            what = " ".join((flags.first("outage") if flags.has("outage") else None) or ["exit", str(res.exit_code)])
            raise SandboxError(f"housekeeping failed ({what}): {res.stderr[-300:]}", field=t.step.name,
                               rule="TURN-8", retryable=True)
        if flags.has("workdir_missing"):
            self._workdir_gone(t)
            return
        if flags.has("workdir_failed"):
            _log.info("workdir merge of %s failed: %s", t.step.name, res.stdout[-500:])
            t.prep_kind = WORKDIR_FAILED
            t.cause = workdir_cause(self._sandbox.workdir, res.stdout, script.marker)

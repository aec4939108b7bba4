"""The verifier phase of a turn (VER-3..11, RWD-1, DIFF-14/15): shared or separate verify, the test.sh
run, the reward read."""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from pathlib import Path
from typing import Any

from harbor_gym.agents import agent_identity, build_trajectory
from harbor_gym.episode._budgets import verifier_budget
from harbor_gym.episode._freeze import freeze_fragment, parse_exempt
from harbor_gym.episode._modes import verifier_command
from harbor_gym.episode._rewards import read_reward_files
from harbor_gym.episode._shell import Script, parse, q
from harbor_gym.episode._spec import resolved_env, verifier_spec
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._turnstate import (
    _HOUSEKEEPING_S,
    _INLINE_CAP,
    _REWARD_CAP,
    _VERIFIER_TOOLS,
    _is_root,
    _Turn,
)
from harbor_gym.errors import SandboxError
from harbor_gym.sandbox.base import Sandbox

__all__: list[str] = []

_log = logging.getLogger("harbor_gym.episode")


class _VerifyPhase:
    """Mixin of `Episode`: stage ``/tests`` and ``trajectory.json``, run test.sh, read the reward files, copy
    the verifier logs."""

    # --- the verifier (VER-3..11) ------------------------------------------------------------------------
    def _verify(self, t: _Turn) -> None:
        step = t.step
        budget = verifier_budget(step.verifier_timeout_sec, self._multiplier)
        env = {**self._env, **resolved_env(step.verifier_env, where=f"steps.{step.name}.verifier.env",
                                           allowlist=self.config.host_env_allowlist)}
        doc = build_trajectory(t.instruction, agent_identity(t.agent),
                               t.outcome.trajectory if t.outcome is not None else None)
        payload = json.dumps(doc, indent=2).encode()
        (t.dirs.agent / "trajectory.json").write_bytes(payload)
        builder = ArchiveBuilder()
        builder.add_bytes(payload, "/logs/agent/trajectory.json", mode=0o644)
        if t.mode == "separate":
            spec, uploads = verifier_spec(self.task, step, agent=self._agent_spec,
                                          default_storage_mb=self.config.default_storage_mb,
                                          default_memory_mb=self.config.default_memory_mb,
                                          host_env_allowlist=self.config.host_env_allowlist)
            if t.index == len(self.task.steps) - 1 and self._sandbox is not None:
                # VER-3: on the last step, the agent sandbox (and its group) stops before the verify.
                (self._group or self._sandbox).stop()
            vsb = self._factory(spec)
            self._others.append(vsb)
            try:
                for entry in t.manifest:
                    if entry.status != "ok" or entry.service is not None:
                        continue
                    local = t.dirs.artifacts / entry.destination
                    if local.is_dir():
                        builder.add_artifact_tree(local, entry.source)
                    elif local.is_file():
                        builder.add_file(local, entry.source, clear_setid=True)
                self._run_verifier(t, vsb, builder, uploads, budget, env, shared=False)
            finally:
                self._others.remove(vsb)
                vsb.stop()
        else:
            # GYM-11: what the freeze stopped stays stopped until the verifier's files are copied out; it is
            # resumed by the next turn's preparation exec (`_prepare`), an episode that ends stops its sandbox.
            self._run_verifier(t, self._sandbox, builder, True, budget, env, shared=True)
        t.verified = True

    def _run_verifier(self, t: _Turn, sb: Sandbox, builder: ArchiveBuilder, upload_tests: bool, budget: float,
                      env: dict[str, str], *, shared: bool) -> None:
        """VER-6/7/11, RWD-1: one staged upload, then one exec (two when the verifier user is not root)."""
        step = t.step
        if upload_tests:
            for layer in step.tests_layers:
                builder.add_tree(layer, "/tests", honour_ignore=True, root=self.task.path)
            builder.add_file(step.test_script, "/tests/test.sh", mode=0o755)
        stdin = builder.render()  # tests + trajectory (+ artifacts) on the staging exec's stdin
        user = step.verifier_user or sb.default_user
        as_root = _is_root(user)
        is_last = t.index == len(self.task.steps) - 1
        prep = Script()
        if shared and self._freeze is not None:
            # GYM-11: every other process stopped before /logs/verifier is emptied, resumed after the read-back
            freeze_fragment(prep, self._freeze)
            self._frozen_pending = True
        tools = " ".join(_VERIFIER_TOOLS)
        prep.add(f"for t in {tools}; do command -v $t >/dev/null 2>&1 || {prep.flag('missing', '$t')}; done")
        if t.art_snapshot:
            prep.add(f"rm -rf {STAGE_DIR}/art; if [ -n \"$(ls -A /logs/artifacts 2>/dev/null)\" ]; then "
                     f"cp -a /logs/artifacts {STAGE_DIR}/art && {prep.note('art')}; fi")
        # P1: whatever an agent put in place of these folders (a symlink to planted reward files, a plain file)
        # is removed first, so the verifier writes, and the engine reads, only fresh folders (VER-6).
        guarded = "/logs /logs/verifier /logs/agent" + (" /tests" if upload_tests else "")
        prep.add(f"for d in {guarded}; do if [ -L \"$d\" ] || {{ [ -e \"$d\" ] && [ ! -d \"$d\" ]; }}; then "
                 "rm -rf \"$d\"; fi; done")
        prep.add("find /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null; "
                 + ("" if upload_tests else ": ") + "find /tests -mindepth 1 -maxdepth 1 -exec rm -rf {} + 2>/dev/null; "
                 "mkdir -p /tests /logs/verifier /logs/agent; chmod 0777 /logs/verifier; "
                 f"tar -xpf - -C / || {prep.flag('outage', 'stage')}; chmod +x /tests/test.sh 2>/dev/null")
        run = Script() if not as_root else prep
        run.add(f"cd {q(sb.workdir)} 2>/dev/null || cd /")
        run.add(f"{verifier_command(budget, harbor=self._harbor)}; echo {q(run.marker)} rc $?")
        self._emit(run)
        if as_root and shared and not is_last:
            # TURN-2 for the next turn, folded in when nothing more has to be copied out first.
            run.add("n=$(find /logs/verifier -mindepth 1 -maxdepth 1 ! -name reward.json ! -name reward.txt "
                    "! -name test-stdout.txt | wc -l); s=$(wc -c < /logs/verifier/test-stdout.txt 2>/dev/null "
                    f"|| echo 0); if [ \"$n\" = 0 ] && [ \"$s\" -le {_INLINE_CAP} ]; then "
                    "find /tests /logs/verifier -mindepth 1 -maxdepth 1 -exec rm -rf {} + ; "
                    "chmod 0777 /logs/verifier; rm -f /logs/agent/trajectory.json; "
                    f"{run.note('cleaned')}; fi")
        host_wait = budget + (5.0 if self._harbor else self.config.verifier_grace_s)
        pflags = None
        if not as_root:
            pre = self._exec(sb, prep.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin)
            pflags = parse(pre.stdout, prep.marker)
            if self._masked_by(t, pflags):
                return
            if pflags.has("outage") or not pre.ok:
                raise SandboxError(f"verifier staging failed: {pre.stderr[-300:]}", field=step.name, rule="VER-6",
                                   retryable=True)
        res = self._exec(sb, run.text(), timeout=host_wait, user="root" if as_root else user, env=env,
                         stdin=stdin if as_root else None)
        flags = parse(res.stdout, run.marker)
        if as_root and self._masked_by(t, flags):
            return
        if as_root and flags.has("outage"):
            raise SandboxError(f"verifier staging failed: {res.stderr[-300:]}", field=step.name, rule="VER-6",
                               retryable=True)
        rc = flags.first("rc")
        art_noted = (pflags or flags).has("art")
        if shared and self._freeze is not None:  # GYM-11: the services left running, for the turn record
            frozen = pflags or flags
            t.freeze_exempt = parse_exempt(frozen)
            if frozen.has("freeze_unavailable"):
                _log.warning("freeze of %s: the verifier's exec is not in a PID namespace of its own: nothing was "
                             "stopped (GYM-11)", step.name)
            if frozen.has("freeze_incomplete"):
                _log.warning("freeze of %s: processes not stopped within the bound: %s", step.name,
                             frozen.first("freeze_incomplete"))
        if res.timed_out or rc is None:
            # The host stopped waiting (VER-7): read what the verifier left in a second call.
            t.verifier_timed_out = True
            again = Script()
            self._emit(again)
            res2 = sb.exec(again.text(), timeout=_HOUSEKEEPING_S, user="root")
            flags = parse(res2.stdout, again.marker)
        elif not self._harbor and rc and rc[0] in ("124", "137"):
            t.verifier_timed_out = True
        if t.art_snapshot:
            # the snapshot note comes from the first exec; after a host-side kill it may be lost: then try
            self._snapshot_artifacts(t, sb, art_noted or t.verifier_timed_out)
        files = flags.files
        t.reading = read_reward_files(
            files["reward.json"][1] if "reward.json" in files else None,
            files["reward.txt"][1] if "reward.txt" in files else None,
            booleans_are_numbers=self._harbor)
        if shared:
            self._cleanup_pending = not flags.has("cleaned")
        self._write_verifier_logs(t, sb, flags)

    def _emit(self, script: Script) -> None:
        script.emit_file("/logs/verifier/reward.json", "reward.json", _REWARD_CAP)
        script.emit_file("/logs/verifier/reward.txt", "reward.txt", _REWARD_CAP)
        script.emit_file("/logs/verifier/test-stdout.txt", "test-stdout.txt", _INLINE_CAP)
        script.add("for f in /logs/verifier/* /logs/verifier/.[!.]*; do [ -e \"$f\" ] || continue; "
                   "case \"${f##*/}\" in reward.json|reward.txt|test-stdout.txt) ;; *) "
                   + script.note("extra", '"${f##*/}"') + ";; esac; done")

    def _masked_by(self, t: _Turn, flags: Any) -> bool:
        """VER-11: a missing tool masks the turn (``mask_reason = "verifier_error"``); test.sh did not start."""
        missing = flags.flags.get("missing")
        if not missing:
            return False
        t.masked, t.mask_reason = True, "verifier_error"
        names = [m[0] for m in missing if m]
        t.cause = f"verifier masked (VER-11): the verifier sandbox lacks {', '.join(names) or 'a needed tool'}"
        _log.warning("verifier of %s masked: missing %s (VER-11)", t.step.name, names)
        return True

    def _write_verifier_logs(self, t: _Turn, sb: Sandbox, flags: Any) -> None:
        out = t.dirs.verifier
        for name, (size, text) in flags.files.items():
            (out / name).write_text(text)
        big = "test-stdout.txt" in flags.files and flags.files["test-stdout.txt"][0] > _INLINE_CAP
        if flags.has("extra") or big:
            with tempfile.TemporaryDirectory(prefix="hg-ver-") as tmp:
                try:
                    got = sb.get("/logs/verifier", Path(tmp))
                    shutil.copytree(got, out, dirs_exist_ok=True)
                except SandboxError as exc:
                    _log.warning("could not copy /logs/verifier of %s: %s", t.step.name, exc)

    def _has_result(self, t: _Turn) -> bool:
        """A valid reward file; under Harbor a timed-out verifier has no result (DIFF-15)."""
        return bool(t.reading and t.reading.valid and not (self._harbor and t.verifier_timed_out))

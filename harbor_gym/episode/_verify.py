"""The verifier phase of a turn (VER-3..11, RWD-1, DIFF-14/15): shared or separate verify, the test.sh
run, the reward read."""

from __future__ import annotations

import json
import logging
import os
import shutil
from pathlib import Path
from typing import Any

from harbor_gym.agents import agent_identity, build_trajectory
from harbor_gym.episode._budgets import verifier_budget
from harbor_gym.episode._freeze import freeze_fragment, parse_exempt, thaw_fragment
from harbor_gym.episode._modes import verifier_command
from harbor_gym.episode._rewards import REWARD_FILES, RewardReading, reward_reading
from harbor_gym.episode._shell import Script, q
from harbor_gym.episode._spec import resolved_env, verifier_spec
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._turnstate import (
    _HOUSEKEEPING_S,
    _VERIFIER_TOOLS,
    _is_root,
    _Turn,
)
from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox.base import Sandbox
from harbor_gym.sandbox.channel import CopiedFile, CopyBudget

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
            # GYM-11: what the freeze stopped stays stopped until the verifier's files are copied out, then it is
            # resumed at once (`_thaw_after_read_back`), so leftover processes keep running between turns; an
            # episode that ends stops its sandbox instead.
            self._run_verifier(t, self._sandbox, builder, True, budget, env, shared=True)
            if self._frozen_pending and t.index < len(self.task.steps) - 1:
                self._thaw_after_read_back(t)
        t.verified = True

    def _thaw_after_read_back(self, t: _Turn) -> None:
        """GYM-11: resume exactly what this turn's freeze stopped, now that ``/logs/verifier`` has crossed to the
        host, in one root exec (none when the freeze noted that it stopped nothing). A thaw that fails is owed and
        retried first in the next turn's preparation exec (`_prepare`)."""
        if t.frozen_count == 0:
            self._frozen_pending = False
            return
        script = Script()
        thaw_fragment(script)
        try:
            res = self._exec(self._sandbox, script.text(), timeout=_HOUSEKEEPING_S, user="root", cwd="/")
        except SandboxError as exc:  # the next preparation exec thaws (or the turn's outage is reported there)
            _log.warning("thaw after the verifier of %s failed, retried at the next preparation: %s",
                         t.step.name, exc)
            return
        if script.outcome(res).finished:
            self._frozen_pending = False

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
        # test.sh's exit code is a note (VER-9: it never changes the reward); a timeout (124/137) is a decision
        run.add(f"{verifier_command(budget, harbor=self._harbor)}; hgrc=$?; {run.note('rc', '$hgrc')}")
        if not self._harbor:
            run.add(f"case $hgrc in 124|137) {run.flag('vtimeout')};; esac")
        host_wait = budget + (5.0 if self._harbor else self.config.verifier_grace_s)
        pre_out = None
        if not as_root:
            pre = self._exec(sb, prep.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin, cwd="/")
            pre_out = prep.outcome(pre)
            if self._masked_by(t, pre_out):
                return
            if pre_out.has("outage") or not pre_out.finished:
                raise SandboxError(f"verifier staging failed: {pre.stderr[-300:]}", field=step.name, rule="VER-6",
                                   retryable=True)
        # in /, then cd: a workdir the agent deleted never turns the verify into an outage it could dodge with
        res = self._exec(sb, run.text(), timeout=host_wait, user="root" if as_root else user, env=env,
                         stdin=stdin if as_root else None, cwd="/")
        out = run.outcome(res)
        if as_root and self._masked_by(t, out):
            return
        if as_root and out.has("outage"):
            raise SandboxError(f"verifier staging failed: {res.stderr[-300:]}", field=step.name, rule="VER-6",
                               retryable=True)
        if res.timed_out or not out.finished or out.has("vtimeout"):
            # VER-7: the host stopped waiting, or timeout(1) ended test.sh; what it left is read all the same
            t.verifier_timed_out = True
        if shared and self._freeze is not None:  # GYM-11: the services left running, for the turn record
            frozen = pre_out or out
            t.freeze_exempt = parse_exempt(frozen)
            counted = frozen.first("frozen")
            t.frozen_count = int(counted[0]) if counted and counted[0].isdigit() else None
            if frozen.has("freeze_unavailable"):
                _log.warning("freeze of %s: the verifier's exec is not in a PID namespace of its own: nothing was "
                             "stopped (GYM-11)", step.name)
            if frozen.has("freeze_incomplete"):
                _log.warning("freeze of %s: processes not stopped within the bound: %s", step.name,
                             frozen.first("freeze_incomplete"))
        if t.art_snapshot:
            # the snapshot note comes from the first exec; after a host-side kill it may be lost: then try
            self._snapshot_artifacts(t, sb, (pre_out or out).has("art") or t.verifier_timed_out)
        t.reading = self._read_verifier_logs(t, sb)
        if shared:
            self._cleanup_pending = True  # TURN-2 before the next turn (folded into its preparation exec)

    def _read_verifier_logs(self, t: _Turn, sb: Sandbox) -> RewardReading:
        """RWD-1, GYM-10: ``/logs/verifier`` crosses to the turn's verifier folder through the trusted channel
        (`Sandbox.copy_out`, one engine request on Docker), capped by the turn's `CopyBudget` (test-stdout.txt
        included); the reward files are read from that same copy, outside the turn budget, and are invalid over
        ``EnvConfig.reward_file_cap_bytes`` or when they are not regular files (links are never followed). Exec
        output plays no part: nothing a sandbox process prints can name a host file or a reward."""
        cap = self.config.reward_file_cap_bytes
        staging = t.dirs.turn / ".hg-verifier-copy"
        shutil.rmtree(staging, ignore_errors=True)
        report = None
        try:
            report = sb.copy_out("/logs/verifier", staging, budget=t.copy_budget(self.config),
                                 reserved={name: cap for name in REWARD_FILES})
        except SandboxPathError:
            _log.warning("verifier of %s left no /logs/verifier", t.step.name)
        except SandboxError as exc:
            if not sb.is_alive():
                shutil.rmtree(staging, ignore_errors=True)
                raise
            _log.warning("could not copy /logs/verifier of %s: %s", t.step.name, exc)
        try:
            if report is not None and report.kind == "directory" and report.cut:
                self._reward_files_alone(t, sb, report, staging, cap)
            if report is not None and report.kind == "directory":
                _move_children(staging, t.dirs.verifier, step=t.step.name)
                if report.truncated or report.links or report.refused:
                    _log.warning("/logs/verifier of %s: truncated %s, links %s, refused %s (GYM-10)", t.step.name,
                                 sorted(n for n, f in report.files.items() if f.truncated), sorted(report.links),
                                 sorted(report.refused))
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return reward_reading(report, cap, booleans_are_numbers=self._harbor)

    def _reward_files_alone(self, t: _Turn, sb: Sandbox, report: Any, staging: Path, cap: int) -> None:
        """The copy of ``/logs/verifier`` was cut (a huge log before the reward files in the engine's stream, or
        the turn budget spent): the reward files it did not reach are copied alone, one engine request each, so
        that a large log never costs a reward (each read at most ``cap`` + 1 bytes, outside the turn budget)."""
        seen = set(report.files) | set(report.links) | set(report.refused)
        for name in REWARD_FILES:
            if name in seen:
                continue
            alone = CopyBudget(file_cap=cap + 1, turn_cap=cap + (64 << 10))
            try:
                got = sb.copy_out(f"/logs/verifier/{name}", staging / name, budget=alone, reserved={"": cap})
            except SandboxPathError:
                continue
            except SandboxError as exc:
                _log.warning("could not copy %s of %s: %s", name, t.step.name, exc)
                continue
            if got.kind == "file":
                report.files[name] = got.files.get("", CopiedFile(0, True))
                report.data[name] = got.data.get("", b"")
            elif got.kind is not None:
                report.refused[name] = got.kind

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

    def _has_result(self, t: _Turn) -> bool:
        """A valid reward file; under Harbor a timed-out verifier has no result (DIFF-15)."""
        return bool(t.reading and t.reading.valid and not (self._harbor and t.verifier_timed_out))


def _move_children(src: Path, dest: Path, *, step: str) -> None:
    """Move the copied ``/logs/verifier`` entries into the turn's verifier folder. ``artifacts`` is the engine's
    own (ART-4: the collected artifacts and their manifest), so a verifier's folder of that name is not merged
    over it."""
    dest.mkdir(parents=True, exist_ok=True)
    for child in sorted(os.listdir(src)):
        if child == "artifacts":
            _log.warning("verifier of %s wrote /logs/verifier/artifacts: not copied over the engine's artifacts/",
                         step)
            continue
        target = dest / child
        if target.is_dir() and not target.is_symlink():
            shutil.rmtree(target)
        elif target.exists() or target.is_symlink():
            target.unlink()
        os.rename(src / child, target)

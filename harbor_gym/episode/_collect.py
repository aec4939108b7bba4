"""The artifact collection phase of a turn (ART-1..5)."""

from __future__ import annotations

import json
import logging

from harbor_gym.episode._artifacts import collect, entry_status, plan_entries, run_hooks
from harbor_gym.episode._records import ManifestEntry
from harbor_gym.episode._staging import STAGE_DIR
from harbor_gym.episode._turnstate import _Turn
from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.sandbox.base import ExecResult, Sandbox

__all__: list[str] = []

_log = logging.getLogger("harbor_gym.episode")


class _CollectPhase:
    """Mixin of `Episode`: collect hooks and artifact entries after the agent, and the verify exec's
    ``/logs/artifacts`` snapshot."""

    # --- artifacts (ART-1..5) ----------------------------------------------------------------------------
    def _collect(self, t: _Turn) -> None:
        sb, step = self._sandbox, t.step
        def main_hook(cmd: str, user: str | None, tmo: float) -> ExecResult:
            return self._exec(sb, ["bash", "-c", cmd], timeout=tmo, user=user or self._user_in_place, cwd=sb.workdir)

        def sidecar_hook(service: str, cmd: str, user: str | None, tmo: float) -> ExecResult | None:
            side = self._sidecar(service)  # COMPOSE-3: no workdir, user or env of main
            return None if side is None else self._exec(side, ["sh", "-c", cmd], timeout=tmo, user=user)

        plan = plan_entries(step)
        if t.mode == "shared" and not step.collect and [p.origin for p in plan] == ["convention"]:
            # One round trip fewer: the verify exec snapshots /logs/artifacts (after the agent, before test.sh)
            # and the snapshot is copied out only when it holds something (ART-1 order kept).
            t.art_snapshot = True
            return
        main_plan = [p for p in plan if p.service is None]
        side_plan = [p for p in plan if p.service is not None]
        done: list[str] = []
        run_hooks(step.collect, main_hook)
        budget = t.copy_budget(self.config)
        manifest = collect(sb, main_plan, t.dirs.artifacts, harbor=False, write_manifest=False, done=done,
                           budget=budget)
        run_hooks(step.collect, main_hook, sidecar_hook if self._group is not None else None, sidecars=True)
        manifest += collect(sb, side_plan, t.dirs.artifacts, harbor=False, sidecars=self._sidecar, done=done,
                            write_manifest=False, budget=budget)
        t.manifest = manifest  # DIFF-13: the Seed side under both semantics
        (t.dirs.artifacts / "manifest.json").write_text(json.dumps([m.to_dict() for m in manifest], indent=2))
        self._clock.check()

    def _snapshot_artifacts(self, t: _Turn, sb: Sandbox, present: bool) -> None:
        """ART-1/4 for a convention-only turn: copy the verify exec's snapshot of ``/logs/artifacts`` out through
        the trusted channel (GYM-10, the turn's `CopyBudget`)."""
        plan = plan_entries(t.step)
        status, report = "empty", None
        out = t.dirs.artifacts / plan[0].destination
        out.mkdir(parents=True, exist_ok=True)
        if present:
            try:
                report = sb.copy_out(f"{STAGE_DIR}/art", out, budget=t.copy_budget(self.config))
                has = bool(report.links or report.refused) or any(out.iterdir())
                status = entry_status(report, has_content=has) if report.kind == "directory" else "failed"
            except SandboxPathError:
                status = "empty"
            except SandboxError as exc:
                _log.warning("artifacts of %s not copied: %s (ART-3)", t.step.name, exc)
                status = "failed"
        t.manifest = (ManifestEntry(plan[0].source, plan[0].destination, "directory", status, None, (),
                                    plan[0].origin, links=dict(report.links) if report else {},
                                    refused=dict(report.refused) if report else {}),)
        (t.dirs.artifacts / "manifest.json").write_text(json.dumps([m.to_dict() for m in t.manifest], indent=2))

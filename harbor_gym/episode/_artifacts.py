"""Artifact collection per turn (SPEC ART-1..5, DIFF-13): collect hooks, then entries, into the turn's
``artifacts/`` folder with a ``manifest.json``.

Every entry crosses through the trusted channel (`Sandbox.copy_out`, GYM-10) under the turn's `CopyBudget`: links
inside an entry are recorded in its manifest object (``links``), never followed; fifos, devices and sockets are
recorded as ``refused``; an entry that a cap cut (a file over ``copy_file_cap_bytes``, the turn past
``copy_turn_cap_bytes``) has the status ``truncated``. An output path that would leave ``artifacts/`` fails.
"""

from __future__ import annotations

import fnmatch
import json
import logging
import os
import posixpath
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from harbor_gym.errors import SandboxError, SandboxPathError
from harbor_gym.episode._records import ManifestEntry
from harbor_gym.sandbox.base import ExecResult, Sandbox
from harbor_gym.sandbox.channel import CopyBudget, CopyReport, safe_relname
from harbor_gym.task import CollectHook, Step

__all__ = ["ArtifactPlan", "plan_entries", "collect", "entry_status", "CONVENTION_SOURCE", "output_path_conflicts"]

_log = logging.getLogger("harbor_gym.episode")

#: ART-2: the convention entry.
CONVENTION_SOURCE = "/logs/artifacts"


@dataclass(frozen=True)
class ArtifactPlan:
    """One entry to collect, in ART-1 order."""

    source: str
    destination: str  # relative to artifacts/
    exclude: tuple[str, ...]
    service: str | None
    origin: str  # convention | task | step


def plan_entries(step: Step) -> list[ArtifactPlan]:
    """ART-1/2/4: ``main``'s entries (the convention entry unless an entry names ``/logs/artifacts`` for main, then
    the task's, then the step's), then sidecars' entries in the same order."""
    entries = [
        ArtifactPlan(a.source, _dest(a.source, a.destination), tuple(a.exclude),
                     None if a.service in (None, "main") else a.service, a.origin)
        for a in step.artifacts
    ]
    names_convention = any(e.service is None and posixpath.normpath(e.source) == CONVENTION_SOURCE for e in entries)
    main = [e for e in entries if e.service is None]
    if not names_convention:
        main.insert(0, ArtifactPlan(CONVENTION_SOURCE, _dest(CONVENTION_SOURCE, None), (), None, "convention"))
    return main + [e for e in entries if e.service is not None]


def _dest(source: str, destination: str | None) -> str:
    """ART-4: ``destination``, else the source path minus its leading ``/``."""
    return posixpath.normpath(destination if destination else source.lstrip("/"))


def output_path_conflicts(path: str, earlier: Sequence[str]) -> bool:
    """ART-5: ``path`` equals, contains or is inside an earlier output path."""
    for other in earlier:
        if path == other or path.startswith(other + "/") or other.startswith(path + "/"):
            return True
    return False


def run_hooks(hooks: Sequence[CollectHook], run: Callable[[str, str | None, float], ExecResult | None],
              run_sidecar: Callable[[str, str, str | None, float], ExecResult | None] | None = None,
              *, sidecars: bool = False) -> None:
    """ART-1/3: ``main``'s hooks in file order via ``bash -c`` as the hook's user (else the service's); with
    ``sidecars``, the sidecars' hooks via ``sh -c``. Failures and timeouts are only logged."""
    for hook in hooks:
        is_main = hook.service in (None, "main")
        if is_main == sidecars:
            continue
        if not is_main and run_sidecar is None:
            _log.warning("collect hook for service %r not run: no sidecars here (ART-3)", hook.service)
            continue
        try:
            result = (run(hook.command, hook.user, float(hook.timeout_sec)) if is_main
                      else run_sidecar(hook.service, hook.command, hook.user, float(hook.timeout_sec)))
        except SandboxError as exc:
            _log.warning("collect hook %r could not run: %s (ART-3)", hook.command, exc)
            continue
        if result is not None and not result.ok:
            _log.warning("collect hook %r failed (exit %s, timed out %s) (ART-3)", hook.command, result.exit_code,
                         result.timed_out)


def collect(sandbox: Sandbox | None, plan: Sequence[ArtifactPlan], out_dir: Path, *, harbor: bool,
            budget: CopyBudget, write_manifest: bool = True, sidecars: Callable[[str], Sandbox | None] | None = None,
            done: list[str] | None = None) -> tuple[ManifestEntry, ...]:
    """ART-3/4/5, GYM-10: copy each planned entry from ``sandbox`` into ``out_dir`` through the trusted channel,
    within ``budget`` (the turn's), and write ``manifest.json``.

    Best effort: a failed copy is recorded ``failed``; an entry whose output path conflicts with an earlier one
    is ``skipped``; an existing empty folder is ``empty``; an entry a cap cut is ``truncated``. ``origin`` is
    left out under Harbor (DIFF-13).

    Raises:
        SandboxError: only when the sandbox itself is out (not alive), so the engine records an outage.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    manifest: list[ManifestEntry] = []
    done = [] if done is None else done
    for entry in plan:
        status, kind, report = "failed", "directory", None
        source_box = sandbox if entry.service is None else (sidecars(entry.service) if sidecars else None)
        if output_path_conflicts(entry.destination, done):
            status = "skipped"
        elif source_box is None:
            _log.warning("artifact %s of service %r not collected: no such service here", entry.source,
                         entry.service)
        else:
            status, kind, report = _copy(source_box, entry, out_dir, budget)
            done.append(entry.destination)
        manifest.append(ManifestEntry(entry.source, entry.destination, kind, status, entry.service,
                                      entry.exclude, None if harbor else entry.origin,
                                      links=dict(report.links) if report else {},
                                      refused=dict(report.refused) if report else {}))
    if write_manifest:
        (out_dir / "manifest.json").write_text(json.dumps([m.to_dict() for m in manifest], indent=2))
    return tuple(manifest)


def entry_status(report: CopyReport, *, has_content: bool) -> str:
    """ART-4 status of a copied entry: ``truncated`` when a cap cut it (GYM-10), else ``ok``, or ``empty`` for a
    folder that holds nothing."""
    if report.truncated:
        return "truncated"
    return "ok" if has_content else "empty"


def _copy(sandbox: Sandbox, entry: ArtifactPlan, out_dir: Path,
          budget: CopyBudget) -> tuple[str, str, CopyReport | None]:
    rel = safe_relname(entry.destination)
    if not rel:
        _log.warning("artifact %s not copied: its destination %r leaves artifacts/ (GYM-10)", entry.source,
                     entry.destination)
        return "failed", "directory", None
    target = out_dir / rel
    try:
        report = sandbox.copy_out(entry.source, target, budget=budget)
    except SandboxPathError:
        return "failed", "directory", None
    except SandboxError as exc:
        if not sandbox.is_alive():
            raise
        _log.warning("artifact %s not copied: %s (ART-3)", entry.source, exc)
        return "failed", "directory", None
    if report.kind == "directory":
        if entry.exclude:
            _apply_exclude(target, entry.exclude)
        has = bool(report.links or report.refused) or any(files or dirs for _, dirs, files in os.walk(target))
        return entry_status(report, has_content=has), "directory", report
    if report.kind == "file":
        return entry_status(report, has_content=True), "file", report
    # the source itself is a link (recorded, never followed) or a fifo, device or socket (refused)
    _log.warning("artifact %s not copied: it is a %s (GYM-10)", entry.source, report.kind)
    return "failed", "file", report


def _apply_exclude(root: Path, patterns: Sequence[str]) -> None:
    """ART-5: ``exclude`` globs, matched against each path relative to the folder and against its name."""
    for dirpath, dirnames, filenames in os.walk(root, topdown=True):
        for name in list(dirnames) + list(filenames):
            full = Path(dirpath) / name
            rel = full.relative_to(root).as_posix()
            if any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(name, p) for p in patterns):
                if full.is_dir() and not full.is_symlink():
                    shutil.rmtree(full)
                    dirnames.remove(name)
                else:
                    full.unlink()

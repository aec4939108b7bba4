"""The seeding of an agent sandbox as data: a pure `SeedPlan` (decided from the task alone) and its ``apply``.

GYM-2 seeding is: create the ``/logs`` folders and the staging folder, create the workdir and upload the files of
``environment/`` into it (FMT-10, only for a ``docker_image`` task without a Dockerfile or compose file), then poll
``[environment].healthcheck`` (TURN-7, as the image's default user, in the workdir; under Harbor semantics a
workdir that does not exist then fails seeding at once, issue 16). A plan fixes all of that before
any sandbox exists, so that it can run either on the reset path (``plan.apply(sandbox)``) or ahead of need, on a
warm pool's sandboxes (``PoolFactory.claim_prepared(spec, plan.key, plan.apply)``).

Guarantees:
- ``plan.key`` names the preparation exactly: two plans with equal keys do the same thing to a sandbox of the same
  spec. It holds the task folder, a digest of every uploaded file (relative path, mode, mtime, content) and empty
  folder, the healthcheck table, and `PLAN_VERSION`. The workdir, image, user and env are the spec's, which the
  pool is keyed by already.
- The uploaded bytes are read once, when the plan is made, and the key is digested from that very archive: what
  the key names is what ``apply`` uploads.
- ``apply`` raises `SandboxError` (retryable: an outage) when the seeding commands fail and `SeedError`
  (``retryable=True``, GYM-2) when the healthcheck fails; it leaves the sandbox running either way (the caller
  stops it).
"""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from harbor_gym.episode._healthcheck import poll_healthcheck
from harbor_gym.episode._shell import Script, q
from harbor_gym.episode._staging import STAGE_DIR, ArchiveBuilder
from harbor_gym.episode._stop import WORKDIR_MISSING_KIND
from harbor_gym.episode._turnstate import _HOUSEKEEPING_S
from harbor_gym.errors import SandboxError, SeedError
from harbor_gym.sandbox.base import Sandbox
from harbor_gym.task import HealthcheckConfig, Task

__all__ = ["PLAN_VERSION", "SeedPlan", "seed_plan"]

#: Bumped whenever ``apply`` changes what it does, so that pools prepared by an older plan are never mixed in.
PLAN_VERSION = 2

_LOGS_SETUP = (f"mkdir -p /logs/agent /logs/verifier /logs/artifacts /tests {STAGE_DIR} && "
               f"chmod 0777 /logs/agent /logs/verifier /logs/artifacts && chmod 0700 {STAGE_DIR}")


@dataclass(frozen=True, eq=False)
class SeedPlan:
    """What GYM-2 seeding does to a fresh agent sandbox of a task (see the module docstring).

    Attributes:
        key: names the preparation (hashable; equal keys = equal preparations).
        task_path: the task folder (for error messages).
        archive: the ``environment/`` files as a tar whose members are relative to the workdir; ``b""``: no upload.
        healthcheck: ``[environment].healthcheck``, or ``None``.
        workdir_must_exist: Harbor semantics (issue 16): the workdir is not created, and the healthcheck runs
            there; when it is missing (the image lacks it, no FMT-10 upload made it) seeding fails at once.
    """

    key: tuple
    task_path: Path
    archive: bytes
    healthcheck: HealthcheckConfig | None
    workdir_must_exist: bool = False

    def apply(self, sb: Sandbox) -> None:
        """Seed ``sb`` (GYM-2): ``/logs`` folders, workdir and FMT-10 files in one exec, then the healthcheck.

        Reads only the plan (a pool runs it on several sandboxes at once).

        Raises:
            SandboxError: the seeding commands failed (``retryable=True``).
            SeedError: the healthcheck failed (``retryable=True``, GYM-2/TURN-7), or it would run in a workdir
                that does not exist (``workdir_must_exist``; ``retryable=False``: the task's fault).
        """
        workdir = sb.workdir
        script = Script()
        script.add(f"{_LOGS_SETUP} || " + script.flag("failed"))
        stdin: bytes | None = None
        if self.archive:
            stdin = self.archive  # the archive travels on the exec's stdin: no separate upload
            # an upload into the workdir creates it, under both semantics (Harbor's `docker compose cp` does)
            script.add(f"mkdir -p {q(workdir)} && tar -xpf - -C {q(workdir)} || {script.flag('failed')}")
        hc = self.healthcheck
        if hc is not None and self.workdir_must_exist:
            script.add(f"[ -d {q(workdir)} ] || {script.flag('workdir_missing')}")
        # in /: the workdir may not exist (Harbor semantics), and nothing here is relative to it
        result = sb.exec(script.text(), timeout=_HOUSEKEEPING_S, user="root", stdin=stdin, cwd="/")
        done = script.outcome(result)  # the decision comes from the exit status, not from printed lines (GYM-10)
        if not done.finished or done.has("failed"):
            raise SandboxError(f"seeding commands failed (exit {result.exit_code}): {result.stderr[-500:]}",
                               field="seed", rule="GYM-2", retryable=True)
        if done.has("workdir_missing"):
            # Harbor runs the healthcheck in the missing workdir and fails it (HealthcheckError); harbor_gym does not
            # poll a check that cannot start, and a repeat would fail the same way
            raise SeedError(f"the workdir {workdir} does not exist in the sandbox (its image lacks it and nothing of "
                            "the task creates it; Harbor semantics do not create it), so [environment].healthcheck "
                            f"cannot run there ({WORKDIR_MISSING_KIND})", path=self.task_path / "task.toml",
                            field="environment.workdir", rule="GYM-2", retryable=False)
        if hc is not None:
            passed, attempts = poll_healthcheck(
                hc, lambda cmd, t: sb.exec(["bash", "-c", cmd], timeout=t, user=sb.default_user, cwd=workdir))
            if not passed:
                raise SeedError(f"[environment].healthcheck failed after {attempts} attempt(s)",
                                path=self.task_path / "task.toml", field="environment.healthcheck",
                                rule="GYM-2", retryable=True)


def seed_plan(task: Task, *, workdir_must_exist: bool = False) -> SeedPlan:
    """The `SeedPlan` of ``task``: reads ``environment/`` now (FMT-10) and touches no sandbox.
    ``workdir_must_exist``: ``not workdir_created(config)`` (Harbor semantics, issue 16).

    Raises:
        TaskLoadError: an ``environment/`` entry is refused (LOAD-13: a dangling or escaping symlink).
    """
    cfg = task.config.environment
    digest = hashlib.sha256()
    archive = b""
    if cfg.docker_image and task.dockerfile is None and task.compose_file is None \
            and task.environment_dir is not None:
        builder = ArchiveBuilder()
        builder.add_tree(Path(task.environment_dir), "/", honour_ignore=False, root=task.path)
        if builder:
            archive = _render_digested(builder, digest)
    hc = cfg.healthcheck
    hc_key = None if hc is None else json.dumps(hc.model_dump(mode="json"), sort_keys=True)
    key = ("seed", PLAN_VERSION, str(Path(task.path).resolve()), digest.hexdigest(), hc_key, workdir_must_exist)
    return SeedPlan(key=key, task_path=Path(task.path), archive=archive, healthcheck=hc,
                    workdir_must_exist=workdir_must_exist)


def _render_digested(builder: ArchiveBuilder, digest: Any) -> bytes:
    """Render ``builder``'s archive and feed ``digest`` with every member's name, type, mode and size, a file's
    mtime and content, but not a folder entry's mtime (the render time)."""
    archive = builder.render()
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            mtime = int(member.mtime) if member.isfile() else 0
            digest.update(f"{member.name}\0{member.type!r}\0{member.mode}\0{member.size}\0{mtime}\0".encode())
            if member.isfile():
                digest.update(hashlib.sha256(tar.extractfile(member).read()).digest())
    return archive

"""`prewarm`: fill this process's warm pools for every task of a folder before a training loop or run starts.

A pool lives in its process (its sandboxes are bound to the process's lease), so a training script calls
`prewarm` itself; ``harbor-gym prewarm PATH --size N`` does the same from the command line, which resolves or builds
every task's image (cached for later runs), proves that N sandboxes of each start, reports the times, and removes
them when it exits.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from harbor_gym.config import EnvConfig

__all__ = ["prewarm", "PrewarmResult"]


@dataclass(frozen=True)
class PrewarmResult:
    """One task's pool after `prewarm`: how many sandboxes are ready, how long the fill took, the error if any."""

    task_id: str
    ready: int
    size: int
    seconds: float
    error: str | None = None
    #: The task is not pooled (a compose group); not a failure.
    skipped: bool = False

    @property
    def ok(self) -> bool:
        """True iff the pool holds ``size`` ready sandboxes, or the task is not pooled."""
        return self.skipped or (self.error is None and self.ready >= self.size)


def prewarm(path: str | Path, *, size: int, config: EnvConfig | Mapping[str, Any] | None = None,
            timeout_s: float = 600.0) -> list[PrewarmResult]:
    """Fill the process's warm pool of every task under ``path`` (a task folder or a folder of them) to ``size``.

    Tasks that fail to load or are refused at seed are reported with their error; compose tasks are reported as
    skipped (their sandboxes start as a group per episode). Those pools are not made. Pools of tasks sharing a sandbox spec are one pool.

    Raises:
        TaskLoadError: ``path`` is neither a task folder nor a loadable dataset. ConfigError: a bad config or size.
    """
    from harbor_gym.episode._seedplan import seed_plan
    from harbor_gym.episode._spec import agent_spec, resolved_env, workdir_created
    from harbor_gym.errors import HarborGymError
    from harbor_gym.sandbox.lease import exit_on_sigterm
    from harbor_gym.sandbox.pool import pool_factory
    from harbor_gym.task import load_dataset, load_task

    exit_on_sigterm()  # pool sandboxes register from the pools' threads: SIGTERM must still take the Ctrl-C path
    cfg = EnvConfig.coerce(dict(config) if isinstance(config, Mapping) else config)
    root = Path(path)
    if (root / "task.toml").is_file():
        one = load_task(root, cfg)
        tasks, failures = {one.id: one}, {}
    else:
        dataset = load_dataset(root)
        tasks, failures = dict(dataset.tasks), dict(dataset.failures)
    factory = pool_factory(cfg, size=size)
    results = [PrewarmResult(task_id, 0, size, 0.0, f"{type(err).__name__}: {err}")
               for task_id, err in sorted(failures.items())]
    from harbor_gym.sandbox.pool import get_pool

    started: list[tuple[str, Any, float]] = []
    for task_id in sorted(tasks):
        task = tasks[task_id]
        if getattr(task, "compose", None) is not None and not task.config.environment.docker_image \
                and task.dockerfile is None:
            results.append(PrewarmResult(task_id, 0, size, 0.0, "a compose group starts per episode; not pooled",
                                         skipped=True))
            continue
        try:
            env = resolved_env(task.config.environment.env, where="environment.env",
                               allowlist=cfg.host_env_allowlist)  # FMT-15 as the episodes resolve it
            spec = agent_spec(task, env=env, pids_limit=cfg.pids_limit, default_storage_mb=cfg.default_storage_mb,
                              default_memory_mb=cfg.default_memory_mb,
                              create_workdir=workdir_created(cfg))  # the same spec the episodes ask for
            # the pool episodes claim from: sandboxes seeded ahead (GYM-2)
            plan = seed_plan(task, workdir_must_exist=not spec.create_workdir)
            pool = get_pool(spec, backend=factory.backend, settings=factory.settings, size=size, prepare=plan.apply,
                            prepare_key=plan.key)
        except HarborGymError as exc:
            results.append(PrewarmResult(task_id, 0, size, 0.0, f"{type(exc).__name__}: {exc}"))
            continue
        started.append((task_id, pool, time.monotonic()))
    for task_id, pool, t0 in started:
        try:
            ready = pool.fill(timeout=timeout_s)
            results.append(PrewarmResult(task_id, ready, size, time.monotonic() - t0))
        except HarborGymError as exc:
            results.append(PrewarmResult(task_id, pool.ready_count, size, time.monotonic() - t0,
                                         f"{type(exc).__name__}: {exc}"))
    return sorted(results, key=lambda r: r.task_id)

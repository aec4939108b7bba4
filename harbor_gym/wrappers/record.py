"""`RecordRollouts`: write the rows of ``harbor-gym run`` (``rollouts.jsonl``, ``rollouts_failures.jsonl``) from
any Gymnasium loop over a harbor_gym env."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import gymnasium as gym

__all__ = ["RecordRollouts"]


def _agent_label(agent: Any) -> str:
    if agent is None:
        return "actions"
    if isinstance(agent, str):
        return "script"
    name = getattr(agent, "name", None)
    return name if isinstance(name, str) and name else type(agent).__name__


class RecordRollouts(gym.Wrapper, gym.utils.RecordConstructorArgs):
    """Append one row per finished episode to ``path/rollouts.jsonl`` (graded) or ``path/rollouts_failures.jsonl``
    (ungraded or masked, STOP-5; or a ``reset`` that raised `SeedError`/`SeedRefusedError`), with the schema of
    `harbor_gym.run.rows` — the same rows ``harbor-gym run`` writes, built from the same ``info`` records.

    Args:
        env: a harbor_gym env (or a wrapper of one).
        path: the results folder (created when missing; rows are appended atomically).
        agent: the ``agent`` field of the rows (default: the announced agent's ``name``, else its class name,
            else ``"actions"``).

    Each ``reset`` starts a new rollout: ``rollout`` counts 0, 1, ... per task id within this wrapper, and ``seed``
    is the seed given to ``reset`` (``None`` when none was). An episode abandoned before its end (a new ``reset``
    or ``close`` first) writes nothing. Set ``EnvConfig.logs_root`` to keep the per-turn folders the rows point to.
    """

    def __init__(self, env: gym.Env, path: str | os.PathLike[str], agent: str | None = None):
        from harbor_gym.run.jsonl import RolloutFiles

        gym.utils.RecordConstructorArgs.__init__(self, path=str(path), agent=agent)
        gym.Wrapper.__init__(self, env)
        self.path = Path(path)
        self.files = RolloutFiles(self.path)
        self._agent = agent
        self._counts: dict[str, int] = {}
        self._key: dict[str, Any] | None = None
        self._records: list[Any] = []
        self._t0 = 0.0

    def _label(self, options: dict[str, Any] | None) -> str:
        if self._agent is not None:
            return self._agent
        announced = (options or {}).get("agent", getattr(self.env.unwrapped, "agent", None))
        return _agent_label(announced)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        from harbor_gym.errors import SeedError, SeedRefusedError
        from harbor_gym.run.rows import SEED_FAILED, SEED_REFUSED, FailureRow

        self._key, self._records = None, []
        self._t0 = time.monotonic()
        label = self._label(options)
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except (SeedRefusedError, SeedError) as exc:
            task = getattr(self.env.unwrapped, "task", None)
            task_id = getattr(task, "id", "unknown")
            if isinstance(options, dict) and isinstance(options.get("task"), str):
                task_id = options["task"]
            rollout = self._next_rollout(task_id)
            kind = SEED_REFUSED if isinstance(exc, SeedRefusedError) else SEED_FAILED
            self.files.write(FailureRow(task_id=task_id, rollout=rollout, seed=seed, agent=label, reason=str(exc),
                                        failure_kind=kind, retryable=bool(exc.retryable),
                                        duration_sec=round(time.monotonic() - self._t0, 3)))
            raise
        task_id = info.get("task_id") or getattr(self.env.unwrapped.task, "id")
        self._key = dict(task_id=task_id, rollout=self._next_rollout(task_id), seed=seed, agent=label,
                         backend=getattr(self.env.unwrapped, "backend", None))
        return obs, info

    def _next_rollout(self, task_id: str) -> int:
        rollout = self._counts.get(task_id, 0)
        self._counts[task_id] = rollout + 1
        return rollout

    def step(self, action: Any):
        from harbor_gym.run.rows import rows_from_episode

        obs, reward, terminated, truncated, info = self.env.step(action)
        if info.get("turn") is not None:
            self._records.append(info["turn"])
        result = info.get("episode_result")
        if result is not None and self._key is not None:
            row = rows_from_episode(result, records=self._records, duration_sec=time.monotonic() - self._t0,
                                    **self._key)
            self.files.write(row)
            self._key = None
        return obs, reward, terminated, truncated, info

"""Shared helpers of the episode integration tests: fixture task folders written into ``tmp_path`` from compact
dicts, and a runner that drives an `Episode` to its end on a real backend.

Fixtures use ``debian:bookworm-slim`` (aliased offline to the local base image), ``network_mode = "no-network"``
and tiny budgets, so each episode takes a second or two.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode, EpisodeResult, TurnResult
from harbor_gym.task import load_task
from task_folders import HEAD, REWARD_1, grade, toml  # noqa: F401  (re-exported for the tests)
from task_folders import write_task as _write_task


def write_task(root: Path, files: dict[str, Any], name: str = "ep-task") -> Path:
    """`task_folders.write_task` with this suite's default folder name."""
    return _write_task(root, files, name)


def run_episode(task_dir: Path, actions: Any, config: dict | None = None, *, agent: Any = None,
                backend: str = "docker", between: Any = None) -> tuple[list[TurnResult], EpisodeResult]:
    """Start an episode and run turns until it ends; ``actions`` is one action for every turn or a list.

    ``between(episode, results)`` is called between turns (e.g. to sleep outside the engine).
    """
    cfg = EnvConfig.coerce({"backend": backend, **(config or {})})
    task = load_task(task_dir, cfg)
    results: list[TurnResult] = []
    with Episode(task, cfg, agent=agent) as ep:
        ep.start()
        i = 0
        while ep.next_step is not None:
            action = actions[i] if isinstance(actions, list) else actions
            results.append(ep.run_turn(action))
            i += 1
            if between is not None and ep.next_step is not None:
                between(ep, results)
        final = ep.result()
    return results, final


BACKENDS = [
    pytest.param("docker", marks=pytest.mark.docker, id="docker"),
    pytest.param("local", marks=pytest.mark.bwrap, id="local"),
]


@pytest.fixture(autouse=True)
def _no_leftover_containers(request):
    """Every test leaves no container of this process's run behind (Docker tests only)."""
    yield
    if request.node.get_closest_marker("docker") is None:
        return
    import time

    import docker

    from harbor_gym.sandbox.base import MANAGED_LABEL, RUN_LABEL
    from harbor_gym.sandbox.lease import process_lease

    run_id = process_lease().run_id
    client = docker.from_env(timeout=30)
    try:
        for _ in range(10):  # one list call per try (no per-container inspect racing other suites' removals)
            left = client.api.containers(all=True, filters={"label": [f"{MANAGED_LABEL}=true",
                                                                      f"{RUN_LABEL}={run_id}"]})
            if not left:
                return
            time.sleep(0.5)
        raise AssertionError(f"containers left behind: {[c['Names'] for c in left]}")
    finally:
        client.close()

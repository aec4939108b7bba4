"""Shared helpers of the episode integration tests: fixture task folders written into ``tmp_path`` from compact
dicts, and a runner that drives an `Episode` to its end on a real backend.

Fixtures use ``debian:bookworm-slim`` (aliased offline to the local base image), ``network_mode = "no-network"``
and tiny budgets, so each episode takes a second or two.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterable

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode, EpisodeResult, TurnResult
from harbor_gym.task import load_task

HEAD = """schema_version = "1.4"
{top}
[environment]
docker_image = "debian:bookworm-slim"
workdir = "/app"
network_mode = "no-network"
{env}
[agent]
timeout_sec = {agent_timeout}
"""

REWARD_1 = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"


def grade(check: str) -> str:
    """A test.sh writing reward 1 when the shell condition ``check`` holds, else 0."""
    return f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n"


def toml(steps: Iterable[str] = (), *, top: str = "", env: str = "", agent_timeout: float = 20,
         tail: str = "") -> str:
    """A task.toml: the common head, then each ``[[steps]]`` body (a name string or a TOML fragment)."""
    text = HEAD.format(top=top, env=env, agent_timeout=agent_timeout) + tail
    for step in steps:
        body = step if "=" in step else f'name = "{step}"\n[steps.verifier]\ntimeout_sec = 10\n'
        text += "\n[[steps]]\n" + body + "\n"
    return text


def write_task(root: Path, files: dict[str, Any], name: str = "ep-task") -> Path:
    """Write a task folder ``root/name`` from ``{relpath: text | (text, mode)}``; ``*.sh`` files are 0755.

    Step folders get an ``instruction.md`` when the dict names a step file but no instruction.
    """
    task = root / name
    for rel, content in files.items():
        text, mode = content if isinstance(content, tuple) else (content, 0o755 if rel.endswith(".sh") else 0o644)
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        os.chmod(path, mode)
        parts = Path(rel).parts
        if len(parts) > 2 and parts[0] == "steps":
            instr = task / "steps" / parts[1] / "instruction.md"
            if not instr.exists():
                instr.write_text(f"Do step {parts[1]}.\n")
    import tomllib

    declared = tomllib.loads((task / "task.toml").read_text()).get("steps") or []
    for step in declared:
        instr = task / "steps" / step["name"] / "instruction.md"
        if not instr.exists():
            instr.parent.mkdir(parents=True, exist_ok=True)
            instr.write_text(f"Do step {step['name']}.\n")
    if not (task / "instruction.md").exists():
        (task / "instruction.md").write_text("Multi-step task; never sent.\n")
    return task


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

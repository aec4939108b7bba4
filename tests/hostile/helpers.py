"""Helpers of the hostile suite: a label unique to this test process, fixture task folders written from compact
dicts, episode drivers and the host-side census (labelled containers) every test ends with.

Each hostile test attacks one of the three promises stated in README.md ("What harbor_gym guarantees"):

- P1 "a reward is the verifier's": nothing an agent does inside its sandbox makes a turn's reward differ from what
  the task's own test.sh wrote (under the conditions listed there);
- P2 "a run always ends": every reset/step returns (or raises a named error) within its bounds, with the SPEC
  outcome and its cause in ``info``;
- P3 "everything it started is gone afterwards": no container, network or volume carrying the test's label
  outlives the test (close, error, Ctrl-C, SIGTERM; SIGKILL within the lease bound).
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Iterable

from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode, EpisodeResult, TurnResult
from harbor_gym.task import load_task

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "harbor-gym/base:bookworm"
#: Unique to this test process: every container the suite starts carries it, leak checks count by it.
LABEL = ("io.harbor-gym.test", "hostile-" + uuid.uuid4().hex[:12])
LABEL_FILTER = "=".join(LABEL)
DOCKER = {"backend": "docker", "labels": dict([LABEL])}
LOCAL = {"backend": "local", "labels": dict([LABEL])}

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

REWARD_0 = "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n"


def grade(check: str, *, then_sleep: float = 0.0) -> str:
    """A test.sh writing reward 1 iff the shell condition ``check`` holds, else 0 (then sleeping)."""
    tail = f"sleep {then_sleep}\n" if then_sleep else ""
    return f"#!/bin/bash\nif {check}; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n{tail}"


def toml(steps: Iterable[str] = (), *, top: str = "", env: str = "", agent_timeout: float = 20,
         verifier_timeout: float = 10, tail: str = "") -> str:
    """A task.toml: the common head, then each ``[[steps]]`` body (a name, or a TOML fragment with ``=``)."""
    text = HEAD.format(top=top, env=env, agent_timeout=agent_timeout) + tail
    for step in steps:
        body = step if "=" in step else f'name = "{step}"\n[steps.verifier]\ntimeout_sec = {verifier_timeout}\n'
        text += "\n[[steps]]\n" + body + "\n"
    return text


def write_task(root: Path, files: dict[str, Any], name: str = "hostile-task") -> Path:
    """Write a task folder ``root/name`` from ``{relpath: text | bytes | (text, mode)}`` (``*.sh`` are 0755 unless
    a mode is given); every declared step gets an instruction."""
    import tomllib

    task = root / name
    for rel, content in files.items():
        data, mode = content if isinstance(content, tuple) else (content, 0o755 if rel.endswith(".sh") else 0o644)
        path = task / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
        os.chmod(path, mode)
    if (task / "task.toml").exists():
        for step in tomllib.loads((task / "task.toml").read_text()).get("steps") or []:
            instr = task / "steps" / step["name"] / "instruction.md"
            if not instr.exists():
                instr.parent.mkdir(parents=True, exist_ok=True)
                instr.write_text(f"Do step {step['name']}.\n")
    if not (task / "instruction.md").exists():
        (task / "instruction.md").write_text("Do the task.\n")
    return task


def config(base: dict | None = None, **over: Any) -> EnvConfig:
    """The suite's config: Docker backend and the test label, plus ``over``."""
    return EnvConfig.coerce({**(base or DOCKER), **over})


def run_episode(task_dir: Path, actions: Any, cfg: EnvConfig | None = None, *, agent: Any = None,
                sandbox_factory: Any = None) -> tuple[list[TurnResult], EpisodeResult]:
    """Start an episode and run turns until it ends (``actions``: one action for every turn, or a list)."""
    cfg = cfg or config()
    task = load_task(task_dir, cfg)
    results: list[TurnResult] = []
    with Episode(task, cfg, agent=agent, sandbox_factory=sandbox_factory) as ep:
        ep.start()
        i = 0
        while ep.next_step is not None:
            action = actions[i] if isinstance(actions, list) else actions
            results.append(ep.run_turn(action))
            i += 1
        final = ep.result()
    return results, final


def labelled(client, label: str = LABEL_FILTER) -> list[dict]:
    """Containers (all states) carrying ``label``, as the engine lists them (one list call)."""
    return client.api.containers(all=True, filters={"label": label})


def labelled_everything(client, label: str = LABEL_FILTER) -> dict[str, list[str]]:
    """Every container, network and volume carrying ``label`` (names), by kind; empty lists when clean."""
    sel = {"label": label}
    return {
        "containers": [(c.get("Names") or [c["Id"]])[0] for c in client.api.containers(all=True, filters=sel)],
        "networks": [n["Name"] for n in client.api.networks(filters=sel)],
        "volumes": [v["Name"] for v in (client.api.volumes(filters=sel) or {}).get("Volumes") or []],
    }


def wait_until(predicate, timeout: float, what: str, interval: float = 0.2) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


PY = sys.executable

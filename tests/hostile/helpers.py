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

import sys
import time
import uuid
from pathlib import Path
from typing import Any

from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode, EpisodeResult, TurnResult
from harbor_gym.task import load_task
from task_folders import HEAD, REWARD_0, grade, toml  # noqa: F401  (re-exported for the suite)
from task_folders import write_task as _write_task

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "harbor-gym/base:bookworm"
#: Unique to this test process: every container the suite starts carries it, leak checks count by it.
LABEL = ("io.harbor-gym.test", "hostile-" + uuid.uuid4().hex[:12])
LABEL_FILTER = "=".join(LABEL)
DOCKER = {"backend": "docker", "labels": dict([LABEL])}
LOCAL = {"backend": "local", "labels": dict([LABEL])}


def write_task(root: Path, files: dict[str, Any], name: str = "hostile-task") -> Path:
    """`task_folders.write_task` with the suite's default folder name."""
    return _write_task(root, files, name)


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

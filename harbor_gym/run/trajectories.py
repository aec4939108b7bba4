"""``trajectories.jsonl``: what each turn's agent did, beside the rollout rows (``harbor-gym run
--save-trajectories``; SPEC GYM-13).

One JSON object per line, one line per episode whose row was written (graded or failed), in the order they end::

    {"task_id": str, "rollout": int, "seed": int, "attempt": int, "agent": str,
     "turns": [{"step_name": str, "index": int, "reward": float | null, "trainable": bool,
                "failure_kind": str | null, "model_calls_refused": int,
                "outcome": {status, policy, trajectory, response, exit_code, output_tail, metadata,
                            failure_kind, model_calls: []} | null,
                "model_calls": [ModelCall.to_dict(), ...]}]}

``outcome`` is `AgentOutcome.to_dict` (its calls moved to ``model_calls``); each model call is `ModelCall.to_dict`
(request messages as a delta: `harbor_gym.agents.full_requests` rebuilds them; token ids and logprobs exactly as the
server sent them, ``null`` when it sent none; with a model upstream, the capture proxy's calls of the activation
follow the agent's own, issue 18). ``model_calls_refused`` counts the proxy calls refused during the turn's span (no
activation window open; never in ``model_calls``). A retried episode's earlier attempts are not kept. A resumed run
appends; lines of a ``(task_id, rollout)`` written twice: the last one wins.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Iterable

__all__ = ["TRAJECTORIES_FILE", "TrajectoryWriter", "episode_trajectory", "read_trajectories"]

TRAJECTORIES_FILE = "trajectories.jsonl"


def episode_trajectory(records: Iterable[Any], **key: Any) -> dict[str, Any]:
    """One line of the file: ``key`` (task_id, rollout, seed, attempt, agent) and every turn record's agent data."""
    turns = []
    for r in records:
        turns.append({"step_name": r.step_name, "index": r.index, "reward": r.reward, "trainable": r.trainable,
                      "failure_kind": r.failure_kind,
                      "model_calls_refused": int(getattr(r, "model_calls_refused", 0) or 0),
                      "outcome": r.outcome.to_dict() if r.outcome is not None else None,
                      "model_calls": [c.to_dict() for c in r.model_calls]})
    return {**key, "turns": turns}


class TrajectoryWriter:
    """Appends episode lines to ``<out>/trajectories.jsonl`` (thread-safe; each line flushed as written)."""

    def __init__(self, out: Path) -> None:
        self.path = Path(out) / TRAJECTORIES_FILE
        self._lock = threading.Lock()

    def write(self, records: Iterable[Any], **key: Any) -> None:
        line = json.dumps(episode_trajectory(records, **key))
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line + "\n")


def read_trajectories(path: Path) -> list[dict[str, Any]]:
    """Every line of a trajectories file, parsed (``[]`` when there is none)."""
    path = Path(path)
    if path.is_dir():
        path = path / TRAJECTORIES_FILE
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]

"""harbor_gym.run: run a task or dataset with a known agent and keep the results (``harbor-gym run``).

- `rows`: the pydantic row schema (`RolloutRow`, `FailureRow`, `TurnRow`) and `rows_from_episode`;
- `jsonl`: atomic JSON Lines appends (`JsonlFile`) and the results folder's two files (`RolloutFiles`);
- `agents`: ``--agent`` specs (`resolve_agent`); `targets`: what PATH holds (`load_targets`);
- `runner`: the scheduler (`run_rollouts`, `RunOptions`, `RunReport`); `summary`, `progress`: what is shown.
"""

from harbor_gym.run.agents import AgentSpec, EpisodeAgent, resolve_agent
from harbor_gym.run.jsonl import FAILURES_FILE, ROLLOUTS_FILE, JsonlFile, RolloutFiles
from harbor_gym.run.rows import (
    ENV_ERROR,
    SCHEMA_VERSION,
    SEED_FAILED,
    SEED_REFUSED,
    TASK_LOAD_FAILED,
    FailureRow,
    RolloutRow,
    TurnRow,
    episode_seed,
    rows_from_episode,
)
from harbor_gym.run.runner import LOGS_DIR, RunOptions, RunReport, run_rollouts
from harbor_gym.run.summary import TaskSummary, summarize
from harbor_gym.run.targets import Targets, load_targets

__all__ = [
    "AgentSpec",
    "EpisodeAgent",
    "resolve_agent",
    "JsonlFile",
    "RolloutFiles",
    "ROLLOUTS_FILE",
    "FAILURES_FILE",
    "LOGS_DIR",
    "SCHEMA_VERSION",
    "TASK_LOAD_FAILED",
    "SEED_FAILED",
    "SEED_REFUSED",
    "ENV_ERROR",
    "RolloutRow",
    "FailureRow",
    "TurnRow",
    "episode_seed",
    "rows_from_episode",
    "RunOptions",
    "RunReport",
    "run_rollouts",
    "TaskSummary",
    "summarize",
    "Targets",
    "load_targets",
]

"""harbor_gym: every Harbor task folder as a ``gymnasium.Env``.

``reset()`` starts a pristine sandbox for the task; ``step(action)`` runs one turn (the agent activation, then the
turn's verifier) and returns the turn's reward. The public surface is exactly ``__all__``.
"""

from harbor_gym.config import EnvConfig
from harbor_gym.errors import (
    ConfigError,
    HarborGymError,
    ResetNeededError,
    SandboxError,
    SeedError,
    SeedRefusedError,
    TaskLoadError,
)

from harbor_gym.agents import AgentOutcome, Oracle, Turn
from harbor_gym.env import HarborDatasetEnv, HarborEnv
from harbor_gym.episode import EpisodeResult, TurnRecord, ValidationReport, validate
from harbor_gym.registration import make, register_envs
from harbor_gym.run.collector import RolloutResult, collect, rollouts
from harbor_gym.task import Dataset, Task, load_dataset, load_task

__version__ = "0.1.0"

register_envs()

__all__ = [
    "HarborEnv",
    "HarborDatasetEnv",
    "make",
    "register_envs",
    "validate",
    "rollouts",
    "collect",
    "RolloutResult",
    "ValidationReport",
    "load_task",
    "load_dataset",
    "Task",
    "Dataset",
    "Oracle",
    "Turn",
    "AgentOutcome",
    "TurnRecord",
    "EpisodeResult",
    "EnvConfig",
    "HarborGymError",
    "ConfigError",
    "TaskLoadError",
    "SeedRefusedError",
    "SeedError",
    "SandboxError",
    "ResetNeededError",
    "__version__",
]

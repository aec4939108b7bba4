"""A loaded task: :class:`Task` and its :class:`Step` turns, every file and raw setting resolved per step.

These are plain frozen dataclasses (they pickle). Budgets here are raw (before the dataset's
``timeout_multiplier`` and any agent cap); the episode computes effective budgets (BUD-1/2).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from harbor_gym.task.compose import ComposeFile
from harbor_gym.task.models import (
    ArtifactEntry,
    CollectHook,
    EnvironmentConfig,
    HealthcheckConfig,
    StepConfig,
    TaskConfig,
    VerifierEnvironmentMode,
)

__all__ = [
    "ImageSourceKind",
    "Step",
    "StepArtifact",
    "Task",
    "VerifierImageSource",
    "effective_verifier_mode",
]


class ImageSourceKind(str, Enum):
    """VER-4: where a separate verifier's image comes from, in first-match order."""

    STEP_IMAGE = "step_image"  # [steps.verifier.environment].docker_image
    STEP_TESTS_BUILD = (
        "step_tests_build"  # Dockerfile / docker-compose.yaml in steps/<name>/tests/ (Harbor only)
    )
    TASK_IMAGE = "task_image"  # [verifier.environment].docker_image
    TASK_TESTS_BUILD = "task_tests_build"  # Dockerfile / docker-compose.yaml in tests/
    AGENT_ENVIRONMENT = "agent_environment"  # the agent's environment definition (a copy of [environment])


@dataclass(frozen=True)
class VerifierImageSource:
    """VER-4's answer for one step: the image (or build) a separate verifier sandbox uses.

    Attributes:
        kind: which VER-4 case matched.
        docker_image: the image name, for ``*_IMAGE`` kinds and for ``AGENT_ENVIRONMENT`` when
            ``[environment].docker_image`` is set (it wins over a Dockerfile, FMT-10).
        dockerfile: the Dockerfile to build, when the image is built.
        compose_file: the compose file, when the source is a compose group.
        uploads_tests: True only for ``AGENT_ENVIRONMENT``: then VER-6 uploads the tests; otherwise ``/tests``
            comes from the image as it is.
    """

    kind: ImageSourceKind
    docker_image: str | None = None
    dockerfile: Path | None = None
    compose_file: Path | None = None

    @property
    def uploads_tests(self) -> bool:
        """VER-4/VER-6: tests are uploaded only when the verifier runs a copy of the agent's environment."""
        return self.kind == ImageSourceKind.AGENT_ENVIRONMENT


@dataclass(frozen=True)
class StepArtifact:
    """One artifact entry of a turn (ART-1): the TOML entry plus whether the task or the step declared it."""

    entry: ArtifactEntry
    origin: str  # "task" | "step"

    @property
    def source(self) -> str:
        return self.entry.source

    @property
    def destination(self) -> str | None:
        return self.entry.destination

    @property
    def exclude(self) -> tuple[str, ...]:
        return self.entry.exclude

    @property
    def service(self) -> str | None:
        return self.entry.service


@dataclass(frozen=True)
class Step:
    """One turn of a task, everything resolved from the task folder and ``task.toml``.

    A single-step task (GYM-9) has one Step named by the task ID, with ``config=None`` and the task's
    ``instruction.md``, ``[verifier]`` and ``tests/``.
    """

    name: str
    index: int  # 0-based
    instruction: str  # FMT-2 applied; TURN-9 (prompt_template) is applied later
    instruction_path: Path
    config: StepConfig | None  # the [[steps]] entry; None for a single-step task
    step_dir: Path | None  # steps/<name>/; None for a single-step task
    workdir_dir: Path | None  # steps/<name>/workdir/ if it exists (TURN-4)
    setup_script: Path | None  # steps/<name>/workdir/setup.sh if it exists (TURN-5)
    tests_layers: tuple[Path, ...]  # existing of tests/, then steps/<name>/tests/ (VER-6)
    test_script: Path  # VER-8: steps/<name>/tests/test.sh if present, else tests/test.sh
    has_own_tests: bool  # steps/<name>/tests/ exists (LOAD-6, VER-4)
    solution_dir: Path | None  # ORACLE-1: steps/<name>/solution/ if it exists, else solution/ if it exists
    validatable: bool  # ORACLE-3: solution_dir holds solve.sh
    agent_timeout_sec: float | None  # BUD-1 raw B: [steps.agent] else [agent]; None = unbounded
    verifier_timeout_sec: float  # BUD-2 raw: [steps.verifier].timeout_sec (600), single-step [verifier]'s
    agent_user: str | None  # USR-1: [steps.agent].user else [agent].user; None = image default
    verifier_user: (
        str | None
    )  # USR-3: [steps.verifier].user else [verifier].user; None = image's original default
    verifier_env: Mapping[str, str] = field(
        repr=False
    )  # [verifier].env < [steps.verifier].env, raw FMT-15 templates
    verifier_mode: VerifierEnvironmentMode  # VER-1 (VER-2 is applied by effective_verifier_mode)
    verifier_environment: (
        EnvironmentConfig | None
    )  # VER-3 table: step's else task's; None = copy of [environment]
    separate_image_source: VerifierImageSource  # VER-4, under the semantics the task was loaded with
    healthcheck: HealthcheckConfig | None  # [steps.healthcheck] (TURN-7); None for single-step tasks
    artifacts: tuple[StepArtifact, ...]  # task's then step's (ART-1)
    collect: tuple[CollectHook, ...]  # task's then step's (ART-1)
    min_reward: float | Mapping[str, float] | None  # STOP-2/3
    artifacts_declared: bool = field(
        default=False
    )  # task or step declares a non-empty artifacts list (VER-2)


def effective_verifier_mode(step: Step, *, separate_verifier_for_artifacts: bool) -> VerifierEnvironmentMode:
    """VER-2 over VER-1: ``separate`` when the flag is on and the task or step declares artifacts."""
    if separate_verifier_for_artifacts and step.artifacts_declared:
        return VerifierEnvironmentMode.SEPARATE
    return step.verifier_mode


@dataclass(frozen=True)
class Task:
    """A loaded, validated task folder (LOAD-1..16 passed). Pickles.

    Attributes:
        id: the folder name (FMT-3).
        path: the folder, absolute.
        config: the validated ``task.toml``.
        steps: the turns in order; a single-step task has one, named by ``id`` (GYM-9).
        is_multi_step: ``[[steps]]`` is declared.
        environment_dir: ``environment/`` if it exists.
        dockerfile / compose_file: ``environment/Dockerfile`` / ``environment/docker-compose.yaml`` if they
            exist.
        compose: the parsed compose file (COMPOSE-1..3) when ``compose_file`` exists, else ``None``.
        timeout_multiplier: the dataset's m (BUD-1/2), 1.0 outside a dataset.
        first_step_trajectory: ``steps/<first>/trajectory.json`` if it exists (LOAD-20 at seed).
    """

    id: str
    path: Path
    config: TaskConfig
    steps: tuple[Step, ...]
    is_multi_step: bool
    environment_dir: Path | None
    dockerfile: Path | None
    compose_file: Path | None
    timeout_multiplier: float = 1.0
    first_step_trajectory: Path | None = None
    compose: ComposeFile | None = None

    def step(self, name: str) -> Step:
        """The step called ``name``.

        Raises:
            KeyError: no such step.
        """
        for step in self.steps:
            if step.name == name:
                return step
        raise KeyError(f"task {self.id!r} has no step {name!r}; steps: {[s.name for s in self.steps]}")

    @property
    def num_steps(self) -> int:
        """How many turns an episode of this task has."""
        return len(self.steps)

    @property
    def step_names(self) -> tuple[str, ...]:
        return tuple(step.name for step in self.steps)

    @property
    def has_compose(self) -> bool:
        """``environment/docker-compose.yaml`` exists (COMPOSE-1)."""
        return self.compose_file is not None

    @property
    def environment(self) -> EnvironmentConfig:
        """``[environment]``."""
        return self.config.environment

"""Pydantic models of the whole ``task.toml`` (SPEC FMT-4..12), ``DatasetSettings`` and VER-1's mode rule.

``TaskConfig`` and its agent, verifier, solution and step tables are frozen, with their defaults declared once.

The leaf tables (``[environment]``, healthchecks, hooks, artifacts, ``[task]``) and the enums live in
:mod:`harbor_gym.task.tables` and are re-exported here, so ``harbor_gym.task.models`` names every model.
Legacy keys (FMT-13) and unknown keys (FMT-14) are handled before validation, in ``toml_io``; the models know
the current schema.
"""

from __future__ import annotations

import math
from typing import Any

from pydantic import Field, StrictStr, ValidationInfo, field_validator, model_validator

from harbor_gym.task.tables import (
    STEP_NAME_PATTERN,
    TASK_NAME_PATTERN,
    ArtifactEntry,
    Author,
    CollectHook,
    EnvironmentConfig,
    HealthcheckConfig,
    MultiStepRewardStrategy,
    NetworkMode,
    Number,
    OperatingSystem,
    RuleViolation,
    TaskMeta,
    VerifierEnvironmentMode,
    _Model,
    check_allowed_hosts,
    is_network_restriction,
)

__all__ = [
    "STEP_NAME_PATTERN",
    "TASK_NAME_PATTERN",
    "AgentConfig",
    "ArtifactEntry",
    "Author",
    "CollectHook",
    "DatasetSettings",
    "EnvironmentConfig",
    "HealthcheckConfig",
    "MultiStepRewardStrategy",
    "NetworkMode",
    "OperatingSystem",
    "RuleViolation",
    "SolutionConfig",
    "StepAgentConfig",
    "StepConfig",
    "StepVerifierConfig",
    "TaskConfig",
    "TaskMeta",
    "VerifierConfig",
    "VerifierEnvironmentMode",
    "is_network_restriction",
    "resolve_verifier_mode",
]


class AgentConfig(_Model):
    """``[agent]`` (FMT-5): the task-wide agent settings every step falls back to (BUD-1, USR-1)."""

    timeout_sec: Number | None = Field(
        None, gt=0, description="Agent budget per turn, seconds; unset: unbounded."
    )
    user: StrictStr | None = Field(None, description="Agent user; unset: the image's default user (USR-1).")
    network_mode: NetworkMode | None = Field(
        None, description="Agent-phase network policy; unset: [environment]'s."
    )
    allowed_hosts: tuple[StrictStr, ...] | None = Field(None, description="Allowlist (LOAD-10); unset: none.")

    @model_validator(mode="after")
    def _rules(self) -> AgentConfig:
        check_allowed_hosts(self.network_mode, self.allowed_hosts)
        return self


class SolutionConfig(_Model):
    """``[solution]`` (FMT-5): the oracle's environment (ORACLE-2)."""

    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Env of solve.sh; values may be FMT-15 templates; unset: empty."
    )


def _check_mode_env(mode: VerifierEnvironmentMode | None, environment: EnvironmentConfig | None) -> None:
    """LOAD-7: ``shared`` and an ``environment`` table contradict each other."""
    if mode == VerifierEnvironmentMode.SHARED and environment is not None:
        raise RuleViolation(
            "LOAD-7",
            'environment_mode = "shared" together with an environment table; drop the table or use "separate"',
            "environment_mode",
        )


class VerifierConfig(_Model):
    """``[verifier]`` (FMT-6): the single-step verifier, and the base of every step's (FMT-11)."""

    timeout_sec: Number = Field(
        600.0, gt=0, description="Single-step verifier budget (BUD-2); steps never use it."
    )
    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Verifier env (VER-7); unset: empty."
    )
    user: StrictStr | None = Field(
        None, description="Verifier user; unset: the image's default user (USR-3)."
    )
    environment_mode: VerifierEnvironmentMode | None = Field(
        None, description="'shared' or 'separate'; unset: decided by VER-1."
    )
    environment: EnvironmentConfig | None = Field(
        None, description="Separate verifier environment (VER-3); unset: a copy of [environment]."
    )
    collect: tuple[CollectHook, ...] = Field(
        (), description="Hooks run before collection (ART-1); unset: none."
    )
    network_mode: NetworkMode | None = Field(
        None, description="Verifier network policy; unset: unrestricted."
    )
    allowed_hosts: tuple[StrictStr, ...] | None = Field(None, description="Allowlist (LOAD-10); unset: none.")

    @model_validator(mode="after")
    def _rules(self) -> VerifierConfig:
        _check_mode_env(self.environment_mode, self.environment)
        check_allowed_hosts(self.network_mode, self.allowed_hosts)
        return self


def _refuse_step_network(network_mode: NetworkMode | None, allowed_hosts: Any, field: str) -> None:
    """LOAD-8: steps carry no network restriction (an explicit ``public`` is not one)."""
    if is_network_restriction(network_mode, allowed_hosts):
        raise RuleViolation(
            "LOAD-8",
            "a step cannot restrict the network; set the policy on [agent], [verifier] or [environment] instead",
            field,
        )


class StepAgentConfig(_Model):
    """``[steps.agent]`` (FMT-11): overrides of ``[agent]`` for one step."""

    timeout_sec: Number | None = Field(
        None, gt=0, description="Step agent budget, seconds; unset: [agent]'s."
    )
    user: StrictStr | None = Field(None, description="Step agent user; unset: [agent]'s (USR-1).")
    network_mode: NetworkMode | None = Field(None, description="Only 'public' is accepted (LOAD-8).")
    allowed_hosts: tuple[StrictStr, ...] | None = Field(None, description="Never accepted (LOAD-8).")

    @model_validator(mode="after")
    def _rules(self) -> StepAgentConfig:
        _refuse_step_network(
            self.network_mode,
            self.allowed_hosts,
            "network_mode" if self.allowed_hosts is None else "allowed_hosts",
        )
        return self


class StepVerifierConfig(_Model):
    """``[steps.verifier]`` (FMT-11): one step's verifier; ``timeout_sec`` never falls back to
    ``[verifier]``."""

    timeout_sec: Number = Field(600.0, gt=0, description="Step verifier budget, seconds (BUD-2).")
    user: StrictStr | None = Field(None, description="Step verifier user; unset: [verifier]'s (USR-3).")
    env: dict[StrictStr, StrictStr] = Field(
        default_factory=dict, description="Merged over [verifier].env (VER-7)."
    )
    environment_mode: VerifierEnvironmentMode | None = Field(None, description="Unset: decided by VER-1.")
    environment: EnvironmentConfig | None = Field(
        None, description="Replaces [verifier.environment] for this step (VER-3); unset: that one."
    )
    collect: tuple[CollectHook, ...] = Field((), description="Hooks run after the task's (ART-1).")
    network_mode: NetworkMode | None = Field(None, description="Only 'public' is accepted (LOAD-8).")
    allowed_hosts: tuple[StrictStr, ...] | None = Field(None, description="Never accepted (LOAD-8).")

    @model_validator(mode="after")
    def _rules(self) -> StepVerifierConfig:
        _refuse_step_network(
            self.network_mode,
            self.allowed_hosts,
            "network_mode" if self.allowed_hosts is None else "allowed_hosts",
        )
        if self.environment is not None:
            env = self.environment
            _refuse_step_network(
                env.network_mode if env.network_mode != NetworkMode.PUBLIC else None,
                env.allowed_hosts,
                "environment.network_mode" if env.allowed_hosts is None else "environment.allowed_hosts",
            )
        _check_mode_env(self.environment_mode, self.environment)
        return self


MinReward = Number | dict[StrictStr, Number]


class StepConfig(_Model):
    """One ``[[steps]]`` entry (FMT-11)."""

    name: StrictStr = Field(description="Step name, FMT-12; its files live in steps/<name>/ (required).")
    agent: StepAgentConfig = Field(
        default_factory=StepAgentConfig, description="[steps.agent]; unset: all fall back."
    )
    verifier: StepVerifierConfig = Field(
        default_factory=StepVerifierConfig, description="[steps.verifier]; unset: defaults (timeout 600 s)."
    )
    healthcheck: HealthcheckConfig | None = Field(
        None, description="Polled before the agent (TURN-7); unset: none."
    )
    artifacts: tuple[ArtifactEntry, ...] = Field(
        (), description="Collected after the task's entries (ART-1)."
    )
    min_reward: MinReward | None = Field(
        None, description="Early-stop gate (STOP-2/3): a number or a table of numbers; unset: no gate."
    )

    @field_validator("min_reward", mode="before")
    @classmethod
    def _min_reward_shape(cls, value: Any) -> Any:
        def is_number(x: Any) -> bool:
            return isinstance(x, (int, float)) and not isinstance(x, bool)

        if value is None or is_number(value):
            return value
        if isinstance(value, dict) and all(isinstance(k, str) and is_number(v) for k, v in value.items()):
            return value
        raise ValueError(f"min_reward must be a number or a table of numbers, got {value!r}")

    @field_validator("name")
    @classmethod
    def _name(cls, value: str, info: ValidationInfo) -> str:
        if (info.context or {}).get("semantics") == "harbor":  # DIFF-8: the names Harbor accepts
            if not harbor_step_name_ok(value):
                raise RuleViolation("LOAD-2", f"step name {value!r} is not a portable folder name of at most 255 "
                                              "UTF-8 bytes (DIFF-8: no '/', no NUL, not '.' or '..')")
            return value
        if not STEP_NAME_PATTERN.match(value):
            raise RuleViolation(
                "LOAD-2", f"step name {value!r} does not match {STEP_NAME_PATTERN.pattern} (FMT-12)"
            )
        return value


def harbor_step_name_ok(name: str) -> bool:
    """DIFF-8 (``semantics="harbor"``): a step name Harbor accepts, i.e. any portable folder name: non-empty, at
    most 255 UTF-8 bytes, no ``/`` or NUL, and not ``.`` or ``..`` (so ``steps/<name>/`` is one folder)."""
    return (bool(name) and name not in (".", "..") and "/" not in name and "\x00" not in name
            and len(name.encode("utf-8", errors="surrogatepass")) <= 255)


def resolve_verifier_mode(task_verifier: VerifierConfig, step: StepConfig | None) -> VerifierEnvironmentMode:
    """VER-1: the step's verifier mode (``step=None``: the single-step task's, from ``[verifier]`` alone).

    ``[steps.verifier].environment_mode``, else ``separate`` if ``[steps.verifier.environment]`` is declared,
    else ``[verifier].environment_mode``, else ``separate`` if ``[verifier.environment]`` is declared, else
    ``shared``.
    """
    if step is not None:
        if step.verifier.environment_mode is not None:
            return step.verifier.environment_mode
        if step.verifier.environment is not None:
            return VerifierEnvironmentMode.SEPARATE
    if task_verifier.environment_mode is not None:
        return task_verifier.environment_mode
    if task_verifier.environment is not None:
        return VerifierEnvironmentMode.SEPARATE
    return VerifierEnvironmentMode.SHARED


class TaskConfig(_Model):
    """The whole ``task.toml`` (FMT-4). Dump with :func:`harbor_gym.task.toml_io.dump_task_toml`."""

    schema_version: StrictStr = Field(
        "1.4", description="Schema version; legacy 'version' is read as it (FMT-13)."
    )
    source: StrictStr | None = Field(None, description="Where the task comes from; unset: unknown.")
    multi_step_reward_strategy: MultiStepRewardStrategy | None = Field(
        None, description="'mean' or 'final' (RWD-7/8); unset means 'mean'."
    )
    task: TaskMeta | None = Field(None, description="[task] label table; unset: no label.")
    metadata: dict[StrictStr, Any] = Field(default_factory=dict, description="Free [metadata]; unset: empty.")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="[agent]; unset: all defaults.")
    verifier: VerifierConfig = Field(
        default_factory=VerifierConfig, description="[verifier]; unset: all defaults."
    )
    environment: EnvironmentConfig = Field(
        default_factory=EnvironmentConfig,
        description="[environment]; unset: all defaults (LOAD-14 still applies).",
    )
    solution: SolutionConfig = Field(
        default_factory=SolutionConfig, description="[solution]; unset: empty env."
    )
    artifacts: tuple[ArtifactEntry, ...] = Field((), description="Task-wide artifacts, every turn (ART-1).")
    steps: tuple[StepConfig, ...] | None = Field(
        None, description="[[steps]], in turn order; unset: a single-step task (GYM-9). Never empty."
    )

    @field_validator("steps")
    @classmethod
    def _steps(cls, value: tuple[StepConfig, ...] | None) -> tuple[StepConfig, ...] | None:
        if value is None:
            return value
        if not value:
            raise ValueError("[[steps]] is empty; declare at least one step or drop the key")
        seen: dict[str, str] = {}
        for i, step in enumerate(value):
            key = step.name.casefold()
            if key in seen:
                raise RuleViolation(
                    "LOAD-2",
                    f"step name {step.name!r} equals {seen[key]!r} after case-folding (FMT-12)",
                    f"{i}.name",
                )
            seen[key] = step.name
        return value

    @model_validator(mode="after")
    def _verifier_network(self) -> TaskConfig:
        """LOAD-9: a ``[verifier]`` network restriction needs every step to verify ``separate``."""
        if not is_network_restriction(self.verifier.network_mode, self.verifier.allowed_hosts):
            return self
        steps: tuple[StepConfig | None, ...] = self.steps if self.steps is not None else (None,)
        for step in steps:
            if resolve_verifier_mode(self.verifier, step) == VerifierEnvironmentMode.SHARED:
                who = f"step {step.name!r}" if step is not None else "the task"
                raise RuleViolation(
                    "LOAD-9",
                    f"[verifier] restricts the network but {who} verifies 'shared' (VER-1); "
                    "make it 'separate' or drop the restriction",
                    "verifier.network_mode"
                    if self.verifier.allowed_hosts is None
                    else "verifier.allowed_hosts",
                )
        return self

    @property
    def is_multi_step(self) -> bool:
        """True iff ``[[steps]]`` is declared."""
        return self.steps is not None


class DatasetSettings(_Model):
    """A dataset folder's ``dataset.toml`` (see :mod:`harbor_gym.task.dataset`). Unset file: all defaults."""

    name: StrictStr | None = Field(None, description="Dataset label; unset: the folder name is used.")
    description: StrictStr = Field("", description="Free text; unset: empty.")
    timeout_multiplier: Any = Field(
        1.0,
        description="m of BUD-1/2: scales agent and verifier budgets; finite number > 0 (LOAD-16); unset: 1.0.",
    )

    @field_validator("timeout_multiplier", mode="before")
    @classmethod
    def _multiplier(cls, value: Any) -> float:
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value <= 0
        ):
            raise RuleViolation("LOAD-16", f"timeout_multiplier must be a finite number > 0, got {value!r}")
        return float(value)

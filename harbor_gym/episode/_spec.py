"""From a `Task` to what a sandbox backend needs: the agent and verifier `SandboxSpec` (FMT-7, FMT-10, FMT-15,
VER-3/4, phase network policies), and the seed refusals checked before any sandbox starts (SPEC LOAD-20..24,
GYM-4, BUD-7), separate verifier environments included."""

from __future__ import annotations

import os
from typing import Any, Iterable, Mapping

from harbor_gym.agents import Oracle, supports_continue
from harbor_gym.config import EnvConfig, Semantics, TurnSessions
from harbor_gym.errors import SeedRefusedError
from harbor_gym.sandbox._gpus import GPU_RUNTIME, engine_gpu_runtime
from harbor_gym.sandbox.base import SandboxSpec
from harbor_gym.task import EnvironmentConfig, ImageSourceKind, NetworkMode, Step, Task, resolve_env_templates

__all__ = ["agent_spec", "verifier_spec", "workdir_created", "phase_policy_refusals", "seed_refusals", "resolved_env", "TASK_LABEL",
           "STEP_LABEL", "DEFAULT_PIDS_LIMIT", "DEFAULT_STORAGE_MB", "DEFAULT_MEMORY_MB"]

#: Label naming the task a sandbox runs (the managed and run labels are added by the backend).
TASK_LABEL = "io.harbor-gym.task"
#: Image placeholder of a compose task's main spec (the group takes service ``main``'s image).
COMPOSE_MAIN_PLACEHOLDER = "harbor-gym-compose:main"
#: Label naming the step a separate verifier sandbox verifies.
STEP_LABEL = "io.harbor-gym.step"
#: `EnvConfig.pids_limit`'s default: what `agent_spec` uses when not told (e.g. warm-pool prewarming).
DEFAULT_PIDS_LIMIT: int | None = EnvConfig.model_fields["pids_limit"].default
#: `EnvConfig.default_storage_mb` / `default_memory_mb`: GYM-10's bounds of a table that sets none.
DEFAULT_STORAGE_MB: int | None = EnvConfig.model_fields["default_storage_mb"].default
DEFAULT_MEMORY_MB: int | None = EnvConfig.model_fields["default_memory_mb"].default


def workdir_created(config: EnvConfig) -> bool:
    """Issue 16: whether the agent sandbox creates a task workdir its image lacks. Seed: yes, at start. Harbor:
    no, the workdir is only the folder commands run in (harbor/environments/docker/docker.py passes it to each
    exec, never at create), so a step that starts without it fails (`WORKDIR_MISSING_KIND`)."""
    return config.semantics != Semantics.HARBOR


def _or(value: int | None, default: int | None) -> int | None:
    return value if value is not None else default


def resolved_env(env: Mapping[str, str], *, where: str, host_env: Mapping[str, str] | None = None,
                 allowlist: Iterable[str] = ()) -> dict[str, str]:
    """FMT-15 applied to ``env`` against the host's environment, reading only the variables of ``allowlist``
    (`EnvConfig.host_env_allowlist`; the default ``()`` reads none: a template's default is used).

    Raises:
        SeedRefusedError: LOAD-23 (an `EnvTemplateError`), naming ``where``, the key and the variable (also when
            the variable is outside ``allowlist``).
    """
    try:
        return resolve_env_templates(env, os.environ if host_env is None else host_env, allowlist=allowlist)
    except SeedRefusedError as exc:
        exc.field = f"{where}.{exc.field}" if exc.field else where
        raise


def _network(env: EnvironmentConfig, task: Task, where: str) -> bool:
    mode = NetworkMode(env.network_mode)
    if mode is NetworkMode.ALLOWLIST or env.allowed_hosts:
        raise SeedRefusedError("network_mode 'allowlist' needs egress control, which no harbor_gym sandbox has; "
                               "use 'public' or 'no-network'", path=task.path / "task.toml",
                               field=f"{where}.network_mode", rule="LOAD-24")
    return mode is NetworkMode.PUBLIC


def _check_resources(env: EnvironmentConfig, task: Task, where: str) -> None:
    toml = task.path / "task.toml"
    if env.gpus and engine_gpu_runtime() is None:
        raise SeedRefusedError(f"{env.gpus} GPU(s) requested but the Docker engine here has no GPU runtime (no "
                               f"'{GPU_RUNTIME}' runtime in docker info), so no sandbox can get one",
                               path=toml, field=f"{where}.gpus", rule="LOAD-24")
    if env.gpu_types:
        raise SeedRefusedError(f"gpu_types {list(env.gpu_types)} requested but no provider here can choose a GPU "
                               "model (a device request selects a count only)", path=toml,
                               field=f"{where}.gpu_types", rule="LOAD-24")
    if env.tpu:
        raise SeedRefusedError("a TPU is requested but no provider here has one", path=toml, field=f"{where}.tpu",
                               rule="LOAD-24")


def agent_spec(task: Task, *, env: Mapping[str, str] | None = None,
               pids_limit: int | None = DEFAULT_PIDS_LIMIT, default_storage_mb: int | None = DEFAULT_STORAGE_MB,
               default_memory_mb: int | None = DEFAULT_MEMORY_MB, create_workdir: bool = True) -> SandboxSpec:
    """The agent sandbox (service ``main``) of ``task``: ``docker_image`` wins over ``environment/Dockerfile``
    (FMT-10); workdir, resources, network and env from ``[environment]`` (FMT-15 applied unless ``env`` given);
    ``create_workdir`` (`workdir_created`: ``False`` under Harbor semantics) says whether the sandbox creates a
    workdir the image lacks (issue 16);
    ``pids_limit`` is the harness guard `EnvConfig.pids_limit` (the task format has no such field; ``None``: none);
    ``storage_mb``/``memory_mb`` unset in the table take ``default_storage_mb``/``default_memory_mb``
    (`EnvConfig.default_storage_mb`/`default_memory_mb`, GYM-10; ``None``: unbounded).

    Raises:
        SeedRefusedError: LOAD-23/24, or a compose-only environment (COMPOSE-2: no provider here runs groups).
    """
    cfg = task.config.environment
    _check_resources(cfg, task, "environment")
    network = _network(cfg, task, "environment")
    if env is None:
        env = resolved_env(cfg.env, where="environment.env")
    common: dict[str, Any] = dict(
        workdir=cfg.workdir, create_workdir=create_workdir, env=dict(env), cpus=cfg.cpus, memory_mb=_or(cfg.memory_mb, default_memory_mb),
        storage_mb=_or(cfg.storage_mb, default_storage_mb),
        network=network, labels={TASK_LABEL: task.id}, name_hint=task.id, gpus=cfg.gpus,
        build_timeout_s=float(cfg.build_timeout_sec), pids_limit=pids_limit,
    )
    if cfg.docker_image:
        return SandboxSpec(image=cfg.docker_image, **common)
    if task.dockerfile is not None:
        return SandboxSpec(build_context=task.dockerfile.parent, dockerfile=task.dockerfile.name, **common)
    if getattr(task, "compose", None) is not None:
        # COMPOSE-1: service main's image replaces this placeholder when the group starts.
        return SandboxSpec(image=COMPOSE_MAIN_PLACEHOLDER, **common)
    raise SeedRefusedError("environment/docker-compose.yaml groups cannot run on any provider here (COMPOSE-2)",
                           path=task.compose_file or task.path, field="environment", rule="LOAD-24")


def verifier_spec(task: Task, step: Step, *, agent: SandboxSpec, default_storage_mb: int | None = DEFAULT_STORAGE_MB,
                  default_memory_mb: int | None = DEFAULT_MEMORY_MB,
                  host_env_allowlist: Iterable[str] = ()) -> tuple[SandboxSpec, bool]:
    """VER-3/4: the fresh sandbox a ``separate`` step verifies in, and whether VER-6 uploads the tests.

    The table is ``[steps.verifier.environment]``, else ``[verifier.environment]``, else a copy of ``[environment]``
    (whole tables, never merged); the image follows VER-4's first match (resolved by the task layer). The pids
    limit is the agent spec's (the harness guard `EnvConfig.pids_limit`, whatever the table); a table of its own
    without ``storage_mb``/``memory_mb`` takes the defaults (GYM-10), a copy of ``[environment]`` the agent's.

    Raises:
        SeedRefusedError: LOAD-23/24 for that table, or a compose group.
    """
    table = step.verifier_environment
    source = step.separate_image_source
    uploads = source.uploads_tests
    where = _verifier_table_where(step)
    if table is None:
        spec_env = agent.env
        base = agent
    else:
        _check_resources(table, task, where)
        spec_env = resolved_env(table.env, where=f"{where}.env", allowlist=host_env_allowlist)
        base = None
    labels = {TASK_LABEL: task.id, STEP_LABEL: step.name}
    if table is None:
        kwargs = dict(workdir=base.workdir, env=dict(spec_env), cpus=base.cpus, memory_mb=base.memory_mb,
                      storage_mb=base.storage_mb, network=base.network, build_timeout_s=base.build_timeout_s,
                      gpus=base.gpus)
    else:
        kwargs = dict(workdir=table.workdir, env=dict(spec_env), cpus=table.cpus,
                      memory_mb=_or(table.memory_mb, default_memory_mb),
                      storage_mb=_or(table.storage_mb, default_storage_mb),
                      network=_network(table, task, where), gpus=table.gpus,
                      build_timeout_s=float(table.build_timeout_sec))
    # Harbor's verifier phase policy: an explicit [steps.verifier] / [verifier] network policy replaces the
    # sandbox's own; a fresh sandbox started for the verify alone honours it without switching
    explicit = _explicit_policy(task, step, "verifier")
    if explicit is not None:
        kwargs["network"] = _phase_network(explicit, task)
    kwargs.update(labels=labels, name_hint=f"{task.id}-verify", pids_limit=agent.pids_limit)
    if source.docker_image:
        return SandboxSpec(image=source.docker_image, **kwargs), uploads
    if source.dockerfile is not None:
        return SandboxSpec(build_context=source.dockerfile.parent, dockerfile=source.dockerfile.name, **kwargs), uploads
    if source.kind is ImageSourceKind.AGENT_ENVIRONMENT:
        image_kw = ({"image": agent.image} if agent.image else
                    {"build_context": agent.build_context, "dockerfile": agent.dockerfile})
        return SandboxSpec(**image_kw, **kwargs), uploads
    raise SeedRefusedError("a verifier compose group cannot run on any provider here (COMPOSE-2)",
                           path=source.compose_file or task.path, field=f"steps.{step.name}.verifier",
                           rule="LOAD-24")


def _verifier_table_where(step: Step) -> str:
    """The task.toml table a step's verifier environment comes from (for messages)."""
    own = step.config is not None and step.config.verifier.environment is not None
    return f"steps.{step.name}.verifier.environment" if own else "verifier.environment"


def _explicit_policy(task: Task, step: Step, role: str) -> tuple[str, str] | None:
    """A phase policy set explicitly for ``role`` (``agent``/``verifier``) of ``step``: ``[steps.<role>]`` wins over
    ``[<role>]`` (harbor/trial/network_policy.py). Returns ``(mode, field)``, or ``None`` (the sandbox's own)."""
    tables = []
    if step.config is not None:
        tables.append((getattr(step.config, role), f"steps.{step.name}.{role}"))
    tables.append((getattr(task.config, role), role))
    for table, where in tables:
        if table.network_mode is not None or table.allowed_hosts is not None:
            mode = NetworkMode(table.network_mode) if table.network_mode is not None else NetworkMode.ALLOWLIST
            return mode.value, f"{where}.network_mode"
    return None


def _phase_network(explicit: tuple[str, str], task: Task) -> bool:
    mode, field = explicit
    if mode == NetworkMode.ALLOWLIST.value:
        raise SeedRefusedError("network_mode 'allowlist' needs egress control, which no harbor_gym sandbox has; "
                               "use 'public' or 'no-network'", path=task.path / "task.toml", field=field,
                               rule="LOAD-24")
    return mode == NetworkMode.PUBLIC.value


def phase_policy_refusals(task: Task, modes: Iterable[str]) -> None:
    """LOAD-24 for phase network policies (FMT-5/6, harbor/trial/network_policy.py), pure: an explicit ``[agent]``
    policy, or an explicit ``[verifier]`` policy of a ``shared`` step, that differs from ``[environment]``'s would
    need the agent sandbox to switch its network between phases, which no harbor_gym provider does (DIFF-9 keeps
    the Seed side); ``allowlist`` needs egress control. A ``separate`` step's verifier policy is honoured by
    `verifier_spec` (its sandbox starts with it).

    Args:
        modes: each step's effective verifier mode (after VER-2), in step order.

    Raises:
        SeedRefusedError: naming the field.
    """
    env = task.config.environment
    baseline = NetworkMode.ALLOWLIST.value if env.allowed_hosts else NetworkMode(env.network_mode).value
    for step, mode in zip(task.steps, modes):
        for role in ("agent", "verifier"):
            explicit = _explicit_policy(task, step, role)
            if explicit is None or (role == "verifier" and mode == "separate"):
                continue
            _phase_network(explicit, task)
            if explicit[0] != baseline:
                phase = "agent" if role == "agent" else "shared verifier"
                raise SeedRefusedError(
                    f"the {phase} phase asks for network_mode {explicit[0]!r} but the agent sandbox has "
                    f"{baseline!r} ([environment].network_mode), and no harbor_gym sandbox can switch its network "
                    "between phases; set the same policy on [environment]", path=task.path / "task.toml",
                    field=explicit[1], rule="LOAD-24")


def seed_refusals(task: Task, config: EnvConfig, agent: Any, *, backend: str, separate_steps: list[Step]) -> None:
    """LOAD-20..24, GYM-4 and BUD-7, checked in ``start()`` before any sandbox starts. Never retried.

    Args:
        agent: the announced agent, or ``None``.
        backend: ``docker`` or ``local`` — the provider the sandboxes will run on.
        separate_steps: the steps that verify ``separate`` (after VER-2).

    Raises:
        SeedRefusedError: naming the file, field and rule.
    """
    toml = task.path / "task.toml"
    harbor = config.semantics == Semantics.HARBOR
    continue_ = config.turn_sessions == TurnSessions.CONTINUE
    if agent is None and (continue_ or (task.first_step_trajectory is not None and not harbor)):
        why = "turn_sessions='continue'" if continue_ else "the first step ships a trajectory.json"
        raise SeedRefusedError(f"{why}: announce the agent with reset(options={{'agent': a}}) or HarborEnv(agent=a)",
                               path=toml, field="agent", rule="GYM-4")
    if task.first_step_trajectory is not None and not harbor and not isinstance(agent, Oracle):
        raise SeedRefusedError("the first step ships trajectory.json, which only the oracle may run with",
                               path=task.first_step_trajectory, field=task.steps[0].name, rule="LOAD-20")
    gpu_tables = [("environment", task.config.environment)] + [
        (f"steps.{s.name}.verifier.environment", s.verifier_environment) for s in task.steps
        if s.verifier_environment is not None]
    for where, table in gpu_tables:
        if table.gpus and backend != "docker":
            raise SeedRefusedError(f"{table.gpus} GPU(s) requested but the {backend!r} provider has no GPUs (only "
                                   "Docker with a GPU runtime passes them through)", path=toml,
                                   field=f"{where}.gpus", rule="LOAD-24")
    if backend not in ("docker", "podman"):  # both take a user as Docker's API does
        for step in task.steps:
            if step.agent_user and ":" in step.agent_user:
                raise SeedRefusedError(f"agent user {step.agent_user!r} of the form name:group needs the Docker "
                                       f"(or podman) provider, not {backend!r}", path=toml, field=f"steps.{step.name}.agent.user",
                                       rule="LOAD-21")
    if continue_:
        if not supports_continue(agent):
            raise SeedRefusedError(f"turn_sessions='continue' but the agent {type(agent).__name__} lacks "
                                   "supports_continue", path=toml, field="agent", rule="LOAD-22")
        users = {step.agent_user for step in task.steps}
        if len(users) > 1 and not harbor:
            raise SeedRefusedError(f"turn_sessions='continue' but the steps' agent users differ: {sorted(map(str, users))}",
                                   path=toml, field="steps.agent.user", rule="LOAD-22")
    # LOAD-23: every env template resolves, reading only allowlisted host variables (FMT-15).
    allow = config.host_env_allowlist
    env = resolved_env(task.config.environment.env, where="environment.env", allowlist=allow)
    resolved_env(task.config.solution.env, where="solution.env", allowlist=allow)
    for step in task.steps:
        resolved_env(step.verifier_env, where=f"steps.{step.name}.verifier.env", allowlist=allow)
        if step.verifier_environment is not None:
            resolved_env(step.verifier_environment.env, where=f"steps.{step.name}.verifier.environment.env",
                         allowlist=allow)
    spec = agent_spec(task, env=env)  # LOAD-24 network/resources of [environment]
    separate = {step.name for step in separate_steps}
    phase_policy_refusals(task, ["separate" if s.name in separate else "shared" for s in task.steps])
    for step in separate_steps:  # LOAD-23/24 of every separate verifier environment, before any sandbox
        verifier_spec(task, step, agent=spec, host_env_allowlist=allow)
    if not config.enforce_task_timeouts and separate_steps:
        allowance = max(_build_timeout(task, s) for s in separate_steps)
        if config.default_episode_timeout_seconds < allowance:
            raise SeedRefusedError(
                f"default_episode_timeout_seconds {config.default_episode_timeout_seconds} is below one sandbox-start "
                f"allowance ({allowance} s) and the task has a separate step", path=toml,
                field="default_episode_timeout_seconds", rule="BUD-7")


def _build_timeout(task: Task, step: Step) -> float:
    """BUD-9: the verifier environment's ``build_timeout_sec``."""
    table = step.verifier_environment or task.config.environment
    return float(table.build_timeout_sec)

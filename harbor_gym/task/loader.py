"""``load_task(path) -> Task``: validate a task folder (LOAD-1..16), resolve each step's files and settings.

Pure: reads files, starts nothing, needs no Docker. Checks run in this order, the first failure is raised:
LOAD-13 (``task.toml``, ``instruction.md``, ``environment``, ``steps`` linking out of the folder),
LOAD-1/2/7..12/15 (``task.toml``), LOAD-16 (multiplier), LOAD-14 (environment), LOAD-13 (inputs inside the
folder), LOAD-3/4/5 (step files), LOAD-13 (symlinks anywhere in ``environment/``, ``tests/``, ``solution/``,
``steps/<name>/``; ``.harborignore``), the compose file's subset
(COMPOSE-1/2, `harbor_gym.task.compose`), LOAD-12 (sidecars need a compose file naming them), LOAD-6.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from harbor_gym.config import EnvConfig, Semantics
from harbor_gym.errors import EnvTemplateError, TaskLoadError
from harbor_gym.task.compose import check_sidecar_names, parse_compose_file
from harbor_gym.task.files import check_inside, upload_listing
from harbor_gym.task.models import StepConfig, TaskConfig, VerifierEnvironmentMode, resolve_verifier_mode
from harbor_gym.task.resolved import ImageSourceKind, Step, StepArtifact, Task, VerifierImageSource
from harbor_gym.task._compose_vars import ComposeVariables, harbor_variables
from harbor_gym.task.text import resolve_env_templates, strip_canary
from harbor_gym.task.toml_io import parse_task_toml

__all__ = ["check_timeout_multiplier", "load_task", "verifier_image_source"]


def _existing_dir(path: Path) -> Path | None:
    return path if path.is_dir() else None


def _existing_file(path: Path) -> Path | None:
    return path if path.is_file() else None


def check_timeout_multiplier(value: object, *, path: Path) -> float:
    """LOAD-16: ``value`` as a float if it is a finite number > 0, else ``TaskLoadError`` naming ``path``."""
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value <= 0
    ):
        raise TaskLoadError(
            f"timeout_multiplier must be a finite number > 0, got {value!r}",
            path=path,
            field="timeout_multiplier",
            rule="LOAD-16",
        )
    return float(value)


def _read_instruction(path: Path, rule: str, field: str) -> str:
    try:
        return strip_canary(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise TaskLoadError(
            f"cannot read the instruction as UTF-8 text: {exc}", path=path, field=field, rule=rule
        ) from exc


def _build_files(folder: Path | None) -> tuple[Path | None, Path | None]:
    """(Dockerfile, docker-compose.yaml) of ``folder`` when present."""
    if folder is None:
        return None, None
    return _existing_file(folder / "Dockerfile"), _existing_file(folder / "docker-compose.yaml")


def verifier_image_source(
    task_dir: Path,
    config: TaskConfig,
    step: StepConfig | None,
    *,
    semantics: Semantics | str = Semantics.SEED,
) -> VerifierImageSource:
    """VER-4, first match wins: the step's verifier image; (Harbor only) a Dockerfile/compose file in
    ``steps/<name>/tests/``; ``[verifier.environment].docker_image``; a Dockerfile/compose file in ``tests/``;
    else the agent's environment definition (the only case where VER-6 uploads the tests)."""
    if step is not None and step.verifier.environment is not None and step.verifier.environment.docker_image:
        return VerifierImageSource(
            ImageSourceKind.STEP_IMAGE, docker_image=step.verifier.environment.docker_image
        )
    if step is not None and Semantics(semantics) == Semantics.HARBOR:
        dockerfile, compose = _build_files(_existing_dir(task_dir / "steps" / step.name / "tests"))
        if dockerfile or compose:
            return VerifierImageSource(
                ImageSourceKind.STEP_TESTS_BUILD, dockerfile=dockerfile, compose_file=compose
            )
    if config.verifier.environment is not None and config.verifier.environment.docker_image:
        return VerifierImageSource(
            ImageSourceKind.TASK_IMAGE, docker_image=config.verifier.environment.docker_image
        )
    dockerfile, compose = _build_files(_existing_dir(task_dir / "tests"))
    if dockerfile or compose:
        return VerifierImageSource(
            ImageSourceKind.TASK_TESTS_BUILD, dockerfile=dockerfile, compose_file=compose
        )
    env_dir = task_dir / "environment"
    image = config.environment.docker_image
    dockerfile, compose = _build_files(_existing_dir(env_dir))
    return VerifierImageSource(
        ImageSourceKind.AGENT_ENVIRONMENT,
        docker_image=image,
        dockerfile=None if image else dockerfile,
        compose_file=compose,
    )


def _check_inside(root: Path, folder: Path, field: str) -> None:
    """LOAD-13 (GYM-10): an input (possibly a symlink, or a link to a link) must resolve inside the task folder."""
    check_inside(folder, root, field=field)


def _check_listing(
    root: Path, folder: Path | None, required: str | None, field: str, honour_ignore: bool
) -> None:
    """LOAD-13: walk ``folder`` (symlink escapes and cycles) and keep ``required`` out of
    ``.harborignore``."""
    if folder is None:
        return
    listed = {rel for _, rel in upload_listing(folder, root=root, honour_ignore=honour_ignore)}
    if required and (folder / required).is_file() and required not in listed:
        raise TaskLoadError(
            f".harborignore excludes the required {required}; remove that pattern (FMT-16)",
            path=folder / ".harborignore",
            field=field,
            rule="LOAD-13",
        )


def _sidecar_uses(config: TaskConfig) -> list[tuple[str, str]]:
    """(field path, service) of every artifact entry or collect hook naming a service other than main."""
    uses: list[tuple[str, str]] = []
    for i, entry in enumerate(config.artifacts):
        if entry.service not in (None, "main"):
            uses.append((f"artifacts[{i}].service", entry.service))
    for i, hook in enumerate(config.verifier.collect):
        if hook.service != "main":
            uses.append((f"verifier.collect[{i}].service", hook.service))
    for s, step in enumerate(config.steps or ()):
        for i, entry in enumerate(step.artifacts):
            if entry.service not in (None, "main"):
                uses.append((f"steps[{s}].artifacts[{i}].service", entry.service))
        for i, hook in enumerate(step.verifier.collect):
            if hook.service != "main":
                uses.append((f"steps[{s}].verifier.collect[{i}].service", hook.service))
    return uses


def _resolve_step(
    root: Path, task_id: str, config: TaskConfig, step: StepConfig | None, index: int, semantics: Semantics
) -> Step:
    """Build one Step (files checked by the caller already)."""
    tests_dir = _existing_dir(root / "tests")
    task_artifacts = tuple(StepArtifact(entry, "task") for entry in config.artifacts)
    if step is None:  # GYM-9: one turn named by the task ID
        instruction_path = root / "instruction.md"
        solution_dir = _existing_dir(root / "solution")
        return Step(
            name=task_id,
            index=0,
            instruction=_read_instruction(instruction_path, "LOAD-5", "instruction.md"),
            instruction_path=instruction_path,
            config=None,
            step_dir=None,
            workdir_dir=None,
            setup_script=None,
            tests_layers=(tests_dir,) if tests_dir else (),
            test_script=root / "tests" / "test.sh",
            has_own_tests=False,
            solution_dir=solution_dir,
            validatable=solution_dir is not None and (solution_dir / "solve.sh").is_file(),
            agent_timeout_sec=config.agent.timeout_sec,
            verifier_timeout_sec=config.verifier.timeout_sec,
            agent_user=config.agent.user,
            verifier_user=config.verifier.user,
            verifier_env=dict(config.verifier.env),
            verifier_mode=resolve_verifier_mode(config.verifier, None),
            verifier_environment=config.verifier.environment,
            separate_image_source=verifier_image_source(root, config, None, semantics=semantics),
            healthcheck=None,
            artifacts=task_artifacts,
            collect=config.verifier.collect,
            min_reward=None,
            artifacts_declared=bool(config.artifacts),
        )
    step_dir = root / "steps" / step.name
    own_tests = _existing_dir(step_dir / "tests")
    workdir = _existing_dir(step_dir / "workdir")
    own_solution = _existing_dir(step_dir / "solution")
    solution_dir = own_solution or _existing_dir(root / "solution")
    own_test = step_dir / "tests" / "test.sh"
    return Step(
        name=step.name,
        index=index,
        instruction=_read_instruction(step_dir / "instruction.md", "LOAD-3", f"step {step.name}"),
        instruction_path=step_dir / "instruction.md",
        config=step,
        step_dir=step_dir,
        workdir_dir=workdir,
        setup_script=_existing_file(workdir / "setup.sh") if workdir else None,
        tests_layers=tuple(p for p in (tests_dir, own_tests) if p is not None),
        test_script=own_test if own_test.is_file() else root / "tests" / "test.sh",
        has_own_tests=own_tests is not None,
        solution_dir=solution_dir,
        validatable=solution_dir is not None and (solution_dir / "solve.sh").is_file(),
        agent_timeout_sec=step.agent.timeout_sec
        if step.agent.timeout_sec is not None
        else config.agent.timeout_sec,
        verifier_timeout_sec=step.verifier.timeout_sec,
        agent_user=step.agent.user if step.agent.user is not None else config.agent.user,
        verifier_user=step.verifier.user if step.verifier.user is not None else config.verifier.user,
        verifier_env={**config.verifier.env, **step.verifier.env},
        verifier_mode=resolve_verifier_mode(config.verifier, step),
        verifier_environment=step.verifier.environment or config.verifier.environment,
        separate_image_source=verifier_image_source(root, config, step, semantics=semantics),
        healthcheck=step.healthcheck,
        artifacts=task_artifacts + tuple(StepArtifact(entry, "step") for entry in step.artifacts),
        collect=config.verifier.collect + step.verifier.collect,
        min_reward=step.min_reward,
        artifacts_declared=bool(config.artifacts) or bool(step.artifacts),
    )


def load_task(
    path: str | os.PathLike[str],
    config: EnvConfig | dict | None = None,
    *,
    timeout_multiplier: float = 1.0,
) -> Task:
    """Load and validate a task folder (GYM-1, SPEC §2-3); nothing starts.

    Args:
        path: the task folder; its name is the task ID (FMT-3).
        config: read for ``semantics`` (VER-4, LOAD-6) and ``separate_verifier_for_artifacts`` (VER-2 in
            LOAD-6); a ``dict`` is coerced, ``None`` means ``EnvConfig()``.
        timeout_multiplier: the dataset's m (LOAD-16), stored on the Task; budgets stay raw.

    Returns:
        The Task; each Step has its instruction (FMT-2), files, raw budgets, users, modes resolved.

    Raises:
        TaskLoadError: LOAD-1..16; the message names the task folder (via the file), the field or step
            and the rule. Nothing is cached; a later call reads the folder again.

    Warns:
        UnknownKeyWarning: once, listing every unknown key (FMT-14).
        LegacyKeyWarning: once, listing every migrated legacy key (FMT-13).
    """
    cfg = EnvConfig.coerce(config)
    semantics = Semantics(cfg.semantics)
    root = Path(os.path.abspath(os.fspath(path)))
    if not root.is_dir():
        raise TaskLoadError("task folder missing or not a folder", path=root, rule="LOAD-1")
    toml_path = root / "task.toml"
    for name in ("task.toml", "instruction.md", "environment", "steps"):
        _check_inside(root, root / name, name)  # LOAD-13 (GYM-10): nothing the loader reads links out
    task_config = parse_task_toml(toml_path, semantics=semantics.value)
    multiplier = check_timeout_multiplier(timeout_multiplier, path=root)

    environment_dir = _existing_dir(root / "environment")
    dockerfile, compose_file = _build_files(environment_dir)
    if not task_config.environment.docker_image and dockerfile is None and compose_file is None:
        raise TaskLoadError(
            "no [environment].docker_image, environment/Dockerfile or environment/docker-compose.yaml; add one",
            path=toml_path,
            field="environment.docker_image",
            rule="LOAD-14",
        )

    for name in ("tests", "solution"):
        _check_inside(root, root / name, f"{name}/")
    step_configs: tuple[StepConfig | None, ...] = (
        task_config.steps if task_config.steps is not None else (None,)
    )

    for step in task_config.steps or ():
        step_dir = root / "steps" / step.name
        field = f"step {step.name}"
        _check_inside(root, step_dir, field)
        if not step_dir.is_dir():
            raise TaskLoadError(
                f"declared step has no folder steps/{step.name}/", path=step_dir, field=field, rule="LOAD-3"
            )
        if not (step_dir / "instruction.md").is_file():
            raise TaskLoadError(
                f"steps/{step.name}/instruction.md is missing",
                path=step_dir / "instruction.md",
                field=field,
                rule="LOAD-3",
            )
        if not (step_dir / "tests" / "test.sh").is_file() and not (root / "tests" / "test.sh").is_file():
            raise TaskLoadError(
                f"neither steps/{step.name}/tests/test.sh nor tests/test.sh exists",
                path=step_dir,
                field=field,
                rule="LOAD-4",
            )
    if task_config.steps is None:
        for required in ("instruction.md", "tests/test.sh"):
            if not (root / required).is_file():
                raise TaskLoadError(
                    f"single-step task without {required}",
                    path=root / required,
                    field=required,
                    rule="LOAD-5",
                )

    _check_listing(root, environment_dir, None, "environment/", False)
    _check_listing(root, _existing_dir(root / "tests"), "test.sh", "tests/", True)
    _check_listing(root, _existing_dir(root / "solution"), "solve.sh", "solution/", True)
    for step in task_config.steps or ():
        step_dir = root / "steps" / step.name
        field = f"step {step.name}"
        _check_listing(root, step_dir, None, field, False)
        _check_listing(root, _existing_dir(step_dir / "tests"), "test.sh", field, True)
        _check_listing(root, _existing_dir(step_dir / "solution"), "solve.sh", field, True)

    compose = parse_compose_file(compose_file, variables=_compose_variables(root, task_config, cfg)) \
        if compose_file is not None else None
    if compose is not None:
        check_sidecar_names(compose, _sidecar_uses(task_config), toml_path)
    if compose_file is None:
        for field, service in _sidecar_uses(task_config):
            raise TaskLoadError(
                f"names service {service!r} but environment/docker-compose.yaml does not exist",
                path=toml_path,
                field=field,
                rule="LOAD-12",
            )

    steps = tuple(
        _resolve_step(root, root.name, task_config, step, i, semantics) for i, step in enumerate(step_configs)
    )
    for step in steps:
        _check_separate_tests(root, step, cfg, semantics, toml_path)

    first_traj = None
    if task_config.steps is not None:
        first_traj = _existing_file(root / "steps" / task_config.steps[0].name / "trajectory.json")
    return Task(
        id=root.name,
        path=root,
        config=task_config,
        steps=steps,
        is_multi_step=task_config.steps is not None,
        environment_dir=environment_dir,
        dockerfile=dockerfile,
        compose_file=compose_file,
        compose=compose,
        timeout_multiplier=multiplier,
        first_step_trajectory=first_traj,
    )


def _compose_variables(root: Path, task_config: TaskConfig, cfg: EnvConfig) -> ComposeVariables:
    """Where the compose file's ``${VAR}`` values come from (`harbor_gym.task._compose_vars`): the task's
    ``[environment].env`` (FMT-15 through the allowlist; a template that cannot resolve is left out here and
    refused at seed, LOAD-23), Harbor's compose variables, the allowlisted host variables."""
    env = task_config.environment
    task_env: dict[str, str] = {}
    for key, value in env.env.items():
        try:
            task_env.update(resolve_env_templates({key: value}, os.environ, allowlist=cfg.host_env_allowlist))
        except EnvTemplateError:
            continue
    memory = env.memory_mb if env.memory_mb is not None else cfg.default_memory_mb
    return ComposeVariables(
        task_env=task_env,
        harbor=harbor_variables(root.name, cpus=env.cpus, memory_mb=memory, docker_image=env.docker_image),
        host_allowlist=tuple(cfg.host_env_allowlist))


def _check_separate_tests(
    root: Path, step: Step, cfg: EnvConfig, semantics: Semantics, toml_path: Path
) -> None:
    """LOAD-6: a separate step (VER-1/2) with its own tests/ needs a docker_image in the chosen verifier
    table."""
    if not step.has_own_tests:
        return
    mode = step.verifier_mode
    if cfg.separate_verifier_for_artifacts and step.artifacts_declared:
        mode = VerifierEnvironmentMode.SEPARATE
    if mode != VerifierEnvironmentMode.SEPARATE:
        return
    table = step.verifier_environment
    if table is not None and table.docker_image:
        return
    if semantics == Semantics.HARBOR and step.separate_image_source.kind == ImageSourceKind.STEP_TESTS_BUILD:
        return
    which = (
        "[steps.verifier.environment]"
        if step.config and step.config.verifier.environment
        else "[verifier.environment]"
    )
    raise TaskLoadError(
        f"verifies 'separate' with its own steps/{step.name}/tests/ but {which} has no docker_image; "
        "give that table a docker_image (with the tests baked in) or verify 'shared'",
        path=toml_path,
        field=f"step {step.name}",
        rule="LOAD-6",
    )

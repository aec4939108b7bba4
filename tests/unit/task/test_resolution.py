"""Per-step resolution: VER-1/2 modes, VER-3/4 environments, BUD-1/2 raw budgets, USR-1/3 users, ORACLE-1/3,
VER-6/8 test layers, ART-1 order, GYM-9 single-step."""

from __future__ import annotations

import warnings

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.task import (
    ImageSourceKind,
    StepConfig,
    VerifierConfig,
    effective_verifier_mode,
    load_task,
    resolve_verifier_mode,
)

from .conftest import FIXTURES, IMAGE, SOLVE_SH, steps_toml

ENV = {"docker_image": "v"}


@pytest.mark.parametrize(
    ("task_verifier", "step_verifier", "expected"),
    [
        ({}, {}, "shared"),
        ({"environment_mode": "separate"}, {}, "separate"),
        ({"environment": ENV}, {}, "separate"),
        ({"environment": ENV, "environment_mode": "separate"}, {}, "separate"),
        ({}, {"environment_mode": "separate"}, "separate"),
        ({}, {"environment": ENV}, "separate"),
        ({"environment": ENV}, {"environment_mode": "shared"}, "shared"),
        ({"environment_mode": "separate"}, {"environment_mode": "shared"}, "shared"),
        ({"environment_mode": "shared"}, {"environment": ENV}, "separate"),
        ({"environment_mode": "shared"}, {}, "shared"),
    ],
)
def test_ver_1_mode_table(task_verifier, step_verifier, expected):
    # SPEC: VER-1
    task = VerifierConfig.model_validate(task_verifier)
    step = StepConfig.model_validate({"name": "s", "verifier": step_verifier})
    assert resolve_verifier_mode(task, step) == expected


@pytest.mark.parametrize(
    ("task_verifier", "expected"),
    [({}, "shared"), ({"environment": ENV}, "separate"), ({"environment_mode": "separate"}, "separate")],
)
def test_ver_1_single_step(task_verifier, expected):
    # SPEC: VER-1, GYM-9
    assert resolve_verifier_mode(VerifierConfig.model_validate(task_verifier), None) == expected


def test_ver_2_artifacts_force_separate(build):
    # SPEC: VER-2
    toml = IMAGE + '[[steps]]\nname = "one"\nartifacts = ["/x"]\n[[steps]]\nname = "two"\n'
    task = load_task(build.multi(toml=toml, own_tests=False))
    one, two = task.steps
    assert one.verifier_mode == "shared" and two.verifier_mode == "shared"
    assert effective_verifier_mode(one, separate_verifier_for_artifacts=True) == "separate"
    assert effective_verifier_mode(two, separate_verifier_for_artifacts=True) == "shared"
    assert effective_verifier_mode(one, separate_verifier_for_artifacts=False) == "shared"


def test_bud_usr_raw_resolution(build):
    # SPEC: BUD-1 (step else [agent], raw), BUD-2 (step 600 default, never [verifier]'s), USR-1, USR-3
    toml = (
        IMAGE + '[agent]\ntimeout_sec = 100\nuser = "agent"\n[verifier]\ntimeout_sec = 77\nuser = "vroot"\n'
    )
    toml += '[[steps]]\nname = "one"\n[steps.agent]\ntimeout_sec = 10\nuser = "alice"\n'
    toml += '[steps.verifier]\ntimeout_sec = 20\nuser = "bob"\n'
    toml += '[[steps]]\nname = "two"\n'
    one, two = load_task(build.multi(toml=toml), timeout_multiplier=3).steps
    assert (one.agent_timeout_sec, one.verifier_timeout_sec, one.agent_user, one.verifier_user) == (
        10,
        20,
        "alice",
        "bob",
    )
    assert (two.agent_timeout_sec, two.verifier_timeout_sec, two.agent_user, two.verifier_user) == (
        100,
        600,
        "agent",
        "vroot",
    )


def test_bud_unbounded_and_single_step(build):
    # SPEC: BUD-1 (unbounded), BUD-2 single-step uses [verifier].timeout_sec
    task = load_task(build.single(toml=IMAGE + "[verifier]\ntimeout_sec = 42\n"), timeout_multiplier=2.5)
    step = task.steps[0]
    assert (
        step.agent_timeout_sec is None and step.verifier_timeout_sec == 42 and task.timeout_multiplier == 2.5
    )
    assert step.agent_user is None and step.verifier_user is None


def test_gym_9_single_step_is_one_turn_named_by_task_id():
    # SPEC: GYM-9, FMT-3
    task = load_task(FIXTURES / "single-minimal")
    assert not task.is_multi_step and task.id == "single-minimal" and len(task.steps) == 1
    step = task.steps[0]
    assert (
        step.name == "single-minimal"
        and step.index == 0
        and step.config is None
        and task.step("single-minimal") is step
    )
    assert step.healthcheck is None and step.workdir_dir is None and step.setup_script is None
    assert step.tests_layers == (task.path / "tests",) and step.test_script == task.path / "tests" / "test.sh"
    assert step.validatable and step.solution_dir == task.path / "solution"
    assert task.first_step_trajectory is None
    with pytest.raises(KeyError):
        task.step("other")


def test_multi_full_fixture_resolution():
    # SPEC: VER-3/4/6/7/8, ART-1, ORACLE-1/3, TURN-4/5, FMT-3
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        task = load_task(FIXTURES / "multi-full")
    assert (
        task.id == "multi-full"
        and task.is_multi_step
        and task.compose_file is not None
        and task.path.is_absolute()
    )
    one, two = task.steps
    assert (one.index, two.index) == (0, 1)
    # VER-6 layers and VER-8 script
    assert one.tests_layers == (task.path / "tests", task.path / "steps/01-setup/tests") and one.has_own_tests
    assert one.test_script == task.path / "steps/01-setup/tests/test.sh"
    assert two.tests_layers == (task.path / "tests",) and not two.has_own_tests
    assert two.test_script == task.path / "tests/test.sh"
    # VER-3: step table replaces the task's, whole
    assert one.verifier_environment.docker_image == "verifier:step1" and one.verifier_environment.cpus is None
    assert two.verifier_environment.docker_image == "verifier:1"
    # VER-4
    assert (
        one.separate_image_source.kind == ImageSourceKind.STEP_IMAGE
        and not one.separate_image_source.uploads_tests
    )
    assert two.separate_image_source.kind == ImageSourceKind.TASK_IMAGE
    # VER-7 env merge, raw templates
    assert one.verifier_env == {"MODE": "strict", "SHARED": "step", "ONLY_STEP": "1"}
    assert two.verifier_env == {"MODE": "strict", "SHARED": "task"}
    # ART-1: task's then step's, with origin; hooks task's then step's
    assert [(a.origin, a.source) for a in one.artifacts] == [
        ("task", "/app/log.txt"),
        ("task", "/var/log/db"),
        ("step", "/app/step1.txt"),
    ]
    assert [h.command for h in one.collect] == [
        "cp /var/log/app.log /logs/artifacts/",
        "pg_dump > /dump.sql",
        "echo step",
    ]
    assert len(two.collect) == 2
    # TURN-4/5
    assert one.workdir_dir == task.path / "steps/01-setup/workdir" and one.setup_script.name == "setup.sh"
    assert two.workdir_dir is None and two.setup_script is None
    # ORACLE-1/3: own solution/ without solve.sh -> unvalidatable, no fallback
    assert one.solution_dir == task.path / "solution" and one.validatable
    assert two.solution_dir == task.path / "steps/02-finish/solution" and not two.validatable
    # STOP-2/3 gates
    assert one.min_reward == 0.5 and two.min_reward == {"correct": 1.0, "style": 0.25}
    assert one.healthcheck.command == "true" and two.healthcheck is None


def test_oracle_1_3_solution_choice(build):
    # SPEC: ORACLE-1, ORACLE-3
    files = {"steps/one/solution/solve.sh": SOLVE_SH}
    task = load_task(build.multi(files=files))
    one, two = task.steps
    assert one.solution_dir == task.path / "steps/one/solution" and one.validatable
    assert two.solution_dir is None and not two.validatable
    task = load_task(build.multi(files={"solution/solve.sh": SOLVE_SH}))
    assert all(s.solution_dir == task.path / "solution" and s.validatable for s in task.steps)


def test_ver_4_sources(build):
    # SPEC: VER-4 — tests/ Dockerfile, then the agent environment (the only case uploading tests)
    toml = IMAGE + '[verifier]\nenvironment_mode = "separate"\n' + steps_toml(["one"])
    task = load_task(
        build.multi(toml=toml, steps=["one"], own_tests=False, files={"tests/Dockerfile": "FROM x\n"})
    )
    src = task.steps[0].separate_image_source
    assert (
        src.kind == ImageSourceKind.TASK_TESTS_BUILD
        and src.dockerfile.name == "Dockerfile"
        and not src.uploads_tests
    )
    task = load_task(build.multi(toml=toml, steps=["one"], own_tests=False))
    src = task.steps[0].separate_image_source
    assert (
        src.kind == ImageSourceKind.AGENT_ENVIRONMENT
        and src.uploads_tests
        and src.docker_image == "debian:bookworm-slim"
    )


def test_load_20_first_step_trajectory_is_found(build):
    # SPEC: LOAD-20 (refused at seed; the loader only finds the file)
    task = load_task(build.multi(files={"steps/one/trajectory.json": "{}"}))
    assert task.first_step_trajectory == task.path / "steps/one/trajectory.json"
    assert load_task(build.multi(files={"steps/two/trajectory.json": "{}"})).first_step_trajectory is None


def test_load_task_takes_env_config(build):
    # GYM-1: HarborEnv passes its EnvConfig
    assert load_task(build.single(), EnvConfig()).steps[0].verifier_mode == "shared"

"""LOAD-1..16: each refusal at load, with the rule, the field or step and the task folder in the message."""

from __future__ import annotations

import pytest

from harbor_gym.config import EnvConfig
from harbor_gym.errors import TaskLoadError
from harbor_gym.task import load_task

from .conftest import IMAGE, SOLVE_SH, TEST_SH, assert_refused, steps_toml

pytestmark = pytest.mark.filterwarnings("ignore::harbor_gym.task.LegacyKeyWarning")


def refused(path, rule, field=None, folder=None, **kwargs):
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(path, **kwargs)
    assert_refused(excinfo, rule, field, folder or path)
    return excinfo.value


# --- LOAD-1 -------------------------------------------------------------------------------------------------


def test_load_1_task_toml_missing(build):
    # SPEC: LOAD-1
    root = build.single(drop=["task.toml"])
    refused(root, "LOAD-1", "task.toml")


def test_load_1_not_toml(build):
    # SPEC: LOAD-1
    root = build.single(toml="[environment\ndocker_image = 1\n")
    refused(root, "LOAD-1", "not valid TOML")


def test_load_1_task_folder_missing(tmp_path):
    # SPEC: LOAD-1
    refused(tmp_path / "nope", "LOAD-1")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        (IMAGE + 'build_timeout_sec = "600"\n', "environment.build_timeout_sec"),
        (IMAGE + "memory_mb = 1.5\n", "environment.memory_mb"),
        (IMAGE + "memory_mb = true\n", "environment.memory_mb"),
        (IMAGE + 'network_mode = "offline"\n', "environment.network_mode"),
        (IMAGE + "env = { A = 1 }\n", "environment.env.A"),
        (IMAGE + "[verifier]\ntimeout_sec = nan\n", "verifier.timeout_sec"),
        (IMAGE + "[verifier]\ntimeout_sec = inf\n", "verifier.timeout_sec"),
        (IMAGE + "[verifier]\ntimeout_sec = -1\n", "verifier.timeout_sec"),
        (IMAGE + '[verifier]\nenvironment_mode = "both"\n', "verifier.environment_mode"),
        (IMAGE + "[agent]\ntimeout_sec = false\n", "agent.timeout_sec"),
        (IMAGE + '[[verifier.collect]]\nservice = "main"\n', "verifier.collect[0].command"),
        (IMAGE + "[environment.healthcheck]\ninterval_sec = 1\n", "environment.healthcheck.command"),
        ('multi_step_reward_strategy = "median"\n' + IMAGE, "multi_step_reward_strategy"),
        ("schema_version = 1.4\n" + IMAGE, "schema_version"),
        (IMAGE + '[task]\nname = "no-slash"\n', "task.name"),
        (IMAGE + '[task]\nname = "org/../x"\n', "task.name"),
        (IMAGE + '[task]\nname = "org/x"\nversion = ""\n', "task.version"),
        (IMAGE + '[task]\nauthors = [{ email = "a@b" }]\n', "task.authors[0].name"),
        ("artifacts = [1]\n" + IMAGE, "artifacts[0]"),
        ("steps = []\n" + IMAGE, "steps"),
    ],
)
def test_load_1_wrong_type_or_value(build, toml, field):
    # SPEC: LOAD-1 (a wrong type or value of a known key is an error, never a silent default)
    root = build.single(toml=toml)
    refused(root, "LOAD-1", field)


def test_load_1_step_field_path(build):
    # SPEC: LOAD-1 — the message names the step field by its index path
    toml = IMAGE + steps_toml(["one"]) + '[[steps]]\nname = "two"\n[steps.verifier]\ntimeout_sec = "30"\n'
    root = build.multi(toml=toml)
    refused(root, "LOAD-1", "steps[1].verifier.timeout_sec")


@pytest.mark.parametrize("value", ['"high"', "true", '{ reward = "1" }', "nan", "[1]"])
def test_load_1_min_reward_number_or_table(build, value):
    # SPEC: LOAD-1, FMT-11 — min_reward is a finite number or a table of numbers
    root = build.multi(toml=IMAGE + f'[[steps]]\nname = "one"\nmin_reward = {value}\n', steps=["one"])
    refused(root, "LOAD-1", "steps[0].min_reward")


# --- LOAD-2 -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["-lead", "a b", "a/b", "", "é", ".hidden"])
def test_load_2_step_name_pattern(build, name):
    # SPEC: LOAD-2, FMT-12
    root = build.multi(toml=IMAGE + f'[[steps]]\nname = "{name}"\n', steps=[])
    refused(root, "LOAD-2", "steps[0].name")


def test_load_2_step_names_equal_after_casefold(build):
    # SPEC: LOAD-2, FMT-12
    root = build.multi(toml=IMAGE + steps_toml(["Setup", "build", "SETUP"]), steps=["Setup", "build"])
    refused(root, "LOAD-2", "steps[2].name")


# --- LOAD-3 / 4 / 5 ----------------------------------------------------------------------------------------


def test_load_3_step_without_folder(build):
    # SPEC: LOAD-3
    root = build.multi(toml=IMAGE + steps_toml(["one", "two"]), steps=["one"])
    refused(root, "LOAD-3", "step two")


def test_load_3_step_without_instruction(build):
    # SPEC: LOAD-3
    root = build.multi(drop=["steps/two/instruction.md"])
    err = refused(root, "LOAD-3", "step two")
    assert "instruction.md" in str(err)


def test_load_4_step_without_any_test_sh(build):
    # SPEC: LOAD-4
    root = build.multi(drop=["steps/two/tests/test.sh"])
    refused(root, "LOAD-4", "step two")


def test_load_4_task_tests_serve_every_step(build):
    # SPEC: LOAD-4 — tests/test.sh alone is enough
    task = load_task(build.multi(own_tests=False))
    assert [s.test_script.relative_to(task.path).as_posix() for s in task.steps] == ["tests/test.sh"] * 2


def test_load_5_single_step_without_instruction(build):
    # SPEC: LOAD-5
    root = build.single(drop=["instruction.md"])
    refused(root, "LOAD-5", "instruction.md")


def test_load_5_single_step_without_test_sh(build):
    # SPEC: LOAD-5
    root = build.single(drop=["tests/test.sh"])
    refused(root, "LOAD-5", "tests/test.sh")


# --- LOAD-6 -------------------------------------------------------------------------------------------------


def test_load_6_separate_step_own_tests_without_image(build):
    # SPEC: LOAD-6 — step environment table without docker_image
    toml = IMAGE + '[[steps]]\nname = "one"\n[steps.verifier.environment]\ncpus = 1\n'
    root = build.multi(toml=toml, steps=["one"])
    refused(root, "LOAD-6", "step one")


def test_load_6_task_verifier_environment_without_image(build):
    # SPEC: LOAD-6 — else [verifier.environment]; a Dockerfile in the step's tests/ does not help (Seed)
    toml = IMAGE + "[verifier.environment]\ncpus = 1\n" + steps_toml(["one"])
    root = build.multi(toml=toml, steps=["one"], files={"steps/one/tests/Dockerfile": "FROM x\n"})
    refused(root, "LOAD-6", "step one")


def test_load_6_explicit_separate_without_any_table(build):
    # SPEC: LOAD-6 — separate by environment_mode with no table at all has no docker_image either
    toml = IMAGE + '[verifier]\nenvironment_mode = "separate"\n' + steps_toml(["one"])
    refused(build.multi(toml=toml, steps=["one"]), "LOAD-6", "step one")


def test_load_6_separate_for_artifacts_counts(build):
    # SPEC: LOAD-6 with VER-2 — separate_verifier_for_artifacts makes a step with artifacts separate
    toml = 'artifacts = ["/app/out"]\n' + IMAGE + steps_toml(["one"])
    root = build.multi(toml=toml, steps=["one"])
    load_task(root)  # shared by VER-1: fine
    refused(root, "LOAD-6", "step one", config=EnvConfig(separate_verifier_for_artifacts=True))


def test_load_6_allowed_cases(build):
    # SPEC: LOAD-6 — an image in the chosen table, no own tests, or Harbor's step Dockerfile are accepted
    with_image = IMAGE + '[[steps]]\nname = "one"\n[steps.verifier.environment]\ndocker_image = "v:1"\n'
    assert load_task(build.multi(toml=with_image, steps=["one"])).steps[0].verifier_mode == "separate"
    task_image = IMAGE + '[verifier.environment]\ndocker_image = "v:1"\n' + steps_toml(["one"])
    assert load_task(build.multi(toml=task_image, steps=["one"])).steps[0].verifier_mode == "separate"
    no_own_tests = IMAGE + '[verifier]\nenvironment_mode = "separate"\n' + steps_toml(["one"])
    load_task(build.multi(toml=no_own_tests, steps=["one"], own_tests=False))
    harbor = IMAGE + "[verifier.environment]\ncpus = 1\n" + steps_toml(["one"])
    root = build.multi(toml=harbor, steps=["one"], files={"steps/one/tests/Dockerfile": "FROM x\n"})
    task = load_task(root, EnvConfig(semantics="harbor"))
    assert task.steps[0].separate_image_source.kind == "step_tests_build"


# --- LOAD-7 -------------------------------------------------------------------------------------------------


def test_load_7_shared_with_environment_task_level(build):
    # SPEC: LOAD-7
    toml = IMAGE + '[verifier]\nenvironment_mode = "shared"\n[verifier.environment]\ndocker_image = "v"\n'
    refused(build.single(toml=toml), "LOAD-7", "verifier.environment_mode")


def test_load_7_shared_with_environment_step_level(build):
    # SPEC: LOAD-7
    toml = IMAGE + '[[steps]]\nname = "one"\n[steps.verifier]\nenvironment_mode = "shared"\n'
    toml += '[steps.verifier.environment]\ndocker_image = "v"\n'
    refused(build.multi(toml=toml, steps=["one"]), "LOAD-7", "steps[0].verifier.environment_mode")


# --- LOAD-8 / 9 / 10 ----------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("table", "body", "field"),
    [
        ("steps.agent", 'network_mode = "no-network"', "steps[0].agent.network_mode"),
        (
            "steps.agent",
            'network_mode = "allowlist"\nallowed_hosts = ["a.com"]',
            "steps[0].agent.allowed_hosts",
        ),
        ("steps.verifier", 'network_mode = "no-network"', "steps[0].verifier.network_mode"),
        ("steps.agent", "allow_internet = false", "steps[0].agent.network_mode"),
        (
            "steps.verifier.environment",
            'docker_image = "v"\nallow_internet = false',
            "steps[0].verifier.environment",
        ),
        (
            "steps.verifier.environment",
            'docker_image = "v"\nnetwork_mode = "no-network"',
            "steps[0].verifier.environment",
        ),
    ],
)
def test_load_8_step_network_restriction(build, table, body, field):
    # SPEC: LOAD-8
    toml = IMAGE + f'[[steps]]\nname = "one"\n[{table}]\n{body}\n'
    refused(build.multi(toml=toml, steps=["one"]), "LOAD-8", field)


def test_load_8_explicit_public_is_no_restriction(build):
    # SPEC: LOAD-8 (open point 4: an explicit "public" is not a restriction)
    toml = IMAGE + '[[steps]]\nname = "one"\n[steps.agent]\nnetwork_mode = "public"\nallow_internet = true\n'
    load_task(build.multi(toml=toml, steps=["one"]))


def test_load_9_verifier_restriction_with_shared_step(build):
    # SPEC: LOAD-9
    toml = IMAGE + '[verifier]\nnetwork_mode = "no-network"\n' + steps_toml(["one", "two"])
    toml += '[steps.verifier.environment]\ndocker_image = "v"\n'  # step two is separate, step one shared
    refused(build.multi(toml=toml, own_tests=False), "LOAD-9", "verifier.network_mode")


def test_load_9_verifier_restriction_single_step_shared(build):
    # SPEC: LOAD-9 — a single-step task is one step (GYM-9)
    toml = IMAGE + "[verifier]\nallow_internet = false\n"
    refused(build.single(toml=toml), "LOAD-9", "verifier.network_mode")


def test_load_9_all_separate_is_fine(build):
    # SPEC: LOAD-9
    toml = IMAGE + '[verifier]\nnetwork_mode = "no-network"\n[verifier.environment]\ndocker_image = "v"\n'
    task = load_task(build.multi(toml=toml + steps_toml(["one"]), steps=["one"]))
    assert task.config.verifier.network_mode == "no-network"


def test_load_10_allowed_hosts_without_allowlist(build):
    # SPEC: LOAD-10
    refused(build.single(toml=IMAGE + 'allowed_hosts = ["a.com"]\n'), "LOAD-10", "environment.allowed_hosts")
    refused(
        build.single(toml=IMAGE + '[agent]\nallowed_hosts = ["a.com"]\n'), "LOAD-10", "agent.allowed_hosts"
    )


@pytest.mark.parametrize(
    "entry",
    ["https://a.com", "a.com:443", "a.com/path", "/etc/hosts", "a.*.com", "*a.com", "*", "**.a.com", ""],
)
def test_load_10_bad_host_entries(build, entry):
    # SPEC: LOAD-10 — URLs, ports, paths, wildcards other than a leading "*."
    toml = IMAGE + f'network_mode = "allowlist"\nallowed_hosts = ["ok.com", "{entry}"]\n'
    refused(build.single(toml=toml), "LOAD-10", "environment.allowed_hosts[1]")


def test_load_10_good_host_entries(build):
    # SPEC: LOAD-10
    toml = (
        IMAGE + 'network_mode = "allowlist"\nallowed_hosts = ["a.com", "*.b.org", "10.0.0.1", "localhost"]\n'
    )
    assert load_task(build.single(toml=toml)).config.environment.allowed_hosts[1] == "*.b.org"


# --- LOAD-11 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('memory = "2G"\nmemory_mb = 1024', "environment.memory"),
        ('storage = "1G"\nstorage_mb = 10', "environment.storage"),
        ("cpus = inf", "environment.cpus"),
        ("cpus = nan", "environment.cpus"),
    ],
)
def test_load_11_conflicts_and_nonfinite_cpus(build, body, field):
    # SPEC: LOAD-11
    refused(build.single(toml=IMAGE + body + "\n"), "LOAD-11", field)


def test_load_11_verifier_environment_too(build):
    # SPEC: LOAD-11 — every environment table
    toml = IMAGE + '[verifier.environment]\ndocker_image = "v"\nmemory = "1G"\nmemory_mb = 1\n'
    refused(build.single(toml=toml), "LOAD-11", "verifier.environment.memory")


def test_load_11_agreeing_values_are_fine(build):
    # SPEC: LOAD-11 — no conflict when they agree
    assert (
        load_task(build.single(toml=IMAGE + 'memory = "2G"\nmemory_mb = 2048\n')).config.environment.memory_mb
        == 2048
    )


# --- LOAD-12 ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "field"),
    [
        ('"/app/../etc"', "artifacts[0].source"),
        ('{ source = "../x" }', "artifacts[0].source"),
        ('{ source = "/a", destination = "/abs" }', "artifacts[0].destination"),
        ('{ source = "/a", destination = "x/../../y" }', "artifacts[0].destination"),
        ('{ source = "/a", destination = "x\\\\y" }', "artifacts[0].destination"),
        ('{ source = "/a", destination = "manifest.json" }', "artifacts[0].destination"),
        ('{ source = "/a", destination = "./manifest.json" }', "artifacts[0].destination"),
        ('{ source = "rel/path", service = "db" }', "artifacts[0].source"),
    ],
)
def test_load_12_artifact_paths(build, entry, field):
    # SPEC: LOAD-12
    root = build.single(toml=f"artifacts = [{entry}]\n" + IMAGE)
    refused(root, "LOAD-12", field)


def test_load_12_step_artifact_paths(build):
    # SPEC: LOAD-12 — step artifacts too
    toml = IMAGE + '[[steps]]\nname = "one"\nartifacts = [{ source = "/a", destination = "/b" }]\n'
    refused(build.multi(toml=toml, steps=["one"]), "LOAD-12", "steps[0].artifacts[0].destination")


@pytest.mark.parametrize(
    ("toml", "field"),
    [
        ('artifacts = [{ source = "/var/log", service = "db" }]\n' + IMAGE, "artifacts[0].service"),
        (IMAGE + '[[verifier.collect]]\ncommand = "true"\nservice = "db"\n', "verifier.collect[0].service"),
        (
            IMAGE + '[[steps]]\nname = "one"\n[[steps.verifier.collect]]\ncommand = "x"\nservice = "db"\n',
            "steps[0].verifier.collect[0].service",
        ),
    ],
)
def test_load_12_sidecar_without_compose(build, toml, field):
    # SPEC: LOAD-12 — a sidecar named without environment/docker-compose.yaml
    root = build.multi(toml=toml, steps=["one"]) if "[[steps]]" in toml else build.single(toml=toml)
    refused(root, "LOAD-12", field)


def test_load_12_sidecar_with_compose_is_fine(build):
    # SPEC: LOAD-12
    toml = 'artifacts = [{ source = "/var/log", service = "db" }]\n'
    root = build.single(
        toml=toml,
        files={"environment/docker-compose.yaml": "services: {main: {image: x}, db: {image: y}}\n"},
    )
    task = load_task(root)
    assert task.has_compose and task.steps[0].artifacts[0].service == "db"


# --- LOAD-13 ------------------------------------------------------------------------------------------------


def test_load_13_tests_outside_task_folder(build, tmp_path):
    # SPEC: LOAD-13 — an input folder resolving outside
    outside = tmp_path / "elsewhere"
    (outside).mkdir()
    (outside / "test.sh").write_text(TEST_SH)
    root = build.single(drop=["tests/test.sh"])
    (root / "tests").symlink_to(outside)
    refused(root, "LOAD-13", "tests/")


def test_load_13_step_folder_outside(build, tmp_path):
    # SPEC: LOAD-13
    outside = tmp_path / "stepout"
    (outside / "tests").mkdir(parents=True)
    (outside / "instruction.md").write_text("x")
    (outside / "tests" / "test.sh").write_text(TEST_SH)
    root = build.multi(steps=["one"], toml=IMAGE + steps_toml(["one", "two"]))
    (root / "steps" / "two").symlink_to(outside)
    refused(root, "LOAD-13", "step two")


def test_load_13_file_symlink_outside(build, tmp_path):
    # SPEC: LOAD-13 — a file inside an input that links out
    (tmp_path / "secret").write_text("s")
    root = build.single()
    (root / "tests" / "data").symlink_to(tmp_path / "secret")
    refused(root, "LOAD-13", "data")


def test_load_13_symlink_cycle(build):
    # SPEC: LOAD-13
    root = build.multi(files={"steps/one/workdir/sub/file.txt": "x"})
    (root / "steps" / "one" / "workdir" / "sub" / "loop").symlink_to(root / "steps" / "one" / "workdir")
    refused(root, "LOAD-13", "cycle")


def test_load_13_harborignore_excludes_test_sh(build):
    # SPEC: LOAD-13, FMT-16
    root = build.single(files={"tests/.harborignore": "*.sh\n"})
    refused(root, "LOAD-13", "test.sh")


def test_load_13_harborignore_excludes_step_solve_sh(build):
    # SPEC: LOAD-13, FMT-16
    files = {"steps/two/solution/solve.sh": SOLVE_SH, "steps/two/solution/.harborignore": "solve.sh\n"}
    refused(build.multi(files=files), "LOAD-13", "step two")


def test_load_13_harborignore_of_other_files_is_fine(build):
    # SPEC: FMT-16
    load_task(build.single(files={"tests/.harborignore": "*.pyc\n", "tests/x.pyc": "bin"}))


# --- LOAD-14 / 15 / 16 --------------------------------------------------------------------------------------


def test_load_14_no_environment(build):
    # SPEC: LOAD-14
    refused(build.single(toml="[environment]\ncpus = 1\n"), "LOAD-14", "environment.docker_image")
    refused(build.single(toml=""), "LOAD-14", "environment")


def test_load_14_dockerfile_or_compose_suffices(build):
    # SPEC: LOAD-14, FMT-10
    task = load_task(build.single(toml="", files={"environment/Dockerfile": "FROM x\n"}))
    assert task.dockerfile is not None and task.compose_file is None
    compose = {"environment/docker-compose.yaml": "services: {main: {image: x}}\n"}
    task = load_task(build.single(toml="", files=compose))
    assert task.compose_file is not None


def test_load_15_windows(build):
    # SPEC: LOAD-15
    refused(build.single(toml=IMAGE + 'os = "windows"\n'), "LOAD-15", "environment.os")


@pytest.mark.parametrize("value", [0, -1.0, float("inf"), float("nan"), "2", True, None])
def test_load_16_bad_multiplier_argument(build, value):
    # SPEC: LOAD-16
    refused(build.single(), "LOAD-16", "timeout_multiplier", timeout_multiplier=value)

"""environment/docker-compose.yaml at load: the supported subset parsed, anything else refused by name."""

from __future__ import annotations

import pickle
from pathlib import Path

import pytest

from harbor_gym.errors import TaskLoadError
from harbor_gym.task import load_task
from harbor_gym.task.compose import ComposeHealthcheck, ComposeMount, ComposeResources, parse_compose_text

from .conftest import write_tree

ENVS = Path(__file__).resolve().parents[3] / "envs"


def env_dir(tmp_path: Path) -> Path:
    """An environment folder with a build context ``kv/`` and a file ``conf/app.ini``."""
    return write_tree(tmp_path / "task" / "environment", {
        "kv/Dockerfile": "FROM python:3.12-slim\n",
        "kv/Other.dockerfile": "FROM python:3.12-slim\n",
        "conf/app.ini": "x=1\n",
    })


def parse(tmp_path: Path, text: str):
    return parse_compose_text(text, path=env_dir(tmp_path) / "docker-compose.yaml")


def refused(tmp_path: Path, text: str, field: str, rule: str = "COMPOSE-1") -> TaskLoadError:
    with pytest.raises(TaskLoadError) as excinfo:
        parse(tmp_path, text)
    err = excinfo.value
    assert err.rule == rule, str(err)
    assert err.field == field, str(err)
    assert "docker-compose.yaml" in str(err) and field in str(err)
    return err


MAIN = "services:\n  main:\n    image: python:3.12-slim\n"


# --- the supported subset ---------------------------------------------------------------------------------

def test_compose_1_every_supported_key_is_parsed(tmp_path):
    # SPEC: COMPOSE-1, COMPOSE-2 — each supported key reaches the model
    compose = parse(tmp_path, """
version: "3.8"
x-common: &common {KEEP: "1"}
services:
  main:
    image: python:3.12-slim
    environment: {A: "1", B: 2, C: true}
    command: sleep infinity
    working_dir: /app
    user: "1000:1000"
    depends_on:
      kv: {condition: service_healthy}
      db: {condition: service_started}
    x-note: ignored like compose does
  kv:
    build: {context: ./kv, dockerfile: Other.dockerfile}
    environment: ["PORT=8000", "EMPTY="]
    entrypoint: ["python3", "-m", "http.server"]
    command: ["8000"]
    volumes:
      - data:/data
      - ./conf:/etc/app:ro
      - {type: volume, source: data, target: /more, read_only: true}
      - {type: bind, source: ./conf/app.ini, target: /etc/app.ini}
    healthcheck:
      test: ["CMD-SHELL", "true"]
      interval: 1m30s
      timeout: 500ms
      retries: 7
      start_period: 2s
    deploy:
      resources:
        limits: {cpus: "0.5", memory: 128m, pids: 64}
        reservations: {cpus: 0.25, memory: 1g}
  db:
    build: kv
    cpus: 1.5
    mem_limit: 256MB
    depends_on: [kv]
    healthcheck: {test: "pg_isready", disable: false}
volumes:
  data:
""")
    main, kv, db = compose.services
    assert [s.name for s in compose.sidecars] == ["kv", "db"] and compose.main is main
    assert main.image == "python:3.12-slim" and main.build is None
    assert main.env == {"A": "1", "B": "2", "C": "true"}
    assert main.command == ("sleep", "infinity") and main.entrypoint is None
    assert (main.working_dir, main.user) == ("/app", "1000:1000")
    assert main.depends_on == (("kv", "service_healthy"), ("db", "service_started"))
    assert kv.build.context == (compose.env_dir / "kv").resolve()
    assert kv.build.dockerfile == "Other.dockerfile"
    assert kv.env == {"PORT": "8000", "EMPTY": ""}
    assert kv.entrypoint == ("python3", "-m", "http.server") and kv.command == ("8000",)
    conf = str((compose.env_dir / "conf").resolve())
    assert kv.mounts == (
        ComposeMount("volume", "data", "/data", False),
        ComposeMount("bind", conf, "/etc/app", True),
        ComposeMount("volume", "data", "/more", True),
        ComposeMount("bind", conf + "/app.ini", "/etc/app.ini", False),
    )
    assert kv.healthcheck == ComposeHealthcheck(("CMD-SHELL", "true"), 90.0, 0.5, 7, 2.0)
    assert kv.limits == ComposeResources(0.5, 128 << 20, 64)
    assert kv.reservations == ComposeResources(0.25, 1 << 30, None)
    assert db.build.context == kv.build.context and db.build.dockerfile == "Dockerfile"
    assert db.legacy == ComposeResources(1.5, 256 << 20, None)
    assert db.depends_on == (("kv", "service_started"),)
    assert db.healthcheck.test == ("CMD-SHELL", "pg_isready")
    assert compose.volumes == ("data",)
    assert [s.name for s in compose.start_order()] == ["kv", "db", "main"]
    # frozen models pickle and hash (Task pickles, vector envs)
    assert pickle.loads(pickle.dumps(compose)) == compose and hash(compose) == hash(compose)


@pytest.mark.parametrize("service, expected", [
    ("deploy: {resources: {limits: {cpus: 1, memory: 64m}, reservations: {cpus: 2, memory: 32m}}}\n"
     "    cpus: 3\n    mem_limit: 16m", ComposeResources(1.0, 64 << 20, None)),
    ("deploy: {resources: {reservations: {cpus: 2, memory: 32m}}}\n    cpus: 3\n    mem_limit: 16m",
     ComposeResources(2.0, 32 << 20, None)),
    ("cpus: 3\n    mem_limit: 16m", ComposeResources(3.0, 16 << 20, None)),
    ("deploy: {resources: {limits: {memory: 64m}}}\n    cpus: 3", ComposeResources(3.0, 64 << 20, None)),
    ("environment: {}", ComposeResources(None, None, None)),
])
def test_compose_2_size_is_limits_else_reservations_else_legacy(tmp_path, service, expected):
    # SPEC: COMPOSE-2
    compose = parse(tmp_path, MAIN + f"  kv:\n    image: x\n    {service}\n")
    assert compose.service("kv").size() == expected


def test_compose_1_healthcheck_forms(tmp_path):
    # SPEC: COMPOSE-1 — string test = CMD-SHELL; defaults as compose's; disable
    compose = parse(tmp_path, MAIN + "  a:\n    image: x\n    healthcheck: {test: curl -f x}\n"
                                     "  b:\n    image: x\n    healthcheck: {disable: true}\n")
    expected = ComposeHealthcheck(("CMD-SHELL", "curl -f x"), 30.0, 30.0, 3, 0.0)
    assert compose.service("a").healthcheck == expected
    assert compose.service("b").healthcheck.disabled


def test_compose_1_shipped_example_loads_onto_the_task():
    # SPEC: COMPOSE-1 — the task carries the parsed compose file (nothing above task/ re-reads it)
    task = load_task(ENVS / "kv-sidecar")
    assert task.compose is not None and task.compose.path == task.compose_file
    assert task.compose.service_names == ("main", "kv")
    assert task.compose.service("kv").size() == ComposeResources(0.5, 128 << 20, None)
    assert pickle.loads(pickle.dumps(task)).compose == task.compose


# --- refusals ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("key, value", [
    ("ports", '["8000:8000"]'),
    ("privileged", "true"),
    ("network_mode", "host"),
    ("cap_add", "[NET_ADMIN]"),
    ("networks", "[default]"),
    ("restart", "always"),
    ("container_name", "x"),
    ("env_file", ".env"),
    ("extra_hosts", '["a:1.2.3.4"]'),
    ("devices", '["/dev/fuse"]'),
    ("tmpfs", "/tmp"),
    ("expose", '["80"]'),
    ("mem_reservation", "1g"),
])
def test_compose_1_unsupported_service_key_is_refused_naming_it(tmp_path, key, value):
    # SPEC: COMPOSE-1 — anything outside the subset is refused at load, never silently ignored
    err = refused(tmp_path, MAIN + f"  x:\n    image: y\n    {key}: {value}\n", f"services.x.{key}")
    assert repr(key) in str(err)


@pytest.mark.parametrize("text, field", [
    ("networks: {a: {}}\n", "networks"),
    ("configs: {a: {file: x}}\n", "configs"),
    ("secrets: {a: {file: x}}\n", "secrets"),
    ("name: proj\n", "name"),
    ("volumes: {data: {driver: local}}\n", "volumes.data.driver"),
    ("volumes: {data: {external: true}}\n", "volumes.data.external"),
])
def test_compose_1_unsupported_top_level_key_is_refused(tmp_path, text, field):
    # SPEC: COMPOSE-1
    refused(tmp_path, MAIN + text, field)


@pytest.mark.parametrize("service, field, rule", [
    ("build: {context: ., args: {A: 1}}", "services.x.build.args", "COMPOSE-1"),
    ("build: {context: ., target: prod}", "services.x.build.target", "COMPOSE-1"),
    ("deploy: {replicas: 2}", "services.x.deploy.replicas", "COMPOSE-1"),
    ("deploy: {resources: {limits: {devices: []}}}", "services.x.deploy.resources.limits.devices",
     "COMPOSE-2"),
    ("deploy: {resources: {reservations: {devices: [{capabilities: [gpu]}]}}}",
     "services.x.deploy.resources.reservations.devices", "COMPOSE-2"),
    ("deploy: {resources: {reservations: {pids: 3}}}", "services.x.deploy.resources.reservations.pids",
     "COMPOSE-2"),
    ("healthcheck: {test: 'true', start_interval: 1s}", "services.x.healthcheck.start_interval", "COMPOSE-1"),
    ("depends_on: {main: {condition: service_completed_successfully}}",
     "services.x.depends_on.main.condition", "COMPOSE-1"),
    ("depends_on: {main: {condition: service_started, restart: true}}", "services.x.depends_on.main.restart",
     "COMPOSE-1"),
    ("volumes: [{type: tmpfs, target: /t}]", "services.x.volumes[0].type", "COMPOSE-1"),
    ("volumes: [{type: volume, source: v, target: /t, volume: {nocopy: true}}]",
     "services.x.volumes[0].volume", "COMPOSE-1"),
])
def test_compose_1_unsupported_nested_key_is_refused_naming_it(tmp_path, service, field, rule):
    # SPEC: COMPOSE-1, COMPOSE-2
    refused(tmp_path, MAIN + f"  x:\n    image: y\n    {service}\nvolumes: {{v: }}\n", field, rule)


def test_compose_1_main_is_required(tmp_path):
    # SPEC: COMPOSE-1 — service main is the agent's sandbox
    refused(tmp_path, "services:\n  app:\n    image: x\n", "services.main")
    refused(tmp_path, "services: {}\n", "services")
    refused(tmp_path, "[1, 2]\n", "services")


@pytest.mark.parametrize("service, field", [
    ("environment: {HOST_VAR: null}", "services.x.environment.HOST_VAR"),
    ("environment: [HOST_VAR]", "services.x.environment[0]"),
    ("working_dir: relative", "services.x.working_dir"),
    ("volumes: [/anonymous]", "services.x.volumes[0]"),
    ("volumes: [undeclared:/data]", "services.x.volumes[0]"),
    ("volumes: ['./conf:/etc/app:z']", "services.x.volumes[0]"),
    ("volumes: ['./missing:/m']", "services.x.volumes[0]"),
    ("depends_on: [nobody]", "services.x.depends_on.nobody"),
    ("depends_on: [x]", "services.x.depends_on.x"),
    ("healthcheck: {interval: 5}", "services.x.healthcheck.test"),
    ("healthcheck: {test: 'true', interval: 5}", "services.x.healthcheck.interval"),
    ("healthcheck: {test: [true]}", "services.x.healthcheck.test"),
    ("healthcheck: {test: ['CMD-SHELL', 'a', 'b']}", "services.x.healthcheck.test"),
    ("healthcheck: {test: 'true', retries: -1}", "services.x.healthcheck.retries"),
])
def test_compose_1_bad_values_are_refused(tmp_path, service, field):
    # SPEC: COMPOSE-1
    refused(tmp_path, MAIN + f"  x:\n    image: y\n    {service}\n", field)


@pytest.mark.parametrize("build, field", [
    ("{context: ./nope}", "services.x.build.context"),
    ("{context: ./kv, dockerfile: Missing}", "services.x.build.dockerfile"),
    ("{context: ./kv, dockerfile: /Dockerfile}", "services.x.build.dockerfile"),
])
def test_compose_1_missing_build_inputs_are_refused(tmp_path, build, field):
    # SPEC: COMPOSE-1
    refused(tmp_path, MAIN + f"  x:\n    build: {build}\n", field)


def test_compose_1_exactly_one_of_image_and_build(tmp_path):
    # SPEC: COMPOSE-1
    refused(tmp_path, MAIN + "  x:\n    environment: {}\n", "services.x")
    refused(tmp_path, MAIN + "  x:\n    image: a\n    build: ./kv\n", "services.x.image")


@pytest.mark.parametrize("service, field", [
    ("cpus: 0", "services.x.cpus"),
    ("cpus: .nan", "services.x.cpus"),
    ("mem_limit: lots", "services.x.mem_limit"),
    ("deploy: {resources: {limits: {memory: -1m}}}", "services.x.deploy.resources.limits.memory"),
    ("deploy: {resources: {limits: {pids: 0}}}", "services.x.deploy.resources.limits.pids"),
])
def test_compose_2_bad_sizes_are_refused(tmp_path, service, field):
    # SPEC: COMPOSE-2
    refused(tmp_path, MAIN + f"  x:\n    image: y\n    {service}\n", field, "COMPOSE-2")


@pytest.mark.parametrize("service, field", [
    ("build: ../..", "services.x.build.context"),
    ("build: /abs", "services.x.build.context"),
    ("build: {context: ./kv, dockerfile: ../../Dockerfile}", "services.x.build.dockerfile"),
    ("volumes: ['/etc:/host-etc']", "services.x.volumes[0]"),
    ("volumes: ['../../secret:/s']", "services.x.volumes[0]"),
    ("volumes: [{type: bind, source: /var/run/docker.sock, target: /s}]", "services.x.volumes[0]"),
])
def test_load_13_paths_outside_the_environment_folder_are_refused(tmp_path, service, field):
    # SPEC: LOAD-13
    body = service if "build" in service else f"image: y\n    {service}"
    refused(tmp_path, MAIN + f"  x:\n    {body}\n", field, "LOAD-13")


def test_compose_1_dependency_cycle_and_disabled_health_are_refused(tmp_path):
    # SPEC: COMPOSE-1
    refused(tmp_path, "services:\n  main: {image: x, depends_on: [a]}\n  a: {image: x, depends_on: [main]}\n",
            "services.main.depends_on")
    refused(tmp_path, "services:\n  main: {image: x, depends_on: {a: {condition: service_healthy}}}\n"
                      "  a: {image: x, healthcheck: {disable: true}}\n", "services.main.depends_on.a")


def test_compose_1_not_yaml_is_refused(tmp_path):
    # SPEC: COMPOSE-1
    with pytest.raises(TaskLoadError) as excinfo:
        parse(tmp_path, "services: [\n")
    assert excinfo.value.rule == "COMPOSE-1" and "YAML" in str(excinfo.value)


def test_compose_1_load_task_refuses_an_unsupported_key(build):
    # SPEC: COMPOSE-1 — load_task itself refuses (GYM-1: at construction, before any sandbox)
    root = build.single(toml="", files={
        "environment/docker-compose.yaml": MAIN + "  db:\n    image: postgres\n    ports: ['5432:5432']\n"})
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    assert excinfo.value.field == "services.db.ports" and excinfo.value.rule == "COMPOSE-1"
    assert str(root / "environment" / "docker-compose.yaml") in str(excinfo.value)


def test_load_12_a_service_named_in_task_toml_must_be_in_the_compose_file(build):
    # SPEC: LOAD-12 — a sidecar named by an artifact or hook is a service of the compose file
    toml = '[[verifier.collect]]\ncommand = "true"\nservice = "cache"\n'
    root = build.single(toml=toml, files={"environment/docker-compose.yaml": MAIN + "  db:\n    image: p\n"})
    with pytest.raises(TaskLoadError) as excinfo:
        load_task(root)
    assert excinfo.value.rule == "LOAD-12" and excinfo.value.field == "verifier.collect[0].service"
    assert "'cache'" in str(excinfo.value)

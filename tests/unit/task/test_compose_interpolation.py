"""Compose interpolation (Issue 16 item 2): ``${VAR}``, ``${VAR:-default}``, ``${VAR:?msg}``, ``$$`` from ``.env``,
Harbor's compose variables and the host allowlist; ``HOST_*_PATH`` never becomes a bind mount. And FMT-15 env
templates under the same allowlist (LOAD-23). Pure: no Docker."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from harbor_gym.errors import EnvTemplateError, TaskLoadError
from harbor_gym.task import load_task, resolve_env_templates
from harbor_gym.task._compose_vars import ComposeVariableWarning
from harbor_gym.task.hostenv import check_host_env

REPO = Path(__file__).resolve().parents[3]

TOML = textwrap.dedent("""\
    schema_version = "1.4"
    [environment]
    workdir = "/app"
    network_mode = "no-network"
    cpus = 2
    memory_mb = 1536
    {env}
    """)

COMPOSE = textwrap.dedent("""\
    services:
      main:
        image: ${MAIN_IMAGE:-python:3.12-slim}
        environment:
          DOLLAR: "cost: $$5"
          CPUS_SEEN: ${CPUS}
          MEMORY_SEEN: ${MEMORY}
          LOGS: ${ENV_VERIFIER_LOGS_PATH}
          FROM_TASK_ENV: ${GREETING}
        volumes:
          - ${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}
          - ${CONTEXT_DIR}/data:/data:ro
      kv:
        image: ${KV_IMAGE}
        environment:
          KV_PORT: ${KV_PORT:-8000}
          SECRET_SEEN: ${HG_TEST_SECRET:-none}
    """)


def _task(tmp_path: Path, compose: str = COMPOSE, dotenv: str | None = "KV_IMAGE=debian:bookworm-slim\n",
          env: str = 'env = { GREETING = "hello" }') -> Path:
    root = tmp_path / "compose-task"
    (root / "environment" / "data").mkdir(parents=True)
    (root / "environment" / "docker-compose.yaml").write_text(compose)
    if dotenv is not None:
        (root / "environment" / ".env").write_text(dotenv)
    (root / "task.toml").write_text(TOML.format(env=env))
    (root / "instruction.md").write_text("Do it.\n")
    (root / "tests").mkdir()
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    return root


def test_compose_defaults_dotenv_harbor_variables_and_escapes(tmp_path, monkeypatch):
    # Issue 16 item 2: ${VAR:-default} images, .env, Harbor's variables, $$; HOST_*_PATH mount dropped (warned)
    monkeypatch.setenv("HG_TEST_SECRET", "s3cret")  # set on the host but not allowlisted: never read
    with pytest.warns(ComposeVariableWarning, match="HOST_VERIFIER_LOGS_PATH"):
        task = load_task(_task(tmp_path))
    main, kv = task.compose.main, task.compose.service("kv")
    assert main.image == "python:3.12-slim" and kv.image == "debian:bookworm-slim"
    assert main.env == {"DOLLAR": "cost: $5", "CPUS_SEEN": "2", "MEMORY_SEEN": "1536M",
                        "LOGS": "/logs/verifier", "FROM_TASK_ENV": "hello"}
    assert [(m.kind, m.target) for m in main.mounts] == [("bind", "/data")]  # no host logs folder mounted
    assert main.mounts[0].source == str((task.path / "environment" / "data").resolve())
    assert kv.env == {"KV_PORT": "8000", "SECRET_SEEN": "none"}


def test_compose_allowlisted_host_variable_is_read(tmp_path, monkeypatch):
    # Issue 16 item 2: an explicit allowlist of host variables from EnvConfig
    monkeypatch.setenv("HG_TEST_SECRET", "s3cret")
    with pytest.warns(ComposeVariableWarning):
        task = load_task(_task(tmp_path), {"host_env_allowlist": ["HG_TEST_SECRET"]})
    assert task.compose.service("kv").env["SECRET_SEEN"] == "s3cret"


def test_compose_required_variable_is_refused_naming_it(tmp_path):
    # Issue 16 item 2: ${VAR:?msg} unset -> refused at load, naming the variable, the key and the message
    compose = COMPOSE.replace("${KV_IMAGE}", "${KV_IMAGE:?set KV_IMAGE in .env}")
    with pytest.raises(TaskLoadError) as caught:
        load_task(_task(tmp_path, compose, dotenv=None))
    text = str(caught.value)
    assert "services.kv.image" in text and "KV_IMAGE is required: set KV_IMAGE in .env" in text


def test_compose_host_path_variable_elsewhere_is_refused(tmp_path):
    # Issue 16 item 2: HOST_*_PATH never reaches the engine as a host path
    compose = COMPOSE.replace("LOGS: ${ENV_VERIFIER_LOGS_PATH}", "LOGS: ${HOST_AGENT_LOGS_PATH}")
    with pytest.raises(TaskLoadError) as caught:
        load_task(_task(tmp_path, compose))
    assert caught.value.rule == "LOAD-13" and "HOST_AGENT_LOGS_PATH" in str(caught.value)


def test_compose_unset_variable_is_empty_and_then_refused_as_an_image(tmp_path):
    # the literal "${KV_IMAGE}" never reaches the engine: unset -> "" -> refused at load, not a retryable outage
    with pytest.raises(TaskLoadError, match="services.kv.image"), pytest.warns(ComposeVariableWarning):
        load_task(_task(tmp_path, dotenv=None))


def test_fmt_15_allowlist_host_variable_outside_is_refused_naming_it():
    # SPEC: FMT-15, LOAD-23 — a template names a host variable outside the allowlist
    host = {"AWS_SECRET_ACCESS_KEY": "x", "OK_VAR": "yes"}
    with pytest.raises(EnvTemplateError) as caught:
        resolve_env_templates({"K": "${AWS_SECRET_ACCESS_KEY}"}, host, allowlist=())
    assert caught.value.variable == "AWS_SECRET_ACCESS_KEY" and "host_env_allowlist" in str(caught.value)
    # with a default the host is not read; allowlisted variables are
    assert resolve_env_templates({"K": "${AWS_SECRET_ACCESS_KEY:-d}", "O": "${OK_VAR}"}, host,
                                 allowlist=("OK_VAR",)) == {"K": "d", "O": "yes"}


def test_load_23_check_host_env_names_table_key_and_variable(tmp_path, monkeypatch):
    # SPEC: LOAD-23 — what check and reset() refuse, pure
    monkeypatch.setenv("HG_TEST_TOKEN", "t")
    root = _task(tmp_path, COMPOSE.replace("${GREETING}", "x"), env='env = { TOKEN = "${HG_TEST_TOKEN}" }')
    with pytest.warns(ComposeVariableWarning):
        task = load_task(root)
    with pytest.raises(EnvTemplateError) as caught:
        check_host_env(task, ())
    assert caught.value.field == "environment.env.TOKEN" and caught.value.variable == "HG_TEST_TOKEN"
    check_host_env(task, ("HG_TEST_TOKEN",))


def test_check_reports_a_host_variable_outside_the_allowlist(tmp_path):
    # Issue 16 item 2: `harbor-gym check` reports it (it said OK before)
    root = tmp_path / "leaky"
    (root / "tests").mkdir(parents=True)
    (root / "task.toml").write_text('schema_version = "1.4"\n[environment]\ndocker_image = "debian:bookworm-slim"\n'
                                    '[verifier]\nenv = { KEY = "${HOME}" }\n')
    (root / "instruction.md").write_text("Do it.\n")
    (root / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    proc = subprocess.run([sys.executable, "-m", "harbor_gym.cli", "check", str(root)], capture_output=True,
                          text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "FAIL" in proc.stdout and "HOME" in proc.stdout and "host_env_allowlist" in proc.stdout
    assert "LOAD-23" in proc.stdout

"""What real Harbor task folders use (Issue 16 item 2), on real Docker: a compose file with ``${VAR:-default}``
images, an ``.env`` and Harbor's compose variables; a task naming a host variable outside the allowlist (refused at
seed, nothing started); a ``RUN --mount`` Dockerfile built with BuildKit; a GPU task refused at seed."""

from __future__ import annotations

import shutil
import warnings

import pytest

from harbor_gym import HarborEnv, SeedRefusedError
from harbor_gym.agents import Oracle
from harbor_gym.errors import EnvTemplateError
from env_helpers import DOCKER, ENVS, labelled_containers
from task_folders import REWARD_1, toml, write_task

pytestmark = pytest.mark.docker

KV_COMPOSE = """\
# The real-world shape: image names with defaults, values from .env, Harbor's runner variables, a mount of
# Harbor's host logs folder (dropped: harbor_gym never bind-mounts host folders), and a working_dir, which compose
# creates at container create (the task's workdir alone is not created under Harbor semantics, issue 16).
services:
  main:
    image: ${MAIN_IMAGE:-python:3.12-slim}
    working_dir: /app
    environment:
      WHERE_LOGS: ${ENV_VERIFIER_LOGS_PATH}
    volumes:
      - ${HOST_VERIFIER_LOGS_PATH}:${ENV_VERIFIER_LOGS_PATH}
    depends_on:
      kv:
        condition: service_healthy
  kv:
    build:
      context: ${CONTEXT_DIR}/kv
    environment:
      KV_PORT: "${KV_PORT:?KV_PORT is set in .env}"
      KV_DATA: ${KV_DATA:-/data}
    volumes:
      - kvdata:/data
    healthcheck:
      test: ["CMD", "python3", "/srv/kv/healthcheck.py"]
      interval: 1s
      timeout: 3s
      retries: 10
volumes:
  kvdata:
"""


def test_compose_interpolation_defaults_and_dotenv_run_on_docker(tmp_path, no_leaks):
    # Issue 16 item 2 must-hold: a compose file with ${VAR:-default} images and an .env runs. Interpolation happens
    # at load and is the same under both semantics (no DIFF row), so one semantics runs here.
    task = tmp_path / "kv-interpolated"
    shutil.copytree(ENVS / "kv-sidecar", task)
    (task / "environment" / "docker-compose.yaml").write_text(KV_COMPOSE)
    (task / "environment" / ".env").write_text("# as docker compose reads it\nKV_PORT=8000\n")
    for semantics in ("harbor",):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            env = HarborEnv(task, config={**DOCKER, "semantics": semantics})
        try:
            env.reset()
            main = env.unwrapped.task.compose.main
            assert main.image == "python:3.12-slim" and main.mounts == ()
            rewards = []
            terminated = False
            while not terminated:
                _, reward, terminated, _, _ = env.step(Oracle())
                rewards.append(reward)
            assert rewards == [1.0] * len(env.unwrapped.task.steps)
        finally:
            env.close()


def test_load_23_host_variable_outside_the_allowlist_is_refused_at_seed(tmp_path, monkeypatch, docker_client,
                                                                          no_leaks):
    # Issue 16 item 2 must-hold: a task naming a host variable outside the allowlist is refused at seed, naming
    # it, before any sandbox starts; allowlisted, the same task runs and sees the value
    monkeypatch.setenv("HG_TRAINER_SECRET", "s3cret")
    check = '#!/bin/bash\n[ "$TOKEN" = s3cret ] && echo 1 > /logs/verifier/reward.txt || echo 0 > /logs/verifier/reward.txt\n'
    task = write_task(tmp_path, {"task.toml": toml(tail='[verifier]\nenv = { TOKEN = "${HG_TRAINER_SECRET}" }\n'),
                                 "instruction.md": "Do it.\n", "tests/test.sh": check}, "leaky")
    env = HarborEnv(task, config=DOCKER)
    try:
        with pytest.raises(EnvTemplateError) as caught:
            env.reset()
        assert isinstance(caught.value, SeedRefusedError) and caught.value.rule == "LOAD-23"
        assert caught.value.variable == "HG_TRAINER_SECRET" and "host_env_allowlist" in str(caught.value)
        assert labelled_containers(docker_client) == []  # refused before any sandbox
    finally:
        env.close()
    env = HarborEnv(task, config={**DOCKER, "host_env_allowlist": ["HG_TRAINER_SECRET"]})
    try:
        env.reset()
        _, reward, terminated, _, _ = env.step(":")
        assert reward == 1.0 and terminated
    finally:
        env.close()


DOCKERFILE_TOML = """\
schema_version = "1.4"
[environment]
workdir = "/app"
network_mode = "no-network"
[agent]
timeout_sec = 20
[verifier]
timeout_sec = 20
"""

MOUNT_DOCKERFILE = """\
# syntax=docker/dockerfile:1.4
FROM debian:bookworm-slim
RUN --mount=type=bind,source=seed.txt,target=/tmp/seed.txt cp /tmp/seed.txt /opt/seed.txt
RUN --mount=type=cache,target=/var/cache/hg-test echo cached > /var/cache/hg-test/x \\
    && ls /var/cache/hg-test > /opt/cache-list
WORKDIR /app
"""


def _dockerfile_task(tmp_path, name: str, dockerfile: str, check: str):
    return write_task(tmp_path, {"task.toml": DOCKERFILE_TOML, "instruction.md": "Do it.\n",
                                 "environment/Dockerfile": dockerfile, "environment/seed.txt": "from-context\n",
                                 "tests/test.sh": "#!/bin/bash\nif " + check + "; then echo 1; else echo 0; fi "
                                                  "> /logs/verifier/reward.txt\n"}, name)


def test_run_mount_dockerfile_builds_with_buildkit_offline(tmp_path, no_leaks):
    # Issue 16 item 2 must-hold: a RUN --mount Dockerfile builds (BuildKit through the engine's API), FROM through
    # the alias table, the unavailable '# syntax=' frontend dropped with a warning; the bind mount leaves no trace
    from harbor_gym.sandbox.images import BuildWarning

    check = '[ "$(cat /opt/seed.txt)" = from-context ] && [ ! -e /tmp/seed.txt ] && [ "$(cat /opt/cache-list)" = x ]'
    task = _dockerfile_task(tmp_path, "mount-task", MOUNT_DOCKERFILE, check)
    env = HarborEnv(task, config=DOCKER)
    try:
        with pytest.warns(BuildWarning, match="syntax=docker/dockerfile:1.4"):
            env.reset()
        _, reward, terminated, _, _ = env.step(":")
        assert reward == 1.0 and terminated
    finally:
        env.close()


def test_heredoc_dockerfile_is_refused_with_a_clear_message(tmp_path, docker_client, no_leaks):
    # Issue 16 item 2: a heredoc, which Docker 20.10's built-in frontend cannot parse, is refused, not retried
    from harbor_gym import SeedError

    version = docker_client.version()["Version"]
    if int(version.split(".")[0]) >= 23:
        pytest.skip(f"Docker {version}'s built-in frontend parses heredocs")
    task = _dockerfile_task(tmp_path, "heredoc-task", "FROM debian:bookworm-slim\nRUN <<EOF\necho hi > /x\nEOF\n",
                            "true")
    env = HarborEnv(task, config=DOCKER)
    try:
        with pytest.raises(SeedError) as caught:
            env.reset()
        assert not caught.value.retryable
        assert "line 2 uses a heredoc" in str(caught.value) and "cannot parse" in str(caught.value)
    finally:
        env.close()


def test_gpu_task_is_refused_at_seed_without_a_gpu_runtime(tmp_path, docker_client, no_leaks):
    # Issue 16 item 2: `gpus` passes through only with a GPU runtime; else refused at seed (LOAD-24), saying so
    from harbor_gym.sandbox._gpus import gpu_runtime

    if gpu_runtime(docker_client.info()) is not None:
        pytest.skip("this engine has a GPU runtime: the task would run")
    task = write_task(tmp_path, {"task.toml": toml(env="gpus = 1"), "instruction.md": "Do it.\n",
                                 "tests/test.sh": REWARD_1}, "gpu-task")
    for backend in ("docker", "local"):
        env = HarborEnv(task, config={**DOCKER, "backend": backend})
        try:
            with pytest.raises(SeedRefusedError) as caught:
                env.reset()
            assert caught.value.rule == "LOAD-24" and caught.value.field == "environment.gpus"
            assert ("no GPU runtime" if backend == "docker" else "'local' provider has no GPUs") in str(caught.value)
        finally:
            env.close()
        assert labelled_containers(docker_client) == []  # refused before any sandbox

"""A compose task through the env: sidecars live across turns and closing the env removes the whole group."""

from __future__ import annotations

import pytest

import harbor_gym
from harbor_gym import HarborEnv
from harbor_gym.agents import Oracle
from env_helpers import DOCKER, ENVS, TEST_LABEL

pytestmark = pytest.mark.docker


def _group_resources(docker_client) -> dict[str, list]:
    selector = {"label": "=".join(TEST_LABEL)}
    return {
        "containers": docker_client.containers.list(all=True, filters=selector),
        "networks": docker_client.networks.list(filters=selector),
        "volumes": docker_client.volumes.list(filters=selector),
    }


def test_compose_1_env_close_removes_the_groups_containers_network_and_volumes(docker_client):
    # SPEC: COMPOSE-1 — sidecars start at seed, run across turns, and stop with the episode.
    env = HarborEnv(ENVS / "kv-sidecar", config=DOCKER)
    try:
        env.reset()
        running = _group_resources(docker_client)
        names = sorted(c.labels.get("com.docker.compose.service", c.name) for c in running["containers"])
        assert len(running["containers"]) >= 2, names  # main and the kv sidecar
        assert running["networks"], "the group's private network carries the env's labels"
        _, reward, terminated, _, info = env.step(Oracle())
        assert reward == 1.0 and not terminated
        services = {entry.service for entry in info["turn"].manifest}
        assert "kv" in services  # ART-1/ART-4: sidecar entries name their service
    finally:
        env.close()
    left = _group_resources(docker_client)
    assert left == {"containers": [], "networks": [], "volumes": []}


def test_compose_2_local_backend_refuses_a_compose_task_before_any_sandbox(docker_client):
    # SPEC: COMPOSE-2 — a provider that cannot run groups refuses at seed.
    env = HarborEnv(ENVS / "kv-sidecar", config={**DOCKER, "backend": "local"})
    try:
        with pytest.raises(harbor_gym.SeedRefusedError) as caught:
            env.reset()
        assert "docker-compose.yaml" in str(caught.value) and "COMPOSE-2" in str(caught.value)
    finally:
        env.close()
    assert _group_resources(docker_client)["containers"] == []

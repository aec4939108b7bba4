"""Issue 16 item 1 and the reward dodge it opens: a task ``workdir`` its image lacks, under both semantics.

Seed semantics create the workdir when the sandbox starts. Harbor semantics (harbor 0.25: the workdir is only the
``-w`` of each ``docker compose exec``) do not: the first step fails ``harbor_gym:workdir_missing``, ungraded and
not retryable, on every backend and on a compose ``main``; a seed healthcheck that would run there fails reset at
once. A workdir that existed and is gone at a later step's start is the agent's doing (GYM-12): 0.0, trainable,
not retried by the collector, never the ungraded kind a policy could dodge a graded 0.0 with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from harbor_gym.episode import Episode
from harbor_gym.episode._stop import WORKDIR_DELETED_KIND, WORKDIR_MISSING_KIND
from harbor_gym.errors import SeedError
from harbor_gym.run.collector import collect
from harbor_gym.task import load_task
from task_folders import toml, write_task

# test.sh: reward 1 iff it runs in /app and step s1's workdir/ merge landed there
IN_APP = '#!/bin/bash\nif [ "$PWD" = /app ] && [ -f /app/data.txt ]; then echo 1; else echo 0; fi ' \
         '> /logs/verifier/reward.txt\n'
COMPOSE_TOML = """schema_version = "1.4"
[environment]
workdir = "/app"
network_mode = "no-network"
[agent]
timeout_sec = 20
[[steps]]
name = "s1"
[steps.verifier]
timeout_sec = 10
"""


def _missing_workdir_task(root: Path, kind: str) -> Path:
    """A task naming /app on an image without it, with nothing of the task creating it before step s1."""
    files = {"steps/s1/workdir/data.txt": "x\n", "steps/s1/tests/test.sh": IN_APP}
    if kind == "compose":  # service main names no working_dir: only the task's workdir says /app
        files |= {"task.toml": COMPOSE_TOML, "environment/docker-compose.yaml":
                  "services:\n  main:\n    image: debian:bookworm-slim\n"}
    else:
        files["task.toml"] = toml(["s1"])
    return write_task(root, files, f"no-app-{kind}", keep_workdir=False)


# SPEC: GYM-2 (issue 16 item 1: the missing workdir, Seed vs Harbor)
@pytest.mark.parametrize("semantics,backend", [
    pytest.param("seed", "docker", marks=pytest.mark.docker, id="seed-docker"),
    pytest.param("harbor", "docker", marks=pytest.mark.docker, id="harbor-docker"),
    pytest.param("harbor", "local", marks=pytest.mark.bwrap, id="harbor-local"),
    pytest.param("harbor", "compose", marks=pytest.mark.docker, id="harbor-compose-main"),
])
def test_missing_workdir_created_under_seed_fails_the_step_under_harbor(tmp_path, semantics, backend,
                                                                        docker_client):
    task = _missing_workdir_task(tmp_path, backend)
    cfg = {"backend": "local" if backend == "local" else "docker", "semantics": semantics}
    results = []
    with Episode(load_task(task, cfg), cfg) as ep:
        ep.start()
        if backend != "local":  # the container as the engine made it: a working_dir only where it creates it
            made = docker_client.api.inspect_container(ep.sandbox.container_id)["Config"]["WorkingDir"]
            assert made == ("/app" if semantics == "seed" else "")
        while ep.next_step is not None:
            results.append(ep.run_turn(":"))
        final = ep.result()
    if semantics == "seed":  # created at start: the step runs and grades in /app
        assert [r.record.reward for r in results] == [1.0] and final.graded
        return
    (only,) = results  # the first step fails before its workdir/ merge (which would create /app)
    record = only.record
    assert record.failure_kind == WORKDIR_MISSING_KIND and only.terminated and not only.truncated
    assert record.agent_status is None and record.reward is None and not record.trainable
    assert not record.agent_caused and "/app does not exist" in record.failure_message
    assert not final.graded and final.reward is None and not final.retryable
    assert final.failure_kind == WORKDIR_MISSING_KIND and len(final.turns) == 1


# SPEC: GYM-12 (issue 16 item 2: deleting the workdir never dodges a graded 0.0)
@pytest.mark.docker
@pytest.mark.parametrize("semantics", ["seed", "harbor"])
def test_workdir_deleted_by_the_agent_is_agent_caused_not_ungraded(tmp_path, semantics):
    # /app exists at seed under both semantics (environment/'s file is copied there, FMT-10); the agent deletes it
    check = '#!/bin/bash\nif [ -f /app/.gitkeep ]; then echo 1; else echo 0; fi > /logs/verifier/reward.txt\n'
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"]), "tests/test.sh": check}, "dodge")
    # through the collector (what harbor-gym run is built on), with retries to spare
    (rollout,) = collect(task, lambda *_: "rm -rf /app", retries=2,
                         config={"backend": "docker", "semantics": semantics})
    first, second = rollout.turns
    # the same turn's verifier still grades (it runs in / when the workdir is gone): a measured 0, no outage
    assert first.reward == 0 and first.reward_valid and first.failure_kind is None
    assert second.failure_kind == WORKDIR_DELETED_KIND and second.agent_caused
    assert second.outage_cause == "workdir_deleted" and second.reward == 0.0 and second.trainable
    assert "/app existed at an earlier step" in second.failure_message
    # not retried (attempt is 1-based), scored 0.0, the episode ungraded but agent-caused (GYM-12)
    assert rollout.attempt == 1 and rollout.agent_caused and rollout.reward == 0.0 and not rollout.graded
    assert rollout.failure_kind == WORKDIR_DELETED_KIND and rollout.episode.agent_caused


# SPEC: GYM-2, TURN-7 (issue 16: where the seed healthcheck runs when the workdir is missing)
@pytest.mark.docker
def test_seed_healthcheck_in_a_missing_workdir(tmp_path):
    # Harbor runs [environment].healthcheck in the task's workdir and fails it there (HealthcheckError); harbor_gym
    # fails reset at once, not retried, naming the folder. Seed: it runs in the created /app and passes.
    hc = '[environment.healthcheck]\ncommand = \'[ "$PWD" = /app ]\'\nretries = 1\ninterval_sec = 0.1\n'
    task = write_task(tmp_path, {"task.toml": toml(["s1"], tail=hc), "steps/s1/tests/test.sh": IN_APP},
                      "hc-no-app", keep_workdir=False)
    for semantics in ("seed", "harbor"):
        cfg = {"backend": "docker", "semantics": semantics}
        with Episode(load_task(task, cfg), cfg, agent=None) as ep:
            if semantics == "seed":
                ep.start()
                assert ep.sandbox.exec("pwd", timeout=20).stdout.strip() == "/app"
                continue
            with pytest.raises(SeedError) as caught:
                ep.start()
        err = caught.value
        assert not err.retryable and err.field == "environment.workdir" and "/app does not exist" in str(err)
        assert ep.sandbox is None  # nothing left running

"""A Ray cluster of engines (issue 17 item 3), all on this machine: a head node on the host's Docker engine and a
worker node on a private engine of the test's own (tests/private_engine.py), both started with ``ray start`` and
declaring ``harbor_engine``. Each node's episodes use only its own engine (checked by the engines' own labelled
container events), results equal the thread executor's under the same seeds with a seeded stochastic agent, and a
worker killed mid-run gives outages naming it, the run finishing on the head with nothing left on either engine."""

from __future__ import annotations

import os
import threading
import time
from pathlib import Path

import pytest

import harbor_gym
from harbor_gym.errors import SandboxUnavailableError
from harbor_gym.vector import HarborVectorEnv

from private_engine import PrivateEngine
from ray_cluster_helpers import CHOICES, RayCluster, SeededChoiceAgent, answer_task_files
from task_folders import toml, write_task
from vector_helpers import TEST_LABEL, labelled

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'harbor-gym[ray]'")

pytestmark = [pytest.mark.docker, pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="starting a dockerd needs root")]

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]
BASE_IMAGE = "harbor-gym/base:bookworm"
#: No storage bound: the private engine's overlay2 cannot enforce one (GYM-10); short leases for the reaping check.
CONFIG = {"backend": "docker", "labels": dict([TEST_LABEL]), "seed_retries": 0, "pull_policy": "never",
          "default_storage_mb": None, "lease_ttl_s": 10}
#: SPEC GYM-10 / _reaper: a dead process's sandboxes are removed within lease_ttl_s + 20 s.
LEASE_BOUND_S = CONFIG["lease_ttl_s"] + 20 + 10
EPISODES = 16


@pytest.fixture(scope="module")
def engines(docker_client):
    """``{"host": client of the host engine, "private": the PrivateEngine}``, the base image loaded into the latter."""
    eng = PrivateEngine()
    eng.start()
    try:
        eng.load_image(docker_client, BASE_IMAGE)
        yield {"host": docker_client, "private": eng}
    finally:
        eng.remove()  # SIGKILL of dockerd, its shims and containers (the reaper too), then its mounts: nothing left


def _reset_ray_auth() -> None:
    from ray._private.authentication_test_utils import reset_auth_token_state

    reset_auth_token_state()


@pytest.fixture(scope="module")
def cluster(engines):
    host = os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"
    c = RayCluster(head_engine=host, worker_engine=engines["private"].sock, head_slots=2, worker_slots=1,
                   pythonpath=[REPO, HERE, REPO / "tests"])
    saved = {k: os.environ.get(k) for k in c.auth_env}
    try:
        c.start()
        os.environ.update(c.auth_env)
        _reset_ray_auth()  # Ray caches the token it first read (this process may have used Ray before)
        ray.init(address=c.address, log_to_driver=False)
        c.learn_node_ids(ray)
        yield c
    finally:
        if ray.is_initialized():
            ray.shutdown()
        c.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        _reset_ray_auth()


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    root = tmp_path_factory.mktemp("ray-cluster")
    return write_task(root, answer_task_files(toml(agent_timeout=60)), "answer")


def _engine_ids(engines) -> dict[str, str]:
    private = engines["private"].client()
    try:
        return {"host": engines["host"].info()["DockerRootDir"], "private": private.info()["DockerRootDir"]}
    finally:
        private.close()


class _Created:
    """Names of the test's containers an engine itself reports created while the watch runs (a live subscription
    to its event stream: an engine replays only its last 256 events, too few on a busy host engine)."""

    def __init__(self, client) -> None:
        self.names: set[str] = set()
        self._stream = client.events(decode=True, filters={"type": "container", "event": "create",
                                                             "label": "=".join(TEST_LABEL)})
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        try:
            for event in self._stream:
                self.names.add(event["Actor"]["Attributes"]["name"][:63])
        except Exception:  # the stream closed
            pass

    def stop(self) -> set[str]:
        time.sleep(0.5)  # the last creates' events are on their way
        self._stream.close()
        self._thread.join(5)
        return set(self.names)


def _watch(engines) -> dict[str, _Created]:
    return {"host": _Created(engines["host"]), "private": _Created(engines["private"].client())}


def _private_labelled(engines) -> list[str]:
    client = engines["private"].client()
    try:
        return labelled(client)
    finally:
        client.close()


def _agent_factory(sleep_s: float = 0.0):
    def make(task_id: str, rollout: int, seed: int) -> SeededChoiceAgent:
        return SeededChoiceAgent(seed, sleep_s)
    return make


def _meta(record) -> dict:
    """What the agent recorded of its turn (it ran to completion: a failed agent would leave no metadata)."""
    outcome = record.outcome
    assert outcome.status.value == "completed", outcome
    return dict(outcome.metadata)


def _check_placement(runs: list[dict], cluster, ids: dict[str, str], created: dict[str, set[str]]) -> None:
    """Every Ray episode ran on an engine node, and only on that node's engine (its process's client and the
    engine's own create events both say so); both nodes got episodes."""
    engine_of = {cluster.head.node_id: "host", cluster.worker.node_id: "private"}
    per_node = {"host": 0, "private": 0}
    for meta in runs:
        which = engine_of[meta["node"]]  # KeyError: an episode on a node that is not an engine node
        other = "private" if which == "host" else "host"
        assert meta["engine"] == ids[which], meta
        assert meta["hostname"] in created[which] and meta["hostname"] not in created[other], meta
        per_node[which] += 1
    assert per_node["host"] > 0 and per_node["private"] > 0, per_node


# SPEC: GYM-2, GYM-10 — each episode on a node declaring harbor_engine uses that node's engine only; the collector
# and the vector env give under Ray exactly what threads give for the same seeds (a seeded stochastic agent).
def test_ray_cluster_each_node_uses_its_own_engine(cluster, engines, task, no_leaks):
    ids = _engine_ids(engines)
    assert ids["host"] != ids["private"]
    watch = _watch(engines)
    got = {}
    for executor in ("ray", "threads"):
        results = harbor_gym.collect(task, _agent_factory(), rollouts_per_task=EPISODES, concurrency=3,
                                     config=CONFIG, executor=executor, seed=11, retries=0)
        assert len(results) == EPISODES and all(r.graded for r in results), [r.reason for r in results]
        got[executor] = results
    created = {name: w.stop() for name, w in watch.items()}
    metas = [_meta(r.turns[0]) for r in got["ray"]]
    _check_placement(metas, cluster, ids, created)

    def outcome(results):
        return sorted((r.rollout, r.seed, r.reward, _meta(r.turns[0])["choice"]) for r in results)

    assert outcome(got["ray"]) == outcome(got["threads"])
    assert {choice for *_, choice in outcome(got["threads"])} == set(CHOICES)  # the draws differ, and so do rewards
    assert {r.reward for r in got["threads"]} == {0.0, 0.5, 1.0}

    # The vector env: 3 sub-env actors fill the cluster's 3 harbor_engine slots (2 on the head, 1 on the worker).
    watch = _watch(engines)
    vec = {}
    for executor in ("ray", "thread"):
        venv = HarborVectorEnv(3, path=task, config=CONFIG, executor=executor, pool_size=0)
        try:
            venv.reset(seed=5)
            rows, metas = [], []
            for step in range(6):  # one-turn episodes: every step ends one per slot (same-step autoreset)
                agents = [SeededChoiceAgent(1000 * slot + step) for slot in range(3)]
                _, reward, term, trunc, info = venv.step(agents)
                assert term.all() and not trunc.any()
                for slot in range(3):
                    meta = _meta(info["final_info"]["turn"][slot])
                    rows.append((slot, step, float(reward[slot]), meta["choice"]))
                    metas.append(meta)
            vec[executor] = (rows, metas)
        finally:
            venv.close()
    assert vec["ray"][0] == vec["thread"][0]
    created = {name: w.stop() for name, w in watch.items()}
    _check_placement(vec["ray"][1], cluster, ids, created)


# SPEC: GYM-2 — no node declares what the actors ask for: a clear SandboxUnavailableError within the bound.
def test_ray_placement_impossible_raises_within_the_bound(cluster, task, no_leaks):
    t0 = time.monotonic()
    with pytest.raises(SandboxUnavailableError, match="harbor_engine_nowhere"):
        HarborVectorEnv(1, path=task, config=CONFIG, executor="ray", ray_placement_timeout_s=3,
                        ray_actor_options={"resources": {"harbor_engine_nowhere": 1}})
    with pytest.raises(SandboxUnavailableError, match="harbor_engine_nowhere"):
        harbor_gym.collect(task, _agent_factory(), config=CONFIG, executor="ray", ray_placement_timeout_s=3,
                           ray_options={"resources": {"harbor_engine_nowhere": 1}})
    assert time.monotonic() - t0 < 20


class _Retries:
    """The collector's listener: the reasons of the retried episodes."""

    def __init__(self) -> None:
        self.reasons: list[str] = []

    def episode_started(self, task_id, rollout) -> None:
        pass

    def episode_retry(self, task_id, rollout, attempt, reason) -> None:
        self.reasons.append(reason)


# SPEC: GYM-2, GYM-12, STOP-8 — the worker node dies mid-run: its in-flight episodes end as outages naming the node
# (never agent-caused), they are retried on the head, the run finishes there; the lost node's sandboxes are removed
# by their leases (the reaper on its engine), and nothing is left on the host engine either.
def test_ray_worker_node_killed_mid_run(cluster, engines, task, no_leaks):
    killed: list[int] = []
    orphans: list[str] = []

    def kill_when_busy() -> None:  # once the worker's engine runs an episode's sandbox, SIGKILL the node
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if _private_labelled(engines):
                time.sleep(1.5)
                killed.extend(cluster.worker.kill())
                time.sleep(0.5)
                orphans.extend(_private_labelled(engines))  # what the dead node's processes can no longer remove
                return
            time.sleep(0.2)

    killer = threading.Thread(target=kill_when_busy, daemon=True)
    killer.start()
    listener = _Retries()
    t0 = time.monotonic()
    results = harbor_gym.collect(task, _agent_factory(sleep_s=3), rollouts_per_task=EPISODES, concurrency=3,
                                 config=CONFIG, executor="ray", seed=11, retries=1, listener=listener)
    killer.join(5)
    assert killed, "the worker node never ran an episode"
    assert len(results) == EPISODES and all(r.graded for r in results), [r.reason for r in results]
    assert listener.reasons, "no episode was lost with the worker"
    for reason in listener.reasons:
        assert cluster.worker.node_id in reason, reason  # the outage names the node
    # The run finished on the head: every retried episode, and every episode after the kill, ran there.
    retried = [r for r in results if r.attempt > 1]
    assert retried and all(_meta(r.turns[0])["node"] == cluster.head.node_id for r in retried)
    assert all(not r.agent_caused for r in results)
    # The dead node's sandboxes: removed by the reaper on its engine once their lease lapses.
    assert orphans, "the kill left no sandbox behind: nothing to prove about leases"
    private = engines["private"].client()
    try:
        assert private.api.containers(filters={"name": "harbor-gym-reaper-"}), "no reaper on the worker's engine"
    finally:
        private.close()
    deadline = time.monotonic() + LEASE_BOUND_S
    while _private_labelled(engines) and time.monotonic() < deadline:
        time.sleep(1)
    assert _private_labelled(engines) == [], f"left on the private engine {time.monotonic() - t0:.0f} s in"

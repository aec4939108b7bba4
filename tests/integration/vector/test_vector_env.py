"""HarborVectorEnv on a real engine: 8 sub-envs in same-step and disabled modes, faults confined to their sub-env,
and the Ray variant matching the thread variant under the same seeds."""

from __future__ import annotations

import os
import shutil
import threading
import time

import gymnasium
import numpy as np
import pytest

import harbor_gym  # noqa: F401 - registers the ids
from harbor_gym import HarborEnv, ResetNeededError
from harbor_gym.errors import SandboxError
from harbor_gym.vector import HarborVectorEnv

from vector_helpers import DOCKER, ENVS, RandomScriptPolicy, labelled, solutions

pytestmark = pytest.mark.docker

N = 8
CAKE = solutions("cake")
STEP1, STEP2 = "01-select-cake-base", "02-select-frosting"
WRONG_FROSTING = "echo ganache > /app/cake/frosting.txt"


def cake_actions(obs: dict, wrong: set[int] = frozenset()) -> list[str]:
    """The reference script of each sub-env's next step; sub-envs in ``wrong`` get a wrong frosting."""
    out = []
    for i, step in enumerate(obs["step_name"]):
        out.append(WRONG_FROSTING if step == STEP2 and i in wrong else CAKE.get(step, ":"))
    return out


def test_same_step_runs_8_cake_envs_through_make_vec(no_leaks):
    # SPEC: GYM-6/7 — 8 sub-envs to completion in same-step mode: turn rewards, final_obs/final_info, autoreset.
    venv = gymnasium.make_vec("harbor_gym/cake-v0", num_envs=N, vectorization_mode="vector_entry_point",
                              config=DOCKER)
    try:
        assert isinstance(venv, HarborVectorEnv)
        assert venv.metadata["autoreset_mode"] is gymnasium.vector.AutoresetMode.SAME_STEP
        obs, info = venv.reset(seed=0)
        assert obs["step_name"] == (STEP1,) * N and obs["turn_index"].tolist() == [0] * N
        assert venv.observation_space.contains(obs)
        wrong = {1, 4}
        obs, r1, term, trunc, info = venv.step(cake_actions(obs, wrong))
        assert r1.tolist() == [1.0] * N and not term.any() and not trunc.any()
        assert [rec.step_name for rec in info["turn"]] == [STEP1] * N and info["_turn"].all()
        obs, r2, term, trunc, info = venv.step(cake_actions(obs, wrong))
        assert r2.tolist() == [0.0 if i in wrong else 1.0 for i in range(N)]
        assert term.all() and not trunc.any()
        # Same-step autoreset: the returned observation is the next episode's first; the ended one is in final_*.
        assert obs["step_name"] == (STEP1,) * N
        assert info["_final_obs"].all() and all(o["instruction"] == "" for o in info["final_obs"])
        results = info["final_info"]["episode_result"]
        assert [res.reward for res in results] == [0.5 if i in wrong else 1.0 for i in range(N)]
    finally:
        venv.close()


def test_disabled_mode_with_reset_mask(no_leaks):
    # Gymnasium 1.x disabled autoreset: ended sub-envs wait for reset(options={"reset_mask": m}).
    venv = HarborVectorEnv(N, path=ENVS / "cake", config=DOCKER, autoreset_mode="disabled")
    try:
        assert venv.metadata["autoreset_mode"] is gymnasium.vector.AutoresetMode.DISABLED
        obs, _ = venv.reset(seed=1)
        total = np.zeros(N)
        for _ in range(2):
            obs, reward, term, trunc, info = venv.step(cake_actions(obs, wrong={0}))
            total += reward
        assert total.tolist() == [1.0] + [2.0] * (N - 1)
        assert term.all() and "final_obs" not in info
        assert obs["instruction"] == ("",) * N  # ended, not reset
        with pytest.raises(ResetNeededError):
            venv.step(cake_actions(obs))
        mask = np.zeros(N, dtype=bool)
        mask[:4] = True
        obs, info = venv.reset(options={"reset_mask": mask})
        assert obs["step_name"][:4] == (STEP1,) * 4 and obs["instruction"][4:] == ("",) * 4
        assert info["_task_id"].tolist() == mask.tolist()
        obs, _ = venv.reset(options={"reset_mask": ~mask})
        obs, reward, term, trunc, _ = venv.step(cake_actions(obs))
        assert reward.tolist() == [1.0] * N and not term.any()
    finally:
        venv.close()


def test_sandbox_killed_mid_turn_truncates_only_that_sub_env(docker_client, no_leaks):
    # SPEC: GYM-2/STOP-8 — an outage in one sub-env is that sub-env's truncation with the cause; the others finish.
    n, victim = 4, 2
    venv = HarborVectorEnv(n, path=ENVS / "cake", config=DOCKER, autoreset_mode="same-step")
    try:
        obs, _ = venv.reset(seed=2)
        name = venv._subs[victim].env._episode.sandbox.name

        def kill_soon():
            time.sleep(1.0)
            docker_client.containers.get(name).kill()

        killer = threading.Thread(target=kill_soon)
        killer.start()
        actions = [CAKE[STEP1]] * n
        actions[victim] = "sleep 8; " + CAKE[STEP1]
        obs, reward, term, trunc, info = venv.step(actions)
        killer.join()
        assert trunc.tolist() == [i == victim for i in range(n)]
        assert not term.any()
        assert reward.tolist() == [0.0 if i == victim else 1.0 for i in range(n)]
        cause = info["final_info"]["turn"][victim].failure_kind
        assert cause == "harbor_gym:sandbox_outage"
        assert info["final_info"]["episode_result"][victim].retryable
        # The victim was reset in the same step; everyone finishes the next turn.
        assert obs["step_name"][victim] == STEP1 and obs["step_name"][0] == STEP2
        obs, reward, term, trunc, _ = venv.step(cake_actions(obs))
        assert reward.tolist() == [1.0] * n
        assert term.tolist() == [i != victim for i in range(n)] and not trunc.any()
    finally:
        venv.close()


class _Outage:
    """A sandbox factory that always fails: every seed of its env is an outage."""

    def __call__(self, spec):
        raise SandboxError("injected outage: the engine refused the sandbox", retryable=True)


def test_reset_fault_is_that_sub_env_truncation(no_leaks):
    # SPEC: GYM-2 — a SeedError in one sub-env's reset is its truncated=True with the cause in info, never a raise.
    n, bad = 3, 1

    def make(i):
        factory = _Outage() if i == bad else None
        return lambda: HarborEnv(ENVS / "cake", config=DOCKER, sandbox_factory=factory)

    venv = HarborVectorEnv(env_fns=[make(i) for i in range(n)], autoreset_mode="same-step")
    try:
        obs, info = venv.reset(seed=0)
        assert info["_error"].tolist() == [i == bad for i in range(n)]
        assert info["error"][bad].startswith("SeedError") and "injected outage" in info["error"][bad]
        assert info["error_stage"][bad] == "reset"
        obs, reward, term, trunc, info = venv.step(cake_actions(obs))
        assert trunc.tolist() == [i == bad for i in range(n)]
        assert reward.tolist() == [0.0 if i == bad else 1.0 for i in range(n)]
        assert "injected outage" in info["error"][bad]  # the same-step retry of its reset failed again
        obs, reward, term, trunc, info = venv.step(cake_actions(obs))
        assert term.tolist() == [i != bad for i in range(n)] and trunc[bad]
    finally:
        venv.close()


def test_bad_actions_are_refused_before_anything_runs(no_leaks):
    # SPEC: GYM-4 — not an action: TypeError, and no sub-env ran a turn.
    venv = HarborVectorEnv(2, path=ENVS / "cake", config=DOCKER)
    try:
        obs, _ = venv.reset(seed=0)
        with pytest.raises(TypeError):
            venv.step([CAKE[STEP1], 42])
        with pytest.raises(ValueError):
            venv.step([CAKE[STEP1]])
        obs, reward, *_ = venv.step(cake_actions(obs))
        assert reward.tolist() == [1.0, 1.0]
    finally:
        venv.close()
    with pytest.raises(ResetNeededError):
        venv.reset()


def _dataset(tmp_path):
    for name in ("cake", "gated-counter"):
        shutil.copytree(ENVS / name, tmp_path / name)
    return tmp_path, {name: solutions(name, tmp_path) for name in ("cake", "gated-counter")}


def _rollout(venv: HarborVectorEnv, scripts, *, steps: int, seed: int) -> list[list[tuple[str, list[float]]]]:
    """Per sub-env, the sequence of (task, per-turn rewards) of its episodes, under a seeded random-script policy."""
    policy = RandomScriptPolicy(venv.num_envs, seed, scripts)
    obs, _ = venv.reset(seed=seed)
    episodes = [[(obs["task_id"][i], [])] for i in range(venv.num_envs)]
    for _ in range(steps):
        obs, reward, term, trunc, info = venv.step(policy(obs))
        for i in range(venv.num_envs):
            episodes[i][-1][1].append(float(reward[i]))
            if term[i] or trunc[i]:
                episodes[i].append((obs["task_id"][i], []))
    return episodes


@pytest.fixture(scope="module")
def ray_cluster():
    ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'harbor-gym[ray]'")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, object_store_memory=100 * 1024 * 1024,
             resources={"harbor_engine": 8})  # issue 17: this node has an engine (every actor/task asks for 1)
    yield ray
    ray.shutdown()


def test_ray_variant_matches_thread_variant(ray_cluster, tmp_path, no_leaks):
    # The same seeds and the same seeded policy give the same (task, per-turn rewards) sequences in Ray actors
    # (real Docker underneath, a local Ray cluster) as in threads.
    root, scripts = _dataset(tmp_path)
    runs = {}
    for executor in ("thread", "ray"):
        venv = HarborVectorEnv(3, path=root, config=DOCKER, executor=executor)
        try:
            runs[executor] = _rollout(venv, scripts, steps=6, seed=7)
            if executor == "ray":
                nodes = {sub.node_id for sub in venv._subs}
                assert len(nodes) == len(ray_cluster.nodes())  # spread over the (one-node) cluster
        finally:
            venv.close()
    assert runs["ray"] == runs["thread"]
    tasks = {task for sub in runs["thread"] for task, _ in sub}
    assert tasks == {"cake", "gated-counter"}  # the seeded dataset draws both


def test_ray_fault_in_actor_is_truncation(ray_cluster, no_leaks, docker_client):
    # A fault inside an actor crosses as data and becomes that sub-env's truncation; nothing labelled remains.
    venv = HarborVectorEnv(2, path=ENVS / "cake", config={**DOCKER, "image_aliases": {}, "pull_policy": "never"},
                           executor="ray", autoreset_mode="disabled", on_error="mask")  # issue 15: else raise
    try:
        obs, info = venv.reset(seed=0)  # the image cannot be had: SeedError in both actors
        assert info["_error"].all() and all(e.startswith("SeedError") for e in info["error"])
        obs, reward, term, trunc, info = venv.step([":", ":"])
        assert trunc.all() and not term.any()
        assert np.isnan(reward).all() and not info["trainable"].any()  # issue 15: masked, never a fake 0.0
    finally:
        venv.close()
    assert labelled(docker_client) == []

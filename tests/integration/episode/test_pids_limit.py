"""The harness pids guard (`EnvConfig.pids_limit`, default 4096): every sandbox of an episode carries it, so that a
fork bomb cannot reach the host; ``None`` leaves pids unlimited. The task format has no such field."""

import pytest

from harbor_gym.episode import Episode
from harbor_gym.task import load_task

from .conftest import BACKENDS, REWARD_1, grade, run_episode, toml, write_task

#: What the sandbox sees of its own pids limit: cgroup v1 (this host, Docker and the local backend's bind) or v2.
READ_PIDS_MAX = "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max 2>/dev/null || true"


def _pids_max(task, config) -> str:
    with Episode(load_task(task), config) as ep:
        ep.start()
        res = ep.sandbox.exec(READ_PIDS_MAX, timeout=10, user="root")
        assert res.ok, res.stderr
        return res.stdout.strip()


# SPEC: LOAD-24 (limits enforced, never ignored) — the harness guard on the agent sandbox
@pytest.mark.parametrize("backend", BACKENDS)
def test_default_pids_limit_reaches_the_agent_sandbox(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    assert _pids_max(task, {"backend": backend}) == "4096"
    assert _pids_max(task, {"backend": backend, "pids_limit": 64}) == "64"


@pytest.mark.parametrize("backend", BACKENDS)
def test_pids_limit_none_is_unlimited(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    # docker: the cgroup's "max"; local: no pids cgroup at all (nothing to read)
    assert _pids_max(task, {"backend": backend, "pids_limit": None}) in ({"max"} if backend == "docker"
                                                                        else {"max", ""})


# SPEC: VER-3 — a separate verifier sandbox carries the same guard
@pytest.mark.docker
def test_separate_verifier_sandbox_has_the_pids_limit(tmp_path):
    body = 'name = "s1"\n[steps.verifier]\ntimeout_sec = 10\nenvironment_mode = "separate"\n'
    task = write_task(tmp_path, {"task.toml": toml([body]),
                                 "tests/test.sh": grade(f'[ "$({READ_PIDS_MAX})" = 1234 ]')})
    _, final = run_episode(task, ":", {"pids_limit": 1234})
    assert final.reward == 1.0
    _, final = run_episode(task, ":", {})
    assert final.reward == 0.0  # the default (4096), not 1234: the check above is not vacuous

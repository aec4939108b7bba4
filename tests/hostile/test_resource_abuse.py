"""P2 "a run always ends" and P3 "everything it started is gone": an agent abusing resources within its sandbox's
limits hurts only its own turn. Real episodes on Docker; each case asserts the exact SPEC outcome.

The sandbox limits under test: ``[environment].memory_mb`` from task.toml, and (through the sandbox factory, as a
pool or a provider would set them) a pids limit and a size-bounded tmpfs at ``/scratch``. The disk filler writes
only there, so the host's disk is never at stake.
"""

from __future__ import annotations

import dataclasses
import time

import pytest

from harbor_gym import sandbox as sandbox_pkg
from harbor_gym.sandbox.base import SandboxSettings

from .helpers import config, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

PIDS = 96
SCRATCH_MB = 16
OUTAGE = "harbor_gym:sandbox_outage"


def _factory(cfg):
    def make(spec):
        spec = dataclasses.replace(spec, pids_limit=PIDS, tmpfs={"/scratch": SCRATCH_MB})
        return sandbox_pkg.open(spec, backend="docker", settings=SandboxSettings.from_config(cfg))

    return make


def _run(tmp_path, script: str, *, name: str, cap: int = 1 << 20, agent_timeout: float = 20):
    cfg = config(output_cap_bytes=cap)
    task = write_task(tmp_path, {"task.toml": toml(["s1", "s2"], env="memory_mb = 256", agent_timeout=agent_timeout),
                                 "tests/test.sh": grade("[ -f /app/done ]")}, name=name)
    t0 = time.monotonic()
    results, final = run_episode(task, [script, "touch /app/done"], cfg, sandbox_factory=_factory(cfg))
    return results, final, time.monotonic() - t0


def _graded_through(results, final, first_reward: float) -> None:
    """The episode ran both turns and ended normally (terminated, graded, not retryable)."""
    assert [r.record.step_name for r in results] == ["s1", "s2"]
    assert results[0].record.reward == first_reward and results[0].record.failure_kind is None
    assert results[-1].terminated and not results[-1].truncated
    assert final.graded and final.failure_kind is None and not final.retryable


# SPEC: TURN-10, TURN-6 (P2: a fork loop is stopped by the pids limit; the episode goes on)
def test_p2_fork_loop_is_stopped_by_the_pids_limit(tmp_path):
    script = (f"bash -c 'for i in $(seq {PIDS * 3}); do sleep 2 & done' 2>/dev/null; sleep 3; "
              "echo peak $(cat /sys/fs/cgroup/pids/pids.peak) events $(cat /sys/fs/cgroup/pids/pids.events); "
              "touch /app/done")
    results, final, took = _run(tmp_path, script, name="fork-loop")
    _graded_through(results, final, 1.0)
    tail = results[0].record.output_tail
    words = tail.split()
    peak, hits = int(words[words.index("peak") + 1]), int(words[words.index("max") + 1])
    assert peak <= PIDS and hits > 0, tail  # the limit was reached and held
    assert took < 60


# SPEC: TURN-10, GYM-4 (P2: the memory hog is killed by the sandbox's memory limit, not the episode or the host)
def test_p2_memory_hog_is_killed_not_the_episode(tmp_path):
    script = ("python3 -c 'x = bytearray(1024 * 1024 * 1024)'; echo hog-exit=$?; touch /app/done")
    results, final, _ = _run(tmp_path, script, name="mem-hog")
    _graded_through(results, final, 1.0)
    assert "hog-exit=137" in results[0].record.output_tail  # SIGKILL by the OOM killer of the sandbox's cgroup
    assert results[0].record.exit_code == 0


# SPEC: TURN-10 (P2: a disk filler fills only its size-bounded tmpfs; the turn goes on)
def test_p2_disk_filler_is_bounded_by_its_tmpfs(tmp_path):
    script = ("dd if=/dev/zero of=/scratch/fill bs=1M count=200 2>&1 | tail -1; "
              "echo size=$(stat -c %s /scratch/fill); touch /app/done")
    results, final, _ = _run(tmp_path, script, name="disk-fill")
    _graded_through(results, final, 1.0)
    tail = results[0].record.output_tail
    assert "No space left on device" in tail or "size=" in tail
    size = int(tail.split("size=")[1].split()[0])
    assert size <= SCRATCH_MB * 1024 * 1024


# SPEC: GYM-8 (P2: captured output stays capped whatever the agent prints)
def test_p2_output_flood_stays_capped(tmp_path):
    cap = 8192
    results, final, _ = _run(tmp_path, "head -c 200000000 /dev/zero | tr '\\0' A; touch /app/done",
                             name="flood", cap=cap)
    _graded_through(results, final, 1.0)
    tail = results[0].record.output_tail
    assert tail is not None and len(tail.encode()) <= cap + 200
    assert "harbor_gym: output cut at" in tail or len(tail) <= 4096


# SPEC: TURN-10, TURN-6 (P2/P3: a process left behind neither holds the turn open nor outlives the episode)
def test_p2_sleep_infinity_left_behind_neither_blocks_nor_leaks(tmp_path):
    results, final, took = _run(tmp_path, "nohup sleep infinity >/dev/null 2>&1 & setsid sleep infinity "
                                "</dev/null >/dev/null 2>&1 & touch /app/done", name="sleeper")
    _graded_through(results, final, 1.0)
    assert results[0].record.timings["agent"] < 5 and took < 30
    # nothing labelled is left: checked by the suite's autouse census (P3)


# SPEC: STOP-8, TURN-8, GYM-12 (P2: an agent killing its sandbox's init ends the episode truncated and retryable; the
# turn is agent-caused, with reward 0.0)
@pytest.mark.parametrize("attack", ["kill -TERM 1; sleep 5", "kill -9 -1; sleep 5"], ids=["term-pid1", "kill-all"])
def test_p2_agent_killing_everything_is_a_retryable_outage(tmp_path, attack):
    results, final, took = _run(tmp_path, "touch /app/done; " + attack, name="killer")
    last = results[-1]
    assert len(results) == 1 and last.truncated and not last.terminated
    assert last.record.failure_kind == OUTAGE and last.record.reward == 0.0 and last.record.agent_caused
    assert final.failure_kind == OUTAGE and final.retryable and not final.graded and final.reward is None
    assert took < 30

"""Temporary episode log folders a SIGKILLed run left behind are reaped; a live run's never (issue 12 item 6)."""

from __future__ import annotations

import os
import subprocess
import sys

from harbor_gym.episode._logs import TEMP_PREFIX, EpisodeLogs, reap_stale_temp_logs
from harbor_gym.sandbox.lease import process_lease


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_gym_10_stale_temp_log_folders_are_reaped(tmp_path):
    # SPEC: GYM-10 — a folder whose process is gone and whose run's lease is dead is removed
    dead = tmp_path / f"{TEMP_PREFIX}0123456789abcdef-{_dead_pid()}-task-x1"
    (dead / "verifier").mkdir(parents=True)
    (dead / "verifier" / "reward.txt").write_text("1")
    live_pid = tmp_path / f"{TEMP_PREFIX}0123456789abcdef-{os.getpid()}-task-x2"
    live_pid.mkdir()
    live_run = tmp_path / f"{TEMP_PREFIX}{process_lease().run_id}-{_dead_pid()}-task-x3"
    live_run.mkdir()
    other = tmp_path / "harbor-gym-somethingelse"
    other.mkdir()
    link = tmp_path / f"{TEMP_PREFIX}0123456789abcdef-{_dead_pid()}-task-x4"
    link.symlink_to(other)
    removed = reap_stale_temp_logs(tmp_path)
    assert removed == [dead]
    assert not dead.exists()
    assert live_pid.is_dir() and live_run.is_dir() and other.is_dir() and link.is_symlink()


def test_episode_temp_folder_names_its_run_and_process():
    logs = EpisodeLogs(None, "some/task id")
    try:
        name = logs.root.name
        assert name.startswith(f"{TEMP_PREFIX}{process_lease().run_id}-{os.getpid()}-some-task-id-")
        assert reap_stale_temp_logs(logs.root.parent).count(logs.root) == 0  # a live run's folder stays
        assert logs.root.is_dir()
    finally:
        logs.close()
    assert not logs.root.exists()

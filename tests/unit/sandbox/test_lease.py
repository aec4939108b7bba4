"""lease: a Lease renews its file while running, goes stale when paused, is gone when released; the container
loop's argv. No Docker needed."""

from __future__ import annotations

import os
import time

from harbor_gym.sandbox.lease import Lease, idle_command, lease_is_live


def test_lease_renews_then_goes_stale_then_disappears(tmp_path):
    lease = Lease(directory=tmp_path, interval_s=0.2).start()
    try:
        os.utime(lease.path, (1, 1))  # pretend it is old: the heartbeat must refresh it
        time.sleep(0.6)
        assert lease_is_live(lease.run_id, 1.0, tmp_path)
        lease.pause()
        assert not lease.is_renewing
        os.utime(lease.path, (1, 1))
        time.sleep(0.5)
        assert not lease_is_live(lease.run_id, 1.0, tmp_path)
    finally:
        lease.release()
    assert not lease.path.exists() and not lease_is_live(lease.run_id, 1e9, tmp_path)


def test_want_ttl_shortens_the_interval():
    lease = Lease(interval_s=5.0)
    lease.path = lease.path.parent / "never-created" / "x.lease"  # want_ttl renews: keep it out of the cache
    try:
        lease.want_ttl(2.0)
        assert lease._interval == 0.5
    finally:
        lease.release()
        lease.path.parent.rmdir()


def test_gym_10_the_sandbox_main_process_reads_no_lease():
    # SPEC: GYM-10 — the main process only waits: no host file, nothing an agent could stop to defeat the lease
    argv = idle_command()
    assert argv[:2] == ["/bin/sh", "-c"]
    assert "stat" not in argv[2] and "/run/harbor-gym" not in " ".join(argv)


class _Remote:
    def __init__(self):
        self.started = self.woken = self.released = 0

    def start(self):
        self.started += 1

    def wake(self):
        self.woken += 1

    def release(self):
        self.released += 1


def test_remotes_follow_the_lease(tmp_path):
    # SPEC: GYM-10 — an engine's copy of the lease starts, stops and is released with the lease
    lease = Lease(directory=tmp_path, interval_s=5.0)
    remote = _Remote()
    lease.add_remote(remote)
    assert remote.started == 0  # not renewing yet
    lease.start()
    assert remote.started == 1 and lease.is_renewing and lease.interval_s == 5.0
    lease.want_ttl(2.0)  # a shorter TTL: the remote is told to look at the new interval
    assert lease.interval_s == 0.5 and remote.woken == 1
    lease.pause()
    assert remote.woken == 2 and not lease.is_renewing
    lease.start()
    assert remote.started == 2
    lease.release()
    assert remote.released == 1 and lease.remotes == []
    lease.release()
    assert remote.released == 1


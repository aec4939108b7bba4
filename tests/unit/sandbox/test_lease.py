"""lease: a Lease renews its file while running, goes stale when paused, is gone when released; the container
loop's argv. No Docker needed."""

from __future__ import annotations

import os
import time

from harbor_gym.sandbox.lease import LEASE_MOUNT, Lease, lease_command, lease_is_live


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


def test_lease_command_is_posix_sh_with_integer_ttl():
    argv = lease_command(2.5)
    assert argv[:2] == ["/bin/sh", "-c"] and argv[-3:] == [LEASE_MOUNT, "3", "1"]

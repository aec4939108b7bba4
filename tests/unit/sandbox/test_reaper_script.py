"""The reaper's decision (`_reaper_script.is_stale`) and its readers, without Docker (SPEC GYM-10, issue 12 item 6)."""

from __future__ import annotations

import os
import time

import pytest

from harbor_gym.sandbox import _reaper, _reaper_script as rs
from harbor_gym.sandbox.base import MANAGED_LABEL


def test_gym_10_renewed_lease_is_live_until_its_ttl_passes():
    # SPEC: GYM-10 — the bound: stale exactly when the last renewal is older than the resource's TTL plus the
    # engine latency allowance, which keeps the removal within ttl + 20 s
    state = ("renewed", 1000.0)
    assert rs.LATENCY_S + rs.POLL_S <= 15
    assert not rs.is_stale(state, ttl=5, created=0, started=0, now=1005.0 + rs.LATENCY_S)
    assert rs.is_stale(state, ttl=5, created=0, started=0, now=1005.1 + rs.LATENCY_S)


def test_gym_10_released_lease_is_stale_at_once():
    # SPEC: GYM-10 — what a finished process left is removed at the next pass
    assert rs.is_stale(("released", 1000.0), ttl=60, created=999, started=0, now=1000.0)


def test_gym_10_missing_lease_gets_one_ttl_of_grace_from_reaper_start_or_creation():
    # SPEC: GYM-10 — a new reaper (leases lost) does not remove a live run's sandbox before it renews
    missing = ("missing", 0.0)
    extra = rs.LATENCY_S
    assert not rs.is_stale(missing, ttl=10, created=0, started=1000, now=1009 + extra)
    assert not rs.is_stale(missing, ttl=10, created=1005, started=0, now=1014 + extra)
    assert rs.is_stale(missing, ttl=10, created=1005, started=1000, now=1016 + extra)


@pytest.mark.parametrize("value,expected", [("5", 5.0), ("2.5", 2.5), (None, 60.0), ("x", 60.0), ("-1", 60.0)])
def test_ttl_label(value, expected):
    labels = {} if value is None else {rs.TTL_LABEL: value}
    assert rs.ttl_of(labels) == expected


def test_engine_timestamps_parse():
    assert rs.parse_time("1970-01-01T00:00:10.123456789Z") == pytest.approx(10.123456)
    assert rs.parse_time("1970-01-01T00:01:00Z") == 60.0
    assert rs.parse_time("garbage") == 0.0


def test_lease_state_reads_ctime_and_release(tmp_path):
    (tmp_path / "run1").write_bytes(b"123.0\n")
    kind, ctime = rs.lease_state("run1", str(tmp_path))
    assert kind == "renewed" and abs(ctime - time.time()) < 5
    (tmp_path / "run2").write_bytes(b"released\n")
    assert rs.lease_state("run2", str(tmp_path))[0] == "released"
    assert rs.lease_state("nope", str(tmp_path)) == ("missing", 0.0)
    os.symlink("/etc/passwd", tmp_path / "x")
    assert rs.lease_state("../etc/passwd", str(tmp_path)) == ("missing", 0.0)  # labels never name paths


def test_the_reaper_is_not_a_sandbox():
    # SPEC: GYM-10 — the reaper carries neither the managed label nor the lease label it reaps by
    assert _reaper.REAPER_LABEL != MANAGED_LABEL and _reaper.REAPER_LABEL != _reaper.LEASE_LABEL
    assert _reaper.LEASE_LABEL == rs.LEASE_LABEL


def test_gym_10_a_slow_engine_extends_the_allowance():
    # SPEC: GYM-10 — an engine that takes long to apply uploads delays removal instead of removing a live run
    state = ("renewed", 1000.0)
    now = 1000.0 + 5 + rs.LATENCY_S + 1
    assert rs.is_stale(state, ttl=5, created=0, started=0, now=now)
    assert not rs.is_stale(state, ttl=5, created=0, started=0, now=now, engine_lag=8.0)
    probe = rs.Probe()
    probe.record(100.0, 8.0)
    assert probe.lag(150.0) == 8.0
    assert probe.lag(100.0 + rs.PROBE_WINDOW_S + 1) == 0.0  # old samples fall out of the window
    probe._in_flight = 300.0
    assert probe.lag(312.0) == 12.0  # an upload still in flight counts with its age

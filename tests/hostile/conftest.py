"""Fixtures of the hostile suite: a leak check by this process's unique label after every Docker test (P3), and a
final sweep that removes anything labelled that a failing test left, so that a failure never leaks either."""

from __future__ import annotations

import time

import pytest

from .helpers import LABEL_FILTER, labelled_everything


def _census(client, wait_s: float = 10.0) -> dict[str, list[str]]:
    """What carries the label once in-flight removals settle (auto-removed containers take a moment)."""
    end = time.monotonic() + wait_s
    while True:
        left = labelled_everything(client)
        if not any(left.values()) or time.monotonic() >= end:
            return left
        time.sleep(0.25)


def _sweep(client) -> None:
    sel = {"label": LABEL_FILTER}
    for c in client.api.containers(all=True, filters=sel):
        try:
            client.api.remove_container(c["Id"], force=True)
        except Exception:  # already going
            pass
    for n in client.api.networks(filters=sel):
        try:
            client.api.remove_network(n["Id"])
        except Exception:
            pass
    for v in (client.api.volumes(filters=sel) or {}).get("Volumes") or []:
        try:
            client.api.remove_volume(v["Name"])
        except Exception:
            pass


@pytest.fixture(autouse=True)
def _nothing_labelled_left(request):
    """P3 after every Docker test: no container, network or volume with this process's label remains."""
    yield
    if request.node.get_closest_marker("docker") is None:
        return
    import docker

    client = docker.from_env(timeout=60)
    try:
        left = _census(client)
        if any(left.values()):
            _sweep(client)
            pytest.fail(f"P3 violated: labelled resources left behind: {left}")
    finally:
        client.close()


@pytest.fixture(scope="session", autouse=True)
def host_scan_stamp(tmp_path_factory):
    """GYM-10's mechanical check: a stamp file touched before the first hostile test of the session;
    ``test_zz_host_scan.py`` (collected last) lists every file of the host newer than it."""
    stamp = tmp_path_factory.getbasetemp() / "host-scan.stamp"
    stamp.touch()
    return stamp

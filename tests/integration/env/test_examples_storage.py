"""Issue 16 must-hold: each example of ``envs/`` runs on this engine with ``storage_mb = 10240`` added to its
``[environment]``, as real Harbor datasets declare it, and its agent container carries that bound (GYM-10)."""

from __future__ import annotations

import re
import shutil
import threading
import uuid

import pytest

from harbor_gym.agents import Oracle
from harbor_gym.episode._spec import STEP_LABEL, TASK_LABEL
from harbor_gym.run.collector import collect
from harbor_gym.sandbox._engine import get_client, storage_support
from harbor_gym.sandbox.compose._service import SERVICE_LABEL
from env_helpers import ENVS

pytestmark = pytest.mark.docker

STORAGE_MB = 10240


def _with_storage(src, dest):
    """Copy the example ``src`` to ``dest`` with ``storage_mb = 10240`` as the first key of ``[environment]``."""
    shutil.copytree(src, dest)
    toml = dest / "task.toml"
    text, n = re.subn(r"^\[environment\]\n", f"[environment]\nstorage_mb = {STORAGE_MB}\n", toml.read_text(),
                      count=1, flags=re.M)
    assert n == 1, f"{src.name}: no [environment] table"
    toml.write_text(text)


def test_every_example_runs_with_storage_mb_10240(tmp_path, docker_client, no_leaks):
    examples = sorted(p.name for p in ENVS.iterdir() if (p / "task.toml").is_file())
    for name in examples:
        _with_storage(ENVS / name, tmp_path / "ds" / name)
    mark = {"io.harbor-gym.test-storage": uuid.uuid4().hex}
    made: dict[str, tuple[dict, dict]] = {}  # container id -> (labels, host config), at create (events, not polling)
    events = docker_client.api.events(decode=True, filters={
        "type": "container", "event": "create", "label": "=".join(next(iter(mark.items())))})

    def watch() -> None:
        for event in events:
            try:
                attrs = docker_client.api.inspect_container(event["id"])
            except Exception:  # removed already: an episode never ends that fast, so it is not an agent sandbox
                continue
            made[event["id"]] = (attrs["Config"]["Labels"], attrs["HostConfig"])

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        results = collect(tmp_path / "ds", lambda *_: Oracle(), concurrency=2, retries=0,
                          config={"backend": "docker", "labels": mark})
    finally:
        events.close()
        watcher.join(timeout=30)
    assert sorted((r.task_id, r.reward) for r in results) == [(n, 1.0) for n in examples], \
        [(r.task_id, r.failure_kind, r.reason) for r in results if r.reward != 1.0]
    includes_image = storage_support(get_client()).includes_image
    agents = {labels[TASK_LABEL]: hc for labels, hc in made.values()
              if STEP_LABEL not in labels and labels.get(SERVICE_LABEL, "main") == "main"}
    assert sorted(agents) == examples
    for name, hc in agents.items():  # the engine's bound: storage_mb, plus the image's size on btrfs qgroups
        size = (hc.get("StorageOpt") or {}).get("size", "")
        assert re.fullmatch(r"\d+M", size), (name, size)
        assert int(size[:-1]) == STORAGE_MB or (includes_image and int(size[:-1]) > STORAGE_MB), (name, size)

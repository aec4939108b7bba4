"""The harness pids guard on a compose group's service ``main`` (`EnvConfig.pids_limit` via the episode's main
spec): the tighter of the spec's limit and the compose file's wins, so the guard never loosens a task's limit."""

from __future__ import annotations

import pytest

from harbor_gym.config import host_settings
from harbor_gym.sandbox import SandboxSettings, SandboxSpec
from harbor_gym.sandbox.compose import ComposeGroup
from harbor_gym.task.compose import parse_compose_text

BASE_IMAGE = "harbor-gym/base:bookworm"
READ = "cat /sys/fs/cgroup/pids/pids.max 2>/dev/null || cat /sys/fs/cgroup/pids.max"

pytestmark = pytest.mark.docker


def _main_pids(tmp_path, limit: str, spec_pids: int | None) -> str:
    text = f"services:\n  main:\n    image: {BASE_IMAGE}\n"
    if limit:
        text += f"    deploy: {{resources: {{limits: {{pids: {limit}}}}}}}\n"
    env = tmp_path / limit / "environment"
    env.mkdir(parents=True)
    (env / "docker-compose.yaml").write_text(text)
    compose = parse_compose_text(text, path=env / "docker-compose.yaml")
    hs = host_settings()
    settings = SandboxSettings(pull_policy="never", image_aliases=dict(hs.image_aliases),
                               rootfs_aliases=dict(hs.rootfs_aliases), lease_ttl_s=30.0, output_cap_bytes=4096)
    spec = SandboxSpec(image="replaced-by-compose", pids_limit=spec_pids)
    with ComposeGroup(compose, settings=settings, main_spec=spec, name_hint="pids-test", start_timeout_s=60) as group:
        res = group.main.exec(READ, timeout=10)
        assert res.ok, res
        return res.stdout.strip()


# SPEC: COMPOSE-2, COMPOSE-3
def test_main_takes_the_tighter_pids_limit(tmp_path):
    assert _main_pids(tmp_path, "", 4096) == "4096"      # only the harness guard
    assert _main_pids(tmp_path, "50", 4096) == "50"      # the task's tighter limit is kept
    assert _main_pids(tmp_path, "9000", 4096) == "4096"  # the guard caps a looser one

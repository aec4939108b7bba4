"""Compose groups on a real Docker engine (SPEC COMPOSE-1..3): network, health, sizes, clean-up, lease."""

from __future__ import annotations

import json
import time
from datetime import datetime
from pathlib import Path

import pytest

from harbor_gym.config import host_settings
from harbor_gym.errors import SandboxError, SandboxUnavailableError
from harbor_gym.sandbox import MANAGED_LABEL, RUN_LABEL, SandboxSettings, SandboxSpec
from harbor_gym.sandbox import lease as leases
from harbor_gym.sandbox.compose import GROUP_LABEL, SERVICE_LABEL, ComposeGroup, open_group
from harbor_gym.sandbox.docker_backend import TTL_LABEL
from harbor_gym.sandbox.gc import _dead as gc_dead
from harbor_gym.task.compose import parse_compose_text

BASE_IMAGE = "harbor-gym/base:bookworm"
ENVS = Path(__file__).resolve().parents[3] / "envs"

def base_settings(lease_ttl_s: float = 30.0) -> SandboxSettings:
    """The host's image aliases, pull policy never, a short lease TTL."""
    hs = host_settings()
    return SandboxSettings(pull_policy="never", image_aliases=dict(hs.image_aliases),
                           rootfs_aliases=dict(hs.rootfs_aliases), lease_ttl_s=lease_ttl_s,
                           output_cap_bytes=4096)


# A sidecar serving HTTP with the base image's python3 (no network tools in it); ready when it answers.
WEB = f"""
  web:
    image: {BASE_IMAGE}
    command: ["python3", "-m", "http.server", "8000", "--directory", "/srv"]
    healthcheck:
      test:
        - CMD
        - python3
        - -c
        - import urllib.request as u; u.urlopen('http://127.0.0.1:8000/', timeout=1)
      interval: 200ms
      timeout: 2s
      retries: 50
"""


def compose_in(tmp_path: Path, text: str, files: dict[str, str] | None = None):
    env = tmp_path / "environment"
    env.mkdir(parents=True, exist_ok=True)
    for rel, content in (files or {}).items():
        (env / rel).parent.mkdir(parents=True, exist_ok=True)
        (env / rel).write_text(content)
    path = env / "docker-compose.yaml"
    path.write_text(text)
    return parse_compose_text(text, path=path)


@pytest.fixture
def group_factory():
    """Start groups with the host's aliases and a short lease; every one is stopped at teardown."""
    made: list[ComposeGroup] = []

    def make(compose, **kwargs) -> ComposeGroup:
        kwargs.setdefault("settings", base_settings())
        kwargs.setdefault("name_hint", "compose-test")
        kwargs.setdefault("start_timeout_s", 60)
        group = ComposeGroup(compose, **kwargs)
        made.append(group)
        group.start()
        return group

    yield make
    for group in made:
        group.stop()


def labelled(client, group_name: str) -> dict[str, list[str]]:
    """Names of the containers, networks and volumes carrying the group's label."""
    selector = {"label": f"{GROUP_LABEL}={group_name}"}
    return {
        "containers": [(c.get("Names") or [c["Id"]])[0].lstrip("/")
                       for c in client.api.containers(all=True, filters=selector)],
        "networks": [n["Name"] for n in client.api.networks(filters=selector)],
        "volumes": [v["Name"] for v in (client.api.volumes(filters=selector) or {}).get("Volumes") or []],
    }


def _started_at(client, container_id: str) -> datetime:
    text = client.api.inspect_container(container_id)["State"]["StartedAt"]  # RFC 3339 with nanoseconds
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00")


# --- COMPOSE-1: the group, its network, reaching sidecars by name -------------------------------------------


@pytest.mark.docker
def test_compose_1_main_reaches_sidecar_by_name_on_an_internal_network(tmp_path, group_factory,
                                                                         docker_client):
    # SPEC: COMPOSE-1 — main and the sidecar share a private network and reach each other by service name; the
    # network is internal when the task's network is off (no route out; nothing is sent off this machine here)
    compose = compose_in(tmp_path, f"services:\n  main:\n    image: {BASE_IMAGE}\n" + WEB)
    group = group_factory(compose, network=False)
    assert set(group.services) == {"main", "web"} and group.main is group.service("main")
    group.service("web").exec("echo hello-from-web > /srv/index.txt", timeout=10)
    fetch = ("import urllib.request as u; "
             "print(u.urlopen('http://web:8000/index.txt', timeout=5).read().decode())")
    res = group.main.exec(["python3", "-c", fetch], timeout=20)
    assert res.ok and res.stdout.strip() == "hello-from-web", res
    net = docker_client.api.inspect_network(group.name)
    assert net["Internal"] is True
    assert net["Labels"][MANAGED_LABEL] == "true" and net["Labels"][RUN_LABEL]
    main_attrs = docker_client.api.inspect_container(group.main.container_id)
    assert list(main_attrs["NetworkSettings"]["Networks"]) == [group.name]
    assert main_attrs["Config"]["Labels"][SERVICE_LABEL] == "main"
    assert group.is_alive()


@pytest.mark.docker
def test_compose_1_network_on_egress_is_the_shared_filtered_network(tmp_path, group_factory, docker_client):
    # SPEC: COMPOSE-1, GYM-10 — with the task's network on, the group's own network stays internal and main's
    # route out is the shared, host-filtered public network (never an ordinary bridge of the group's)
    compose = compose_in(tmp_path, f"services:\n  main:\n    image: {BASE_IMAGE}\n")
    group = group_factory(compose, network=True)
    assert docker_client.api.inspect_network(group.name)["Internal"] is True
    networks = docker_client.api.inspect_container(group.main.container_id)["NetworkSettings"]["Networks"]
    assert set(networks) == {group.name, "harbor-gym-public"}


@pytest.mark.docker
def test_compose_1_depends_on_service_healthy_is_waited_for(tmp_path, group_factory, docker_client):
    # SPEC: COMPOSE-1 — main starts only after the sidecar's healthcheck passed (here ~2 s after it started)
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    depends_on:
      slow: {{condition: service_healthy}}
  slow:
    image: {BASE_IMAGE}
    command: ["sh", "-c", "sleep 2; date +%s.%N > /tmp/ready; exec sleep 1000"]
    healthcheck:
      test: ["CMD-SHELL", "test -f /tmp/ready"]
      interval: 200ms
      timeout: 2s
      retries: 100
""")
    group = group_factory(compose)
    slow = group.service("slow")
    ready_at = float(slow.read_file("/tmp/ready", max_bytes=100))
    main_started = _started_at(docker_client, group.main.container_id).timestamp()
    slow_started = _started_at(docker_client, slow.container_id).timestamp()
    assert main_started - slow_started >= 1.9
    assert main_started >= ready_at - 0.5  # clocks of host and container are the same kernel's
    assert docker_client.api.inspect_container(slow.container_id)["State"]["Health"]["Status"] == "healthy"


@pytest.mark.docker
def test_compose_1_unhealthy_dependency_fails_start_and_leaves_nothing(tmp_path, docker_client):
    # SPEC: COMPOSE-1 — a service_healthy condition that fails stops the start; nothing of the group is left
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    depends_on: {{bad: {{condition: service_healthy}}}}
  bad:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    healthcheck: {{test: "exit 1", interval: 200ms, timeout: 1s, retries: 2}}
volumes:
  data:
""")
    group = ComposeGroup(compose, settings=base_settings(), name_hint="compose-test", start_timeout_s=30)
    with pytest.raises(SandboxError) as excinfo:
        group.start()
    assert "unhealthy" in str(excinfo.value) and excinfo.value.field == "services.bad.healthcheck"
    assert "main" not in group.services  # main never started
    assert labelled(docker_client, group.name) == {"containers": [], "networks": [], "volumes": []}


@pytest.mark.docker
def test_compose_1_sidecar_exiting_during_start_is_reported_with_its_output(tmp_path, docker_client):
    # SPEC: COMPOSE-1 — a sidecar whose command dies is named, with its last output, and nothing is left
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    depends_on: {{crash: {{condition: service_healthy}}}}
  crash:
    image: {BASE_IMAGE}
    command: ["sh", "-c", "echo boom-before-exit; exit 3"]
    healthcheck: {{test: "true", interval: 5s}}
""")
    group = ComposeGroup(compose, settings=base_settings(), name_hint="compose-test", start_timeout_s=30)
    with pytest.raises(SandboxError) as excinfo:
        group.start()
    assert "'crash'" in str(excinfo.value) and "boom-before-exit" in str(excinfo.value)
    assert labelled(docker_client, group.name) == {"containers": [], "networks": [], "volumes": []}


# --- volumes and binds --------------------------------------------------------------------------------------


@pytest.mark.docker
def test_compose_1_named_volumes_and_environment_binds(tmp_path, group_factory):
    # SPEC: COMPOSE-1 — a named volume is shared between services; a read-only bind shows the environment
    # folder's file; a read-write bind is a copy (the task folder is never written by a sandbox)
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    volumes: ["shared:/shared", "./conf:/etc/app:ro"]
  side:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    volumes: ["shared:/data", "./seed.txt:/work/seed.txt"]
volumes:
  shared:
""", files={"conf/app.ini": "mode=ro\n", "seed.txt": "seed\n"})
    group = group_factory(compose)
    side, main = group.service("side"), group.main
    assert side.exec("echo from-side > /data/x.txt", timeout=10).ok
    assert main.read_file("/shared/x.txt", max_bytes=100) == b"from-side\n"
    assert main.read_file("/etc/app/app.ini", max_bytes=100) == b"mode=ro\n"
    assert not main.exec("echo no >> /etc/app/app.ini", timeout=10).ok  # read-only
    assert side.exec("echo changed > /work/seed.txt", timeout=10).ok
    assert (tmp_path / "environment" / "seed.txt").read_text() == "seed\n"


# --- COMPOSE-2: sizes ---------------------------------------------------------------------------------------

CGROUP = ("if [ -f /sys/fs/cgroup/memory.max ]; then cat /sys/fs/cgroup/memory.max /sys/fs/cgroup/cpu.max "
          "/sys/fs/cgroup/pids.max; else cat /sys/fs/cgroup/memory/memory.limit_in_bytes; "
          "echo $(cat /sys/fs/cgroup/cpu/cpu.cfs_quota_us) $(cat /sys/fs/cgroup/cpu/cpu.cfs_period_us); "
          "cat /sys/fs/cgroup/pids/pids.max; fi")


def _cgroup(sandbox) -> list[str]:
    """[memory limit, "quota period", pids limit] read inside the sandbox (cgroup v2 or v1)."""
    res = sandbox.exec(CGROUP, timeout=10)
    assert res.ok, res
    lines = res.stdout.split("\n")
    return [lines[0].strip(), " ".join(lines[1].split()[:2]), lines[2].strip()]


@pytest.mark.docker
def test_compose_2_sizes_are_applied_inside_the_sidecars_cgroup(tmp_path, group_factory):
    # SPEC: COMPOSE-2 — limits, else reservations, else legacy cpus/mem_limit; read back from the cgroup
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
  limited:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    deploy:
      resources:
        limits: {{cpus: "0.5", memory: 64m, pids: 50}}
        reservations: {{cpus: "1", memory: 256m}}
    cpus: 1.5
    mem_limit: 512m
  reserved:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    deploy: {{resources: {{reservations: {{cpus: "0.25", memory: 96m}}}}}}
    mem_limit: 512m
  legacy:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    cpus: 0.75
    mem_limit: 80m
""")
    group = group_factory(compose)
    assert _cgroup(group.service("limited")) == [str(64 << 20), "50000 100000", "50"]
    assert _cgroup(group.service("reserved")) == [str(96 << 20), "25000 100000", "max"]
    assert _cgroup(group.service("legacy")) == [str(80 << 20), "75000 100000", "max"]


@pytest.mark.docker
def test_compose_3_main_spec_applies_to_main_only(tmp_path, group_factory):
    # SPEC: COMPOSE-3 — main's workdir, user and env (from the episode) never reach a sidecar's commands
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    environment: {{FROM_COMPOSE: main}}
  side:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    working_dir: /srv
    environment: {{ROLE: side}}
""")
    spec = SandboxSpec(image="replaced-by-compose", workdir="/app", env={"TASK_ENV": "1"}, user="nobody",
                       memory_mb=200)
    group = group_factory(compose, main_spec=spec)
    main, side = group.main, group.service("side")
    out = main.exec('echo "$(pwd) $(id -un) $TASK_ENV $FROM_COMPOSE"', timeout=10).stdout.split()
    assert out == ["/app", "nobody", "1", "main"]
    out = side.exec('echo "$(pwd) $(id -un) ${TASK_ENV:-unset} $ROLE"', timeout=10).stdout.split()
    assert out == ["/srv", "root", "unset", "side"]
    assert _cgroup(main)[0] == str(200 << 20)


# --- stop and the lease -------------------------------------------------------------------------------------


@pytest.mark.docker
def test_compose_1_stop_removes_containers_network_and_volumes(tmp_path, docker_client):
    # SPEC: COMPOSE-1 — the group stops with the episode; stop is idempotent and leaves nothing labelled
    compose = compose_in(tmp_path, f"services:\n  main:\n    image: {BASE_IMAGE}\n    volumes: [data:/d]\n"
                                   + WEB + "volumes:\n  data:\n")
    group = ComposeGroup(compose, settings=base_settings(), name_hint="compose-test")
    with group:
        before = labelled(docker_client, group.name)
        assert len(before["containers"]) == 2 and before["networks"] == [group.name]
        assert before["volumes"] == [f"{group.name}_data"]
        vol = docker_client.api.inspect_volume(f"{group.name}_data")
        assert vol["Labels"][MANAGED_LABEL] == "true" and vol["Labels"][TTL_LABEL]
    deadline = time.monotonic() + 10
    while labelled(docker_client, group.name) != {"containers": [], "networks": [], "volumes": []}:
        assert time.monotonic() < deadline, labelled(docker_client, group.name)
        time.sleep(0.2)
    group.stop()  # idempotent
    assert not group.is_alive()
    with pytest.raises(SandboxError):
        group.service("main")


@pytest.mark.docker
def test_compose_1_the_reaper_removes_a_group_whose_lease_goes_stale(tmp_path, docker_client):
    # SPEC: COMPOSE-1, GYM-10 — every container (sidecars with their own command included), the network and the
    # volumes carry the lease label, and the engine's reaper removes them all once the lease is not renewed
    from harbor_gym.sandbox._reaper import LEASE_LABEL

    lease = leases.Lease(directory=tmp_path / "leases", interval_s=0.5).start()
    compose = compose_in(tmp_path, f"services:\n  main:\n    image: {BASE_IMAGE}\n{WEB}volumes:\n  v:\n")
    group = ComposeGroup(compose, settings=base_settings(lease_ttl_s=2), name_hint="compose-test",
                         lease=lease)
    try:
        group.start()
        selector = {"label": f"{GROUP_LABEL}={group.name}"}
        resources = ([c["Labels"] for c in docker_client.api.containers(all=True, filters=selector)]
                     + [n["Labels"] for n in docker_client.api.networks(filters=selector)]
                     + [v["Labels"] for v in docker_client.api.volumes(filters=selector)["Volumes"] or []])
        assert len(resources) == 4
        for labels in resources:
            assert labels[LEASE_LABEL] == labels[RUN_LABEL] == lease.run_id and labels[TTL_LABEL] == "2"
        time.sleep(3)  # renewed: alive past its TTL
        assert group.is_alive()
        lease.pause()
        (tmp_path / "leases" / f"{lease.run_id}.lease").unlink()
        assert all(gc_dead(labels) for labels in resources)  # `harbor-gym gc` agrees on this host
        deadline = time.monotonic() + 2 + 20
        while any(c["State"] != "removing" for c in docker_client.api.containers(all=True, filters=selector)):
            assert time.monotonic() < deadline, f"outlived its lease: {labelled(docker_client, group.name)}"
            time.sleep(0.5)  # gone, or being removed at the reaper's request (a loaded engine takes its time)
        deadline = time.monotonic() + 300
        while labelled(docker_client, group.name) != {"containers": [], "networks": [], "volumes": []}:
            assert time.monotonic() < deadline, f"the engine did not finish: {labelled(docker_client, group.name)}"
            time.sleep(0.5)
    finally:
        group.stop()
        lease.release()
    assert labelled(docker_client, group.name) == {"containers": [], "networks": [], "volumes": []}


@pytest.mark.docker
def test_compose_1_stop_during_start_leaves_nothing(tmp_path, docker_client):
    # SPEC: COMPOSE-1, GYM-7 — closing from another thread while the group waits for a healthy sidecar ends
    # the start with an error and removes everything made so far
    import threading

    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    depends_on: {{never: {{condition: service_healthy}}}}
  never:
    image: {BASE_IMAGE}
    command: ["sleep", "1000"]
    healthcheck: {{test: "false", interval: 200ms, retries: 1000}}
volumes:
  v:
""")
    group = ComposeGroup(compose, settings=base_settings(), name_hint="compose-test", start_timeout_s=60)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            group.start()
        except BaseException as exc:  # collected for the assertion below
            errors.append(exc)

    worker = threading.Thread(target=start)
    worker.start()
    deadline = time.monotonic() + 30
    while "never" not in group.services:
        assert time.monotonic() < deadline
        time.sleep(0.1)
    group.stop()
    worker.join(30)
    assert not worker.is_alive() and errors and isinstance(errors[0], SandboxError), errors
    group.stop()
    assert labelled(docker_client, group.name) == {"containers": [], "networks": [], "volumes": []}


@pytest.mark.docker
def test_compose_1_a_sidecar_that_exits_is_not_alive(tmp_path, group_factory):
    # SPEC: COMPOSE-1 — a sidecar's container follows its command (as compose); main outlives its own command
    compose = compose_in(tmp_path, f"""services:
  main:
    image: {BASE_IMAGE}
    command: ["true"]
  short:
    image: {BASE_IMAGE}
    command: ["sleep", "1"]
""")
    group = group_factory(compose)
    deadline = time.monotonic() + 15
    while group.service("short").is_alive():
        assert time.monotonic() < deadline
        time.sleep(0.3)
    assert group.main.is_alive() and not group.is_alive()


# --- the shipped example and the local backend --------------------------------------------------------------


@pytest.mark.docker
def test_compose_1_kv_sidecar_example_validates_with_sidecar_artifacts_in_the_manifest(tmp_path):
    # SPEC: COMPOSE-1, ART-1, ART-3, ART-4, ORACLE-4 — the example scores 1.0 per turn; the sidecar's collect
    # hook ran in kv and both kv artifacts are in the manifest with service "kv"
    from harbor_gym import HarborEnv
    from harbor_gym.agents import Oracle

    env = HarborEnv(ENVS / "kv-sidecar", config={"backend": "docker", "logs_root": str(tmp_path / "logs")})
    try:
        env.reset(seed=0)
        for expected_keys in (["color", "size"], ["color", "label", "size"]):
            _, reward, _, truncated, info = env.step(Oracle())
            turn = info["turn"]
            assert reward == 1.0 and not truncated, turn
            entries = {m.source: m for m in turn.manifest}
            for source in ("/data/log.txt", "/data/snapshot.json"):
                assert entries[source].service == "kv" and entries[source].status == "ok", entries
            artifacts = Path(turn.log_dir) / "verifier" / "artifacts"
            manifest = json.loads((artifacts / "manifest.json").read_text())
            assert {(m["source"], m["service"]) for m in manifest} >= {("/data/log.txt", "kv"),
                                                                       ("/data/snapshot.json", "kv")}
            snapshot = json.loads((artifacts / "kv" / "snapshot.json").read_text())
            assert sorted(snapshot) == expected_keys  # written by the hook inside kv
    finally:
        env.close()


def test_compose_2_local_backend_refuses_groups(tmp_path):
    # SPEC: COMPOSE-2 — a provider that cannot run groups refuses (before anything starts), naming the file
    compose = compose_in(tmp_path, f"services:\n  main:\n    image: {BASE_IMAGE}\n" + WEB)
    with pytest.raises(SandboxUnavailableError) as excinfo:
        open_group(compose, backend="local", settings=base_settings())
    err = excinfo.value
    assert err.rule == "COMPOSE-2" and err.path == compose.path and "local" in str(err)

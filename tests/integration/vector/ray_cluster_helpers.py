"""Helpers of the Ray-cluster tests (issue 17 item 3): a local two-node Ray cluster started with ``ray start``, each
node with its own Docker engine, and a seeded stochastic agent that records where it ran.

This module is importable in the cluster's workers (the nodes' ``PYTHONPATH`` holds its folder), so Ray ships the
agent by reference and the workers rebuild it here.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from harbor_gym.agents import AgentOutcome

__all__ = ["SeededChoiceAgent", "RayNode", "RayCluster", "CHOICES", "answer_task_files"]

#: The answers the agent picks from and the reward each earns (the verifier writes the answer as the reward).
CHOICES = ("0", "0.5", "1")


def answer_task_files(toml_text: str) -> dict[str, str]:
    """A one-turn task whose reward is the number the agent wrote to /app/answer (0 without one)."""
    return {"task.toml": toml_text,
            "tests/test.sh": "#!/bin/bash\ncat /app/answer 2>/dev/null > /logs/verifier/reward.txt "
                             "|| echo 0 > /logs/verifier/reward.txt\n"
                             "[ -s /logs/verifier/reward.txt ] || echo 0 > /logs/verifier/reward.txt\n"}


@dataclass
class SeededChoiceAgent:
    """Picks one of `CHOICES` with a numpy RNG seeded from the episode seed and writes it as the answer, so its
    reward depends on the draw. Its outcome's metadata says what it drew and where it ran: the Ray node (if any),
    the engine its process talks to (``docker info``'s data root: engines on one machine share their ID) and the sandbox's hostname (its container name)."""

    seed: int
    sleep_s: float = 0.0

    def run(self, turn):
        rng = np.random.default_rng(self.seed)
        choice = CHOICES[int(rng.integers(len(CHOICES)))]
        if self.sleep_s:
            time.sleep(self.sleep_s)
        turn.exec(f"echo {choice} > /app/answer", timeout=30)
        hostname = turn.exec("hostname", timeout=30).stdout.strip()
        from harbor_gym.sandbox._engine import get_client

        node = ""
        try:
            import ray

            if ray.is_initialized():
                node = ray.get_runtime_context().get_node_id()
        except ImportError:
            pass
        return AgentOutcome(status="completed", metadata={
            "choice": choice, "node": node, "engine": get_client().info()["DockerRootDir"], "hostname": hostname,
            "docker_host": os.environ.get("DOCKER_HOST", "")})


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RayNode:
    """One ``ray start``ed node: ``mark`` is an environment variable value only its processes carry."""

    mark: str
    docker_host: str
    node_id: str = ""
    procs: list[int] = field(default_factory=list)

    def pids(self) -> list[int]:
        """Every live process of this node (raylet, agents, workers): those whose environment carries the mark."""
        needle = f"{RayCluster.MARK_VAR}={self.mark}".encode()
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                with open(f"/proc/{entry}/environ", "rb") as f:
                    if needle in f.read().split(b"\0"):
                        found.append(int(entry))
            except OSError:
                continue
        return found

    def kill(self) -> list[int]:
        """SIGKILL every process of the node (a node that dies at once); the pids killed."""
        pids = self.pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return pids


class RayCluster:
    """A head and a worker node on this machine (``--num-cpus=1``, ``--node-ip-address=127.0.0.1``, no dashboard),
    each declaring ``harbor_engine`` and with its own ``DOCKER_HOST``. Ports are picked free; the temp dir is a short
    one of its own (so no other Ray on this machine finds this cluster); teardown kills only its own processes (by
    the mark in their environment), never other Ray instances of the machine."""

    MARK_VAR = "HARBOR_GYM_TEST_RAY_NODE"

    def __init__(self, *, head_engine: str, worker_engine: str, head_slots: int = 2, worker_slots: int = 1,
                 pythonpath: list[Path]) -> None:
        tag = uuid.uuid4().hex[:8]
        self.temp_dir = tempfile.mkdtemp(prefix="hgray-", dir="/tmp")
        self.port = _free_port()
        self.address = f"127.0.0.1:{self.port}"
        self.head = RayNode(f"{tag}-head", head_engine)
        self.worker = RayNode(f"{tag}-worker", worker_engine)
        self._slots = {"head": head_slots, "worker": worker_slots}
        self._pythonpath = os.pathsep.join(str(p) for p in pythonpath)
        #: Token authentication with a token of this cluster's own, so that a token file another Ray of the
        #: machine left in ``~/.ray`` cannot get in the way; the driver sets `auth_env` before ``ray.init``.
        self.auth_env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": uuid.uuid4().hex + uuid.uuid4().hex}

    def _start(self, node: RayNode, args: list[str], slots: int) -> None:
        env = {**os.environ, **self.auth_env, self.MARK_VAR: node.mark, "DOCKER_HOST": node.docker_host,
               "PYTHONPATH": self._pythonpath, "RAY_USAGE_STATS_ENABLED": "0",
               # A lost node is declared dead within seconds (default: ~15 s of missed health checks).
               "RAY_health_check_period_ms": "1000", "RAY_health_check_timeout_ms": "1000",
               "RAY_health_check_failure_threshold": "3"}
        ports = ["--node-manager-port", "--object-manager-port", "--dashboard-agent-listen-port",
                 "--dashboard-agent-grpc-port", "--metrics-export-port", "--runtime-env-agent-port"]
        argv = [shutil.which("ray") or "ray", "start", *args, "--num-cpus=1", "--node-ip-address=127.0.0.1",
                "--disable-usage-stats", f"--object-store-memory={80 * 1024 * 1024}",
                f'--resources={{"harbor_engine": {slots}}}']
        for flag in ports:
            argv.append(f"{flag}={_free_port()}")
        done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=120, cwd="/")
        if done.returncode != 0:
            raise RuntimeError(f"ray start ({node.mark}) failed: {done.stderr[-2000:]}")

    def start(self) -> None:
        self._start(self.head, ["--head", f"--port={self.port}", "--include-dashboard=false",
                                f"--temp-dir={self.temp_dir}"],
                    self._slots["head"])
        self._start(self.worker, [f"--address={self.address}"], self._slots["worker"])

    def learn_node_ids(self, ray) -> None:
        """Which Ray node is the head and which the worker (the head carries ``node:__internal_head__``)."""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            alive = [n for n in ray.nodes() if n["Alive"]]
            if len(alive) == 2:
                for n in alive:
                    target = self.head if "node:__internal_head__" in n["Resources"] else self.worker
                    target.node_id = n["NodeID"]
                return
            time.sleep(0.5)
        raise RuntimeError(f"the cluster did not show 2 live nodes: {ray.nodes()}")

    def stop(self) -> None:
        """Kill every process of both nodes (worker first), wait for them, remove the temp dir."""
        for node in (self.worker, self.head):
            for pid in node.pids():
                try:
                    os.kill(pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (self.head.pids() or self.worker.pids()):
            time.sleep(0.2)
        self.worker.kill()
        self.head.kill()
        shutil.rmtree(self.temp_dir, ignore_errors=True)

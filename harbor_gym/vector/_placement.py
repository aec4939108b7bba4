"""Placement on a Ray cluster of engines (issue 17 item 3): the custom resource `ENGINE_RESOURCE` a node declares when
it has a Docker engine, the bound on waiting for Ray to place work there, and the names of lost nodes.

How a cluster of engines is made (no scheduler of harbor_gym's own: Ray places, by custom resources):

- every node with an engine is started with ``ray start ... --resources='{"harbor_engine": K}'`` and with
  ``DOCKER_HOST`` naming its engine in that command's environment. Ray's raylet hands its environment to the worker
  processes it starts, so harbor_gym's `get_client()` (``docker.from_env``) in an actor or task on that node talks
  to that node's engine, and its sandboxes' leases and reaper live there too (`harbor_gym.sandbox._reaper`);
- every sub-env actor (`harbor_gym.vector._ray`) and every episode task of the collector (`harbor_gym.run.collector`)
  asks for ``{"harbor_engine": 1}`` (`ENGINE_DEMAND`; overridable through the actor or task options), so ``K`` is
  the number of episodes that node's engine runs at once. A node without the resource gets none of them.

Guarantees: work is placed only on nodes declaring the resource; when none can take it within the placement bound
(`PLACEMENT_TIMEOUT_S` by default) the caller raises `SandboxUnavailableError` naming the resource, the demand and
what the cluster offers, instead of waiting forever. A node that dies is named (node id and IP) in the outage of
every episode it was running.
"""

from __future__ import annotations

import os
import time
from typing import Any, Mapping

from harbor_gym.errors import SandboxUnavailableError

__all__ = ["ENGINE_RESOURCE", "ENGINE_DEMAND", "PLACEMENT_TIMEOUT_S", "ray_module", "ensure_ray", "demand_of",
           "offered", "wait_offered", "unplaced_error", "node_lost_error", "here"]

#: The custom resource a Ray node declares when it has a Docker engine (its ``DOCKER_HOST`` names it).
ENGINE_RESOURCE = "harbor_engine"
#: What each sub-env actor and each collector episode asks for by default (one engine slot).
ENGINE_DEMAND: Mapping[str, float] = {ENGINE_RESOURCE: 1.0}
#: How long Ray may take to place an actor (or to offer the resource at all) before `SandboxUnavailableError`.
PLACEMENT_TIMEOUT_S = 60.0


def ray_module():
    """The ``ray`` module (usage statistics kept off the machine). Raises ImportError naming the extra."""
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'harbor-gym[ray]'") from exc
    return ray


def ensure_ray(slots: int) -> Any:
    """Ray, initialised: as the caller initialised it; else connected to ``$RAY_ADDRESS`` (a cluster whose engine
    nodes declare `ENGINE_RESOURCE` themselves); else a one-node local cluster whose node declares ``slots`` of
    `ENGINE_RESOURCE` (this machine's engine). A cluster started with ``ray start`` on this machine is used only
    through ``RAY_ADDRESS`` or the caller's own ``ray.init(address=...)``."""
    ray = ray_module()
    if ray.is_initialized():
        return ray
    if os.environ.get("RAY_ADDRESS"):
        ray.init(log_to_driver=False)
    else:
        ray.init(address="local", include_dashboard=False, log_to_driver=False,
                 resources={ENGINE_RESOURCE: float(max(1, slots))})
    return ray


def demand_of(options: Mapping[str, Any]) -> dict[str, float]:
    """The custom resources ``options`` (Ray actor or task options) ask for."""
    return {str(k): float(v) for k, v in dict(options.get("resources") or {}).items()}


def offered(ray: Any, demand: Mapping[str, float]) -> dict[str, float]:
    """What the cluster's live nodes declare in total of each resource of ``demand``."""
    total = ray.cluster_resources()
    return {name: float(total.get(name, 0.0)) for name in demand}


def wait_offered(ray: Any, demand: Mapping[str, float], *, timeout_s: float = PLACEMENT_TIMEOUT_S,
                 what: str) -> None:
    """Return once some live node could take ``demand`` (each resource declared at least that much in total);
    wait up to ``timeout_s`` for one (an autoscaler adding nodes).

    Raises:
        SandboxUnavailableError: no node offers it within ``timeout_s`` (`unplaced_error`).
    """
    deadline = time.monotonic() + timeout_s
    while True:
        have = offered(ray, demand)
        if all(have[name] >= amount for name, amount in demand.items()):
            return
        if time.monotonic() >= deadline:
            raise unplaced_error(ray, demand, timeout_s=timeout_s, what=what)
        time.sleep(0.5)


def unplaced_error(ray: Any, demand: Mapping[str, float], *, timeout_s: float, what: str,
                   count: int = 1) -> SandboxUnavailableError:
    """The error of work Ray could not place within ``timeout_s``: the demand, and what the cluster offers."""
    have = offered(ray, demand)
    asked = ", ".join(f"{name}={amount:g}" for name, amount in demand.items())
    has = ", ".join(f"{name}={amount:g}" for name, amount in have.items())
    return SandboxUnavailableError(
        f"Ray could not place {what} within {timeout_s:g} s: {count} x {{{asked}}} asked, the cluster's live nodes "
        f"declare {{{has}}} in total (and some may be taken). Start each node that has a Docker engine with "
        f"ray start ... --resources='{{\"{ENGINE_RESOURCE}\": K}}' and DOCKER_HOST naming its engine, or lower "
        f"the demand through the actor/task options' resources", field="executor", retryable=True)


def node_lost_error(node: Mapping[str, str] | None, exc: BaseException, *, what: str) -> SandboxUnavailableError:
    """The outage of work whose Ray node (``{"node_id", "ip"}`` when known) died or became unreachable."""
    if node:
        where = f"Ray node {node.get('node_id', '?')} ({node.get('ip', '?')})"
    else:
        where = "its Ray node"
    return SandboxUnavailableError(f"{what} was lost with {where}: {type(exc).__name__}: {exc}",
                                   field="executor", retryable=True)


def here() -> dict[str, str]:
    """Inside an actor or task: this node's id and IP, and the engine ``DOCKER_HOST`` names here (if any)."""
    import ray

    ctx = ray.get_runtime_context()
    return {"node_id": ctx.get_node_id(), "ip": ray.util.get_node_ip_address(),
            "docker_host": os.environ.get("DOCKER_HOST", "")}

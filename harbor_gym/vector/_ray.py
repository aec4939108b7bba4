"""Sub-envs hosted in Ray actors (extra ``harbor_gym[ray]``): `HarborVectorEnv(executor="ray")`.

One actor per sub-env, placed by Ray on a node declaring the custom resource ``harbor_engine`` (each asks for
``{"harbor_engine": 1}``, `harbor_gym.vector._placement`) and spread over such nodes (``scheduling_strategy=
"SPREAD"``); each builds its env in its own process, so it uses its node's Docker engine (the ``DOCKER_HOST`` of
that node's raylet) and its process's warm pools. Actors not placed within the placement bound (no node offers the
resource, or all of it is taken) raise `SandboxUnavailableError` naming the demand, instead of waiting forever.

Only plain data crosses: the recipe (path + config dict, or a picklable ``env_fn``), seeds, options, actions (a ``str`` or ``Oracle()``; agent
objects are shipped by value on every call), observations (dicts of ``str``/``int``), rewards, flags and infos
whose records travel as ``to_dict()`` and are rebuilt as frozen `TurnRecord`/`EpisodeResult` on the caller's side.

An actor that dies or becomes unreachable (``RayActorError``: its node lost, its process killed) makes its sub-env's
call raise a retryable `SandboxUnavailableError` naming the node (id and IP) the actor was placed on, which the vector
env turns into that sub-env's truncation (an outage, SPEC GYM-2/STOP-8); the next reset of that sub-env starts a new
actor wherever Ray finds a free ``harbor_engine`` (within the placement bound, else that reset fails the same way).
The lost actor's sandboxes are left to their leases: the reaper on that node's engine removes them once the dead
process stops renewing (within ``lease_ttl_s`` + 20 s, `harbor_gym.sandbox._reaper`).
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping

from harbor_gym.vector._placement import (ENGINE_DEMAND, PLACEMENT_TIMEOUT_S, demand_of, ensure_ray, node_lost_error,
                                         ray_module, unplaced_error)
from harbor_gym.vector._subenv import EnvRecipe, info_from_plain, info_to_plain

__all__ = ["RaySubEnv", "make_ray_subenvs", "RemoteEnvError", "DEFAULT_ACTOR_OPTIONS"]

log = logging.getLogger("harbor_gym.vector")

#: ``max_concurrency=2``: the vector env calls one sub-env at a time, except ``close``, which must run beside a busy
#: ``step`` (it stops the env's sandboxes, so the turn ends at once as an outage) instead of queueing behind it.
#: ``resources``: one engine slot of a node declaring ``harbor_engine`` (``ray_actor_options={"resources": {}}``
#: places actors anywhere, as before issue 17).
DEFAULT_ACTOR_OPTIONS: dict[str, Any] = {"num_cpus": 0, "scheduling_strategy": "SPREAD", "max_restarts": 0,
                                         "max_concurrency": 2, "resources": dict(ENGINE_DEMAND)}
#: Bound of an actor's ``close`` (its env and its pools) before the actor is killed anyway.
_CLOSE_TIMEOUT_S = 120.0


class RemoteEnvError(Exception):
    """A sub-env's call raised inside its actor: ``type_name`` is the remote error's class, the message its text."""

    def __init__(self, type_name: str, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.retryable = retryable


class _EnvHost:
    """The actor's body: one env built from a recipe, called with plain data, answering with plain data.

    The env is built by `open` (or the first call needing it), not in ``__init__``: the first method call then tells
    placement (`where`, answered once the actor runs on a node) apart from building the env."""

    def __init__(self, recipe: EnvRecipe) -> None:
        self._recipe = recipe
        self._env: Any = None

    @property
    def env(self) -> Any:
        if self._env is None:
            self._env = self._recipe.build()
        return self._env

    def where(self) -> dict[str, str]:
        """This actor's node (``node_id``, ``ip``) and the engine its ``DOCKER_HOST`` names."""
        from harbor_gym.vector._placement import here

        return here()

    def open(self) -> bool:
        """Build the env; whether its observations carry ``task_id``."""
        space = getattr(getattr(self.env, "unwrapped", self.env), "observation_space", None)
        return bool(space is not None and "task_id" in getattr(space, "spaces", {}))

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> dict[str, Any]:
        try:
            obs, info = self.env.reset(seed=seed, options=options)
        except Exception as exc:  # the error crosses as data; the caller raises it for the vector env
            return _error(exc)
        return {"obs": obs, "info": info_to_plain(info)}

    def step(self, action: Any) -> dict[str, Any]:
        try:
            obs, reward, term, trunc, info = self.env.step(action)
        except Exception as exc:
            return _error(exc)
        return {"obs": obs, "reward": float(reward), "terminated": bool(term), "truncated": bool(trunc),
                "info": info_to_plain(info)}

    def close(self) -> None:
        from harbor_gym.sandbox.pool import close_pools

        try:
            if self._env is not None:
                self._env.close()
        finally:
            close_pools()


def _error(exc: BaseException) -> dict[str, Any]:
    return {"error": {"type": type(exc).__name__, "message": str(exc),
                      "retryable": bool(getattr(exc, "retryable", True))}}


def _unwrap(reply: Mapping[str, Any]) -> Mapping[str, Any]:
    err = reply.get("error")
    if err is not None:
        raise RemoteEnvError(err["type"], err["message"], err["retryable"])
    return reply


class RaySubEnv:
    """A sub-env in a Ray actor (the vector env calls it from its worker threads; each call blocks on the actor).

    Attributes:
        node: where the actor runs (``node_id``, ``ip``, ``docker_host``), known once it is placed.
        has_task_id: whether observations carry ``task_id`` (set by `make_ray_subenvs` once the actor is up).
    """

    def __init__(self, recipe: EnvRecipe, actor_options: Mapping[str, Any], *,
                 placement_timeout_s: float = PLACEMENT_TIMEOUT_S) -> None:
        self._recipe = recipe
        self._options = dict(actor_options)
        self._placement_timeout_s = float(placement_timeout_s)
        self._actor = None
        self._where_ref = None
        self._dead = False
        self.node: dict[str, str] | None = None
        self.has_task_id = False
        self._start_actor()

    def _start_actor(self) -> None:
        """Ask Ray for a new actor (placement is awaited by `_await_placement`)."""
        ray = ray_module()
        remote_cls = ray.remote(_EnvHost)
        self._actor = remote_cls.options(**self._options).remote(self._recipe)
        self._where_ref = self._actor.where.remote()
        self.node = None
        self._dead = False

    def _placed(self, deadline: float) -> bool:
        """Wait until Ray placed the actor, at most until ``deadline`` (monotonic); whether it was.

        Raises:
            SandboxUnavailableError: the actor died before answering (its node lost at once).
        """
        ray = ray_module()
        ready, _ = ray.wait([self._where_ref], timeout=max(0.0, deadline - time.monotonic()))
        if not ready:
            return False
        try:
            self.node = ray.get(self._where_ref)
        except ray.exceptions.RayActorError as exc:
            self._dead = True
            raise node_lost_error(None, exc, what="a new sub-env actor") from exc
        return True

    def _ensure_actor(self) -> None:
        """A live, placed actor (a new one after a death), within the placement bound.

        Raises:
            SandboxUnavailableError: not placed in time (the request is withdrawn), or lost at once.
        """
        if self._actor is None or self._dead:
            self._kill()
            self._start_actor()
        if self.node is None and not self._placed(time.monotonic() + self._placement_timeout_s):
            self._kill()
            raise unplaced_error(ray_module(), demand_of(self._options), timeout_s=self._placement_timeout_s,
                                 what="a HarborVectorEnv sub-env actor")

    def _call(self, method: str, *args: Any) -> Any:
        ray = ray_module()
        try:
            return ray.get(getattr(self._actor, method).remote(*args))
        except ray.exceptions.RayActorError as exc:  # died, or unreachable (its node lost): this episode is gone
            self._dead = True
            raise node_lost_error(self.node, exc, what=f"sub-env actor ({method})") from exc

    @property
    def node_id(self) -> str:
        """The id of the Ray node the actor runs on."""
        self._ensure_actor()
        return self.node["node_id"] if self.node else ""

    def open(self) -> None:
        """Build the env in the (placed) actor and learn whether its observations carry ``task_id``."""
        self._ensure_actor()
        self.has_task_id = bool(self._call("open"))

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[dict, dict]:
        self._ensure_actor()
        reply = _unwrap(self._call("reset", seed, options))
        return reply["obs"], info_from_plain(reply["info"])

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        if self._dead:  # the actor of this episode is gone: the episode with it (no new one without a reset)
            raise node_lost_error(self.node, RuntimeError("the actor died earlier"), what="sub-env actor (step)")
        reply = _unwrap(self._call("step", action))
        return (reply["obs"], reply["reward"], reply["terminated"], reply["truncated"],
                info_from_plain(reply["info"]))

    def close(self) -> None:
        ray = ray_module()
        if self._actor is None:
            return
        try:
            if not self._dead and self.node is not None:
                ray.get(self._actor.close.remote(), timeout=_CLOSE_TIMEOUT_S)
        except Exception as exc:  # a dead or stuck actor: its containers' leases remove them
            log.warning("closing a Ray sub-env failed: %s", exc)
        finally:
            self._kill()

    def _kill(self) -> None:
        ray = ray_module()
        actor, self._actor = self._actor, None
        self._where_ref = None
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception as exc:  # already gone
                log.debug("ray.kill: %s", exc)


def make_ray_subenvs(recipes: list[EnvRecipe], *, actor_options: Mapping[str, Any] | None = None,
                     placement_timeout_s: float = PLACEMENT_TIMEOUT_S) -> list[RaySubEnv]:
    """One actor per recipe, each placed by Ray on a node declaring ``harbor_engine`` (`DEFAULT_ACTOR_OPTIONS`,
    overridden key by key by ``actor_options``); Ray is initialised by `ensure_ray` if it is not.

    Guarantees: on return every actor is placed and its env built. On raise every actor asked for is gone.

    Raises:
        ImportError: Ray is not installed.
        SandboxUnavailableError: some actor was not placed within ``placement_timeout_s`` (all together).
        Whatever an env's construction raises (as `RemoteEnvError` text inside Ray's error).
    """
    ray = ensure_ray(len(recipes))
    options = {**DEFAULT_ACTOR_OPTIONS, **dict(actor_options or {})}
    subs: list[RaySubEnv] = []
    try:
        for recipe in recipes:
            subs.append(RaySubEnv(recipe, options, placement_timeout_s=placement_timeout_s))
        deadline = time.monotonic() + placement_timeout_s  # actors are placed in parallel: one deadline for all
        unplaced = [sub for sub in subs if not sub._placed(deadline)]
        if unplaced:
            raise unplaced_error(ray, demand_of(options), timeout_s=placement_timeout_s,
                                 what=f"{len(unplaced)} of HarborVectorEnv's {len(subs)} sub-env actors",
                                 count=len(subs))
        # Envs are built in parallel; wait for all of them (an env refused in its actor raises here).
        flags = ray.get([sub._actor.open.remote() for sub in subs])
        for sub, flag in zip(subs, flags):
            sub.has_task_id = bool(flag)
    except BaseException:
        for sub in subs:
            sub.close()
        raise
    return subs

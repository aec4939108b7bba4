"""Sub-envs hosted in Ray actors (extra ``harbor_gym[ray]``): `HarborVectorEnv(executor="ray")`.

One actor per sub-env, spread over the cluster's nodes (``scheduling_strategy="SPREAD"``); each builds its env in
its own process, so it uses its node's Docker engine and its process's warm pools. Only plain data crosses: the
recipe (path + config dict, or a picklable ``env_fn``), seeds, options, actions (a ``str`` or ``Oracle()``; agent
objects are shipped by value on every call), observations (dicts of ``str``/``int``), rewards, flags and infos
whose records travel as ``to_dict()`` and are rebuilt as frozen `TurnRecord`/`EpisodeResult` on the caller's side.

An actor that dies (its node lost) makes its sub-env's call fail, which the vector env turns into that sub-env's
truncation; the next reset of that sub-env starts a new actor.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Mapping

from harbor_gym.vector._subenv import EnvRecipe, info_from_plain, info_to_plain

__all__ = ["RaySubEnv", "make_ray_subenvs", "RemoteEnvError"]

log = logging.getLogger("harbor_gym.vector")

#: ``max_concurrency=2``: the vector env calls one sub-env at a time, except ``close``, which must run beside a busy
#: ``step`` (it stops the env's sandboxes, so the turn ends at once as an outage) instead of queueing behind it.
_DEFAULT_OPTIONS: dict[str, Any] = {"num_cpus": 0, "scheduling_strategy": "SPREAD", "max_restarts": 0,
                                    "max_concurrency": 2}
#: Bound of an actor's ``close`` (its env and its pools) before the actor is killed anyway.
_CLOSE_TIMEOUT_S = 120.0


def _ray():
    # Ray's usage statistics would be sent off the machine; harbor_gym never lets them go out.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    try:
        import ray
    except ImportError as exc:
        raise ImportError("executor='ray' needs Ray: pip install 'harbor-gym[ray]'") from exc
    return ray


class RemoteEnvError(Exception):
    """A sub-env's call raised inside its actor: ``type_name`` is the remote error's class, the message its text."""

    def __init__(self, type_name: str, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.type_name = type_name
        self.retryable = retryable


class _EnvHost:
    """The actor's body: one env built from a recipe, called with plain data, answering with plain data."""

    def __init__(self, recipe: EnvRecipe) -> None:
        self.env = recipe.build()

    def node(self) -> str:
        import ray

        return ray.get_runtime_context().get_node_id()

    def has_task_id(self) -> bool:
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
            self.env.close()
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
    """A sub-env in a Ray actor (the vector env calls it from its worker threads; each call blocks on the actor)."""

    def __init__(self, recipe: EnvRecipe, actor_options: Mapping[str, Any]) -> None:
        self._recipe = recipe
        self._options = dict(actor_options)
        self._actor = None
        self._dead = False
        self._start_actor()
        #: Whether observations carry ``task_id`` (set by `make_ray_subenvs` once the actor is up).
        self.has_task_id = False

    def _start_actor(self) -> None:
        ray = _ray()
        remote_cls = ray.remote(_EnvHost)
        self._actor = remote_cls.options(**self._options).remote(self._recipe)
        self._dead = False

    def _call(self, method: str, *args: Any) -> Any:
        ray = _ray()
        try:
            return ray.get(getattr(self._actor, method).remote(*args))
        except ray.exceptions.RayActorError:
            self._dead = True
            raise

    @property
    def node_id(self) -> str:
        """The id of the Ray node the actor runs on."""
        return self._call("node")

    def reset(self, seed: int | None, options: dict[str, Any] | None) -> tuple[dict, dict]:
        if self._dead:
            self._kill()
            self._start_actor()
        reply = _unwrap(self._call("reset", seed, options))
        return reply["obs"], info_from_plain(reply["info"])

    def step(self, action: Any) -> tuple[dict, float, bool, bool, dict]:
        reply = _unwrap(self._call("step", action))
        return (reply["obs"], reply["reward"], reply["terminated"], reply["truncated"],
                info_from_plain(reply["info"]))

    def close(self) -> None:
        ray = _ray()
        if self._actor is None:
            return
        try:
            if not self._dead:
                ray.get(self._actor.close.remote(), timeout=_CLOSE_TIMEOUT_S)
        except Exception as exc:  # a dead or stuck actor: its containers' leases remove them
            log.warning("closing a Ray sub-env failed: %s", exc)
        finally:
            self._kill()

    def _kill(self) -> None:
        ray = _ray()
        actor, self._actor = self._actor, None
        if actor is not None:
            try:
                ray.kill(actor)
            except Exception as exc:  # already gone
                log.debug("ray.kill: %s", exc)


def make_ray_subenvs(recipes: list[EnvRecipe], *, actor_options: Mapping[str, Any] | None = None) -> list[RaySubEnv]:
    """One actor per recipe, spread over the cluster (``ray.init()`` is called if Ray is not initialised).

    Raises:
        ImportError: Ray is not installed. Whatever an env's construction raises (every actor made is closed).
    """
    ray = _ray()
    if not ray.is_initialized():
        ray.init()
    options = {**_DEFAULT_OPTIONS, **dict(actor_options or {})}
    subs: list[RaySubEnv] = []
    try:
        for recipe in recipes:
            subs.append(RaySubEnv(recipe, options))
        # Actors start in parallel; wait for all of them (an env refused in its actor raises here).
        flags = ray.get([sub._actor.has_task_id.remote() for sub in subs])
        for sub, flag in zip(subs, flags):
            sub.has_task_id = bool(flag)
    except BaseException:
        for sub in subs:
            sub.close()
        raise
    return subs

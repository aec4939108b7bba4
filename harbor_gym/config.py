"""`EnvConfig`: the one settings object of harbor_gym, and the host settings file that feeds its image defaults.

Every knob SPEC.md gives to ``EnvConfig`` lives here, with its default. The object is frozen and JSON-serialisable,
and every place that takes one also takes a plain ``dict`` (``EnvConfig.coerce``), so
``gymnasium.make(id, config={...})`` and ``EnvSpec.to_json`` work.

Host settings (image aliases, rootfs aliases, pull policy) come from explicit configuration only, never from probing
the machine: an ``EnvConfig`` field when given, else the host settings file (``$HARBOR_GYM_SETTINGS``, else
``~/.cache/harbor_gym/settings.toml``, written by ``scripts/setup-host.sh``), else the built-in default; the
environment variable ``HARBOR_GYM_PULL_POLICY`` overrides the file's pull policy.
"""

from __future__ import annotations

import os
import tomllib
from enum import Enum
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from harbor_gym.errors import ConfigError

__all__ = [
    "EnvConfig",
    "Semantics",
    "TurnSessions",
    "DeadlineClock",
    "PullPolicy",
    "BackendName",
    "AgentOutcomePolicy",
    "ModelEnvNames",
    "HostSettings",
    "host_settings",
    "settings_path",
]


class Semantics(str, Enum):
    """Which side of SPEC §14 applies: the Seed (default) or Harbor 0.25.0."""

    SEED = "seed"
    HARBOR = "harbor"


class TurnSessions(str, Enum):
    """SES-1: a fresh harness session per turn, or one continued session per episode."""

    FRESH = "fresh"
    CONTINUE = "continue"


class DeadlineClock(str, Enum):
    """BUD-6: count only time inside ``reset()``/``step()`` (``env``), or wall-clock time (``wall``)."""

    ENV = "env"
    WALL = "wall"


class PullPolicy(str, Enum):
    """When a named image that is not present locally may be pulled."""

    MISSING = "missing"
    NEVER = "never"
    ALWAYS = "always"


class BackendName(str, Enum):
    """The sandbox backend: ``docker`` when an engine answers, else ``local`` (bubblewrap), for ``auto``; ``podman``
    (its Docker-compatible API) only when asked for."""

    AUTO = "auto"
    DOCKER = "docker"
    PODMAN = "podman"
    LOCAL = "local"


class AgentOutcomePolicy(str, Enum):
    """GYM-5/STOP-6: what an agent ``error`` outcome without its own policy does."""

    GRADE = "grade"
    RETRY = "retry"
    FAIL = "fail"


_ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"


class ModelEnvNames(BaseModel):
    """Issue 18: the names of the variables an activation's commands get when `EnvConfig.model_upstream` is set
    (``None``: that variable is not set). The base URLs point at the episode's capture proxy as the sandbox
    reaches it; both keys hold the episode's session token, never the upstream's key."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    openai_base_url: str | None = Field("OPENAI_BASE_URL", pattern=_ENV_NAME,
                                        description="The proxy's OpenAI base URL, http://ADDR:PORT/v1.")
    anthropic_base_url: str | None = Field("ANTHROPIC_BASE_URL", pattern=_ENV_NAME,
                                           description="The proxy's Anthropic base URL, http://ADDR:PORT (clients "
                                           "append /v1/messages).")
    openai_api_key: str | None = Field("OPENAI_API_KEY", pattern=_ENV_NAME,
                                       description="The session token, sent as `Authorization: Bearer`.")
    anthropic_api_key: str | None = Field("ANTHROPIC_API_KEY", pattern=_ENV_NAME,
                                          description="The session token, sent as `x-api-key`.")

    @model_validator(mode="after")
    def _distinct(self) -> "ModelEnvNames":
        names = [n for n in (self.openai_base_url, self.anthropic_base_url, self.openai_api_key,
                             self.anthropic_api_key) if n]
        if len(set(names)) != len(names):
            raise ValueError(f"model_env: the variable names must differ, got {names}")
        return self


def settings_path() -> Path:
    """The host settings file: ``$HARBOR_GYM_SETTINGS``, else ``$HARBOR_GYM_CACHE/settings.toml``."""
    explicit = os.environ.get("HARBOR_GYM_SETTINGS")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("HARBOR_GYM_CACHE") or str(Path.home() / ".cache" / "harbor_gym")
    return Path(cache) / "settings.toml"


class HostSettings(BaseModel):
    """What the host settings file holds (see the module docstring)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    pull_policy: PullPolicy = PullPolicy.MISSING
    image_aliases: dict[str, str] = Field(default_factory=dict)
    rootfs_aliases: dict[str, str] = Field(default_factory=dict)
    registry: str | None = None


def host_settings() -> HostSettings:
    """Read the host settings file (missing file = built-in defaults) and apply ``HARBOR_GYM_PULL_POLICY``.

    Raises:
        ConfigError: the file exists but is not valid TOML or holds invalid values.
    """
    path = settings_path()
    data: dict[str, Any] = {}
    if path.is_file():
        try:
            data = tomllib.loads(path.read_text(encoding="utf-8"))
        except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
            raise ConfigError(f"not valid TOML: {exc}", path=path) from exc
    env_policy = os.environ.get("HARBOR_GYM_PULL_POLICY")
    if env_policy:
        data["pull_policy"] = env_policy
    try:
        return HostSettings.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_first_error(exc), path=path) from exc


def _first_error(exc: ValidationError) -> str:
    err = exc.errors()[0]
    loc = ".".join(str(p) for p in err["loc"])
    return f"{loc}: {err['msg']}" if loc else err["msg"]


class EnvConfig(BaseModel):
    """Settings of an env, an episode and a run. Frozen; JSON round-trips; a ``dict`` is accepted wherever it is.

    ``None`` on an image field means "not given here: take the host settings file" (see the module docstring).
    """

    model_config = ConfigDict(frozen=True, extra="forbid", use_enum_values=False)

    # --- semantics -------------------------------------------------------------------------------------
    semantics: Semantics = Field(Semantics.SEED, description="SPEC §14: 'seed' (default) or 'harbor' (Harbor 0.25.0).")
    turn_sessions: TurnSessions = Field(TurnSessions.FRESH, description="SES-1: 'fresh' (default) or 'continue'.")
    prompt_template: str | None = Field(
        None, description="TURN-9: a Jinja2 template using `instruction`, wrapping turn 1's instruction. None: none."
    )
    agent_outcome_policy: AgentOutcomePolicy = Field(
        AgentOutcomePolicy.GRADE, description="GYM-5/STOP-6: policy for an agent `error` outcome that names none."
    )
    separate_verifier_for_artifacts: bool = Field(
        False, description="VER-2: a turn whose task or step declares artifacts verifies `separate`."
    )
    freeze_agent_during_verify: bool | Literal["auto"] = Field(
        "auto",
        description="GYM-11: while a verifier runs in the agent's sandbox, stop (SIGSTOP) every other process in "
        "it as the kernel sees it, except init and the verifier's own processes; 'auto' (default) also exempts "
        "processes holding a listening socket (services), which are listed in the turn record; True stops "
        "services too; False: the seed's unfrozen behaviour.",
    )

    # --- budgets (BUD) ---------------------------------------------------------------------------------
    step_setup_timeout_s: float | None = Field(
        None, gt=0, description="BUD-4: bound of setup.sh. None: the turn's agent budget (unbounded if that is)."
    )
    verifier_grace_s: float = Field(30.0, ge=0, description="VER-7/BUD-6: host wait past the verifier budget.")
    harness_setup_allowance_s: float = Field(
        360.0, ge=0, description="BUD-6: per-step harness setup allowance (Harbor's base 360 s)."
    )
    enforce_task_timeouts: bool = Field(True, description="BUD-6/7: derive the episode deadline from the task.")
    deadline_clock: DeadlineClock = Field(DeadlineClock.ENV, description="BUD-6: 'env' (default) or 'wall'.")
    default_episode_timeout_seconds: float = Field(
        21_600.0, gt=0, description="BUD-6/7: deadline when not enforced; warning threshold when enforced."
    )
    timeout_multiplier: float | None = Field(
        None, gt=0, allow_inf_nan=False, description="BUD-1/2: overrides the dataset's multiplier. None: dataset's (1.0)."
    )

    # --- sandboxes -------------------------------------------------------------------------------------
    backend: BackendName = Field(BackendName.AUTO, description="'auto' (docker if an engine answers, else local), 'docker', 'podman' or 'local'.")
    engines: tuple[str, ...] = Field(
        (), description="Issue 17: Docker host URLs (unix://, tcp://, ssh://) whose engines share this config's "
        "episodes (harbor_gym.sandbox.engines: least in-flight episodes first; an engine that stops answering is out "
        "for engine_probe_interval_s, its episodes' outages naming it). Empty: the one engine the environment names "
        "(DOCKER_HOST). Needs backend 'docker' or 'auto'.",
    )
    engine_sockets: dict[str, str] = Field(
        default_factory=dict, description="Issue 17: engine URL -> the path of that engine's socket on its own host, "
        "mounted into its lease reaper (default: a unix:// URL's path, else /var/run/docker.sock).",
    )
    engine_probe_interval_s: float = Field(
        30.0, gt=0, allow_inf_nan=False, description="Issue 17: how long an engine of `engines` that stopped "
        "answering stays out before it is probed again.",
    )
    seed_retries: int = Field(2, ge=0, description="GYM-2: retries of a sandbox outage while seeding.")
    pull_policy: PullPolicy | None = Field(None, description="None: the host settings file's (default 'missing').")
    image_aliases: dict[str, str] | None = Field(
        None, description="Public image name -> local image. None: the host settings file's table."
    )
    rootfs_aliases: dict[str, str] | None = Field(
        None, description="Image name -> unpacked root filesystem folder (local backend). None: host settings."
    )
    copy_file_cap_bytes: int = Field(
        10 << 20, ge=1 << 20, description="GYM-10: real bytes copied out of a sandbox per file (artifacts, "
        "test-stdout.txt, logs); a longer file is truncated and its manifest entry says `truncated`.",
    )
    copy_turn_cap_bytes: int = Field(
        100 << 20, ge=10 << 20, description="GYM-10: real bytes copied out of a sandbox per turn, all files together; "
        "past it, further files are truncated or skipped and say so.",
    )
    reward_file_cap_bytes: int = Field(
        64 << 10, ge=1024, description="RWD-1..3/GYM-10: a reward.json or reward.txt longer than this is invalid "
        "(never truncated, never judged on its first bytes).",
    )
    default_storage_mb: int | None = Field(
        10240, ge=16, description="GYM-10: writable size of a sandbox whose task sets no `storage_mb`. None lifts "
        "it. A backend that cannot bound size refuses the task at seed, naming why.",
    )
    default_memory_mb: int | None = Field(
        4096, ge=16, description="GYM-10: memory of a sandbox whose task sets no `memory_mb`. None lifts it.",
    )
    unfiltered_network: Literal["refuse", "allow"] = Field(
        "refuse", description="GYM-10: where harbor_gym cannot install its host-side network filter (a remote or "
        "rootless engine), a task with a public network would reach host services and sibling sandboxes: 'refuse' "
        "(default) refuses it at seed, naming why; 'allow' runs it unfiltered.",
    )
    retry_agent_outages: bool = Field(
        False, description="GYM-12: retry agent-caused outages like any outage (the seed's rule) in `harbor-gym run` "
        "and the rollout collector. False (default): an agent-caused outage is a failed rollout, not retried.",
    )
    async_concurrency: int = Field(
        64, ge=1, description="Issue 15: threads of the process-wide pool that runs env.areset/env.astep sandbox "
        "work (one per env in flight; an async agent's turn.aexec runs on its turn's thread). At most this many "
        "resets/turns run at once across the envs that share it; more wait without blocking the event loop. "
        "harbor_gym.rollouts uses its own pool of `concurrency` threads instead.",
    )
    output_cap_bytes: int = Field(
        1 << 20, ge=1024, description="Cap of each captured stdout/stderr; longer output is cut with a marker."
    )
    lease_ttl_s: float = Field(
        60.0, ge=5, description="A sandbox whose lease is not renewed for this long removes itself."
    )
    pids_limit: int | None = Field(
        4096, ge=1, description="Pids per sandbox (agent sandbox, separate verifier sandboxes, compose service "
        "main), so that a fork bomb cannot reach the host; None: no limit. The task format has no such field, so "
        "this is a harness guard. The local backend enforces it through a pids cgroup and refuses to start where "
        "it cannot (LOAD-24): set None there.",
    )
    labels: dict[str, str] = Field(
        default_factory=dict,
        description="Extra labels on every container this config starts (e.g. an experiment id); {}: none.",
    )
    logs_root: str | None = Field(
        None, description="Turn logs land here and are kept; None: a temporary folder removed at close."
    )
    host_env_allowlist: tuple[str, ...] = Field(
        (), description="FMT-15/compose interpolation: host variables a task may read (env templates such as "
        "${VAR} and ${VAR:-default}, ${VAR} in environment/docker-compose.yaml). A variable outside it counts as "
        "unset: the default is used, the host is never read; a template without a default is refused at seed "
        "(LOAD-23), naming the variable. (): no host variable is readable.",
    )
    model_upstream: "ModelUpstream | None" = Field(
        None, description="Issue 18: the OpenAI-compatible policy server behind each episode's capture proxy "
        "(harbor_gym.proxy.ModelUpstream: base URL, the NAME of the host variable holding its key, request "
        "rewrites). Set: every episode opens a proxy session, its agent sandbox gets a route to the proxy (and "
        "nothing else of the host), each activation's commands get the variables of `model_env`, and the calls "
        "they make land in info['turn'].model_calls; refused at seed where sandboxes have no route. None: no proxy.",
    )
    model_env: ModelEnvNames = Field(
        default_factory=ModelEnvNames, description="Issue 18: names of the variables an activation gets with "
        "`model_upstream` (OPENAI_BASE_URL, ANTHROPIC_BASE_URL, OPENAI_API_KEY, ANTHROPIC_API_KEY by default).",
    )
    registry: str | None = Field(
        None, description="Datasets by name (NAME@VERSION): a registry file in Harbor's registry.json format, a "
        "local path or an http(s) URL. None: the host settings file's `registry`, else none (names do not resolve).",
    )
    pool_size: int = Field(
        0, ge=0, description="Warm pool bound per sandbox spec (harbor_gym.sandbox.pool): N pristine sandboxes "
        "started and seeded (GYM-2: workdir, environment/ files, [environment].healthcheck) ahead, so that reset "
        "claims one instead of starting and seeding it. N > 0 alone switches pools on for HarborEnv, Episode, the "
        "vector env and `harbor-gym run` (the default sandbox factory becomes pool_factory(config)). Pools are "
        "process-wide: their warm sandboxes run and hold the process lease until close_pools() or interpreter exit "
        "removes them; an env's close() removes only the sandboxes its episodes used. A handed-out sandbox is never "
        "reused. 0: no pool (reset starts and seeds its own sandbox).",
    )

    @field_validator("prompt_template")
    @classmethod
    def _template_compiles(cls, value: str | None) -> str | None:
        if value is None:
            return value
        import jinja2

        try:
            jinja2.Environment(undefined=jinja2.StrictUndefined).from_string(value)
        except jinja2.TemplateSyntaxError as exc:
            raise ValueError(f"prompt_template is not a valid Jinja2 template: {exc}") from exc
        return value

    @field_validator("engines")
    @classmethod
    def _engine_urls(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        from harbor_gym.sandbox.engines import url_problem

        for url in value:
            problem = url_problem(url)
            if problem:
                raise ValueError(f"engines: {problem}")
        if len(set(value)) != len(value):
            raise ValueError("engines: an engine is listed twice")
        return tuple(value)

    @model_validator(mode="after")
    def _engines_need_docker(self) -> "EnvConfig":
        if self.engines and self.backend not in (BackendName.AUTO, BackendName.DOCKER):
            raise ValueError(f"engines are Docker engines; backend {self.backend.value!r} cannot use them (use "
                             "'docker' or 'auto')")
        unknown = sorted(set(self.engine_sockets) - set(self.engines))
        if unknown:
            raise ValueError(f"engine_sockets names {unknown[0]!r}, which is not one of engines")
        return self

    @model_validator(mode="after")
    def _upstream_key_unreadable(self) -> "EnvConfig":
        """Issue 18: the upstream's key never reaches a sandbox, so no task may read its host variable (FMT-15
        templates and compose interpolation read exactly `host_env_allowlist`)."""
        key_env = getattr(self.model_upstream, "api_key_env", None)
        if key_env and key_env in self.host_env_allowlist:
            raise ValueError(f"host_env_allowlist names {key_env!r}, the variable holding model_upstream's key "
                             "(model_upstream.api_key_env): a task could read the key through an env template or "
                             "its compose file; take it out of host_env_allowlist")
        return self

    @classmethod
    def coerce(cls, value: "EnvConfig | dict[str, Any] | None") -> "EnvConfig":
        """Return ``value`` as an `EnvConfig` (``None`` = defaults, a ``dict`` is validated).

        Raises:
            ConfigError: an unknown key or an invalid value, named.
        """
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if isinstance(value, dict):
            try:
                return cls.model_validate(value)
            except ValidationError as exc:
                raise ConfigError(_first_error(exc), field="EnvConfig") from exc
        raise ConfigError(f"expected EnvConfig or dict, got {type(value).__name__}", field="EnvConfig")

    def replace(self, **changes: Any) -> "EnvConfig":
        """A copy with ``changes`` applied and validated."""
        return self.coerce({**self.model_dump(mode="json"), **{k: _jsonable(v) for k, v in changes.items()}})

    # --- effective image settings ----------------------------------------------------------------------
    def effective_pull_policy(self) -> PullPolicy:
        """The pull policy in force: this config's, else the host settings file's."""
        return self.pull_policy if self.pull_policy is not None else host_settings().pull_policy

    def effective_image_aliases(self) -> dict[str, str]:
        """The image alias table in force: this config's, else the host settings file's."""
        return dict(self.image_aliases) if self.image_aliases is not None else dict(host_settings().image_aliases)

    def effective_registry(self) -> str | None:
        """The dataset registry in force (path or URL): this config's, else the host settings file's, else None."""
        return self.registry if self.registry is not None else host_settings().registry

    def effective_rootfs_aliases(self) -> dict[str, str]:
        """The rootfs alias table in force: this config's, else the host settings file's."""
        return dict(self.rootfs_aliases) if self.rootfs_aliases is not None else dict(host_settings().rootfs_aliases)


def _jsonable(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else value


# Issue 18: ModelUpstream lives in harbor_gym.proxy, which imports harbor_gym.agents, which imports this module;
# imported last, once every name above exists, then the forward reference of `model_upstream` is resolved.
from harbor_gym.proxy import ModelUpstream  # noqa: E402

EnvConfig.model_rebuild()

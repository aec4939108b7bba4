"""harbor_gym.episode: the turn engine (SPEC §4-§11, §13, §14) — `Episode`, its frozen results, and oracle
validation. It knows no Gymnasium; `harbor_gym.env` adapts it."""

from harbor_gym.episode._engine import (
    ENGINE_ERROR_KIND,
    HEALTHCHECK_FAILED,
    SETUP_FAILED,
    WORKDIR_FAILED,
    Episode,
    EpisodeState,
)
from harbor_gym.episode._records import EpisodeResult, ManifestEntry, TurnRecord, TurnResult
from harbor_gym.episode._stop import (
    AGENT_FAILED_KIND,
    AGENT_RETRY_KIND,
    DEADLINE_KIND,
    DEADLINE_NOT_ENFORCED_KIND,
    OUTAGE_KIND,
)
from harbor_gym.episode._validate import StepValidation, ValidationReport, validate, validate_paths

__all__ = [
    "Episode",
    "EpisodeState",
    "TurnResult",
    "TurnRecord",
    "EpisodeResult",
    "ManifestEntry",
    "validate",
    "validate_paths",
    "ValidationReport",
    "StepValidation",
    "SETUP_FAILED",
    "WORKDIR_FAILED",
    "HEALTHCHECK_FAILED",
    "OUTAGE_KIND",
    "AGENT_RETRY_KIND",
    "AGENT_FAILED_KIND",
    "DEADLINE_KIND",
    "DEADLINE_NOT_ENFORCED_KIND",
    "ENGINE_ERROR_KIND",
]

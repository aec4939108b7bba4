"""harbor_gym.task: the pure task layer — ``task.toml`` models, ``load_task``, ``load_dataset`` (SPEC §2-3).

Nothing here starts a sandbox or needs Docker. ``load_task(path)`` returns a frozen, picklable :class:`Task`
whose :class:`Step` turns carry their resolved files, raw budgets, users and verifier modes; LOAD-1..16 raise
``TaskLoadError``.
"""

from harbor_gym.task.dataset import DATASET_SETTINGS_FILE, Dataset, load_dataset
from harbor_gym.task.files import HARBORIGNORE, upload_listing
from harbor_gym.task.loader import check_timeout_multiplier, load_task, verifier_image_source
from harbor_gym.task.models import (
    STEP_NAME_PATTERN,
    TASK_NAME_PATTERN,
    AgentConfig,
    ArtifactEntry,
    Author,
    CollectHook,
    DatasetSettings,
    EnvironmentConfig,
    HealthcheckConfig,
    MultiStepRewardStrategy,
    NetworkMode,
    OperatingSystem,
    SolutionConfig,
    StepAgentConfig,
    StepConfig,
    StepVerifierConfig,
    TaskConfig,
    TaskMeta,
    VerifierConfig,
    VerifierEnvironmentMode,
    is_network_restriction,
    resolve_verifier_mode,
)
from harbor_gym.task.resolved import (
    ImageSourceKind,
    Step,
    StepArtifact,
    Task,
    VerifierImageSource,
    effective_verifier_mode,
)
from harbor_gym.task.text import is_env_template, resolve_env_templates, strip_canary
from harbor_gym.task.toml_io import (
    LegacyKeyWarning,
    UnknownKeyWarning,
    dump_task_toml,
    parse_task_toml,
    task_config_from_dict,
)

__all__ = [
    "DATASET_SETTINGS_FILE",
    "HARBORIGNORE",
    "STEP_NAME_PATTERN",
    "TASK_NAME_PATTERN",
    "AgentConfig",
    "ArtifactEntry",
    "Author",
    "CollectHook",
    "Dataset",
    "DatasetSettings",
    "EnvironmentConfig",
    "HealthcheckConfig",
    "ImageSourceKind",
    "LegacyKeyWarning",
    "MultiStepRewardStrategy",
    "NetworkMode",
    "OperatingSystem",
    "SolutionConfig",
    "Step",
    "StepAgentConfig",
    "StepArtifact",
    "StepConfig",
    "StepVerifierConfig",
    "Task",
    "TaskConfig",
    "TaskMeta",
    "UnknownKeyWarning",
    "VerifierConfig",
    "VerifierEnvironmentMode",
    "VerifierImageSource",
    "check_timeout_multiplier",
    "dump_task_toml",
    "effective_verifier_mode",
    "is_env_template",
    "is_network_restriction",
    "load_dataset",
    "load_task",
    "parse_task_toml",
    "resolve_env_templates",
    "resolve_verifier_mode",
    "strip_canary",
    "task_config_from_dict",
    "upload_listing",
    "verifier_image_source",
]

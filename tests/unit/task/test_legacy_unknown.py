"""FMT-13 legacy keys and FMT-14 unknown keys."""

from __future__ import annotations

import warnings

import pytest

from harbor_gym.task import LegacyKeyWarning, UnknownKeyWarning, load_task

from .conftest import IMAGE, steps_toml


def _load(build, toml, **kwargs):
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        task = load_task(
            build.single(toml=toml) if "[[steps]]" not in toml else build.multi(toml=toml, steps=["one"])
        )
    return task, caught


@pytest.mark.parametrize(
    ("text", "mb"),
    [("2G", 2048), ("512M", 512), ("1024K", 1), ("1500K", 1), ("1.5G", 1536), ("4g", 4096), ("2GB", 2048)],
)
def test_fmt_13_memory_and_storage_strings(build, text, mb):
    # SPEC: FMT-13 — x1024, x1, /1024, truncated
    task, _ = _load(build, IMAGE + f'memory = "{text}"\nstorage = "{text}"\n')
    assert task.config.environment.memory_mb == mb and task.config.environment.storage_mb == mb


def test_fmt_13_bad_size_string(build):
    # SPEC: FMT-13 / LOAD-1
    from harbor_gym.errors import TaskLoadError

    with pytest.raises(TaskLoadError, match=r"environment\.memory.*LOAD-1"):
        _load(build, IMAGE + 'memory = "lots"\n')
    with pytest.raises(TaskLoadError, match=r"environment\.memory.*LOAD-1"):
        _load(build, IMAGE + "memory = 2048\n")
    with pytest.raises(TaskLoadError, match=r"environment\.memory_mb.*LOAD-1"):
        _load(build, IMAGE + 'memory = "1023K"\n')  # truncates to 0 MiB, which is not > 0


def test_fmt_13_version_is_schema_version(build):
    # SPEC: FMT-13 — an explicit schema_version wins
    task, _ = _load(build, 'version = "1.1"\n' + IMAGE)
    assert task.config.schema_version == "1.1"
    task, _ = _load(build, 'version = "1.1"\nschema_version = "1.3"\n' + IMAGE)
    assert task.config.schema_version == "1.3"


def test_fmt_13_multi_step_reward_mode_dropped(build):
    # SPEC: FMT-13
    task, caught = _load(build, 'multi_step_reward_mode = "final"\n' + IMAGE)
    assert task.config.multi_step_reward_strategy is None
    assert not [w for w in caught if issubclass(w.category, UnknownKeyWarning)]


@pytest.mark.parametrize(
    ("body", "mode", "hosts"),
    [
        ("allow_internet = true", "public", None),
        ("allow_internet = false", "no-network", None),
        ('allow_internet = false\nnetwork_mode = "public"', "public", None),
        (
            'allow_internet = true\nnetwork_mode = "allowlist"\nallowed_hosts = ["a.com"]',
            "allowlist",
            ("a.com",),
        ),
    ],
)
def test_fmt_13_allow_internet(build, body, mode, hosts):
    # SPEC: FMT-13 — allow_internet becomes network_mode unless network_mode or allowed_hosts is set
    task, _ = _load(build, IMAGE + body + "\n")
    assert task.config.environment.network_mode == mode
    assert task.config.environment.allowed_hosts == hosts


def test_fmt_13_allow_internet_with_allowed_hosts_only_is_dropped(build):
    # SPEC: FMT-13, LOAD-10 — allow_internet is dropped, allowed_hosts without allowlist is then refused
    from harbor_gym.errors import TaskLoadError

    with pytest.raises(TaskLoadError, match="LOAD-10"):
        _load(build, IMAGE + 'allow_internet = true\nallowed_hosts = ["a.com"]\n')


def test_fmt_13_allow_internet_must_be_bool(build):
    # SPEC: FMT-13, LOAD-1
    from harbor_gym.errors import TaskLoadError

    with pytest.raises(TaskLoadError, match=r"environment\.allow_internet.*LOAD-1"):
        _load(build, IMAGE + 'allow_internet = "no"\n')


def test_fmt_13_one_legacy_warning(build):
    # SPEC: FMT-13 — migrated in one place, one DeprecationWarning listing them
    _, caught = _load(build, 'version = "1"\n' + IMAGE + 'memory = "1G"\nallow_internet = true\n')
    legacy = [w for w in caught if issubclass(w.category, LegacyKeyWarning)]
    assert len(legacy) == 1
    text = str(legacy[0].message)
    assert "version" in text and "environment.memory" in text and "environment.allow_internet" in text


def test_fmt_14_unknown_keys_one_warning(build):
    # SPEC: FMT-14 — unknown keys ignored, exactly one warning listing all of them
    toml = "colour = 1\n" + IMAGE + "flavour = 2\n[agent]\nmood = 3\n" + steps_toml(["one"])
    toml += 'shade = 4\n[steps.verifier]\nweight = 5\n[[steps.verifier.collect]]\ncommand = "x"\nsize = 6\n'
    task, caught = _load(build, toml)
    unknown = [w for w in caught if issubclass(w.category, UnknownKeyWarning)]
    assert len(unknown) == 1
    text = str(unknown[0].message)
    for key in (
        "colour",
        "environment.flavour",
        "agent.mood",
        "steps[0].shade",
        "steps[0].verifier.weight",
        "steps[0].verifier.collect[0].size",
    ):
        assert key in text
    assert "FMT-14" in text
    assert task.steps[0].name == "one"


def test_fmt_14_free_tables_are_not_unknown(build):
    # SPEC: FMT-4 ([metadata] free), FMT-7 (env free)
    toml = "[metadata]\nanything = 1\n" + IMAGE + 'env = { X = "1" }\n[verifier]\nenv = { Y = "2" }\n'
    _, caught = _load(build, toml)
    assert not [w for w in caught if issubclass(w.category, UnknownKeyWarning)]

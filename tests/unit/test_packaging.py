"""The package as users get it: the public surface, the console script, and envs/ shipped inside the wheel."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import harbor_gym

REPO = Path(__file__).resolve().parents[2]


def test_public_surface_is_pinned():
    # STYLE: the public API is exactly __all__; a change here is a deliberate API change.
    assert sorted(harbor_gym.__all__) == sorted(
        [
            "HarborEnv",
            "HarborDatasetEnv",
            "make",
            "register_envs",
            "validate",
            "rollouts",
            "collect",
            "RolloutResult",
            "ValidationReport",
            "load_task",
            "load_dataset",
            "Task",
            "Dataset",
            "Oracle",
            "Turn",
            "AgentOutcome",
            "TurnRecord",
            "EpisodeResult",
            "EnvConfig",
            "HarborGymError",
            "ConfigError",
            "TaskLoadError",
            "SeedRefusedError",
            "SeedError",
            "SandboxError",
            "ResetNeededError",
            "__version__",
        ]
    )
    for name in harbor_gym.__all__:
        assert hasattr(harbor_gym, name), name


def test_console_script_is_declared():
    text = (REPO / "pyproject.toml").read_text()
    assert 'harbor-gym = "harbor_gym.cli:main"' in text


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    proc = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(out), str(REPO)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    if proc.returncode != 0:
        pytest.fail(f"building the wheel failed:\n{proc.stdout}\n{proc.stderr}")
    (path,) = out.glob("*.whl")
    return path


def test_wheel_ships_every_example_with_exec_bits(wheel):
    names = {p.name for p in (REPO / "envs").iterdir() if (p / "task.toml").is_file()}
    assert names, "envs/ holds no example"
    with zipfile.ZipFile(wheel) as zf:
        infos = {i.filename: i for i in zf.infolist()}
    for name in names:
        assert f"harbor_gym/envs/{name}/task.toml" in infos, name
    for source in (REPO / "envs").rglob("*.sh"):
        member = "harbor_gym/envs/" + source.relative_to(REPO / "envs").as_posix()
        assert member in infos, member
        assert (infos[member].external_attr >> 16) & 0o111 == source.stat().st_mode & 0o111, member


def test_installed_package_finds_its_examples(wheel, tmp_path):
    with zipfile.ZipFile(wheel) as zf:
        zf.extractall(tmp_path)
    code = "import harbor_gym.examples as e; print(e.examples_dir()); print(','.join(e.example_names()))"
    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={"PYTHONPATH": str(tmp_path)},
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    folder, names = proc.stdout.splitlines()
    assert Path(folder) == tmp_path / "harbor_gym" / "envs"
    assert "cake" in names.split(",")

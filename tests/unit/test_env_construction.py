"""Building an env loads the task under the env's own config (no sandbox starts: GYM-1)."""

from __future__ import annotations

import pytest

from harbor_gym import HarborDatasetEnv, HarborEnv, TaskLoadError


def _separate_step_with_a_tests_dockerfile(root):
    task = root / "sep"
    (task / "steps" / "check" / "tests").mkdir(parents=True)
    (task / "steps" / "check" / "instruction.md").write_text("do it\n")
    (task / "steps" / "check" / "tests" / "test.sh").write_text("#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n")
    (task / "steps" / "check" / "tests" / "Dockerfile").write_text("FROM debian:bookworm-slim\n")
    (task / "instruction.md").write_text("never sent\n")
    (task / "task.toml").write_text(
        '[environment]\ndocker_image = "debian:bookworm-slim"\n\n'
        '[[steps]]\nname = "check"\n[steps.verifier]\nenvironment_mode = "separate"\n'
    )
    return task


def test_load_6_is_judged_under_the_envs_semantics(tmp_path):
    # SPEC: LOAD-6 — refused under the Seed; Harbor (VER-4) builds the step's tests/Dockerfile instead.
    task = _separate_step_with_a_tests_dockerfile(tmp_path)
    with pytest.raises(TaskLoadError, match="LOAD-6"):
        HarborEnv(task)
    env = HarborEnv(task, config={"semantics": "harbor"})
    assert env.task.steps[0].name == "check"
    env.close()
    dataset = HarborDatasetEnv(tmp_path, config={"semantics": "harbor"})
    assert dataset.task_ids == ["sep"] and dataset.failures == {}
    dataset.close()

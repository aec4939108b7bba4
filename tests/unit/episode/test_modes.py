"""Verifier mode override, instruction rendering and the verifier command (SPEC VER-2, TURN-9, DIFF-7, DIFF-14)."""

from harbor_gym.episode._modes import effective_verifier_mode, render_instruction, verifier_command


# SPEC: VER-2
def test_ver_2_artifacts_force_separate_even_over_explicit_shared():
    assert effective_verifier_mode("shared", declares_artifacts=True, separate_for_artifacts=True) == "separate"
    assert effective_verifier_mode("shared", declares_artifacts=True, separate_for_artifacts=False) == "shared"
    assert effective_verifier_mode("shared", declares_artifacts=False, separate_for_artifacts=True) == "shared"


# SPEC: TURN-9
def test_turn_9_template_wraps_turn_1_only():
    t = "Task: {{ instruction }}"
    assert render_instruction("do x", t, index=0) == "Task: do x"
    assert render_instruction("do y", t, index=1) == "do y"
    assert render_instruction("do y", None, index=0) == "do y"


# SPEC: DIFF-7
def test_diff_7_harbor_template_wraps_every_activation():
    assert render_instruction("do y", "T: {{ instruction }}", index=1, harbor=True) == "T: do y"


# SPEC: VER-7
def test_ver_7_seed_command_uses_timeout_bash():
    assert verifier_command(30.0).startswith("timeout -k 5 30 bash /tests/test.sh")


# SPEC: DIFF-14
def test_diff_14_harbor_runs_test_sh_directly():
    cmd = verifier_command(30.0, harbor=True)
    assert cmd.startswith("/tests/test.sh") and "timeout" not in cmd

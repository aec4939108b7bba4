"""Pure per-turn switches: the verifier mode override (SPEC VER-2), the instruction an agent gets (TURN-9,
DIFF-7) and the verifier command (VER-7, DIFF-14)."""

from __future__ import annotations

import shlex

__all__ = ["effective_verifier_mode", "render_instruction", "verifier_command"]


def effective_verifier_mode(step_mode: str, *, declares_artifacts: bool, separate_for_artifacts: bool) -> str:
    """VER-2: ``separate`` when ``separate_verifier_for_artifacts`` and the task or step declares artifacts, else the
    VER-1 mode (``step_mode``), even an explicit ``shared`` (open point 4)."""
    if separate_for_artifacts and declares_artifacts:
        return "separate"
    return step_mode


def render_instruction(instruction: str, template: str | None, *, index: int, harbor: bool = False) -> str:
    """TURN-9: ``prompt_template`` (Jinja2 using ``instruction``) wraps turn 1's instruction only; Harbor: every
    activation's (DIFF-7). No template: the instruction unchanged."""
    if template is None or (index > 0 and not harbor):
        return instruction
    import jinja2

    env = jinja2.Environment(undefined=jinja2.StrictUndefined, keep_trailing_newline=True)
    return env.from_string(template).render(instruction=instruction)


def verifier_command(budget_sec: float, *, harbor: bool = False) -> str:
    """VER-7: ``timeout <budget> bash /tests/test.sh``, output to ``/logs/verifier/test-stdout.txt``; Harbor runs
    ``/tests/test.sh`` directly after ``chmod +x`` and bounds it from the host only (DIFF-14)."""
    out = "> /logs/verifier/test-stdout.txt 2>&1"
    if harbor:
        return f"/tests/test.sh {out}"
    return f"timeout -k 5 {shlex.quote(_fmt(budget_sec))} bash /tests/test.sh {out}"


def _fmt(seconds: float) -> str:
    return f"{seconds:.3f}".rstrip("0").rstrip(".") or "0"

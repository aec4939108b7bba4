"""Count the turns that need the ``"auto"`` freeze's exemption (GYM-11) on the shipped tasks.

Runs the reference solution (the oracle) through every turn of every task folder given (default: each folder of
``envs/`` and of ``tests/fixtures/tasks/``) under the default ``freeze_agent_during_verify="auto"``, and reports per
task the turns whose shared verifier ran while a process was left running because it held a listening socket
(``TurnRecord.freeze_exempt``). Those are the turns that would score differently (or could be forged) under
``freeze_agent_during_verify=True``.

Run: ``python3 scripts/count_freeze_exemptions.py [TASK_DIR ...]`` (needs the Docker engine).
"""

from __future__ import annotations

import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from harbor_gym import HarborEnv  # noqa: E402
from harbor_gym.agents import Oracle  # noqa: E402
from harbor_gym.errors import HarborGymError  # noqa: E402


def count(task_dir: Path) -> tuple[int, list[str]]:
    """(turns run, the step names of the turns that needed the exemption) of one oracle episode."""
    env = HarborEnv(task_dir)
    try:
        env.reset(seed=0)
        turns, exempt, done = 0, [], False
        while not done:
            _, _, terminated, truncated, info = env.step(Oracle())
            turns += 1
            if info["turn"].freeze_exempt:
                exempt.append(f"{info['turn'].step_name} ({', '.join(e.exe for e in info['turn'].freeze_exempt)})")
            done = terminated or truncated
        return turns, exempt
    finally:
        env.close()


def main(argv: list[str]) -> int:
    dirs = [Path(a) for a in argv] or sorted(
        p for base in (REPO / "envs", REPO / "tests" / "fixtures" / "tasks") for p in base.iterdir()
        if (p / "task.toml").is_file())
    total = needing = 0
    for task_dir in dirs:
        try:
            turns, exempt = count(task_dir)
        except HarborGymError as exc:  # e.g. a fixture that needs a host variable (LOAD-23)
            print(f"{task_dir.name}: not run ({type(exc).__name__}: {str(exc)[:120]})")
            continue
        total += turns
        needing += len(exempt)
        print(f"{task_dir.relative_to(REPO) if task_dir.is_relative_to(REPO) else task_dir}: {turns} turns, "
              f"{len(exempt)} exempt" + (f": {'; '.join(exempt)}" if exempt else ""))
    print(f"total: {needing} of {total} turns needed the exemption")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))

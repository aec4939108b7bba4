"""turn.exec takes commands of any length (SPEC GYM-13, issue 14 item 3): over 128 KiB they travel on stdin."""

from __future__ import annotations

import pytest

from harbor_gym import HarborEnv
from harbor_gym.agents import AgentOutcome

from agents_helpers import DOCKER, chat_task

BIG = 200 * 1024


class LongCommand:
    """Writes a 200 KiB heredoc (as an LLM would) and reads it back, with and without its own stdin."""

    name = "long-command"

    def run(self, turn):
        payload = ("x" * 1023 + "\n") * (BIG // 1024)
        command = f"cat > /app/big.txt <<'HGEOF'\n{payload}HGEOF\nwc -c < /app/big.txt"
        assert len(command.encode()) > 128 * 1024
        first = turn.exec(command)
        second = turn.exec("cat > /app/in.txt; wc -c < /app/in.txt; echo " + "y" * BIG + " > /dev/null",
                           stdin=b"hello")
        argv = turn.exec(["bash", "-c", f'printf %s "$1" | wc -c # {"z" * BIG}', "zero", "one"])
        return AgentOutcome(response="|".join(r.stdout.strip() for r in (first, second, argv)),
                            exit_code=first.exit_code)


@pytest.mark.parametrize("backend", [pytest.param("docker", marks=pytest.mark.docker),
                                     pytest.param("local", marks=pytest.mark.bwrap)])
def test_a_200_kib_command_runs(tmp_path, backend):
    # SPEC: GYM-13 — a 200 KiB command (str), one with its own stdin, and and a 200 KiB ``bash -c`` script with arguments all run.
    config = {**DOCKER, "backend": backend}
    env = HarborEnv(chat_task(tmp_path), config=config)
    try:
        env.reset(seed=0)
        _, _, _, _, info = env.step(LongCommand())
    finally:
        env.close()
    record = info["turn"]
    assert record.agent_status == "completed", record.output_tail
    assert record.outcome.response == "204800|5|3"
    assert record.exit_code == 0

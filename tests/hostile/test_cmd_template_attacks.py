"""Hostile: a task's instruction (text from the internet) against `--agent cmd:` templates (GYM-10).

The instruction is substituted into the user's command line; whatever it holds (shell metacharacters, quotes,
newlines, a placeholder of its own) it must reach the harness as one argument holding exactly its text, run nothing
in the sandbox but the harness, and nothing at all on the host (no host shell is involved).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from harbor_gym import HarborEnv
from harbor_gym.agents import CommandAgent

from .helpers import DOCKER, grade, toml, write_task

pytestmark = pytest.mark.docker

HOST_CANARY = Path("/tmp/hg-cmd-host-canary")
INSTRUCTION = ("Solve it.\n$(touch /app/pwned) `touch /app/pwned` ; touch /app/pwned & | > /app/pwned\n"
               f"it's \"quoted\" '\"'\"' \\ {{instruction}} ${{HOME}} $'\\x41' $(touch {HOST_CANARY}) *\n")
#: The harness: dumps its arguments as JSON (python3 is in the base image).
HARNESS = "import json, sys; json.dump(sys.argv[1:], open('/app/argv.json', 'w'))"
CHECK = ("[ ! -e /app/pwned ] && python3 -c \"import json; a = json.load(open('/app/argv.json')); "
         "i = open('/logs/agent/instruction.md').read(); raise SystemExit(0 if a == [i, 'x' + i + 'y', i] else 1)\"")


@pytest.mark.parametrize("template", [
    "python3 -c \"{h}\" {{instruction}} \"x{{instruction}}y\" '{{instruction}}'",
    "python3 -c \"{h}\" \"$(printf '%s' {{instruction}})\"$'\\n' x{{instruction}}y $'{{instruction}}'",
])
def test_gym_10_instruction_reaches_the_harness_as_one_argument(tmp_path, template):
    # SPEC: GYM-10: unquoted, in double, single and ANSI-C quotes and inside $(...), the instruction is exactly one
    # argument holding its text; none of its commands runs in the sandbox or on the host.
    HOST_CANARY.unlink(missing_ok=True)
    task = write_task(tmp_path, {"task.toml": toml(["s1"], agent_timeout=20), "steps/s1/instruction.md": INSTRUCTION,
                                 "steps/s1/tests/test.sh": grade(CHECK)}, "cmd-hostile")
    agent = CommandAgent(template.format(h=HARNESS.replace('"', '\\"')))
    env = HarborEnv(task, config=DOCKER)
    try:
        env.reset(seed=0)
        _, reward, *_, info = env.step(agent)
    finally:
        env.close()
    assert info["turn"].outcome.exit_code == 0, info["turn"].outcome.output_tail
    assert reward == 1.0
    assert not HOST_CANARY.exists()
    json.dumps(info["turn"].outcome.output_tail)

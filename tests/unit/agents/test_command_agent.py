"""`CommandAgent` without Docker: the command line, the instruction's quoting and file, the outcome, pickling
(issue 18 item 3). Real runs: tests/integration/agents/test_capture_episode.py."""

import pickle
import subprocess
import time

import pytest

from harbor_gym.agents import AgentStatus, CommandAgent, Turn, as_agent
from harbor_gym.sandbox.base import ExecResult


class FakeExec:
    def __init__(self, result=None):
        self.calls = []
        self.result = result or ExecResult(exit_code=7, stdout="out", stderr="err")

    def __call__(self, command, **kw):
        self.calls.append((command, kw))
        return self.result


def make_turn(fake, instruction, budget=10, env=None):
    return Turn(step_name="s1", index=1, num_steps=3, instruction=instruction, user="agent", budget_sec=budget,
                workdir="/app", _exec_fn=fake, _deadline=time.monotonic() + budget, env=env or {})


NASTY = "it's \"quoted\" $(rm -rf /) `id` \\ {instruction}\nline two; & | > <"


# issue 18 item 3: {instruction} is replaced by the shell-quoted instruction, one word whatever it holds
def test_issue18_instruction_placeholder_is_one_shell_word():
    agent = CommandAgent("printf '%s' {instruction} {instruction}")
    line = agent.command_line(NASTY)
    out = subprocess.run(["bash", "-c", line], capture_output=True, text=True, check=True).stdout
    assert out == NASTY + NASTY  # each placeholder is exactly the instruction, nothing of it ran
    assert CommandAgent("echo {other} {instruction}").command_line("x") == "echo {other} x"


# issue 18 item 3: the instruction file is written (exact text) before the command runs, as the turn's user, in the
# workdir, under the budget; the outcome keeps the exit code and output tail
def test_issue18_runs_command_as_turn_user_with_instruction_file(tmp_path):
    fake = FakeExec()
    agent = CommandAgent("harness --task {instruction}", env={"HARNESS_MODE": "eval"})
    outcome = agent.run(make_turn(fake, NASTY, env={"OPENAI_BASE_URL": "http://10.0.0.1:1/v1"}))
    (cmd, kw), = fake.calls
    assert cmd[:2] == ["bash", "-c"]
    script = cmd[2]
    assert script.endswith("\n" + agent.command_line(NASTY))
    first = script[:-len(agent.command_line(NASTY)) - 1]  # the instruction-file line(s)
    assert "/logs/agent/instruction.md" in first
    assert kw["user"] == "agent" and kw["cwd"] == "/app" and 0 < kw["timeout"] <= 10
    assert kw["env"]["HARNESS_MODE"] == "eval" and kw["env"]["HARBOR_STEP_INDEX"] == "1"
    assert kw["env"]["OPENAI_BASE_URL"] == "http://10.0.0.1:1/v1"  # the turn's variables reach the command
    assert outcome.status is AgentStatus.COMPLETED and outcome.exit_code == 7
    assert outcome.output_tail == "out\nerr"
    # the instruction-file line writes exactly the instruction (run it against a local folder)
    local = first.replace("/logs/agent/instruction.md", str(tmp_path / "i.md"))
    subprocess.run(["bash", "-c", local], check=True)
    assert (tmp_path / "i.md").read_text() == NASTY


# issue 18 item 3 / GYM-5: a command cut at the budget is a timeout
def test_issue18_timeout_is_status_timeout():
    fake = FakeExec(ExecResult(exit_code=-1, timed_out=True, stdout="partial"))
    outcome = CommandAgent("sleep 99").run(make_turn(fake, "x", budget=1))
    assert outcome.status is AgentStatus.TIMEOUT and outcome.exit_code is None and outcome.output_tail == "partial"


# issue 18 item 3: picklable (it travels to vector workers and Ray as an action), equal copies, an agent as is
def test_issue18_command_agent_pickles_and_is_an_agent():
    agent = CommandAgent("run {instruction}", env={"A": "1"})
    copy = pickle.loads(pickle.dumps(agent))
    assert copy == agent and hash(copy) == hash(agent) and copy.env == {"A": "1"}
    assert as_agent(agent) is agent and agent.supports_continue is False


def test_issue18_bad_command_or_env_refused():
    with pytest.raises(ValueError, match="empty"):
        CommandAgent("  ")
    with pytest.raises(ValueError, match="variable name"):
        CommandAgent("true", env={"NOT A NAME": "x"})


HOSTILE = ["it's", '"', "$(touch /tmp/hg-cmd-pwned)", "`touch /tmp/hg-cmd-pwned`", "\\", "\\'", "'\"'\"'",
           "${HOME}", "$'\\x41'", "a\nb; touch /tmp/hg-cmd-pwned", "{instruction}", "!!", "*", "-n", "",
           "'$(touch /tmp/hg-cmd-pwned)'", "\"; touch /tmp/hg-cmd-pwned; \"", NASTY]


@pytest.mark.parametrize("template, wrap", [
    ("printf '%s' {instruction}", "{}"),
    ("printf '%s' \"{instruction}\"", "{}"),
    ("printf '%s' '{instruction}'", "{}"),
    ("printf '%s' $'{instruction}'", "{}"),
    ("printf '%s' \"pre-{instruction}-post\"", "pre-{}-post"),
    ("printf '%s' \"$(printf '%s' {instruction})\"", "{}"),
    ("printf '%s' \"$(printf '%s' \"<{instruction}>\")\"", "<{}>"),
    ("(printf '%s' '[{instruction}]')", "[{}]"),
])
def test_instruction_is_exactly_one_argument_in_every_quoting_context(tmp_path, template, wrap):
    # SPEC: GYM-10: the instruction reaches the harness as exactly its text, in whatever quotes the template puts
    # the placeholder; metacharacters, quotes, newlines and a placeholder inside the instruction run nothing.
    canary = __import__("pathlib").Path("/tmp/hg-cmd-pwned")
    canary.unlink(missing_ok=True)
    agent = CommandAgent(template)
    for text in HOSTILE:
        out = subprocess.run(["bash", "-c", agent.command_line(text)], capture_output=True, text=True).stdout
        assert out == wrap.replace("{}", text, 1), (template, text)
    assert not canary.exists()


@pytest.mark.parametrize("template", ["harness `echo {instruction}`", "cat <<EOF\n{instruction}\nEOF\n",
                                      "harness \"`echo {instruction}`\""])
def test_placeholder_where_no_quoting_holds_is_refused(template):
    # SPEC: GYM-10: inside backticks or a here-document (whose body expands $(...)) no quoting of the instruction
    # holds: the agent is refused when made, naming the alternative.
    with pytest.raises(ValueError, match="backticks|here-document"):
        CommandAgent(template)


def test_instruction_with_nul_ends_the_turn_without_running():
    # SPEC: GYM-5: no program argument can hold a NUL byte: the turn ends as an error (policy fail) naming it and
    # the command never runs.
    fake = FakeExec()
    outcome = CommandAgent("harness {instruction}").run(make_turn(fake, "a\x00b"))
    assert fake.calls == []
    assert outcome.status is AgentStatus.ERROR and outcome.failure_kind == "harbor_gym:instruction_has_nul"

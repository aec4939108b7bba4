"""SPEC §9 SES (harness sessions) on a real Docker sandbox: the continued session's protocol and its close before
the last verifier, the same-agent rule, the LOAD-22 refusals before any sandbox starts, fresh sessions per turn."""

from __future__ import annotations

import pytest

from harbor_gym.agents import AgentOutcome, Session
from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode
from harbor_gym.errors import SeedRefusedError, SessionMismatchError
from harbor_gym.sandbox import open as open_sandbox
from harbor_gym.sandbox.base import SandboxSettings
from harbor_gym.task import load_task

from .conftest import REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker
CONTINUE = {"turn_sessions": "continue"}


class Recorder:
    """A `HarnessSession` agent: every call is recorded; each activation appends its step to ``/app/conv.txt`` (the
    conversation kept on disk), ``close()`` touches ``/app/closed`` (through the last turn's exec)."""

    supports_continue = True
    name = "recorder"

    def __init__(self) -> None:
        self.calls: list[str] = []
        self.seen: list[tuple[Session, int, str | None]] = []
        self.close_exit: list[int] = []
        self._turn = None

    def _act(self, kind: str, turn) -> AgentOutcome:
        self.calls.append(f"{kind}:{turn.step_name}")
        self.seen.append((turn.session, turn.session.activations, turn.user))
        self._turn = turn
        res = turn.exec(f"echo {turn.step_name} >> /app/conv.txt")
        return AgentOutcome(response=f"resp-{turn.step_name}", output_tail=f"did {turn.step_name}",
                            exit_code=res.exit_code,
                            trajectory=({"source": "agent", "message": f"ok {turn.step_name}"},))

    def start(self, turn) -> AgentOutcome:
        return self._act("start", turn)

    def continue_turn(self, turn) -> AgentOutcome:
        return self._act("continue", turn)

    def close(self) -> None:
        self.calls.append("close")
        self.close_exit.append(self._turn.exec(f"touch /app/closed-{self._turn.step_name} /app/closed").exit_code)


class RunOnly:
    """A ``continue`` agent with only ``run(turn)``: ``turn.session`` carries the continuation."""

    supports_continue = True

    def __init__(self) -> None:
        self.seen: list[tuple[Session, int, bool]] = []

    def run(self, turn) -> AgentOutcome:
        self.seen.append((turn.session, turn.session.activations, turn.session.is_continued))
        turn.session.state["count"] = turn.session.state.get("count", 0) + 1
        turn.exec(f"echo {turn.session.state['count']} > /app/count")
        return AgentOutcome(response=f"r{turn.index}")


class CountingFactory:
    """A sandbox factory counting its calls (0 calls = no sandbox started)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, spec):
        self.calls += 1
        return open_sandbox(spec, backend="docker", settings=SandboxSettings.from_config(EnvConfig()))


def _three_steps(tmp_path, last_check: str = "[ -f /app/closed ] && [ \"$(wc -l < /app/conv.txt)\" = 3 ]"):
    """s1, s2 grade that the session is still open and trajectory.json holds only their own instruction (SES-4);
    s3 grades ``last_check``."""
    own = ("[ ! -f /app/closed ] && grep -q 'Do step {s}' /logs/agent/trajectory.json && "
           "! grep -q 'Do step {o}' /logs/agent/trajectory.json")
    return write_task(tmp_path, {
        "task.toml": toml(["s1", "s2", "s3"]),
        "steps/s1/tests/test.sh": grade(own.format(s="s1", o="s2")),
        "steps/s2/tests/test.sh": grade(own.format(s="s2", o="s1")),
        "steps/s3/tests/test.sh": grade(last_check),
        "tests/test.sh": REWARD_1,
    })


def _episode(task_dir, config, agent, factory=None):
    cfg = EnvConfig.coerce({"backend": "docker", **config})
    return Episode(load_task(task_dir, cfg), cfg, agent=agent, sandbox_factory=factory)


# SPEC: SES-3, SES-4, STOP-9
def test_ses_3_start_continue_close_in_order_and_close_before_last_verifier(tmp_path):
    agent = Recorder()
    with _episode(_three_steps(tmp_path), CONTINUE, agent) as ep:
        ep.start()
        results = [ep.run_turn(agent) for _ in range(3)]
        final = ep.result()
        session, transcript = ep.session, ep.transcript
    assert agent.calls == ["start:s1", "continue:s2", "continue:s3", "close"]  # close exactly once
    assert agent.close_exit == [0]  # close ran while the sandbox was still up
    # s1/s2 verified while the session was open (and saw only their own trajectory); s3 after close (SES-3).
    assert [r.record.reward for r in results] == [1.0, 1.0, 1.0] and final.reward == 1.0
    assert len({id(s) for s, _, _ in agent.seen}) == 1 and [n for _, n, _ in agent.seen] == [0, 1, 2]
    assert session is agent.seen[0][0] and session.closed and session.activations == 3
    assert [s["message"] for s in transcript if s["source"] == "user"] == [f"Do step s{i}.\n" for i in (1, 2, 3)]
    assert [s["step_id"] for s in transcript] == list(range(1, 7))
    assert final.response == "resp-s3" == session.response  # the last activation's only


# SPEC: SES-3
def test_ses_3_run_only_agent_gets_the_same_session_every_turn(tmp_path):
    agent = RunOnly()
    task = _three_steps(tmp_path, last_check="[ \"$(cat /app/count)\" = 3 ]")
    results, final = run_episode(task, agent, CONTINUE, agent=agent)
    sessions = [s for s, _, _ in agent.seen]
    assert all(s is sessions[0] for s in sessions) and sessions[0].mode == "continue"
    assert [(n, c) for _, n, c in agent.seen] == [(0, False), (1, True), (2, True)]
    assert sessions[0].closed and results[-1].record.reward == 1.0 and final.response == "r2"


# SPEC: SES-3
def test_ses_3_different_agent_object_raises_value_error_without_side_effect(tmp_path):
    announced, other = Recorder(), Recorder()
    with _episode(_three_steps(tmp_path), CONTINUE, announced) as ep:
        ep.start()
        with pytest.raises(SessionMismatchError):  # turn 1: not the announced object either
            ep.run_turn(other)
        ep.run_turn(announced)
        for wrong in (other, "touch /app/by-script"):
            with pytest.raises(ValueError, match="SES-3"):
                ep.run_turn(wrong)
        assert other.calls == [] and ep.turn_index == 1 and not ep.is_over
        listing = ep.sandbox.exec("cat /app/conv.txt; ls /app", timeout=10, user="root").stdout.split()
        assert listing.count("s1") == 1 and "s2" not in listing and "by-script" not in listing
        ep.run_turn(announced)  # the episode goes on with the right object
        ep.run_turn(announced)
        assert ep.result().reward == 1.0
    assert announced.calls == ["start:s1", "continue:s2", "continue:s3", "close"]


# SPEC: LOAD-22, GYM-4
def test_load_22_refusals_before_any_sandbox_starts(tmp_path):
    class NoContinue(Recorder):
        supports_continue = False

    one_user = _three_steps(tmp_path / "a")
    two_users = write_task(tmp_path / "b", {
        "task.toml": toml(['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n',
                           'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n']),
        "tests/test.sh": REWARD_1})
    for task, agent, rule in ((one_user, NoContinue(), "LOAD-22"), (two_users, Recorder(), "LOAD-22"),
                              (one_user, None, "GYM-4")):
        factory = CountingFactory()
        with pytest.raises(SeedRefusedError) as err, _episode(task, CONTINUE, agent, factory) as ep:
            ep.start()
        assert err.value.rule == rule and factory.calls == 0
        assert agent is None or agent.calls == []


# SPEC: DIFF-11, DIFF-6, SES-3
def test_diff_11_continue_with_user_switch_allowed_under_harbor(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n',
                           'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n']),
        "tests/test.sh": REWARD_1})

    class Harness(Recorder):
        def _act(self, kind, turn):
            if kind == "start":  # the harness's conversation in /logs/agent survives (resuming, DIFF-6)
                turn.exec("chmod 0777 /app; touch /app/conv.txt; chmod 0666 /app/conv.txt; "
                          "echo hello > /logs/agent/conversation.txt")
            else:
                self.kept = turn.exec("cat /logs/agent/conversation.txt").stdout.strip()
            return super()._act(kind, turn)

    agent = Harness()
    results, final = run_episode(task, agent, {"semantics": "harbor", **CONTINUE}, agent=agent)
    assert agent.calls == ["start:s1", "continue:s2", "close"]
    assert [u for _, _, u in agent.seen][1] == "nobody" and agent.kept == "hello"
    assert final.reward == 1.0


# SPEC: SES-2, SES-4
def test_ses_2_fresh_gives_a_new_session_per_turn(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(["s1", "s2"]),
        # each fresh session closed before its own verifier
        "steps/s1/tests/test.sh": grade("[ -f /app/closed-s1 ] && [ ! -f /app/closed-s2 ]"),
        "steps/s2/tests/test.sh": grade("[ -f /app/closed-s2 ]"),
        "tests/test.sh": REWARD_1})
    agent = Recorder()
    with _episode(task, {}, agent) as ep:
        ep.start()
        results = [ep.run_turn(agent), ep.run_turn(agent)]
        assert ep.session is None and ep.transcript == ()  # more than one session ran
    assert agent.calls == ["start:s1", "close", "start:s2", "close"]
    (s1, n1, _), (s2, n2, _) = agent.seen
    assert s1 is not s2 and n1 == n2 == 0 and s1.mode == s2.mode == "fresh" and s1.closed and s2.closed
    assert [r.record.reward for r in results] == [1.0, 1.0]
    # a run-only agent gets a new session per turn too; one fresh session is the episode's session
    runner = RunOnly()
    run_episode(task, runner, {}, agent=runner)
    assert runner.seen[0][0] is not runner.seen[1][0] and [n for _, n, _ in runner.seen] == [0, 0]
    single = write_task(tmp_path / "one", {"task.toml": toml(["s1"]), "tests/test.sh": REWARD_1})
    with _episode(single, {}, runner) as ep:
        ep.start()
        ep.run_turn(runner)
        assert ep.session is runner.seen[-1][0] and [s["source"] for s in ep.transcript] == ["user"]


# SPEC: SES-3, STOP-1, STOP-10
def test_ses_3_early_stop_and_close_end_the_session_once(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(['name = "s1"\nmin_reward = 1.0\n[steps.verifier]\ntimeout_sec = 10\n', "s2", "s3"]),
        "steps/s1/tests/test.sh": "#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n",
        "tests/test.sh": REWARD_1})
    agent = Recorder()
    with _episode(task, CONTINUE, agent) as ep:
        ep.start()
        res = ep.run_turn(agent)
        assert res.terminated and ep.result().stopped_after_turn == "s1"
        assert agent.calls == ["start:s1", "close"] and agent.close_exit == [0]  # before the sandbox stopped
    assert agent.calls == ["start:s1", "close"]  # Episode.close() does not close it again
    # closing the episode between turns closes the session once, while the sandbox still runs
    agent = Recorder()
    with _episode(_three_steps(tmp_path / "b"), CONTINUE, agent) as ep:
        ep.start()
        ep.run_turn(agent)
        assert agent.calls == ["start:s1"]
    ep.close()
    assert agent.calls == ["start:s1", "close"] and agent.close_exit == [0]

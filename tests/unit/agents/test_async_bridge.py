"""The async-agent bridge (issue 15) without a sandbox: the coroutine runs on the caller's loop, ``aexec`` runs on
the engine's waiting thread (never on the loop), an expired turn cancels the coroutine, and the no-loop path."""

from __future__ import annotations

import asyncio
import threading
import time

from harbor_gym.agents import AgentOutcome, AgentStatus, Turn
from harbor_gym.agents._async import bridge_for, is_async_agent
from harbor_gym.sandbox.base import ExecResult


def _turn(exec_fn, deadline=None) -> Turn:
    return Turn(step_name="s", index=0, num_steps=1, instruction="i", user=None, budget_sec=None, workdir="/app",
                _exec_fn=exec_fn, _deadline=deadline)


class Agent:
    def __init__(self, sleep: float = 0.0) -> None:
        self.sleep = sleep
        self.loop_thread = None

    async def run(self, turn):
        self.loop_thread = threading.current_thread()
        await asyncio.sleep(self.sleep)
        res = await turn.aexec("echo hi")
        return AgentOutcome(exit_code=res.exit_code, response=res.stdout)


def test_coroutine_on_the_loop_and_aexec_on_the_engine_thread():
    exec_threads = []

    def exec_fn(command, **kw):
        exec_threads.append(threading.current_thread())
        time.sleep(0.2)  # a blocking sandbox call: must not stall the loop
        return ExecResult(exit_code=0, stdout="hi")

    agent = Agent()
    assert is_async_agent(agent)

    async def main():
        bridge = bridge_for(agent, {}, asyncio.get_running_loop())
        engine = threading.Thread(target=lambda: box.append(bridge.run(_turn(exec_fn))))
        ticks = 0
        engine.start()
        while engine.is_alive():
            await asyncio.sleep(0.01)
            ticks += 1
        return ticks

    box: list = []
    ticks = asyncio.run(main())
    assert box[0].response == "hi" and box[0].exit_code == 0
    assert agent.loop_thread is threading.main_thread()  # the coroutine ran on the caller's loop
    assert exec_threads and exec_threads[0] is not threading.main_thread()  # the exec did not
    assert ticks >= 10  # the loop kept running during the blocking exec


def test_an_expired_turn_cancels_the_coroutine():
    turn = _turn(lambda c, **kw: ExecResult(exit_code=0), deadline=time.monotonic() + 0.3)

    async def main():
        bridge = bridge_for(Agent(sleep=30), {}, asyncio.get_running_loop())
        return await asyncio.get_running_loop().run_in_executor(None, bridge.run, turn)

    t0 = time.monotonic()
    outcome = asyncio.run(main())
    assert time.monotonic() - t0 < 5
    assert outcome.status is AgentStatus.TIMEOUT


def test_without_a_loop_the_agent_runs_privately():
    outcome = bridge_for(Agent(), {}, None).run(_turn(lambda c, **kw: ExecResult(exit_code=3, stdout="x")))
    assert outcome.exit_code == 3


def test_a_sync_agent_is_not_wrapped():
    class Sync:
        def run(self, turn):
            return AgentOutcome()

    agent = Sync()
    assert bridge_for(agent, {}, None) is agent

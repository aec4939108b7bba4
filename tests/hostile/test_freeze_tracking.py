"""P1, the attribution behind ``freeze_agent_during_verify`` (pure, no Docker): which processes count as an agent
activation's leftovers across turns, and which never do."""

from __future__ import annotations

from harbor_gym.episode._freeze import AgentProcesses, parse_listing


def _stat(pid: int, ppid: int, start: int, comm: str = "sh") -> str:
    rest = " ".join(["S", str(ppid)] + ["0"] * 17 + [str(start)] + ["0"] * 5)
    return f"{pid} ({comm}) {rest}"


def _listing(me: int, *procs: tuple[int, int, int]) -> str:
    return "\n".join([f"me {me}"] + [_stat(*p) for p in procs])


def test_p1_listing_drops_the_listing_shell_its_ancestors_and_children():
    text = _listing(50, (1, 0, 1), (49, 0, 10), (50, 49, 11), (51, 50, 12), (7, 1, 5))
    assert sorted(parse_listing(text)) == [1, 7]
    assert parse_listing(_stat(9, 1, 3, comm="a) b (c")).get(9).ppid == 1  # comm with ") " parses


def test_p1_agent_processes_across_turns_exclude_preparation():
    tracker = AgentProcesses()
    # turn 1: a setup ticker (20) exists before; the agent leaves a writer (30, orphaned to init) with a child (31);
    # meanwhile the ticker spawned a short sleep (21): not the agent's
    tracker.before_activation(_listing(99, (1, 0, 1), (20, 1, 100)))
    tracker.after_activation(_listing(99, (1, 0, 1), (20, 1, 100), (21, 20, 150), (30, 1, 160), (31, 30, 161)))
    assert tracker.tracked == {"30:160", "31:161"}
    # turn 2: preparation starts 40 (alive before the activation): never the agent's; the writer's new child is
    tracker.before_activation(_listing(99, (1, 0, 1), (20, 1, 100), (30, 1, 160), (40, 1, 300), (32, 30, 301)))
    tracker.after_activation(_listing(99, (1, 0, 1), (20, 1, 100), (30, 1, 160), (40, 1, 300), (32, 30, 301),
                                      (41, 40, 310)))
    assert tracker.tracked == {"30:160", "32:301"}
    # a reused pid (same pid, other start time) is not the agent's process any more
    tracker.before_activation(_listing(99, (1, 0, 1), (30, 1, 999)))
    tracker.after_activation(_listing(99, (1, 0, 1), (30, 1, 999)))
    assert tracker.tracked == set()

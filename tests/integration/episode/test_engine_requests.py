"""Pins the number of Docker engine API requests one turn of the cake example makes, so that an extra round trip
is a failing test rather than a slower benchmark."""

import pytest

from harbor_gym.agents import Oracle
from harbor_gym.config import EnvConfig
from harbor_gym.episode import Episode
from harbor_gym.sandbox import DockerSandbox, count_requests
from harbor_gym.sandbox.base import SandboxSettings

pytestmark = pytest.mark.docker

#: Per oracle turn of cake: exec (solution on stdin, place it, run solve.sh; TURN-2 clean-up of the previous turn)
#: + exec (tests + trajectory on stdin, snapshot artifacts, verify); exec = create + start
#: + one archive GET of /logs/verifier: GYM-10, results cross only through the engine's archive API, never through
#: exec output (the clean-up therefore moves to the next turn's first exec, as no exec can follow the read-back).
TURN_REQUESTS = 5


def test_cake_turn_engine_requests_pinned(envs_dir):
    import docker

    client = docker.from_env(timeout=60)
    counter = count_requests(client)
    cfg = EnvConfig(backend="docker")

    def factory(spec):
        sb = DockerSandbox(spec, SandboxSettings.from_config(cfg), client=client)
        sb.start()
        return sb

    try:
        with Episode(envs_dir / "cake", cfg, sandbox_factory=factory, agent=Oracle()) as ep:
            ep.start()
            counts = []
            for _ in range(2):
                counter.reset()
                result = ep.run_turn(Oracle())
                assert result.record.reward == 1.0
                counts.append((counter.count, list(counter.paths)))
        first, last = counts
        assert first[0] == TURN_REQUESTS, first[1]
        # the last turn also removes the container (STOP-10): one DELETE more
        assert last[0] == TURN_REQUESTS + 1, last[1]
        assert last[1][-1].startswith("DELETE ")
    finally:
        client.close()

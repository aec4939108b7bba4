"""Hostile: a task folder that wants the trainer's host environment (FMT-15, LOAD-23, GYM-10).

A downloaded task names host variables in every place that interpolates: ``[environment].env``, ``[verifier].env``,
compose ``environment``, ``command``, ``image`` and ``healthcheck``, in every form (``${VAR}``,
``$VAR``, defaults, ``:?`` errors that would echo, nesting, ``$$``). Under the default configuration (an empty
``host_env_allowlist``) no host variable outside the allowlist — a canary this test exports, ``HOME``, cloud
credentials — appears in a sandbox, a log, a record or an error message.
"""

from __future__ import annotations

import pickle

import pytest

from harbor_gym import HarborEnv
from harbor_gym.errors import HarborGymError, TaskLoadError
from harbor_gym.task import load_task

from task_folders import write_task as write_task_folder

from .helpers import DOCKER, LOCAL, grade, toml, write_task

CANARY = "hg-canary-Q7x9-do-not-leak"
SECRETS = {"HG_TEST_CANARY": CANARY, "AWS_SECRET_ACCESS_KEY": CANARY + "-aws", "OPENAI_API_KEY": CANARY + "-oai"}
FORMS = ["${HG_TEST_CANARY:-fallback}", "$HG_TEST_CANARY", "${HG_TEST_CANARY-x}", "${A:-${HG_TEST_CANARY}}",
         "$${HG_TEST_CANARY}", "${AWS_SECRET_ACCESS_KEY:-d}", "${OPENAI_API_KEY:+set}", "pre-${HOME:-h}-post"]
#: Everything a sandbox process can see of its environment, searched for the canary by the verifier (the pattern
#: is assembled at run time, so that the script's own text, which processes may carry, does not match itself).
CHECK = ("! { env; cat /proc/[0-9]*/environ 2>/dev/null; cat /app/seen 2>/dev/null; } | tr '\\0' '\\n' "
         f"| grep -q -e \"{CANARY[:9]}$(printf %s '{CANARY[9:]}')\"")


@pytest.fixture
def secrets(monkeypatch):
    for key, value in SECRETS.items():
        monkeypatch.setenv(key, value)
    return SECRETS


def _env_table(name: str) -> str:
    return f"[{name}.env]\n" + "".join(f'V{i} = "{form}"\n' for i, form in enumerate(FORMS))


def _assert_clean(*things) -> None:
    for thing in things:
        for text in (repr(thing), str(thing), pickle.dumps(thing, protocol=4).decode("latin-1")):
            for value in SECRETS.values():
                assert value not in text


@pytest.mark.docker
@pytest.mark.parametrize("where", ["environment", "verifier"])
def test_load_23_a_bare_template_of_a_host_variable_is_refused_without_its_value(tmp_path, secrets, where):
    # SPEC: LOAD-23, FMT-15: ${VAR} of a variable outside the allowlist is refused at seed, before any sandbox
    # starts; the error names the variable and the key, never the value.
    tail = f'[{where}.env]\nLEAK = "${{HG_TEST_CANARY}}"\n'
    task = write_task(tmp_path, {"task.toml": toml(["s1"], tail=tail) if where != "environment" else
                                 toml(["s1"], env='env = { LEAK = "${HG_TEST_CANARY}" }'),
                                 "steps/s1/tests/test.sh": grade("true")}, "env-hostile")
    env = HarborEnv(task, config=DOCKER)
    try:
        with pytest.raises(HarborGymError) as err:
            env.reset(seed=0)
    finally:
        env.close()
    assert "HG_TEST_CANARY" in str(err.value)
    _assert_clean(err.value, err.value.args)


@pytest.mark.parametrize("backend", [
    pytest.param(DOCKER, marks=pytest.mark.docker, id="docker"),
    pytest.param(LOCAL, marks=pytest.mark.bwrap, id="local"),
])
def test_gym_10_no_template_form_brings_a_host_value_into_a_sandbox(tmp_path, secrets, backend):
    # SPEC: FMT-15, GYM-10: in every interpolating table and every form, a variable outside the allowlist counts as
    # unset: defaults are used, the rest stays literal; the sandbox (agent and verifier, and every process's
    # /proc/N/environ, the sandbox's PID 1 included), the turn and episode records and the log folder never hold
    # the host's value.
    tail = _env_table("verifier") + "\n"
    text = toml(['name = "s1"\n[steps.agent]\nuser = "root"\n'], tail=tail,
        env="env = {" + ", ".join(f'E{i} = "{f}"' for i, f in enumerate(FORMS)) + "}")
    task = write_task(tmp_path, {"task.toml": text, "steps/s1/tests/test.sh": grade(CHECK)}, "env-hostile")
    env = HarborEnv(task, config={**backend, "logs_root": str(tmp_path / "logs")})
    try:
        env.reset(seed=0)
        _, reward, *_, info = env.step("{ env; cat /proc/[0-9]*/environ; } > /app/seen 2>/dev/null; true")
    finally:
        env.close()
    assert reward == 1.0, info["turn"].outcome
    _assert_clean(info["turn"], info.get("episode_result"))
    for path in (tmp_path / "logs").rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            assert all(v.encode() not in data for v in SECRETS.values()), path


COMPOSE_FIELDS = {
    "environment": "    environment:\n      A: \"{form}\"\n",
    "command": "    command: [\"sh\", \"-c\", \"echo {form}; sleep infinity\"]\n",
    "image": "    image: \"img-{form}\"\n",
    "healthcheck": "    healthcheck:\n      test: [\"CMD\", \"echo\", \"{form}\"]\n",
}


@pytest.mark.parametrize("field", list(COMPOSE_FIELDS))
@pytest.mark.parametrize("form", FORMS + ["${HG_TEST_CANARY}", "${HG_TEST_CANARY:?the value is $HG_TEST_CANARY}",
                                          "${HG_TEST_CANARY?}"])
def test_gym_10_compose_interpolation_reads_no_host_variable(tmp_path, secrets, field, form):
    # SPEC: FMT-15, COMPOSE-1, GYM-10: compose interpolation takes only allowlisted host variables: whatever the
    # form, the parsed task (every service's fields) and any error it raises hold no host value.
    body = COMPOSE_FIELDS[field].format(form=form.replace('"', '\\"'))
    base = "" if field == "image" else "    image: \"harbor-gym/base:bookworm\"\n"
    compose = "services:\n  main:\n" + base + body
    task = write_task_folder(tmp_path, {
        "task.toml": toml(["s1"]).replace('docker_image = "debian:bookworm-slim"\n', ""),
        "environment/docker-compose.yaml": compose, "steps/s1/tests/test.sh": grade("true")},
        "compose-hostile", keep_workdir=False)
    try:
        loaded = load_task(task)
    except (TaskLoadError, HarborGymError) as err:
        _assert_clean(err, err.args)
        return
    _assert_clean(loaded)

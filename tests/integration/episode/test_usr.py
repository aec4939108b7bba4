"""USR rules on real sandboxes: per-step agent user, workdir owner switch, verifier user."""

import pytest

from harbor_gym.errors import SeedRefusedError

from .conftest import REWARD_1, grade, run_episode, toml, write_task

pytestmark = pytest.mark.docker

STEPS = ['name = "s1"\n[steps.verifier]\ntimeout_sec = 10\n',
         'name = "s2"\n[steps.agent]\nuser = "nobody"\n[steps.verifier]\ntimeout_sec = 10\n',
         'name = "s3"\n[steps.verifier]\ntimeout_sec = 10\n']


# SPEC: USR-1, USR-2, USR-3
def test_usr_2_step_with_its_own_agent_user(tmp_path):
    task = write_task(tmp_path, {
        "task.toml": toml(STEPS),
        "steps/s2/workdir/merged.txt": "m\n",
        "tests/test.sh": "#!/bin/bash\necho \"$(id -un) $(stat -c %U /app)\" >> /app/verifier-users\n"
                         "echo 1 > /logs/verifier/reward.txt\n",
        "steps/s3/tests/test.sh": grade(
            "[ \"$(cat /app/who)\" = 'root nobody root' ] && [ \"$(stat -c %U /app/merged.txt)\" = root ] && "
            "[ \"$(cat /app/verifier-users | sort -u)\" = \"$(printf 'root nobody\\nroot root')\" ]"),
    })
    script = "echo -n \"$(id -un) \" >> /app/who 2>/dev/null || echo -n \"$(id -un) \" >> /tmp/who; " \
             "[ $HARBOR_STEP_INDEX = 2 ] && { cat /tmp/who 2>/dev/null; echo $(id -un); } >> /app/who; true"
    # s1 (root) writes /app/who; s2 (nobody) owns /app but not /app/who -> writes /tmp/who; s3 gathers
    script = ("case $HARBOR_STEP_INDEX in 0) echo -n 'root ' > /app/who;; "
              "1) touch /app/by-nobody && echo -n 'nobody ' > /tmp/who;; "
              "2) { cat /tmp/who; id -un; } | tr -d '\\n' >> /app/who; echo >> /app/who;; esac")
    results, _ = run_episode(task, script)
    assert [r.record.reward for r in results] == [1.0, 1.0, 1.0]


# SPEC: USR-4, LOAD-21
def test_usr_4_name_group_user_refused_on_local_before_start(tmp_path):
    body = 'name = "s1"\n[steps.agent]\nuser = "nobody:nogroup"\n[steps.verifier]\ntimeout_sec = 10\n'
    task = write_task(tmp_path, {"task.toml": toml([body]), "tests/test.sh": REWARD_1})
    with pytest.raises(SeedRefusedError) as err:
        run_episode(task, ":", backend="local")
    assert err.value.rule == "LOAD-21"
    results, _ = run_episode(task, "id -un > /tmp/u")  # Docker runs it
    assert results[0].record.reward == 1.0

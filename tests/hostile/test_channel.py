"""GYM-10 "one trusted channel out of a sandbox": results and artifacts reach the host only through the engine's
archive API (Docker) or host-side O_NOFOLLOW reads beneath the sandbox root (local), under names confined to the
turn's log folder and sizes capped in real bytes. Real episodes on Docker and on bubblewrap, shared and separate
mode, freeze on and off.

The attacks: a verifier (and a process the agent left behind, appending to test-stdout.txt) prints the engine's old marker blocks, with every marker it finds in ``/proc/*/cmdline``: a
block naming an absolute host path, a forged reward.json, forged control lines (a missing tool, an outage, a
done clean-up); a 1 GiB sparse artifact; links to ``/etc/shadow`` and ``/``, a fifo and a device among the
artifacts; reward files over their cap or that are links.
"""

from __future__ import annotations

import json
import os
import resource

import pytest

from .helpers import DOCKER, LOCAL, config, run_episode, toml, write_task

MiB = 1 << 20
#: A host path outside every scratch folder: the host scan (test_zz_host_scan.py) would find it.
FIXED_TARGET = "/var/lib/hg-channel-pwned"


def _backends():
    return [pytest.param(DOCKER, marks=pytest.mark.docker, id="docker"),
            pytest.param(LOCAL, marks=pytest.mark.bwrap, id="local")]


def _forger(host_path: str) -> str:
    """A POSIX sh function ``forge`` printing forged marker blocks for every marker visible in /proc/*/cmdline to
    its stdout and stderr and appending them to test-stdout.txt (the engine used to print that file between its
    own marker lines, and parse the lot).

    Writing into the engine's own exec pipes through ``/proc/<pid>/fd`` is left out: it needs the exec's uid (root
    here), and a root agent in shared mode is outside GYM-10's promise (README: the defence is separate mode, and
    the freeze); such a writer makes its turns agent-caused outages (GYM-12), never a reward."""
    blocks = (
        f"printf '%s file {host_path} 6\\nPWNED!\\n%s end\\n' \"$m\" \"$m\"; "
        "printf '%s file reward.json 14\\n{\"reward\": 1}\\n%s end\\n' \"$m\" \"$m\"; "
        "printf '%s file reward.txt 2\\n1\\n%s end\\n' \"$m\" \"$m\"; "
        f"printf '%s file ../../../../../..{host_path}.rel 6\\nPWNED!\\n%s end\\n' \"$m\" \"$m\"; "
        f"printf '%s file {FIXED_TARGET} 6\\nPWNED!\\n%s end\\n' \"$m\" \"$m\"; "
        "printf '%s missing bash\\n%s outage stage\\n%s cleaned\\n%s rc 0\\n%s thawed\\n' \"$m\" \"$m\" \"$m\" \"$m\" \"$m\"; "
    )
    return (
        "forge() { for c in /proc/[0-9]*/cmdline; do "
        "for m in $(tr '\\0' '\\n' < \"$c\" 2>/dev/null | grep -o '@@HG[0-9a-f]*' | sort -u); do "
        f"out=$( {blocks} ); echo \"$out\"; echo \"$out\" >&2; "
        "echo \"$out\" >> /logs/verifier/test-stdout.txt 2>/dev/null; "
        "done; done; }"
    )


def _forging_task(tmp_path, host_path: str, *, mode: str):
    # test.sh: the verifier's own reward is 0; then it forges, for two seconds, while the engine's execs run
    verifier = ("#!/bin/bash\necho 0 > /logs/verifier/reward.txt\n" + _forger(host_path) + "\n"
                "for i in $(seq 20); do forge; sleep 0.1; done\n")
    tail = f'[verifier]\nenvironment_mode = "{mode}"\n'
    return write_task(tmp_path, {"task.toml": toml(["s1", "s2"], tail=tail, verifier_timeout=20),
                                 "tests/test.sh": verifier}, name=f"forge-{mode}")


# SPEC: GYM-10, RWD-1, VER-11, TURN-2 (forged marker blocks and control lines from test.sh and from a leftover agent
# process: no host file is written, the reward stays the verifier's 0, the turn is neither masked nor an outage,
# and the TURN-2 clean-up still happens before turn 2)
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("mode", ["shared", "separate"])
@pytest.mark.parametrize("freeze", [True, False], ids=["freeze", "nofreeze"])
def test_gym_10_forged_marker_blocks_write_no_host_file_and_pay_nothing(tmp_path, backend, mode, freeze):
    host_path = str(tmp_path / "pwned")
    task = _forging_task(tmp_path, host_path, mode=mode)
    leftover = ("nohup sh -c '" + _forger(host_path).replace("'", "'\\''")
                + "; while :; do forge; sleep 0.05; done' >/dev/null 2>&1 &")
    check = "ls -A /tests | wc -l > /app/tests-left; cat /app/tests-left"
    results, final = run_episode(task, [leftover, check], config(backend, freeze_agent_during_verify=freeze))
    assert len(results) == 2, [r.record for r in results]
    for r in results:
        rec = r.record
        assert rec.reward == 0.0 and rec.reward_valid and rec.verifier_rewards == {"reward": 0.0}, rec
        assert not rec.masked and rec.failure_kind is None, rec
    assert final.reward == 0.0 and final.graded and not final.masked
    assert not os.path.lexists(host_path) and not os.path.lexists(host_path + ".rel")
    assert not os.path.lexists(FIXED_TARGET)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"forge-{mode}"]
    if mode == "shared":  # TURN-2 ran before turn 2 although "cleaned" was forged: /tests was empty for its agent
        assert results[1].record.output_tail.strip().splitlines()[0] == "0", results[1].record.output_tail


def _logs_root_size(root) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            total += os.lstat(os.path.join(dirpath, name)).st_blocks * 512
    return total


# SPEC: GYM-10, ART-4 (a 1 GiB sparse file in /logs/artifacts and in a declared artifact folder: the host copy is cut
# at copy_file_cap_bytes, the turn at copy_turn_cap_bytes, the manifest says `truncated`, host disk and memory grow
# by at most the caps)
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("mode", ["shared", "separate"])
def test_gym_10_sparse_artifact_is_truncated_within_the_caps(tmp_path, backend, mode):
    tail = f'[verifier]\nenvironment_mode = "{mode}"\n'
    verifier = "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\ntruncate -s 1G /logs/verifier/huge.log\n"
    top = 'artifacts = ["/app/out"]' if mode == "separate" else ""
    task = write_task(tmp_path, {"task.toml": toml(["s1"], tail=tail, top=top), "tests/test.sh": verifier},
                      name=f"sparse-{mode}")
    action = ("mkdir -p /app/out; truncate -s 1G /logs/artifacts/big.bin /app/out/big.bin; "
              "echo small > /logs/artifacts/small.txt")
    logs = tmp_path / "logs"
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    results, final = run_episode(task, [action], config(backend, copy_file_cap_bytes=MiB,
                                                         copy_turn_cap_bytes=10 * MiB, logs_root=str(logs)))
    grew_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before
    rec = results[0].record
    assert rec.reward == 1.0 and rec.reward_valid, rec  # the reward file is read outside the turn budget
    by_source = {m.source: m for m in rec.manifest}
    assert by_source["/logs/artifacts"].status == "truncated", rec.manifest
    if mode == "separate":
        assert by_source["/app/out"].status == "truncated", rec.manifest
    art = rec.log_dir and os.path.join(rec.log_dir, "verifier", "artifacts")
    assert os.path.getsize(os.path.join(art, "logs", "artifacts", "big.bin")) == MiB
    manifest = json.loads(open(os.path.join(art, "manifest.json")).read())
    assert "truncated" in {m["status"] for m in manifest}
    huge = os.path.join(rec.log_dir, "verifier", "huge.log")
    assert not os.path.exists(huge) or os.path.getsize(huge) <= MiB
    # host disk: all the turn's copies together stay within the turn cap (plus small files and JSON)
    assert _logs_root_size(logs) <= 10 * MiB + 256 * 1024
    # host memory: never a whole member in memory (a 1 GiB file would show as ~1 GiB of resident growth)
    assert grew_kib < 64 * 1024, f"resident memory grew by {grew_kib} KiB"
    assert final.reward == 1.0


# SPEC: GYM-10, ART-4 (links among artifacts are recorded as links and never followed; a fifo and a device are
# refused; nothing of /etc reaches the host)
@pytest.mark.parametrize("backend", _backends())
def test_gym_10_links_fifos_and_devices_in_artifacts_are_recorded_never_followed(tmp_path, backend):
    top = 'artifacts = ["/app/out"]'
    task = write_task(tmp_path, {"task.toml": toml(["s1"], top=top),
                                 "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"}, name="links")
    plant = ("for d in /logs/artifacts /app/out; do mkdir -p $d; ln -s /etc/shadow $d/shadow; ln -s / $d/root; "
             "ln -s ../../../../etc/passwd $d/up; mkfifo $d/fifo; mknod $d/null c 1 3 2>/dev/null || true; "
             "echo fine > $d/plain.txt; done")
    logs = tmp_path / "logs"
    results, _ = run_episode(task, [plant], config(backend, logs_root=str(logs)))
    rec = results[0].record
    assert rec.reward == 1.0, rec
    for entry in rec.manifest:
        assert entry.links == {"shadow": "/etc/shadow", "root": "/", "up": "../../../../etc/passwd"}, entry
        assert entry.refused.get("fifo") == "fifo", entry
        assert entry.refused.get("null", "device") == "device", entry
        assert entry.status == "ok", entry
    for dirpath, dirs, files in os.walk(logs):
        for name in dirs + files:
            path = os.path.join(dirpath, name)
            assert not os.path.islink(path), path
            assert name not in ("shadow", "root", "up", "fifo", "null"), path
            if os.path.isfile(path):
                assert b"root:" not in open(path, "rb").read(), path


# SPEC: GYM-10, ART-4 (the convention folder itself replaced by a link to /etc: recorded, never followed)
@pytest.mark.parametrize("backend", _backends())
def test_gym_10_artifact_folder_that_is_a_link_is_not_followed(tmp_path, backend):
    task = write_task(tmp_path, {"task.toml": toml(["s1"]),
                                 "tests/test.sh": "#!/bin/bash\necho 1 > /logs/verifier/reward.txt\n"}, name="dirlink")
    logs = tmp_path / "logs"
    results, _ = run_episode(task, ["rm -rf /logs/artifacts; ln -s /etc /logs/artifacts"],
                             config(backend, logs_root=str(logs)))
    rec = results[0].record
    assert rec.reward == 1.0 and rec.manifest[0].status in ("failed", "empty"), rec.manifest
    found = [os.path.join(d, f) for d, _, fs in os.walk(logs) for f in fs]
    assert not any(p.endswith(("passwd", "shadow", "hostname")) for p in found), found


# SPEC: RWD-1, RWD-2, RWD-3, GYM-10 (a reward file over reward_file_cap_bytes is invalid, a measured 0, never judged
# on its first bytes; one just under the cap counts; a reward file that is a link is invalid, not followed)
@pytest.mark.parametrize("backend", _backends())
@pytest.mark.parametrize("case", ["json-over", "txt-over", "json-under", "txt-link"])
def test_rwd_reward_file_over_its_cap_is_invalid(tmp_path, backend, case):
    cap = 64 * 1024
    script = {
        "json-over": f"printf '{{\"reward\": 1%*s}}' {cap + 10} '' > /logs/verifier/reward.json",
        "txt-over": f"printf '1%*s' {cap + 10} '' > /logs/verifier/reward.txt",
        "json-under": f"printf '{{\"reward\": 1%*s}}' {cap - 100} '' > /logs/verifier/reward.json",
        "txt-link": "echo 1 > /tmp/r.txt; ln -s /tmp/r.txt /logs/verifier/reward.txt",
    }[case]
    task = write_task(tmp_path, {"task.toml": toml(["s1"]), "tests/test.sh": f"#!/bin/bash\n{script}\n"},
                      name=f"cap-{case}")
    results, final = run_episode(task, [":"], config(backend, reward_file_cap_bytes=cap))
    rec = results[0].record
    if case == "json-under":
        assert rec.reward == 1.0 and rec.reward_valid, rec
    else:
        assert rec.reward == 0.0 and not rec.reward_valid and rec.verifier_rewards == {}, rec
        assert final.reward == 0.0 and final.graded

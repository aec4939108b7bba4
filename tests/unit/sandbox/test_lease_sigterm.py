"""lease.exit_on_sigterm: SIGTERM takes the Ctrl-C path in a plain Python process using harbor_gym (``finally``
blocks and `atexit` run, so registered sandboxes are stopped; exit status 143), installed at the first registration
from the main thread, never over a handler of the program's own, never from another thread. Each case runs in a
child process (signal handlers are per process). No Docker needed."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

PRELUDE = textwrap.dedent("""
    import signal, sys, threading, time
    from pathlib import Path
    from harbor_gym.sandbox import lease
    out = Path(sys.argv[1])

    class Fake:
        def __init__(self, name):
            self.name = name
        def stop(self):
            (out / f"stopped-{self.name}").write_text("")
""")


def _child(tmp_path: Path, body: str) -> subprocess.Popen:
    code = PRELUDE + textwrap.dedent(body)
    return subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _ready_then_term(proc: subprocess.Popen) -> tuple[int, str]:
    line = proc.stdout.readline().strip()
    assert line == "ready", (line, proc.stderr.read() if proc.poll() is not None else "")
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return proc.returncode, proc.stderr.read()


# SPEC: GYM-7 (P3: SIGTERM of a process embedding the envs removes its sandboxes: finally + atexit run)
def test_sigterm_runs_finally_and_atexit_and_exits_143(tmp_path):
    proc = _child(tmp_path, """
        lease.register(Fake("main"))
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        try:
            print("ready", flush=True)
            time.sleep(60)
        finally:
            (out / "finally").write_text("")
    """)
    rc, err = _ready_then_term(proc)
    assert rc == 143, err
    assert (tmp_path / "finally").exists() and (tmp_path / "stopped-main").exists()


# SPEC: GYM-7 (the program's own SIGTERM handler is never replaced)
def test_a_handler_of_the_program_is_kept(tmp_path):
    proc = _child(tmp_path, """
        signal.signal(signal.SIGTERM, lambda s, f: sys.exit(7))
        lease.register(Fake("main"))
        print("ready", flush=True)
        time.sleep(60)
    """)
    rc, err = _ready_then_term(proc)
    assert rc == 7, err
    assert (tmp_path / "stopped-main").exists()  # atexit still stops what is registered


# SPEC: GYM-7 (a registration off the main thread installs nothing and does not fail; the main thread's does)
def test_off_the_main_thread_waits_for_the_main_thread(tmp_path):
    proc = _child(tmp_path, """
        t = threading.Thread(target=lambda: lease.register(Fake("worker")))
        t.start(); t.join()
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        assert lease.exit_on_sigterm() is True
        assert lease.exit_on_sigterm() is False  # decided once
        print("ready", flush=True)
        time.sleep(60)
    """)
    rc, err = _ready_then_term(proc)
    assert rc == 143, err
    assert (tmp_path / "stopped-worker").exists()


# SPEC: GYM-7 (without any registration the process keeps Python's default: nothing installed on import)
def test_nothing_is_installed_on_import(tmp_path):
    proc = _child(tmp_path, """
        assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
        print("ready", flush=True)
        time.sleep(60)
    """)
    rc, err = _ready_then_term(proc)
    assert rc == -signal.SIGTERM, err

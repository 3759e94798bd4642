"""The engine's pool pings a connection on checkout only when it sat idle past the limit:
a backend killed while idle is replaced without an error, a connection just used is not pinged."""

from __future__ import annotations

import time

import psycopg
import pytest
import sqlalchemy.exc
from sqlalchemy import text

from memory.database import IDLE_PING_SECONDS, make_engine

IDLE = 0.3
"""The tests' idle limit, seconds (the runtime's is :data:`IDLE_PING_SECONDS`)."""


@pytest.fixture
def pinged(db_url, monkeypatch):
    """A one-connection engine with a short idle limit, and the list its pings append to."""
    engine = make_engine(db_url, pool_size=1, idle_ping_seconds=IDLE)
    pings: list[int] = []
    real = engine.dialect.do_ping

    def counted(dbapi_connection) -> bool:
        pings.append(1)
        return real(dbapi_connection)

    monkeypatch.setattr(engine.dialect, "do_ping", counted)
    yield engine, pings
    engine.dispose()


def _backend(engine) -> int:
    """The server process id behind the pooled connection (one checkout, one statement)."""
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT pg_backend_pid()")).scalar_one())


def _terminate(db_url: str, pid: int) -> None:
    """Kill the backend ``pid`` from another connection and wait until it is gone."""
    with psycopg.connect(db_url, autocommit=True) as admin:
        assert admin.execute("SELECT pg_terminate_backend(%s)", (pid,)).fetchone() == (True,)
        deadline = time.monotonic() + 5
        while admin.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone():
            assert time.monotonic() < deadline, "the terminated backend is still there"
            time.sleep(0.02)


def test_the_runtime_limit_is_seconds_not_zero():
    assert 1 <= IDLE_PING_SECONDS <= 60


def test_a_connection_just_used_is_not_pinged_and_one_idle_past_the_limit_is(pinged):
    engine, pings = pinged
    first = _backend(engine)
    assert [_backend(engine) for _ in range(5)] == [first] * 5
    assert pings == [], "checkouts within the idle limit send no ping"
    time.sleep(IDLE + 0.2)
    assert _backend(engine) == first
    assert pings == [1], "the checkout after the idle limit pings once"
    assert _backend(engine) == first
    assert pings == [1], "and the checkout right after it does not"


def test_a_backend_killed_while_idle_is_replaced_on_the_next_use(pinged, db_url):
    engine, pings = pinged
    killed = _backend(engine)
    _terminate(db_url, killed)
    time.sleep(IDLE + 0.2)
    replacement = _backend(engine)  # no error: the ping failed and the pool connected again
    assert replacement != killed
    assert pings == [1]
    assert _backend(engine) == replacement
    assert pings == [1], "the new connection is used without a ping"


def test_a_backend_killed_within_the_limit_fails_one_use_then_is_replaced(db_url):
    """The limit's trade-off: a connection broken within it is not pinged, so its next
    statement fails (once); the pool then connects again."""
    engine = make_engine(db_url, pool_size=1, idle_ping_seconds=60)
    try:
        killed = _backend(engine)
        _terminate(db_url, killed)
        with pytest.raises(sqlalchemy.exc.OperationalError) as caught:
            _backend(engine)
        assert caught.value.connection_invalidated
        assert _backend(engine) != killed
    finally:
        engine.dispose()

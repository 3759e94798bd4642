"""The compaction lock and the connection pool: a held lock takes no connection from the pool."""

from __future__ import annotations

import threading

import pytest

from errors import ConfigurationError
from memory.database import make_engine
from memory.store import Store
from runtime.config import Settings


def test_pool_size_is_a_setting_with_its_bound():
    assert Settings.from_env({"COMPANION_DB_POOL_SIZE": "4"}).db_pool_size == 4
    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"COMPANION_DB_POOL_SIZE": "0"})
    assert caught.value.setting == "COMPANION_DB_POOL_SIZE"


def test_the_engine_pool_has_the_size_given_and_no_overflow(db_url):
    engine = make_engine(db_url, pool_size=3)
    try:
        assert engine.pool.size() == 3
        assert engine.pool._max_overflow == 0
    finally:
        engine.dispose()


def test_held_compaction_locks_leave_the_whole_pool_to_reads_and_writes(db_url):
    """With a one-connection pool, a compaction that holds its lock (as during a slow summary)
    still reads and writes, and so does every other session meanwhile."""
    engine = make_engine(db_url, pool_size=1)
    engine.pool._timeout = 3  # a starved pool fails in 3 s instead of 30
    store = Store(engine)
    try:
        store.sessions.ensure(session_id="s1", user_id="u1")
        store.sessions.ensure(session_id="s2", user_id="u1")
        inside = threading.Event()
        done = threading.Event()
        outcome: dict = {}

        def other_compaction() -> None:
            with store.compaction.lock("s2") as held:
                outcome["s2_held"] = held
                inside.set()
                done.wait(10)

        holder = threading.Thread(target=other_compaction)
        holder.start()
        assert inside.wait(10)
        with store.compaction.lock("s1") as held:
            assert held and outcome["s2_held"]
            assert store.compaction.summary("s1") is None  # a read inside the lock, from the pool's one connection
            assert store.compaction.state("s2").consecutive_failures == 0
        done.set()
        holder.join(10)
        with store.compaction.lock("s1") as again:
            assert again  # released
    finally:
        engine.dispose()

"""A turn's cost stays flat as history grows: indexed turn reads, a bounded number of
statements per turn, recall over the HNSW index for a large archive, a kept segment count."""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from sqlalchemy import event, text

import memory.recall as recall_module
from memory.recall import RecallQuery, recall
from memory.tables import TurnState
from tests.archive_fixtures import archive_segments

DIM = 384


class Statements:
    """The SQL statements sent on an engine while it is attached."""

    def __init__(self, *engines) -> None:
        self.sql: list[str] = []
        self.params: list[object] = []
        self.engines = engines

    def _seen(self, conn, cursor, statement, parameters, *args) -> None:
        self.sql.append(statement)
        self.params.append(parameters)

    def __enter__(self) -> Statements:
        for engine in self.engines:
            event.listen(engine, "before_cursor_execute", self._seen)
        return self

    def __exit__(self, *exc: object) -> None:
        for engine in self.engines:
            event.remove(engine, "before_cursor_execute", self._seen)


def _unit(v: np.ndarray) -> np.ndarray:
    return v / np.linalg.norm(v, axis=-1, keepdims=True)


def _archive_vectors(store, *, user_id: str, vectors: np.ndarray, contents: list[str]) -> None:
    archive_segments(
        store,
        user_id=user_id,
        session_id=f"{user_id}:s",
        contents=contents,
        vectors=vectors,
        tokens=lambda c: 10,
        step=timedelta(hours=1),
    )


@pytest.fixture
def large_archive(store):
    """User ``big`` with 2,000 random segments and 8 planted near a query vector (2 of them with
    a rare word), user ``other`` with 500; returns the query vector and the planted ids."""
    rng = np.random.default_rng(3)
    query = _unit(rng.standard_normal(DIM))
    vectors = _unit(rng.standard_normal((2000, DIM)))
    planted = [100 + 200 * i for i in range(8)]
    for rank, i in enumerate(planted):  # nearer for a smaller rank
        vectors[i] = _unit(query + (0.05 + 0.03 * rank) * rng.standard_normal(DIM))
    contents = [f"User: ordinary line number {i} about the weather and work" for i in range(2000)]
    contents[planted[5]] = "User: the zorblax festival was loud"
    contents[planted[7]] = "User: I bought a zorblax lamp"
    _archive_vectors(store, user_id="big", vectors=vectors, contents=contents)
    _archive_vectors(
        store, user_id="other", vectors=_unit(rng.standard_normal((500, DIM))), contents=["User: other"] * 500
    )
    with store.engine.begin() as conn:
        conn.execute(text("ANALYZE archived_segments"))
        ids = conn.execute(
            text("SELECT first_seq, id FROM archived_segments WHERE user_id = 'big' AND first_seq = ANY(:s)"),
            {"s": [i + 1 for i in planted]},
        ).all()
    by_seq = dict(ids)
    return query, [by_seq[i + 1] for i in planted]


def test_large_archive_recall_over_the_index_finds_the_exact_top_hits(store, large_archive, monkeypatch):
    query, planted = large_archive
    monkeypatch.setattr(recall_module, "INDEX_FROM", 1000)
    args = dict(user_id="big", query_embedding=list(query), query_text="zorblax", limit=10, pool=50)
    exact = recall(store.engine, RecallQuery(vector_index=False, **args))
    with Statements(store.engine) as seen:
        chosen = recall(store.engine, RecallQuery(**args))
    assert any("hnsw.iterative_scan" in s for s in seen.sql), "2,000 of 2,500 rows: the index path is chosen"
    # the planner reads the HNSW index only when recall orders by the index's own expression
    # (half-precision keys, migration 0017); otherwise it would sort every row of the user
    ranked = next(i for i, s in enumerate(seen.sql) if "ORDER BY score" in s)
    settings = next(i for i, s in enumerate(seen.sql) if "hnsw.iterative_scan" in s)
    with store.engine.raw_connection().driver_connection as conn, conn.transaction():
        conn.execute(seen.sql[settings], seen.params[settings])
        plan = "\n".join(r[0] for r in conn.execute("EXPLAIN " + seen.sql[ranked], seen.params[ranked]).fetchall())
    assert "ix_archived_segments_embedding_hnsw" in plan
    by_vector = [s.id for s in sorted(chosen, key=lambda s: s.vector_rank or 10**6)[:8]]
    assert by_vector == planted
    # The planted hits rank alike on both paths. The other two of the ten are random rows whose
    # distances to the query are as little as 0.0005 apart: the index (approximate, over
    # half-precision keys) may pick or order those differently from the exact scan.
    assert len(chosen) == len(exact)
    assert [s.id for s in chosen][:8] == [s.id for s in exact][:8]
    assert [s.text_rank for s in chosen if s.text_rank] == [1, 2]
    assert [s.distance for s in chosen][:8] == pytest.approx([s.distance for s in exact][:8])


def test_recall_over_the_index_reads_the_neighbours_in_its_statement(store, large_archive, monkeypatch):
    """On the index path too, the best hits' neighbours come with the hits, in one statement."""
    query, planted = large_archive
    monkeypatch.setattr(recall_module, "INDEX_FROM", 1000)
    args = dict(user_id="big", query_embedding=list(query), query_text="zorblax", limit=10, pool=50)
    with Statements(store.engine) as seen:
        found = recall(store.engine, RecallQuery(neighbours=1, **args))
    assert any("hnsw.iterative_scan" in s for s in seen.sql)
    assert sum("ORDER BY score" in s for s in seen.sql) == 1 and not any("unnest(CAST(:hit_ids" in s for s in seen.sql)
    assert [s.id for s in found if s.neighbour_of is None][:8] == [
        s.id for s in recall(store.engine, RecallQuery(**args))
    ][:8]


def test_small_archive_recall_stays_exact(store, large_archive):
    query, _ = large_archive
    with Statements(store.engine) as seen:
        hits = recall(store.engine, RecallQuery(user_id="other", query_embedding=list(query), limit=5))
    assert len(hits) == 5
    assert not any("hnsw" in s for s in seen.sql), "500 segments are below INDEX_FROM: exact search"


def test_archive_count_follows_inserts_and_deletes(store, large_archive):
    def counts() -> dict[str, int]:
        with store.engine.connect() as conn:
            return dict(conn.execute(text("SELECT user_id, segments FROM archive_counts")).all())

    assert counts() == {"big": 2000, "other": 500}
    store.sessions.delete("other:s")
    assert counts() == {"big": 2000}


def _history(store, *, session_id: str, turns: int, context: int) -> None:
    """``turns`` turns in one statement, the newest ``context`` in the recent window."""
    store.sessions.ensure(session_id=session_id, user_id="u-" + session_id)
    with store.engine.begin() as conn:
        conn.execute(
            text(
                "INSERT INTO turns (session_id, seq, role, content, tokens, state, created_at) "
                "SELECT :s, g, CASE WHEN g % 2 = 1 THEN 'user' ELSE 'assistant' END, 'line ' || g, 5, "
                "CASE WHEN g > :n - :c THEN 'context' ELSE 'summarized' END, now() "
                "FROM generate_series(1, :n) AS g"
            ),
            {"s": session_id, "n": turns, "c": context},
        )
        conn.execute(text("ANALYZE turns"))


def test_recent_window_read_uses_the_partial_index(store):
    _history(store, session_id="long", turns=20_000, context=6)
    with Statements(store.engine) as seen:
        window = store.turns.of_session("long", state=TurnState.context)
    assert [t.seq for t in window] == list(range(19_995, 20_001))
    sql, params = next((s, p) for s, p in zip(seen.sql, seen.params, strict=True) if "FROM turns" in s)
    with store.engine.connect() as conn:
        plan = "\n".join(r[0] for r in conn.exec_driver_sql("EXPLAIN " + sql, params))
    assert "ix_turns_session_context" in plan


def _turn_statements(engine, session_id: str, n: int) -> list[int]:
    out = []
    for i in range(n):
        with Statements(engine.store.engine, engine.store.compaction._lock_engine) as seen:
            engine.turn(user_id="u1", session_id=session_id, message=f"Hello number {i}", reply="Hi!")
        out.append(len(seen.sql))
    return out


def test_statements_per_turn_are_few_and_do_not_grow(make_engine_for):
    engine = make_engine_for(window=8192)
    _turn_statements(engine, "s1", 1)  # the first turn also creates the session
    early = _turn_statements(engine, "s1", 3)
    later = _turn_statements(engine, "s1", 3)
    # 11: assembling reads the summary, the archive's size and whether there are files or
    # knowledge in one statement (Store.assembly.session), and reads no files and searches no
    # knowledge when there are none; the claim's UPDATE checks the session's user, so an
    # existing session is not read first. With each of those read on its own a turn took 15.
    # These short follow-ups read the vector of the user turn before them (the enriched query's)
    assert max(early) <= 11, early
    assert later == early, "the statements of a turn do not depend on the history's length"


class RowsRead:
    """Rows the SELECTs sent on an engine returned while it is attached."""

    def __init__(self, engine) -> None:
        self.engine, self.rows = engine, 0

    def _done(self, conn, cursor, statement, parameters, *args) -> None:
        if statement.lstrip().upper().startswith(("SELECT", "WITH")) and cursor.rowcount > 0:
            self.rows += cursor.rowcount

    def __enter__(self) -> RowsRead:
        event.listen(self.engine, "after_cursor_execute", self._done)
        return self

    def __exit__(self, *exc: object) -> None:
        event.remove(self.engine, "after_cursor_execute", self._done)


def test_a_compaction_reads_the_turns_it_rolls_out_not_the_history(store, embedder):
    from runtime.accounting import counter_for
    from runtime.compaction import Compactor, ExtractiveSummarizer

    _history(store, session_id="long", turns=20_000, context=40)
    compactor = Compactor(
        store=store,
        embedder=embedder,
        summarizer=ExtractiveSummarizer(),
        counter=counter_for("gpt-4o-mini"),
        keep_exchanges=2,
        target=0.6,
        breaker_threshold=3,
    )
    with RowsRead(store.engine) as read:
        outcome = compactor.maybe_compact(
            session_id="long", user_id="u-long", recent_cap=100, summary_cap=200, assistant_name="Mira"
        )
    assert outcome is not None and outcome.ok and outcome.summarized
    summary = store.compaction.summary("long")
    assert summary is not None and any(i.get("role") == "user" for i in summary.items), "user quotes were validated"
    # the recent window (40 turns), the summary, the quoted turns: not the 19,960 rolled-out turns
    assert read.rows < 200, read.rows


def _round_trips(trace: str) -> int:
    """Requests the client sent in a libpq trace: simple queries and extended-protocol syncs."""
    fields = (line.split("\t") for line in trace.splitlines())
    return sum(1 for f in fields if len(f) > 2 and f[0] == "F" and f[2].split(" ")[0] in ("Query", "Sync"))


def test_a_turn_sends_few_round_trips(make_engine_for, tmp_path):
    """Each request to the server is a round trip: a turn's statements, plus ``BEGIN`` and
    ``COMMIT``/``ROLLBACK`` only around work of several statements, and no pings."""
    from psycopg import pq

    engine = make_engine_for(window=8192)
    _turn_statements(engine, "s1", 2)
    path = tmp_path / "libpq.trace"
    with path.open("w") as sink:

        def traced(dbapi_connection, record) -> None:
            dbapi_connection.pgconn.trace(sink.fileno())
            dbapi_connection.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS)

        engine.store.engine.dispose()  # the pool connects again, traced
        event.listen(engine.store.engine, "connect", traced)
        try:
            statements = _turn_statements(engine, "s1", 1)[0]
            engine.store.engine.dispose()  # closes the traced connections before the file
        finally:
            event.remove(engine.store.engine, "connect", traced)
    trace = path.read_text()
    trips = _round_trips(trace)
    begins = trace.count('Query\t "BEGIN')
    # two transactions: the user turn (seq and activity), the reply likewise; every other
    # statement runs alone in autocommit, recall's ranked read too (its path known beforehand)
    assert begins == 2, begins
    assert trips == statements + 2 * begins, (trips, statements)
    assert not any('Query\t ";"' in line for line in trace.splitlines()), "no pings"


def test_session_reads_answer_as_the_reads_they_replace(make_engine_for, embedder):
    """One statement gives the summary, the session's character, the archive's size, and whether
    the session has files and its character knowledge: the same answers as reading each on its
    own, before and after a compaction, and after the character gains knowledge."""
    from memory.knowledge import NewChunk, replace_sources

    engine = make_engine_for(window=1024)
    store = engine.store
    engine.turn(user_id="u1", session_id="s1", message="Hello there", reply="Hi!")
    first = store.assembly.session("s1", user_id="u1")
    assert first.character_id == engine.cast.default.id and first.revision == engine.cast.default.revision
    assert first.summary is None and first.archived_segments == 0
    assert not first.has_files and not first.has_knowledge
    for i in range(14):  # a 1,024-token window compacts within these
        engine.turn(user_id="u1", session_id="s1", message=f"Message {i}: " + "tell me more " * 20, reply="Sure. " * 30)
    reads = store.assembly.session("s1", user_id="u1")
    assert reads.summary is not None and reads.summary.model_dump() == store.compaction.summary("s1").model_dump()
    assert reads.archived_segments == store.archive.count(user_id="u1") > 0
    assert not store.assembly.session("s1", user_id="u2").archived_segments  # the user's own
    fact = {"notes.md": [NewChunk(content="a fact", tokens=2, embedding=embedder.embed(["a fact"])[0])]}
    replace_sources(store.engine, character_id=store.characters.placeholder("another character").id, sources=fact)
    assert not store.assembly.session("s1", user_id="u1").has_knowledge  # another character's knowledge
    replace_sources(store.engine, character_id=engine.cast.default.id, sources=fact)
    assert store.assembly.session("s1", user_id="u1").has_knowledge

"""Each turn's text is embedded once: the user's message when the turn is stored (its recall
query's vector), the other turns when compaction archives them; archive keys and enriched
queries are composed from these stored vectors instead of embedding their joined texts."""

from __future__ import annotations

import contextlib
import json
import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event, text

from memory.archive import build_segments, compose, key_vectors, key_weights
from memory.embeddings import SentenceTransformerEmbedder
from memory.store import RequestRecord
from memory.tables import TurnState
from runtime.accounting import counter_for
from runtime.compaction import Compactor, ExtractiveSummarizer
from runtime.context import enrich_query, enrichment

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
COUNTER = counter_for("gpt-4o-mini")


class Recording:
    """Wraps an embedder; records the texts of each call."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.name, self.dimension = inner.name, inner.dimension
        self.calls: list[list[str]] = []
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            self.calls.append(list(texts))
        return self.inner.embed(texts)

    @property
    def texts(self) -> list[str]:
        return [t for call in self.calls if call for t in call]


@contextlib.contextmanager
def recorded_sql(engine, parameters: list | None = None) -> Iterator[list[str]]:
    """The SQL statements ``engine`` sends inside the ``with`` block, in order (their parameters,
    in the same order, appended to ``parameters`` when given)."""
    sent: list[str] = []

    def seen(conn, cursor, statement, params, *args) -> None:
        sent.append(statement)
        if parameters is not None:
            parameters.append(params)

    event.listen(engine, "before_cursor_execute", seen)
    try:
        yield sent
    finally:
        event.remove(engine, "before_cursor_execute", seen)


def add_exchanges(store, n: int, *, session="s1", user="u1"):
    store.sessions.ensure(session_id=session, user_id=user)
    turns = []
    for i in range(n):
        for role, body in (
            ("user", f"I planted {i} tomato seedlings in the garden on day {i}."),
            ("assistant", f"That sounds lovely, tell me how the {i} seedlings grow!"),
        ):
            turns.append(
                store.turns.add(
                    session_id=session,
                    role=role,
                    content=body,
                    tokens=COUNTER.count_message({"role": role, "content": body}),
                    created_at=T0 + timedelta(minutes=i),
                )
            )
    return turns


def compactor(store, embedder) -> Compactor:
    return Compactor(
        store=store,
        embedder=embedder,
        summarizer=ExtractiveSummarizer(),
        counter=COUNTER,
        keep_exchanges=1,
        target=0.5,
        breaker_threshold=3,
    )


def compact(c: Compactor):
    return c.maybe_compact(session_id="s1", user_id="u1", recent_cap=60, summary_cap=400, assistant_name="Mira")


def archived_vectors(store) -> dict[int, list[float]]:
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT first_seq, embedding::text FROM archived_segments ORDER BY first_seq")).all()
    return {seq: json.loads(vector) for seq, vector in rows}


def test_compose_is_the_unit_weighted_sum_and_the_weights_follow_the_setting():
    assert compose([[1.0, 0.0], [0.0, 1.0]], [3.0, 4.0]) == pytest.approx([0.6, 0.8])
    assert key_weights([10, 20, 30], 1, "equal") == [1.0, 1.0, 1.0]
    assert key_weights([10, 20, 30], 1, "centre2") == [1.0, 2.0, 1.0]
    assert key_weights([10, 20, 30], 1, "tokens") == [10.0, 20.0, 30.0]
    assert key_weights([10, 20, 30], 2, "tokens-centre2") == [10.0, 20.0, 60.0]
    with pytest.raises(ValueError, match="one weight per vector"):
        compose([[1.0, 0.0]], [1.0, 2.0])


def test_enrichment_names_the_turns_the_enriched_query_joins():
    previous = ["I went to Hangzhou last week", "", "Sounds great!"]
    assert enrichment("and then?", previous) == [2]  # the last two turns, less the blank one
    assert enrich_query("and then?", previous) == "Sounds great!\nand then?"
    long_message = "What did you think about the museum we visited in Hangzhou last week?"
    assert enrichment(long_message, previous) == [] and enrich_query(long_message, previous) == long_message


def test_the_user_turns_stored_vector_is_its_recall_query_embedding(make_engine_for, store, embedder):
    engine = make_engine_for(window=4096)
    result = engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")
    assert result.user_turn.id is not None and result.assistant_turn.id is not None
    stored = store.turns.vectors([result.user_turn.id, result.assistant_turn.id])
    assert list(stored) == [result.user_turn.id]  # the reply is embedded when it is archived
    assert stored[result.user_turn.id] == pytest.approx(embedder.embed(["My sister Ana moved to Lisbon."])[0], abs=1e-6)


def test_assembling_a_stored_session_does_not_load_the_embedder(make_engine_for, store):
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")
    engine.turn(
        user_id="u1",
        session_id="s1",
        message="She loves riding the old yellow trams around the city.",
        reply="How charming.",
    )
    fresh = SentenceTransformerEmbedder("all-MiniLM-L6-v2")  # loads its model on the first embed
    inspecting = make_engine_for(window=4096)
    inspecting.embedder = fresh
    inspecting = inspecting.derive(window=4096)
    context = inspecting.assemble(user_id="u1", session_id="s1")
    assert "She loves riding the old yellow trams around the city." in context.source_text["recent"]
    assert not fresh.loaded  # the stored vector was the query's: no model load, no embedding


def test_a_user_turn_added_without_a_reply_stores_its_vector_too(make_engine_for, store):
    """A replay or an import adds a user turn with no reply (``add_turn``): its vector is stored
    with it, so assembling after it (``companion inspect``) loads no model either."""
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")
    added = engine.add_turn(user_id="u1", session_id="s1", role="user", content="Her flat has a view of the river.")
    reply = engine.add_turn(user_id="u1", session_id="s1", role="assistant", content="Lovely.")
    assert added.id is not None and reply.id is not None
    assert list(store.turns.vectors([added.id, reply.id])) == [added.id]  # a reply is embedded when archived
    fresh = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    inspecting = make_engine_for(window=4096)
    inspecting.embedder = fresh
    inspecting = inspecting.derive(window=4096)
    context = inspecting.assemble(user_id="u1", session_id="s1")
    assert "Her flat has a view of the river." in context.source_text["recent"]
    assert not fresh.loaded


def test_a_turn_hands_its_messages_vector_to_assembling_and_a_later_assemble_reads_it(make_engine_for, store):
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")
    turn_params: list = []
    with recorded_sql(store.engine, turn_params) as turn_sql:
        result = engine.turn(user_id="u1", session_id="s1", message="She rides the yellow trams.", reply="Fun!")
    with recorded_sql(store.engine) as sent:
        engine.assemble(user_id="u1", session_id="s1")
    stored = [s for s in turn_sql if "INSERT INTO turn_vectors" in s]
    assert len(stored) == 1 and "INSERT INTO turns" in stored[0], "the vector is stored by the turn's own INSERT"
    own = next(t.id for t in engine.store.turns.of_session("s1") if t.content == "She rides the yellow trams.")
    earlier = next(t.id for t in engine.store.turns.of_session("s1") if t.content == "My sister Ana moved to Lisbon.")
    reads = [p for s, p in zip(turn_sql, turn_params, strict=True) if "FROM turn_vectors" in s]
    # the turn reads the vector of the user's message before it (has the talk moved on?), never its own
    assert reads and all(own not in p.values() and earlier in p.values() for p in reads), reads
    assert "She rides the yellow trams." in result.context.source_text["recent"]
    assert any("FROM turn_vectors" in s for s in sent), "an assemble of its own reads the stored vector"


def test_a_follow_up_embeds_only_the_turns_without_a_stored_vector(make_engine_for, store, embedder):
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="I went to Hangzhou last week.", reply="Sounds great!")
    engine.turn(user_id="u1", session_id="s1", message="and then?", reply="Tell me more.")
    recording = Recording(embedder)
    inspecting = make_engine_for(window=4096)
    inspecting.embedder = recording
    inspecting = inspecting.derive(window=4096)
    inspecting.assemble(user_id="u1", session_id="s1")
    # "and then?" is enriched with the two turns before it: the user's vectors are stored, the
    # reply's is not; it is embedded alone, and the enriched text never is
    assert recording.calls == [["Sounds great!"]]


def test_a_compaction_whose_turns_have_stored_vectors_embeds_nothing_and_composes_the_keys(store, embedder):
    turns = add_exchanges(store, 6)
    store.turns.add_vectors({t.id: v for t, v in zip(turns, embedder.embed([t.content for t in turns]), strict=True)})
    recording = Recording(embedder)
    outcome = compact(compactor(store, recording))
    assert outcome is not None and outcome.ok and outcome.rolled_turns >= 4
    assert recording.texts == []
    rolled = turns[: outcome.rolled_turns]
    groups = [rolled[i : i + 2] for i in range(0, len(rolled), 2)]
    expected = key_vectors(
        groups,
        [v for t in rolled for v in [store.turns.vectors([t.id])[t.id]]],
        tokens=[COUNTER.count_text(t.content) for t in rolled],
    )
    stored = archived_vectors(store)
    assert [d.first_seq for d in build_segments(groups, assistant_name="Mira")] == list(stored)
    for seq, vector in zip(stored, expected, strict=True):
        assert stored[seq] == pytest.approx(vector, abs=1e-6)


def test_a_compaction_embeds_the_turns_without_a_vector_in_one_call_and_stores_them(store, embedder):
    turns = add_exchanges(store, 6)
    users = [t for t in turns if t.role == "user"]
    store.turns.add_vectors({t.id: v for t, v in zip(users, embedder.embed([t.content for t in users]), strict=True)})
    recording = Recording(embedder)
    outcome = compact(compactor(store, recording))
    assert outcome is not None and outcome.ok
    rolled = turns[: outcome.rolled_turns]
    assert recording.calls == [[t.content for t in rolled if t.role == "assistant"]]
    stored = store.turns.vectors(t.id for t in turns)
    assert set(stored) == {t.id for t in rolled} | {t.id for t in users}
    for t in rolled:
        assert stored[t.id] == pytest.approx(embedder.embed([t.content])[0], abs=1e-6)


def test_deleting_or_editing_turns_deletes_their_vectors(make_engine_for, store):
    engine = make_engine_for(window=4096)
    first = engine.turn(user_id="u1", session_id="s1", message="I like green tea.", reply="Me too.")
    engine.edit_turn(user_id="u1", session_id="s1", seq=first.user_turn.seq, message="I like black tea.", reply="Ok.")
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM turn_vectors")).scalar() == 1
    store.sessions.delete("s1")
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM turn_vectors")).scalar() == 0


def test_the_migration_adds_turn_vectors_and_downgrades_cleanly(store):
    from alembic import command

    from memory.database import _alembic_config, head_revision

    def tables():
        with store.engine.connect() as conn:
            return {r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}

    assert "turn_vectors" in tables()
    with store.engine.connect() as conn:
        dim = conn.execute(
            text(
                "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'turn_vectors'::regclass AND attname = 'embedding'"
            )
        ).scalar()
    assert dim == 384
    with store.engine.begin() as conn:
        command.downgrade(_alembic_config(conn, 384), "0015")
    assert "turn_vectors" not in tables()
    with store.engine.begin() as conn:
        command.upgrade(_alembic_config(conn, 384), head_revision())
    assert "turn_vectors" in tables()


def test_window_turns_reads_the_recent_window_and_the_newest_usage_turns_in_one_statement(store):
    """Assembling reads the recent window and the calibration's turns (the newest with reported
    usage, rolled out or not) in one statement: the same turns as reading each on its own."""
    store.sessions.ensure(session_id="s1", user_id="u1")
    turns = [
        store.turns.add(
            session_id="s1",
            role=role,
            content=f"{role} {i}",
            tokens=5,
            created_at=T0 + timedelta(minutes=i),
            request=RequestRecord(prompt_tokens=100 + i if role == "assistant" and i % 3 else None),
        )
        for i in range(12)
        for role in ("user", "assistant")
    ]
    with store.engine.begin() as conn:  # the oldest 16 turns rolled out, as a compaction leaves them
        conn.execute(
            text("UPDATE turns SET state = 'summarized' WHERE session_id = 's1' AND seq <= 16"),
        )
    with recorded_sql(store.turns._one) as sent:
        window, usage = store.turns.window("s1", usage_limit=4)
    assert len(sent) == 1
    assert (
        [t.seq for t in window]
        == [t.seq for t in store.turns.of_session("s1", state=TurnState.context)]
        == list(range(17, 25))
    )
    with_usage = [t for t in reversed(turns) if t.usage_prompt_tokens is not None]
    assert [t.seq for t in usage] == [t.seq for t in with_usage[:4]]
    assert any(t.seq <= 16 for t in usage)  # a rolled-out turn still counts for calibration
    assert len({id(t) for t in window} | {id(t) for t in usage}) == len({t.seq for t in window + usage})


def test_an_embedder_failure_stores_no_turn(make_engine_for, store):
    """The message is embedded before anything is written: when the embedder fails, the
    session is as it was (no user turn without its vector, no half-done edit, no new session)."""
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")

    class Failing:
        name, dimension = engine.embedder.name, engine.embedder.dimension

        def embed(self, texts):
            raise RuntimeError("the embedder is down")

    engine.embedder = Failing()
    broken = engine.derive(window=4096)
    before = [(t.seq, t.content) for t in store.turns.of_session("s1")]
    with pytest.raises(RuntimeError):
        broken.turn(user_id="u1", session_id="s1", message="She rides the yellow trams.", reply="Fun!")
    with pytest.raises(RuntimeError):
        broken.edit_turn(user_id="u1", session_id="s1", seq=1, message="My brother moved.", reply="Oh!")
    with pytest.raises(RuntimeError):
        broken.turn(user_id="u1", session_id="s-new", message="A first message.", reply="Hi!")
    assert [(t.seq, t.content) for t in store.turns.of_session("s1")] == before
    assert store.sessions.get("s1").turn_owner is None  # no claim left behind
    assert store.sessions.get("s-new") is None  # not even the session


def test_a_turn_reads_its_recent_window_once(make_engine_for, store):
    """The compaction check after the reply uses the window the turn assembled from (plus the
    reply) instead of reading it again; a turn that pushes the window over the cap still compacts."""
    engine = make_engine_for(window=1024)
    engine.turn(user_id="u1", session_id="s1", message="My sister Ana moved to Lisbon.", reply="Oh, nice!")
    with recorded_sql(store.engine) as sent:
        engine.turn(user_id="u1", session_id="s1", message="She rides the yellow trams.", reply="Fun!")
    window_reads = [s for s in sent if "FROM turns" in s and "turns.state" in s]
    assert len(window_reads) == 1 and "UNION ALL" in window_reads[0]

    long = " ".join(f"word{i}" for i in range(120))
    results = [
        engine.turn(user_id="u1", session_id="s1", message=f"{i}: {long}", reply=f"Reply {i}: {long}") for i in range(8)
    ]
    assert any(r.compactions for r in results)
    assert store.compaction.state("s1").compactions >= 1

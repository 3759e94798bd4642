"""`companion db reembed`: every stored vector (turn vectors, archive keys, knowledge chunks)
rewritten with the configured model, in one transaction, and the model recorded, after which
the guard accepts the new model and refuses the old one."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from sqlalchemy import text

from errors import DatabaseInUseError, EmbeddingModelMismatch
from memory.database import vector_dimension
from memory.knowledge import NewChunk, replace_sources
from memory.profiles import Profiles
from memory.reembed import reembed
from memory.vector_model import RecordedModel, check_model, recorded_model
from runtime.context import without_names
from tests.test_turn_vectors import COUNTER, add_exchanges, compact, compactor

CHUNKS = ["Mira grew up by the sea.", "Mira's favourite food is miso soup.", "Mira plays the cello."]


class Transformed:
    """The real embedder under another name, its vectors passed through ``transform``."""

    def __init__(self, inner, name: str, transform, dimension: int | None = None) -> None:
        self.inner, self.name, self.transform = inner, name, transform
        self.dimension = dimension or inner.dimension
        self.texts: list[str] = []

    def embed(self, texts):
        self.texts.extend(texts)
        return [self.transform(v) for v in self.inner.embed(texts)]


def negate(vector):
    return [-x for x in vector]


def first_eight(vector):
    head = vector[:8]
    norm = math.sqrt(sum(x * x for x in head))
    return [x / norm for x in head]


def _vectors(store, sql: str) -> dict:
    with store.engine.connect() as conn:
        return {k: [float(x) for x in v.strip("[]").split(",")] for k, v in conn.execute(text(sql))}


def snapshot(store) -> dict[str, dict]:
    return {
        "turns": _vectors(store, "SELECT turn_id, embedding::text FROM turn_vectors"),
        "keys": _vectors(store, "SELECT id, embedding::text FROM archived_segments"),
        "chunks": _vectors(store, "SELECT id, embedding::text FROM knowledge_chunks"),
    }


def fill(store, embedder) -> None:
    """Two compactions (so one boundary between their windows), a user turn still in the
    recent window with its stored vector, and a knowledge base; the model recorded."""
    check_model(store.engine, model_name=embedder.name, model_dim=embedder.dimension)
    c = compactor(store, embedder)
    turns = add_exchanges(store, 5)
    assert compact(c).ok
    recent_user = turns[-2]
    store.turns.add_vectors({recent_user.id: embedder.embed([recent_user.content])[0]})
    store.sessions.ensure(session_id="s1", user_id="u1", character_id=store.characters.placeholder("Mira").id)
    for i in range(5, 9):
        for role, body in (("user", f"On day {i} I repotted the basil."), ("assistant", f"Basil day {i}, nice!")):
            store.turns.add(session_id="s1", role=role, content=body, tokens=COUNTER.count_text(body) + 4)
    assert compact(c).ok
    vectors = embedder.embed(CHUNKS)
    chunks = [
        NewChunk(content=t, tokens=COUNTER.count_text(t), embedding=v) for t, v in zip(CHUNKS, vectors, strict=True)
    ]
    replace_sources(store.engine, character_id=store.characters.placeholder("Mira").id, sources={"mira.md": chunks})


def test_reembed_rewrites_every_vector_and_records_the_model(store, embedder):
    fill(store, embedder)
    before = snapshot(store)
    with store.engine.connect() as conn:
        compactions = conn.execute(text("SELECT compactions FROM compaction_state WHERE session_id = 's1'")).scalar()
    assert compactions == 2 and len(before["keys"]) >= 6 and len(before["chunks"]) == 3
    negated = Transformed(embedder, "negated-minilm", negate)
    progress: list[tuple[str, int, int]] = []

    result = reembed(
        store.engine,
        negated,
        count_tokens=COUNTER.count_text,
        user_text=without_names,
        batch=4,
        progress=lambda *a: progress.append(a),
    )

    after = snapshot(store)
    for kind in ("turns", "keys", "chunks"):
        assert after[kind].keys() == before[kind].keys()
        for key, old in before[kind].items():  # negating every turn vector negates every composed key
            assert after[kind][key] == pytest.approx(negate(old), abs=1e-6), (kind, key)
    # every key was recomposed over its own compaction's window (the boundary between the two included)
    assert result.keys_matched == result.archive_keys == len(before["keys"])
    assert result.keys_full_window == result.keys_from_content == 0
    assert result.turn_vectors == len(before["turns"]) and result.knowledge_chunks == 3
    assert result.previous == RecordedModel("all-MiniLM-L6-v2", 384)
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)
    assert ("turn vectors", len(before["turns"]), len(before["turns"])) in progress
    assert [p for p in progress if p[0] == "knowledge chunks"] == [("knowledge chunks", 3, 3)]

    check_model(store.engine, model_name="negated-minilm", model_dim=384)  # the guard accepts the new model
    with pytest.raises(EmbeddingModelMismatch, match="negated-minilm"):
        check_model(store.engine, model_name=embedder.name, model_dim=384)  # and refuses the old one


def test_reembed_embeds_a_users_message_without_the_speakers_names(store, embedder):
    check_model(store.engine, model_name=embedder.name, model_dim=embedder.dimension)
    store.sessions.ensure(session_id="named", user_id="caroline", character_id=store.characters.placeholder("Mira").id)
    Profiles(store.engine).set("caroline", name="Caroline")
    said = "Mira, Caroline here: I repotted the basil today."
    turn = store.turns.add(session_id="named", role="user", content=said, tokens=12, vector=embedder.embed([said])[0])
    reply = store.turns.add(session_id="named", role="assistant", content="Caroline, the basil thanks you!", tokens=9)
    store.turns.add_vectors({reply.id: embedder.embed([reply.content])[0]})
    recording = Transformed(embedder, "recording-minilm", lambda v: v)

    reembed(store.engine, recording, count_tokens=COUNTER.count_text, user_text=without_names)

    unnamed = ", here: I repotted the basil today."
    assert unnamed in recording.texts and said not in recording.texts
    assert reply.content in recording.texts  # the companion's lines are embedded as they are
    assert snapshot(store)["turns"][turn.id] == pytest.approx(embedder.embed([unnamed])[0], abs=1e-6)


def test_an_interrupted_reembed_changes_nothing(store, embedder):
    fill(store, embedder)
    before = snapshot(store)

    calls = {"n": 0}

    def fail_late(vector):  # Ctrl-C in the last stage, the turn vectors and archive keys rewritten
        calls["n"] += 1
        if calls["n"] > len(before["turns"]) + 1:
            raise KeyboardInterrupt
        return negate(vector)

    with pytest.raises(KeyboardInterrupt):
        reembed(
            store.engine,
            Transformed(embedder, "negated-minilm", fail_late),
            count_tokens=COUNTER.count_text,
            user_text=without_names,
            batch=4,
        )
    assert snapshot(store) == before
    assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)


HOLDER = """
import sys
from memory.database import make_engine
engine = make_engine(sys.argv[1])
with engine.connect() as conn:  # a pooled connection, as a running service keeps
    pass
print("connected", flush=True)
sys.stdin.read()
"""


def test_reembed_refuses_while_another_runtime_process_is_connected(store, db_url, embedder):
    fill(store, embedder)
    before = snapshot(store)
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, db_url], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "connected"
        with pytest.raises(DatabaseInUseError, match=rf"pid {holder.pid}\b") as refused:
            reembed(
                store.engine,
                Transformed(embedder, "negated-minilm", negate),
                count_tokens=COUNTER.count_text,
                user_text=without_names,
            )
        assert refused.value.processes == 1
        assert snapshot(store) == before
        assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)
    finally:
        holder.communicate("", timeout=60)  # its engine's connections close as it exits

    reembed(
        store.engine,
        Transformed(embedder, "negated-minilm", negate),
        count_tokens=COUNTER.count_text,
        user_text=without_names,
    )
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)


def test_reembed_to_another_dimension_changes_the_columns_and_rebuilds_the_index(store, embedder):
    fill(store, embedder)
    small = Transformed(embedder, "minilm-first-8", first_eight, dimension=8)

    result = reembed(store.engine, small, count_tokens=COUNTER.count_text, user_text=without_names)

    assert result.dimension_changed
    for table in ("turn_vectors", "archived_segments", "knowledge_chunks"):
        assert vector_dimension(store.engine, table) == 8
    after = snapshot(store)
    with store.engine.connect() as conn:
        contents = {r.id: r.content for r in conn.execute(text("SELECT id, content FROM turns"))}
        index = conn.execute(
            text("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_archived_segments_embedding_hnsw'")
        ).scalar_one()
    for turn_id, vector in after["turns"].items():
        assert vector == pytest.approx(first_eight(embedder.embed([contents[turn_id]])[0]), abs=1e-6)
    for vector in [*after["keys"].values(), *after["chunks"].values()]:
        assert len(vector) == 8 and math.isclose(math.sqrt(sum(x * x for x in vector)), 1.0, abs_tol=1e-5)
    assert "halfvec(8)" in index and "halfvec_cosine_ops" in index  # recall's ORDER BY expression, new N
    assert recorded_model(store.engine) == RecordedModel("minilm-first-8", 8)


def test_the_cli_reembeds_with_the_configured_model(store, db_url, embedder):
    """A database whose vectors came from another model: `companion db reembed` with the
    configured (bundled) model fixes it, printing its progress."""
    fill(store, Transformed(embedder, "negated-minilm", negate))
    env = {**os.environ, "DATABASE_URL": db_url, "COMPANION_EMBEDDING_MODEL": "all-MiniLM-L6-v2"}
    command = [sys.executable, "-m", "runtime.cli", "db", "reembed", "--batch", "5"]

    # this test process's pooled connections are a runtime still running on the database
    refused = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        f"error: 1 other process(es) of the runtime are connected to this database (pid {os.getpid()}): "
        "stop companion serve and companion jobs run, then run companion db reembed again. Nothing was changed."
    ]
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)
    store.engine.dispose()  # the "service" stops

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr
    assert "recorded: 'negated-minilm' (384)" in result.stdout
    assert "turn vectors: 5/" in result.stdout and "knowledge chunks: 3/3" in result.stdout
    assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)
    after = snapshot(store)
    with store.engine.connect() as conn:
        chunks = {r.id: r.content for r in conn.execute(text("SELECT id, content FROM knowledge_chunks"))}
    for chunk_id, vector in after["chunks"].items():
        assert vector == pytest.approx(embedder.embed([chunks[chunk_id]])[0], abs=1e-6)


def test_ctrl_c_during_the_cli_reembed_is_one_line_and_changes_nothing(store, db_url, embedder, monkeypatch, capsys):
    import memory.reembed
    from runtime.cli import main

    fill(store, Transformed(embedder, "negated-minilm", negate))
    before = snapshot(store)
    store.engine.dispose()
    real = memory.reembed.reembed

    def interrupted(engine, embedder, **kwargs):  # Ctrl-C after the first batch's progress
        def progress(*args):
            kwargs["progress"](*args)
            raise KeyboardInterrupt

        return real(engine, embedder, **{**kwargs, "progress": progress})

    monkeypatch.setattr(memory.reembed, "reembed", interrupted)
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("COMPANION_EMBEDDING_MODEL", "all-MiniLM-L6-v2")

    status = main(["db", "reembed", "--batch", "2"])

    assert status == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        "interrupted: nothing was changed (one transaction); run it again to re-embed"
    ]
    assert snapshot(store) == before
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)

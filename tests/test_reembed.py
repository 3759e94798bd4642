"""`companion db reembed`: every stored vector (turn vectors, archive keys, knowledge chunks)
re-embedded with the configured model beside the old ones, then switched to in one short
transaction and the model recorded, after which the guard accepts the new model and refuses the
old one. An interrupted run leaves the old vectors in use and resumes where it stopped."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from sqlalchemy import text

from errors import EmbeddingModelMismatch
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
        assert after[kind].keys() >= before[kind].keys()
        for key, old in before[kind].items():  # negating every turn vector negates every composed key
            assert after[kind][key] == pytest.approx(negate(old), abs=1e-6), (kind, key)
    # the user turns stored without a vector got one; nothing else was added
    with store.engine.connect() as conn:
        roles = dict(conn.execute(text("SELECT id, role FROM turns")).all())
    added = after["turns"].keys() - before["turns"].keys()
    assert added == set(result.added_turn_vectors) and all(roles[t] == "user" for t in added)
    # every key was recomposed over its own compaction's window (the boundary between the two included)
    assert result.keys_matched == result.archive_keys == len(before["keys"])
    assert result.keys_full_window == result.keys_from_content == 0
    assert result.turn_vectors == len(after["turns"]) and result.knowledge_chunks == 3
    assert result.previous == RecordedModel("all-MiniLM-L6-v2", 384)
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)
    assert ("turn vectors", len(after["turns"]), len(after["turns"])) in progress
    assert [p for p in progress if p[0] == "knowledge chunks"] == [("knowledge chunks", 3, 3)]
    with store.engine.connect() as conn:  # the stage is empty again
        assert conn.execute(text("SELECT count(*) FROM reembed_turn_vectors")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM reembed_target")).scalar_one() == 0

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


def test_an_interrupted_reembed_keeps_the_old_vectors_and_resumes_where_it_stopped(store, embedder):
    fill(store, embedder)
    before = snapshot(store)
    calls = {"n": 0}

    def fail_late(vector):  # Ctrl-C after the turn vectors and one knowledge chunk were staged
        calls["n"] += 1
        if calls["n"] > len(before["turns"]) + 3:
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
    assert snapshot(store) == before  # recall goes on with the old vectors
    assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)

    again = Transformed(embedder, "negated-minilm", negate)
    result = reembed(store.engine, again, count_tokens=COUNTER.count_text, user_text=without_names, batch=4)

    assert result.resumed > 0
    assert len(again.texts) < calls["n"]  # what the first run staged was not embedded again
    after = snapshot(store)
    for kind in ("turns", "keys", "chunks"):
        for key, old in before[kind].items():
            assert after[kind][key] == pytest.approx(negate(old), abs=1e-6), (kind, key)
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)


def test_a_run_for_another_model_starts_over(store, embedder):
    fill(store, embedder)

    def stop_at_once(vector):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        reembed(
            store.engine,
            Transformed(embedder, "other", stop_at_once),
            count_tokens=COUNTER.count_text,
            user_text=without_names,
            batch=2,
        )
    result = reembed(
        store.engine,
        Transformed(embedder, "negated-minilm", negate),
        count_tokens=COUNTER.count_text,
        user_text=without_names,
    )
    assert result.resumed == 0
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)


def test_turns_stored_while_it_runs_get_the_new_vectors_too(store, embedder):
    """The runtime is not stopped: a turn (and a compaction) in the middle of the run are re-embedded."""
    fill(store, embedder)
    negated = Transformed(embedder, "negated-minilm", negate)
    added: list = []

    def meanwhile(stage, done, total):
        if stage == "knowledge chunks" and not added:  # after the turn vectors were staged
            body = "Meanwhile I bought a lemon tree."
            added.append(
                store.turns.add(session_id="s1", role="user", content=body, tokens=8, vector=embedder.embed([body])[0])
            )

    reembed(store.engine, negated, count_tokens=COUNTER.count_text, user_text=without_names, progress=meanwhile)

    after = snapshot(store)
    assert after["turns"][added[0].id] == pytest.approx(negate(embedder.embed([added[0].content])[0]), abs=1e-6)


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


def test_the_cli_reembeds_with_the_configured_model_while_the_runtime_is_connected(store, db_url, embedder):
    """A database whose vectors came from another model: `companion db reembed` with the
    configured (bundled) model fixes it, printing its progress, while this test process (a
    runtime) keeps its connections."""
    fill(store, Transformed(embedder, "negated-minilm", negate))
    env = {**os.environ, "DATABASE_URL": db_url, "COMPANION_EMBEDDING_MODEL": "all-MiniLM-L6-v2"}
    command = [sys.executable, "-m", "runtime.cli", "db", "reembed", "--batch", "5"]

    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)

    assert result.returncode == 0, result.stderr
    assert "recorded: 'negated-minilm' (384)" in result.stdout
    assert "turn vectors: 5/" in result.stdout and "knowledge chunks: 3/3" in result.stdout
    assert "Restart every process" in result.stdout
    assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)
    after = snapshot(store)
    with store.engine.connect() as conn:
        chunks = {r.id: r.content for r in conn.execute(text("SELECT id, content FROM knowledge_chunks"))}
    for chunk_id, vector in after["chunks"].items():
        assert vector == pytest.approx(embedder.embed([chunks[chunk_id]])[0], abs=1e-6)


def test_ctrl_c_during_the_cli_reembed_is_one_line_and_keeps_the_old_vectors(
    store, db_url, embedder, monkeypatch, capsys
):
    import memory.reembed
    from runtime.cli import main

    fill(store, Transformed(embedder, "negated-minilm", negate))
    before = snapshot(store)
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
        "interrupted: the old vectors are still in use; run it again to go on from where it stopped"
    ]
    assert snapshot(store) == before
    assert recorded_model(store.engine) == RecordedModel("negated-minilm", 384)


def _staged(store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM reembed_turn_vectors")).scalar_one()


def test_reembed_to_an_api_model_resumes_after_sigkill_and_loses_no_segment(store, db_url, embedder):
    """From the bundled model to an embeddings API of another dimension: the run is killed
    (SIGKILL) halfway, the old vectors stay in use, and the next run finishes from where it stopped."""
    import signal
    import time

    from tests.fake_embeddings import FakeEmbeddings, hash_vector

    fill(store, embedder)
    before = snapshot(store)
    with store.engine.connect() as conn:
        segments = dict(conn.execute(text("SELECT id, content FROM archived_segments")).all())
    with FakeEmbeddings(dimension=64) as fake:
        env = {
            **os.environ,
            "DATABASE_URL": db_url,
            "COMPANION_EMBEDDING_MODEL": "openai/fake-embedding",
            "COMPANION_EMBEDDING_API_BASE": fake.api_base,
            "COMPANION_EMBEDDING_API_KEY": "sk-test",
        }
        command = [sys.executable, "-m", "runtime.cli", "db", "reembed", "--batch", "2"]
        fake.stall = 0.3
        run = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.monotonic() + 120
        while _staged(store) < 4 and time.monotonic() < deadline and run.poll() is None:
            time.sleep(0.05)
        os.kill(run.pid, signal.SIGKILL)
        run.communicate(timeout=60)
        staged = _staged(store)
        assert 4 <= staged < len(before["turns"])
        assert snapshot(store) == before  # recall answers from the old vectors
        assert recorded_model(store.engine) == RecordedModel("all-MiniLM-L6-v2", 384)

        fake.stall = 0.0
        sent = fake.texts_embedded
        result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr
        assert "staged by an earlier run" in result.stdout
        resumed_texts = fake.texts_embedded - sent

    assert recorded_model(store.engine) == RecordedModel("openai/fake-embedding", 64)
    after = snapshot(store)
    with store.engine.connect() as conn:
        now = dict(conn.execute(text("SELECT id, content FROM archived_segments")).all())
        contents = dict(conn.execute(text("SELECT id, content FROM turns")).all())
    assert now == segments  # no segment lost, none changed
    assert after["keys"].keys() == before["keys"].keys()
    assert all(len(v) == 64 for kind in after.values() for v in kind.values())
    assert resumed_texts < len(after["turns"]) + len(after["chunks"])  # the staged rows were not sent again
    for turn_id, vector in after["turns"].items():
        assert vector == pytest.approx(hash_vector(without_names(contents[turn_id], []), 64), abs=1e-6)


def test_after_a_switch_a_process_on_the_old_model_writes_no_vector_and_recalls_by_text(db_url, embedder):
    """A service still running the old model once the switch is recorded: its turns answer, the
    database keeps its vectors out (the trigger reads the model its connections name), and its
    recall stops using vectors, until it restarts with the new model."""
    import structlog

    from memory.database import make_engine
    from memory.store import Store
    from memory.vector_model import record_model
    from runtime.config import Settings
    from runtime.turn import Engine
    from tests.conftest import PERSONA

    engine = make_engine(db_url, embedding_model="all-MiniLM-L6-v2")
    store = Store(engine)
    check_model(engine, model_name="all-MiniLM-L6-v2", model_dim=384)
    runtime = Engine(
        settings=Settings(context_window=1024, database_url="unused"), store=store, embedder=embedder, persona=PERSONA
    )
    first = runtime.turn(user_id="u", session_id="s", message="I keep bees.", reply="Lovely.")
    with engine.begin() as conn:
        record_model(conn, name="negated-minilm", dimension=384)  # what `companion db reembed` commits last

    with structlog.testing.capture_logs() as logs:
        after = runtime.turn(user_id="u", session_id="s", message="The bees swarmed today.", reply="Oh!")

    vectors = store.turns.vectors([first.user_turn.id, after.user_turn.id])
    assert first.user_turn.id in vectors and after.user_turn.id not in vectors
    assert any(e["event"] == "embedder.model_switched" and e["recorded"] == "negated-minilm" for e in logs)
    engine.dispose()

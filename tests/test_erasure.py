"""Erasing a user: every row, vector, lexeme, blob, job and breaker state of theirs is gone from
every table (searched column by column, tests/traces.py), on both blob stores; another user's
file with the same bytes keeps them; running it again is safe; the export holds every turn."""

from __future__ import annotations

import json
import uuid

import pytest

from memory.apps import Directory
from runtime.config import Settings
from runtime.files import open_file_services
from runtime.llm import LiteLLMReplier
from runtime.turn import Engine
from tests.cards import v2_card
from tests.conftest import PERSONA, S3_CREDENTIALS
from tests.traces import traces


@pytest.fixture(params=["postgres", "s3"])
def world(request, store, embedder, fake_llm, tmp_path):
    """An engine with file services on one blob store, compaction queued (its jobs stay waiting),
    and the S3 client and bucket when the blobs are in S3."""
    from runtime.service import QueuedCompaction

    s3 = bucket = None
    extra: dict = {}
    if request.param == "s3":
        import boto3

        bucket, endpoint = request.getfixturevalue("s3_bucket"), request.getfixturevalue("s3_endpoint")
        extra = dict(
            blob_store="s3",
            s3_bucket=bucket,
            s3_endpoint_url=endpoint,
            s3_region=S3_CREDENTIALS["region"],
            s3_access_key_id=S3_CREDENTIALS["access_key_id"],
            s3_secret_access_key=S3_CREDENTIALS["secret_access_key"],
        )
        s3 = boto3.client(
            "s3",
            endpoint_url=endpoint,
            region_name=S3_CREDENTIALS["region"],
            aws_access_key_id=S3_CREDENTIALS["access_key_id"],
            aws_secret_access_key=S3_CREDENTIALS["secret_access_key"],
        )
    from runtime.accounting import Budgets

    # a small recent window (turns roll out soon) and a summary that keeps every quote
    budgets = Budgets.create(recent=200, summary=800)
    settings = Settings(database_url="unused", files_dir=tmp_path / "files", budgets=budgets, **extra)
    services = open_file_services(settings, store.engine)
    scheduler = QueuedCompaction(store.engine)
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(
        settings=settings,
        store=store,
        embedder=embedder,
        persona=PERSONA,
        replier=replier,
        file_services=services,
        compaction=scheduler,
    )
    yield engine, s3, bucket
    scheduler.close()
    services.close()


def _plant(engine: Engine, marker: str) -> tuple[str, str, bytes]:
    """A user of an app whose words hold ``marker`` everywhere the runtime keeps them; returns
    their id, another user's id, and the bytes both uploaded."""
    directory = Directory(engine.store.engine)
    app, _ = directory.create_app("erase-" + uuid.uuid4().hex[:6])
    user, _ = directory.ensure_user(app.id, f"ext-{marker}")
    other, _ = directory.ensure_user(app.id, "someone-else")
    shared = f"shared bytes {uuid.uuid4().hex}\n".encode() * 20
    files = engine.files
    assert files is not None
    files.add(user_id=user.id, name="shared.txt", data=shared)
    files.add(user_id=other.id, name="shared.txt", data=shared)
    mine = files.add(user_id=user.id, name=f"{marker}.txt", data=f"my notes: {marker}\n".encode() * 5)
    engine.set_profile(user_id=user.id, name="Ana", facts=[f"Keeps a locker coded {marker}."])
    card = engine.characters.read(json.dumps(v2_card(name=f"Private {marker}")).encode())
    private = engine.characters.add(card, app_id=app.id, owner_id=user.id)
    session = directory.start_session(user_id=user.id, character_id=private.id).id
    engine.turn(user_id=user.id, session_id=session, message=f"My locker code is {marker}.", attachments=[mine.id])
    for i in range(8):  # rolls the marker's exchange out: archive, summary (compaction runs from the queue)
        engine.turn(
            user_id=user.id, session_id=session, message=f"Filler {i} ({marker}): " + "the garden was quiet. " * 12
        )
    engine.runner.compact_now(engine.runner.request(session, user.id))
    engine.store.profiles.learn(user.id, [f"Their locker code is {marker}."], character_id=private.id)
    return user.id, other.id, shared


def test_an_erased_user_leaves_no_trace_in_any_table_or_blob(world, capsys):
    engine, s3, bucket = world
    marker = "zq" + uuid.uuid4().hex[:12]
    user, other, shared = _plant(engine, marker)
    db = engine.store.engine
    before = traces(db, marker, s3=s3, bucket=bucket)
    expected = {
        "turns.content",
        "archived_segments.content",
        "archived_segments.search",
        "summaries.content",
        "summaries.items",
        "user_profiles.facts",
        "learned_facts.facts",
        "files.name",
        "users.external_id",
        "characters.name",
        "character_revisions.card",
    }
    assert expected <= set(before), before  # the search finds every place the words were
    assert ("file_blobs.data" in before) == (s3 is None) and any(k.startswith("s3:") for k in before) == (
        s3 is not None
    )
    assert traces(db, user)["procrastinate_jobs.args"] >= 1  # a compaction job names the user

    erased = engine.users.erase(user, job_wait=5)
    assert erased.finished and erased.counts["users"] == 1 and erased.counts["turns"] >= 18
    assert traces(db, marker, s3=s3, bucket=bucket) == {}
    assert traces(db, user) == {}  # not even the user's id, in any table or job
    other_file = engine.files.list(user_id=other)[0]
    assert engine.files.read_bytes(other_file) == shared  # the bytes another user shares stay theirs
    assert engine.users.erase(user).counts == {}  # running it again is safe
    out, err = capsys.readouterr()
    assert marker not in out and marker not in err  # nor in the logs


def test_a_turn_of_a_user_being_erased_is_refused_and_nothing_is_stored(make_engine_for, store):
    from errors import UserErasingError

    engine = make_engine_for()
    engine.turn(user_id="u1", session_id="s1", message="hello", reply="hi")
    assert store.erasure.mark("u1")
    with pytest.raises(UserErasingError):
        engine.turn(user_id="u1", session_id="s1", message="still here?", reply="no")
    with pytest.raises(UserErasingError):
        engine.turn(user_id="u1", session_id="s2", message="a new session?", reply="no")
    assert [t.seq for t in store.turns.of_session("s1")] == [1, 2]
    assert store.sessions.get("s2") is None


def test_the_export_holds_every_turn_verbatim(make_engine_for, store):
    engine = make_engine_for(window=1024)
    said = [f"Message {i}: " + "words about the harbour " * 10 for i in range(12)]
    for text in said:
        engine.turn(user_id="u1", session_id="s1", message=text, reply="ok")
    exported = engine.users.export("u1")
    turns = [t["content"] for s in exported["sessions"] for t in s["turns"] if t["role"] == "user"]
    assert turns == said
    assert exported["sessions"][0]["memories"] and exported["sessions"][0]["summary"]["content"]
    json.dumps(exported)  # JSON-ready


def _conversation(engine: Engine, marker: str, *, attach: bool = False) -> tuple[str, str, int]:
    """A user's session whose second message holds ``marker`` (with a file only it carries, with
    ``attach``), rolled out of the recent window into the archive and the summary; then the session
    closed and a new one started from its summary (which carries the quote). Returns the user, the
    first session and the marker turn's seq."""
    from datetime import timedelta

    from memory.tables import utcnow
    from runtime.service import close_idle_sessions

    directory = Directory(engine.store.engine)
    user = "u-" + uuid.uuid4().hex[:8]
    session = f"{user}:first"
    engine.turn(user_id=user, session_id=session, message="Hello there, how are you today?")
    attachments = []
    if attach:
        assert engine.files is not None
        attachments = [engine.files.add(user_id=user, name="code.txt", data=f"the code is {marker}\n".encode() * 4).id]
    engine.turn(user_id=user, session_id=session, message=f"My locker code is {marker}.", attachments=attachments)
    for i in range(8):
        engine.turn(user_id=user, session_id=session, message=f"Filler {i}: " + "the garden was quiet. " * 3)
    engine.runner.compact_now(engine.runner.request(session, user))
    close_idle_sessions(engine, idle_seconds=0, now=utcnow() + timedelta(seconds=1), worker_id="w")
    later = directory.start_session(user_id=user, character_id=engine.cast.default.id)
    assert later.carried_from == session
    return user, session, 3


def test_a_forgotten_memory_is_gone_from_recall_and_every_summary_but_the_transcript_keeps_it(world, capsys):
    engine, s3, bucket = world
    marker = "zq" + uuid.uuid4().hex[:12]
    user, session, _ = _conversation(engine, marker)
    db = engine.store.engine
    before = traces(db, marker, s3=s3, bucket=bucket)
    assert {"turns.content", "archived_segments.content", "archived_segments.search", "summaries.content"} <= set(
        before
    )
    assert before["summaries.content"] == 2  # the session's summary and the one carried into the next session
    [memory] = [m for m in engine.memories.page(user) if marker in m.content]
    assert [m.id for m in engine.memories.search(user, "What is my locker code?")][:3].count(memory.id) == 1

    counts = engine.memories.forget(user, memory.id)
    assert counts["archived_segments"] == 1 and counts["summaries"] == 2
    assert traces(db, marker, s3=s3, bucket=bucket) == {"turns.content": 1}  # the transcript keeps the message
    for summary in engine.store.memories.summaries(user):
        assert summary.items and "Filler" in summary.content  # the rest of each summary is kept
    context = engine.assemble(user_id=user, session_id=session, pending="What is my locker code?")
    assert marker not in "\n".join(str(m["content"]) for m in context.messages)
    with pytest.raises(Exception) as gone:
        engine.memories.forget(user, memory.id)
    assert type(gone.value).__name__ == "NotFoundError"
    out, err = capsys.readouterr()
    assert marker not in out and marker not in err  # the logs never held the words


def test_a_deleted_message_is_gone_everywhere_with_the_file_only_it_carried(world, capsys):
    engine, s3, bucket = world
    marker = "zq" + uuid.uuid4().hex[:12]
    user, session, seq = _conversation(engine, marker, attach=True)
    db = engine.store.engine
    before = traces(db, marker, s3=s3, bucket=bucket)
    assert {"turns.content", "archived_segments.content", "summaries.items"} <= set(before)
    assert ("file_blobs.data" in before) == (s3 is None)

    counts = engine.memories.delete_turn(user, session, seq)
    assert counts["turns"] == 1 and counts["archived_segments"] == 1 and counts["files"] == 1
    assert traces(db, marker, s3=s3, bucket=bucket) == {}
    assert seq not in [t.seq for t in engine.store.turns.of_session(session)]
    assert engine.files.list(user_id=user) == []
    out, err = capsys.readouterr()
    assert marker not in out and marker not in err


def test_the_command_line_exports_and_erases_a_user(db_url, tmp_path):
    import os
    import subprocess
    import sys

    env = {**os.environ, "DATABASE_URL": db_url}

    def run(*args):
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", *args], env=env, capture_output=True, text=True, timeout=300
        )

    from memory.database import make_engine
    from memory.store import Store

    store = Store(make_engine(db_url))
    store.sessions.ensure(session_id="s1", user_id="cli-user")
    store.turns.add(session_id="s1", role="user", content="A line to export.", tokens=6)
    out = tmp_path / "export.json"
    exported = run("users", "export", "cli-user", str(out))
    assert exported.returncode == 0, exported.stderr
    assert json.loads(out.read_text())["sessions"][0]["turns"][0]["content"] == "A line to export."
    erased = run("users", "erase", "cli-user")
    assert erased.returncode == 0 and "erased" in erased.stdout, erased.stderr
    assert store.sessions.get("s1") is None
    again = run("users", "erase", "cli-user")
    assert again.returncode == 0 and "nothing to erase" in again.stdout
    store.engine.dispose()


def test_retention_deletes_sessions_closed_longer_ago_and_keeps_the_rest(make_engine_for, store):
    from datetime import timedelta

    from memory.tables import utcnow
    from runtime.service import close_idle_sessions

    engine = make_engine_for()
    for session in ("old", "young", "open"):
        engine.turn(user_id="u1", session_id=session, message=f"hello from {session}", reply="hi")
    now = utcnow()
    close_idle_sessions(engine, idle_seconds=0, now=now + timedelta(seconds=1), worker_id="w", limit=2)
    with store.engine.begin() as conn:  # "old" was closed 40 days ago
        from sqlalchemy import text

        conn.execute(text("UPDATE sessions SET closed_at = now() - interval '40 days' WHERE id = 'old'"))
        conn.execute(text("UPDATE sessions SET closed_at = NULL WHERE id = 'open'"))
    report = close_idle_sessions(engine, idle_seconds=86400, now=now, worker_id="w", retention_days=30)
    assert report.expired == 1
    assert store.sessions.get("old") is None and store.sessions.get("young") is not None
    assert store.sessions.get("open") is not None
    off = close_idle_sessions(engine, idle_seconds=86400, now=now + timedelta(days=400), worker_id="w")
    assert off.expired == 0 and store.sessions.get("young") is not None  # off by default


def test_forgetting_waits_for_a_running_compaction_and_never_writes_under_it(make_engine_for, store):
    from errors import ConflictError
    from runtime.accounting import Budgets

    engine = make_engine_for(budgets=Budgets.create(recent=200, summary=800))
    marker = "zq" + uuid.uuid4().hex[:12]
    user, session, _ = _conversation(engine, marker)
    [memory] = [m for m in engine.memories.page(user) if marker in m.content]
    before = {s.session_id: s.content for s in store.memories.summaries(user)}
    with store.compaction.lock(session) as held:  # a compaction of the session is running
        assert held
        with pytest.raises(ConflictError):
            engine.memories.forget(user, memory.id)
    assert {s.session_id: s.content for s in store.memories.summaries(user)} == before  # nothing written
    assert engine.memories.forget(user, memory.id)["archived_segments"] == 1  # once it has ended


def test_the_export_of_a_replayed_locomo_conversation_holds_every_user_turn_verbatim(make_engine_for):
    """The repository's sample conversation (LoCoMo's layout); with ``../shared/data/locomo_dev7.json``
    beside the repository, its first conversation too."""
    from pathlib import Path

    from runtime.service import load_conversations, replay_conversation

    repo = Path(__file__).resolve().parents[1]
    paths = [repo / "scripts" / "data" / "sample_conversation.json"]
    shared = repo.parent / "shared" / "data" / "locomo_dev7.json"
    conversations = [c for p in paths for c in load_conversations(p)]
    if shared.is_file():
        conversations.append(load_conversations(shared)[0])
    engine = make_engine_for(window=1024)
    for conv in conversations:
        report = replay_conversation(engine, conv, run_id="export")
        exported = engine.users.export(report.user_id)
        said = [t["content"] for s in exported["sessions"] for t in s["turns"] if t["role"] == "user"]
        assert said == [t.text for t in conv.turns if t.role == "user"], conv.id

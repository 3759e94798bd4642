"""One turn at a time per session: concurrent turns, edits, greetings and closes never cross
or lose a stored turn. A turn that finds its session busy stores nothing and says so
(``TurnInProgressError``, HTTP 409 ``turn_in_progress``)."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
import structlog
from sqlalchemy import text
from structlog.testing import capture_logs

from errors import InvalidRequestError, SessionClosedError, SessionOwnershipError, TurnInProgressError
from memory.tables import TurnState
from runtime.config import Settings
from runtime.llm import Reply
from runtime.service import close_idle_sessions
from runtime.service._jobs import close_session
from runtime.turn import Engine
from tests.conftest import PERSONA


class SlowEcho:
    """A replier that answers the newest user message of what it is sent, after a pause:
    a turn that answers another turn's message shows up as a crossed reply."""

    model = "openai/fake-model"

    def __init__(self, seconds: float = 0.3) -> None:
        self.seconds = seconds
        self.started = threading.Event()

    def reply(self, messages, *, session_id, on_delta=None, tools=None, **_: Any) -> Reply:
        self.started.set()
        newest = [m for m in messages if m["role"] == "user"][-1]["content"]
        time.sleep(self.seconds)
        return Reply(content=f"echo: {newest}")


@pytest.fixture
def slow_engine(store, embedder):
    def build(seconds: float = 0.3, **overrides: Any) -> Engine:
        overrides.setdefault("turn_wait_seconds", 0.0)  # refused at once, unless a test waits
        settings = Settings(context_window=4096, database_url="unused", **overrides)
        return Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=SlowEcho(seconds))

    return build


def transcript(engine: Engine, session_id: str) -> list[tuple[str, str]]:
    return [(t.role, t.content) for t in engine.store.turns.of_session(session_id)]


def test_concurrent_turns_on_one_session_never_cross(slow_engine):
    engine = slow_engine(0.2)
    engine.add_turn(user_id="u", session_id="s", role="assistant", content="Hello!")
    messages = [f"message {i}" for i in range(12)]

    def send(message: str) -> str:
        try:
            return engine.turn(user_id="u", session_id="s", message=message).assistant_turn.content
        except TurnInProgressError:
            return "busy"

    with ThreadPoolExecutor(max_workers=12) as pool:
        answers = list(pool.map(send, messages))

    done = [(m, a) for m, a in zip(messages, answers, strict=True) if a != "busy"]
    assert done, "at least one turn ran"
    assert all(a == f"echo: {m}" for m, a in done), "every reply answers its own message"
    rows = transcript(engine, "s")[1:]
    assert [r for r, _ in rows] == ["user", "assistant"] * len(done), "user and reply alternate"
    for (_, user), (_, reply) in zip(rows[::2], rows[1::2], strict=True):
        assert reply == f"echo: {user}"
    refused = [m for m, a in zip(messages, answers, strict=True) if a == "busy"]
    assert not {m for m in refused} & {c for _, c in rows}, "a refused message stored nothing"


def test_a_turn_while_another_runs_is_refused_and_stores_nothing(slow_engine):
    engine = slow_engine(1.0)
    engine.add_turn(user_id="u", session_id="s", role="assistant", content="Hello!")
    replier = engine.replier
    with ThreadPoolExecutor(max_workers=1) as pool:
        first = pool.submit(engine.turn, user_id="u", session_id="s", message="first")
        assert replier.started.wait(30)
        with pytest.raises(TurnInProgressError):
            engine.turn(user_id="u", session_id="s", message="second")
        with pytest.raises(TurnInProgressError):
            engine.edit_turn(user_id="u", session_id="s", seq=2, message="edited")
        with pytest.raises(TurnInProgressError):
            close_session(engine, "s", closed_by="test")
        assert first.result(timeout=60).assistant_turn.content == "echo: first"
    assert transcript(engine, "s") == [("assistant", "Hello!"), ("user", "first"), ("assistant", "echo: first")]
    assert engine.store.sessions.get("s").closed_at is None


def test_edit_and_resend_is_one_step_for_other_turns(slow_engine):
    engine = slow_engine(0.3)
    engine.turn(user_id="u", session_id="s", message="one")
    with ThreadPoolExecutor(max_workers=2) as pool:
        edit = pool.submit(engine.edit_turn, user_id="u", session_id="s", seq=1, message="one, edited")
        time.sleep(0.05)
        other = pool.submit(engine.turn, user_id="u", session_id="s", message="two")
        outcomes = []
        for future in (edit, other):
            try:
                outcomes.append(future.result(timeout=60).assistant_turn.content)
            except TurnInProgressError:
                outcomes.append("busy")
    rows = transcript(engine, "s")
    assert [r for r, _ in rows] == ["user", "assistant"] * (len(rows) // 2)
    for (_, user), (_, reply) in zip(rows[::2], rows[1::2], strict=True):
        assert reply == f"echo: {user}"


def test_the_close_job_skips_a_session_whose_turn_is_running(slow_engine):
    engine = slow_engine(1.0)
    engine.add_turn(user_id="u", session_id="s", role="assistant", content="Hello!")
    with engine.store.engine.begin() as conn:  # idle for a day
        conn.execute(text("UPDATE sessions SET last_activity_at = now() - interval '1 day' WHERE id = 's'"))
    claim = engine.claim("s")
    try:
        report = close_idle_sessions(engine, idle_seconds=3600, batch=10, worker_id="w1")
        assert report.closed == []
        assert engine.store.sessions.get("s").closed_at is None
    finally:
        claim.release()
    report = close_idle_sessions(engine, idle_seconds=3600, batch=10, worker_id="w1")
    assert report.closed == ["s"]
    with pytest.raises(SessionClosedError):
        engine.turn(user_id="u", session_id="s", message="too late")
    assert [t.content for t in engine.store.turns.of_session("s")] == ["Hello!"]


def test_a_claim_whose_process_died_lapses(slow_engine):
    engine = slow_engine(0.0, turn_lease_seconds=5)
    engine.add_turn(user_id="u", session_id="s", role="assistant", content="Hello!")
    engine.store.sessions.claim("s", owner="dead-process", lease_seconds=5)
    with pytest.raises(TurnInProgressError):
        engine.turn(user_id="u", session_id="s", message="hi")
    stale = datetime.now(UTC) - timedelta(seconds=6)
    with engine.store.engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET turn_claimed_at = :t WHERE id = 's'"), {"t": stale})
    assert engine.turn(user_id="u", session_id="s", message="hi").assistant_turn.content == "echo: hi"
    assert engine.store.turns.of_session("s", state=TurnState.context)[-1].content == "echo: hi"


def test_a_turn_on_a_busy_session_waits_for_it_within_the_bound(slow_engine):
    engine = slow_engine(0.5, turn_wait_seconds=30)
    engine.add_turn(user_id="u", session_id="s", role="assistant", content="Hello!")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = [pool.submit(engine.turn, user_id="u", session_id="s", message=f"m{i}") for i in range(4)]
        answers = [f.result(timeout=120).assistant_turn.content for f in futures]
    assert answers == [f"echo: m{i}" for i in range(4)]
    rows = transcript(engine, "s")[1:]
    assert [r for r, _ in rows] == ["user", "assistant"] * 4
    for (_, user), (_, reply) in zip(rows[::2], rows[1::2], strict=True):
        assert reply == f"echo: {user}"


@pytest.fixture
def default_structlog():
    """structlog as it starts (another test's CLI run may have configured a warning level); reset after."""
    structlog.reset_defaults()
    yield
    structlog.reset_defaults()


def test_a_claim_knows_its_sessions_user_and_breaker(make_engine_for, store, default_structlog):
    """The claim's one statement also says whose session it is and whether the breaker was
    open: a turn under a claim of another user's session is refused and stores nothing, and
    ``turn.completed`` reports an open breaker without reading it again."""
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="Hello there.", reply="Hi!")
    with store.engine.begin() as conn:
        conn.execute(text("UPDATE compaction_state SET breaker_opened_at = now() WHERE session_id = 's1'"))
    claim = engine.claim("s1")
    try:
        assert (claim.session.user_id, claim.session.breaker_open) == ("u1", True)
        with pytest.raises(SessionOwnershipError):
            engine.turn(user_id="u2", session_id="s1", message="Not my session.", reply="?", claim=claim)
        with capture_logs() as logs:
            engine.turn(user_id="u1", session_id="s1", message="Still here.", reply="Good.", claim=claim)
    finally:
        claim.release()
    assert [t.content for t in store.turns.of_session("s1")] == ["Hello there.", "Hi!", "Still here.", "Good."]
    assert [e["breaker_state"] for e in logs if e["event"] == "turn.completed"] == ["open"]


def test_a_claim_on_another_session_is_refused(make_engine_for, store):
    """A caller's claim must be on the turn's own session: one on another session (even the
    same user's) neither skips the session's checks nor lets the turn run unclaimed."""
    engine = make_engine_for(window=4096)
    engine.turn(user_id="victim", session_id="sx", message="Mine.", reply="Yes.")
    engine.turn(user_id="u", session_id="sy", message="Hello.", reply="Hi.")
    claim = engine.claim("sy")
    try:
        for call in (
            lambda: engine.turn(user_id="u", session_id="sx", message="Not mine.", reply="?", claim=claim),
            lambda: engine.runner.add_turn(user_id="u", session_id="sx", role="user", content="Not mine.", claim=claim),
            lambda: engine.edit_turn(user_id="victim", session_id="sx", seq=1, message="Edit.", reply="?", claim=claim),
        ):
            with pytest.raises(InvalidRequestError) as raised:
                call()
            assert raised.value.field == "claim"
    finally:
        claim.release()
    assert [t.content for t in store.turns.of_session("sx")] == ["Mine.", "Yes."]


def test_a_turn_on_another_users_session_is_refused_without_claiming_it(make_engine_for, store):
    """A turn claims its session only if the session is its user's: another user's turn is
    refused (nothing stored), the session is left unclaimed, and a new session is created on
    the turn's first claim."""
    engine = make_engine_for(window=4096)
    engine.turn(user_id="u1", session_id="s1", message="Hello there.", reply="Hi!")
    with pytest.raises(SessionOwnershipError):
        engine.turn(user_id="u2", session_id="s1", message="Not my session.", reply="?")
    with store.engine.connect() as conn:
        owner = conn.execute(text("SELECT turn_owner FROM sessions WHERE id = 's1'")).scalar()
    assert owner is None
    assert [t.content for t in store.turns.of_session("s1")] == ["Hello there.", "Hi!"]
    engine.turn(user_id="u2", session_id="s2", message="My own.", reply="Welcome.")
    assert store.sessions.get("s2").user_id == "u2"

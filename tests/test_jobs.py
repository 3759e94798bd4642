"""The session-close job: idle sessions roll out into their summary and archive and close,
exactly once even with two workers at once; the breaker rules hold; a returning user's
new session starts from the previous summary; ``companion jobs close-idle --once``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import uuid
from datetime import timedelta

import pytest
from sqlalchemy import text

from errors import ConfigurationError, SessionClosedError
from memory.apps import Directory
from memory.database import make_engine
from memory.store import Store
from memory.tables import TurnState, utcnow
from runtime.accounting import Budgets
from runtime.config import Settings
from runtime.service import close_idle_sessions
from runtime.turn import Engine
from tests.conftest import PERSONA

HOUR = 3600.0


def engine_default(engine) -> str:
    """The id of the deployment character named as the test persona (made if missing)."""
    from sqlmodel import Session

    from memory.characters import placeholder

    with Session(engine) as db:
        found = placeholder(db, PERSONA.name)
        db.commit()
    return found


def seed_idle_sessions(engine, n: int, *, idle_hours: float = 7.0, turns_each: int = 2) -> list[str]:
    """``n`` sessions of ``n`` users, ``turns_each`` short turns each, last active
    ``idle_hours`` ago, inserted in bulk."""
    tag = uuid.uuid4().hex[:6]
    ids = [f"idle-{tag}-{i:03d}" for i in range(n)]
    at = utcnow() - timedelta(hours=idle_hours)
    with engine.begin() as conn:
        conn.execute(text("INSERT INTO users (id) VALUES (:u)"), [{"u": f"u-{s}"} for s in ids])
        conn.execute(
            text(
                "INSERT INTO sessions (id, user_id, character_id, created_at, last_activity_at) "
                "VALUES (:s, :u, :c, :at, :at)"
            ),
            [{"s": s, "u": f"u-{s}", "c": engine_default(engine), "at": at} for s in ids],
        )
        conn.execute(text("INSERT INTO compaction_state (session_id) VALUES (:s)"), [{"s": s} for s in ids])
        conn.execute(
            text(
                "INSERT INTO turns (session_id, seq, role, content, tokens, state, created_at, interrupted) "
                "VALUES (:s, :q, :r, :c, 12, 'context', :at, false)"
            ),
            [
                {
                    "s": s,
                    "q": q,
                    "r": "user" if q % 2 else "assistant",
                    "c": f"Line {q} of {s}: I like green tea.",
                    "at": at,
                }
                for s in ids
                for q in range(1, turns_each + 1)
            ],
        )
    return ids


def worker_engine(db_url: str, embedder, **settings) -> Engine:
    """An engine with its own connection pool, as a separate worker process would have."""
    return Engine(
        settings=Settings(database_url=db_url, **settings),
        store=Store(make_engine(db_url)),
        embedder=embedder,
        persona=PERSONA,
    )


def test_two_workers_close_200_idle_sessions_exactly_once(db_url, embedder):
    ids = seed_idle_sessions(make_engine(db_url), 200)
    workers = [worker_engine(db_url, embedder) for _ in range(2)]
    start = threading.Barrier(2)
    reports: dict[str, object] = {}

    def run(name: str, engine: Engine) -> None:
        start.wait()
        reports[name] = close_idle_sessions(engine, idle_seconds=6 * HOUR, worker_id=name, batch=5)

    threads = [threading.Thread(target=run, args=(f"w{i}", e)) for i, e in enumerate(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    a, b = set(reports["w0"].closed), set(reports["w1"].closed)
    assert not reports["w0"].failed and not reports["w1"].failed
    assert a.isdisjoint(b)
    assert a | b == set(ids)
    assert len(reports["w0"].closed) + len(reports["w1"].closed) == 200  # no session twice within a worker either
    assert a and b, "both workers took part"
    with workers[0].store.engine.connect() as conn:
        closed_by = dict(conn.execute(text("SELECT id, closed_by FROM sessions WHERE closed_at IS NOT NULL")).all())
        per_session = dict(
            conn.execute(text("SELECT session_id, count(*) FROM archived_segments GROUP BY session_id")).all()
        )
        left = conn.execute(text("SELECT count(*) FROM turns WHERE state = 'context'")).scalar()
    assert closed_by == {**{s: "w0" for s in a}, **{s: "w1" for s in b}}
    assert per_session == {s: 2 for s in ids}  # each session's two turns archived once, never twice
    assert left == 0
    assert all("I like green tea." in (workers[0].store.compaction.summary(s).content) for s in ids[:3])


def test_sessions_active_within_the_threshold_stay_open(db_url, embedder):
    engine = make_engine(db_url)
    idle = seed_idle_sessions(engine, 2, idle_hours=7)
    fresh = seed_idle_sessions(engine, 2, idle_hours=1)
    report = close_idle_sessions(worker_engine(db_url, embedder), idle_seconds=6 * HOUR, worker_id="w")
    assert sorted(report.closed) == sorted(idle)
    store = Store(engine)
    assert all(store.sessions.get(s).closed_at is None for s in fresh)
    # measured from a later "now", the fresh ones are idle too
    later = close_idle_sessions(
        worker_engine(db_url, embedder), idle_seconds=6 * HOUR, now=utcnow() + timedelta(hours=6)
    )
    assert sorted(later.closed) == sorted(fresh)


def test_with_the_breaker_open_the_close_archives_only(db_url, embedder):
    ids = seed_idle_sessions(make_engine(db_url), 1, turns_each=4)
    engine = worker_engine(db_url, embedder)
    for _ in range(3):
        engine.store.compaction.record_failure(ids[0], error="SummarizationError: test", threshold=3)
    report = close_idle_sessions(engine, idle_seconds=6 * HOUR, worker_id="w")
    assert report.closed == ids and report.rolled_turns == 4
    assert engine.store.compaction.summary(ids[0]) is None
    assert {t.state for t in engine.store.turns.of_session(ids[0])} == {TurnState.archived}
    assert len(engine.store.archive.segments(session_id=ids[0])) == 4


def test_a_closed_session_refuses_new_turns(make_engine_for, fake_llm):
    engine = make_engine_for()
    engine.add_turn(user_id="ana", session_id="s-closed", role="user", content="Hi there")
    with engine.store.engine.begin() as conn:
        conn.execute(text("UPDATE sessions SET last_activity_at = now() - interval '7 hours' WHERE id = 's-closed'"))
    assert close_idle_sessions(engine, idle_seconds=6 * HOUR, worker_id="w").closed == ["s-closed"]
    with pytest.raises(SessionClosedError):
        engine.turn(user_id="ana", session_id="s-closed", message="Are you there?")
    assert len(engine.store.turns.of_session("s-closed")) == 1
    assert fake_llm.requests == []


def test_a_returning_user_starts_from_the_previous_summary_and_it_stays_valid(make_engine_for, fake_llm):
    engine = make_engine_for(budgets=Budgets.create(recent=200, summary=800))
    directory = Directory(engine.store.engine)
    app, _ = directory.create_app("carry")
    user, _ = directory.ensure_user(app.id, "ana")
    first = directory.start_session(user_id=user.id, character_id=engine.cast.default.id)
    for i, line in enumerate(["My dog is called Pixel.", "I work as a nurse in Braga."]):
        engine.turn(user_id=user.id, session_id=first.id, message=line, reply=f"Noted {i}.")
    report = close_idle_sessions(engine, idle_seconds=0, now=utcnow() + timedelta(seconds=1), worker_id="w")
    assert report.closed == [first.id]

    second = directory.start_session(user_id=user.id, character_id=engine.cast.default.id)
    assert second.carried_from == first.id
    carried = engine.store.compaction.summary(second.id)
    assert [i["text"] for i in carried.items if i["role"] == "user"] == [
        "My dog is called Pixel.",
        "I work as a nurse in Braga.",
    ]
    assert all(i["seq"] <= 0 and i["carried_from"] == first.id for i in carried.items)
    engine.turn(user_id=user.id, session_id=second.id, message="Guess what happened today?", reply="Tell me!")
    context = engine.assemble(user_id=user.id, session_id=second.id)
    assert "My dog is called Pixel." in context.source_text["summary"]
    assert context.sources["recent"].items == 2  # not the old session's raw turns

    # the new session compacts: the carried quotes pass validation and stay, flat
    for i in range(8):
        engine.turn(
            user_id=user.id, session_id=second.id, message=f"Today's story part {i}: " + "la " * 20, reply="Mm."
        )
    summary = engine.store.compaction.summary(second.id)
    state = engine.store.compaction.state(second.id)
    assert (state.compactions >= 1, state.consecutive_failures) == (True, 0)
    assert summary.last_seq > 0 and summary.content.count("<summary") == 1
    assert "My dog is called Pixel." in summary.content
    assert any(i["role"] == "user" and i["seq"] > 0 for i in summary.items)


def test_close_settings_are_read_and_checked():
    settings = Settings.from_env({})
    assert (settings.close_cron, settings.close_idle_hours, settings.close_batch) == ("0 3 * * *", 6.0, 20)
    assert Settings.from_env({"COMPANION_CLOSE_CRON": settings.close_cron}).close_cron == settings.close_cron
    custom = Settings.from_env({"COMPANION_CLOSE_CRON": "30 4 * * *", "COMPANION_CLOSE_IDLE_HOURS": "1.5"})
    assert (custom.close_cron, custom.close_idle_hours) == ("30 4 * * *", 1.5)
    with pytest.raises(ConfigurationError, match="COMPANION_CLOSE_CRON"):
        Settings.from_env({"COMPANION_CLOSE_CRON": "every night"})


def test_close_idle_once_from_the_command_line(db_url, fake_llm):
    ids = seed_idle_sessions(make_engine(db_url), 3)
    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "COMPANION_MODEL": "openai/fake",
        "COMPANION_API_BASE": fake_llm.api_base,
        "COMPANION_CONTEXT_WINDOW": "1024",
        "OPENAI_API_KEY": "sk-test",
    }
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "jobs", "close-idle", "--once", "--worker", "cron-1"],
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "claimed 3, closed 3, failed 0" in done.stdout
    store = Store(make_engine(db_url))
    assert [store.sessions.get(s).closed_by for s in ids] == ["cron-1"] * 3


def test_jobs_run_starts_the_scheduler_and_ctrl_c_exits_cleanly(db_url, fake_llm):
    import signal

    env = {
        **os.environ,
        "DATABASE_URL": db_url,
        "COMPANION_MODEL": "openai/fake",
        "COMPANION_CONTEXT_WINDOW": "1024",
        "COMPANION_CLOSE_CRON": "15 4 * * *",
        "COMPANION_LOG_LEVEL": "info",
        "COMPANION_LOG_FORMAT": "json",
    }
    proc = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "jobs", "run"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        events = []
        for line in proc.stderr:
            if line.startswith("{"):
                events.append(json.loads(line))
                if events[-1]["event"] == "job.scheduler_started":
                    break
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert events[-1]["cron"] == "15 4 * * *"
    assert "'15 4 * * *'" in out
    assert '"job.scheduler_stopped"' in err


def test_a_new_session_by_id_through_the_engine_also_starts_from_the_previous_summary(make_engine_for, fake_llm):
    """The CLI and Python API name sessions themselves (``Sessions.ensure``): a new one
    carries over too, and an existing session never gets a second copy."""
    engine = make_engine_for(budgets=Budgets.create(recent=200, summary=800))
    for line in ["My dog is called Pixel.", "I work as a nurse in Braga."]:
        engine.turn(user_id="bea", session_id="bea-1", message=line, reply="Noted.")
    close_idle_sessions(engine, idle_seconds=0, now=utcnow() + timedelta(seconds=1), worker_id="w")
    engine.turn(user_id="bea", session_id="bea-2", message="I'm back!", reply="Welcome back.")
    assert engine.store.sessions.get("bea-2").carried_from == "bea-1"
    context = engine.assemble(user_id="bea", session_id="bea-2")
    assert "My dog is called Pixel." in context.source_text["summary"]
    engine.turn(user_id="bea", session_id="bea-2", message="Still here.", reply="Good.")
    assert (
        engine.store.compaction.summary("bea-2").content.count('User: "My dog is called Pixel."') == 1
    )  # one quote, not two
    # another user's new session carries nothing over
    engine.turn(user_id="cai", session_id="cai-1", message="Hello", reply="Hi.")
    assert engine.store.compaction.summary("cai-1") is None and engine.store.sessions.get("cai-1").carried_from is None

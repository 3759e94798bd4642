"""Compaction off the reply path: queued as a procrastinate job, run by workers.

Real parts: the embedded PostgreSQL with procrastinate's schema (migration 0014), real
procrastinate workers, the real embedder; the chat and summary models are the loopback fake
(``tests/fake_llm.py``), the summary one slowed down where a test needs a slow summarizer.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
import structlog
from sqlalchemy import text
from structlog.testing import capture_logs

from memory.tables import TurnState
from runtime.accounting import Budgets
from runtime.compaction import LiteLLMSummarizer
from runtime.config import Settings
from runtime.llm import LiteLLMReplier
from runtime.service import QueuedCompaction, QueueWorker, drain
from runtime.service._queue import build_app, recover_stalled_jobs
from runtime.turn import Engine
from tests.conftest import PERSONA

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SUMMARY_MODEL = "fake-summary"
BUDGETS = Budgets.create(persona=150, memory=150, retrieval=50, summary=250, recent=240, reply_reserve=100)
WINDOW = BUDGETS.total


@pytest.fixture(autouse=True)
def _reset_structlog():
    yield
    structlog.reset_defaults()


def summary_json() -> str:
    return json.dumps(
        {
            "profile": ["The user counts words."],
            "relationship": [],
            "preferences": [],
            "open_threads": [],
            "quotes": [],
        }
    )


def slow_summaries(
    fake_llm, seconds: float, started: threading.Event | None = None, release: threading.Event | None = None
):
    """Summary requests answer after ``seconds`` (or, with ``release``, once it is set, 60 s at
    most); replies at once."""

    def respond(body):
        if body.get("model") != SUMMARY_MODEL:
            return "I hear you."
        if started is not None:
            started.set()
        if release is not None:
            release.wait(60)
        time.sleep(seconds)
        return summary_json()

    fake_llm.responder = respond


def summary_requests(fake_llm) -> list[dict]:
    return [r for r in fake_llm.requests if r.get("model") == SUMMARY_MODEL]


def user_text(i: int, words: int = 20) -> str:
    return f"user message {i}: " + " ".join(f"word{i}x{j}" for j in range(words))


@pytest.fixture
def build(store, embedder, fake_llm):
    """``build(queued=True)``: an engine on the test database whose compaction is queued (or inline)."""
    opened: list[QueuedCompaction] = []

    def make(*, queued: bool = True) -> Engine:
        settings = Settings(database_url="unused", budgets=BUDGETS)
        scheduler = QueuedCompaction(store.engine) if queued else None
        if scheduler is not None:
            opened.append(scheduler)
        return Engine(
            settings=settings,
            store=store,
            embedder=embedder,
            persona=PERSONA,
            replier=LiteLLMReplier(
                model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10
            ),
            summarizer=LiteLLMSummarizer(
                model=f"openai/{SUMMARY_MODEL}", api_base=fake_llm.api_base, api_key="sk-test", timeout=30
            ),
            compaction=scheduler,
        )

    yield make
    for scheduler in opened:
        scheduler.close()


def jobs(store, session_id: str | None = None) -> list[tuple[str, str]]:
    """(status, queueing_lock) of the compaction jobs in the queue, oldest first."""
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT status::text, queueing_lock FROM procrastinate_jobs ORDER BY id")).all()
    # the embeddings sweep a worker defers every ten minutes is not one of them
    wanted = f"compaction:{session_id}" if session_id is not None else None
    return [(s, q) for s, q in rows if (q or "").startswith("compaction:") and (wanted is None or q == wanted)]


def over_cap(store, session_id: str) -> bool:
    return sum(t.tokens for t in store.turns.of_session(session_id, state=TurnState.context)) > BUDGETS.recent


def turn(engine: Engine, i: int, session_id: str = "s1") -> float:
    """One model turn; returns its wall time, seconds."""
    start = time.perf_counter()
    engine.turn(user_id="u1", session_id=session_id, message=user_text(i), at=T0 + timedelta(minutes=i))
    return time.perf_counter() - start


def turns_until_queued(engine: Engine, store, session_id: str = "s1", start: int = 0) -> int:
    """Run turns until one leaves a compaction job queued; returns the next turn index."""
    i = start
    while not jobs(store, session_id):
        turn(engine, i, session_id)
        i += 1
        assert i < start + 20, "no compaction job was queued"
    return i


def test_the_reply_returns_while_a_slow_summary_runs_and_the_job_compacts_afterwards(build, store, fake_llm):
    started = threading.Event()
    slow_summaries(fake_llm, 3.0, started)
    engine = build()
    turn(engine, 0, "warm-up")  # first-call imports and connections are not the point here
    with QueueWorker(engine, name="w1", poll_seconds=0.2):
        i = 0
        while not started.is_set():
            turn(engine, i)
            i += 1
            assert i < 20, "no compaction ran"
        # the turns returned while the summarizer was still answering: nothing is compacted yet
        assert store.compaction.state("s1").compactions == 0
        deadline = time.monotonic() + 30
        while store.compaction.state("s1").compactions == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
    # one job per queued batch of turns; a turn added while the first job ran may have queued a second
    done = store.compaction.state("s1").compactions
    assert done >= 1 and len(summary_requests(fake_llm)) >= done
    assert store.compaction.summary("s1") is not None and store.archive.segments(session_id="s1")


def test_a_compaction_turn_waits_for_the_summary_inline_but_not_queued(build, store, fake_llm):
    """The turn that triggers compaction: inline it waits for the slow summarizer; queued it does not."""
    slow_summaries(fake_llm, 2.0)
    inline = build(queued=False)
    turn(inline, 0, "warm-up")
    seconds = [turn(inline, i, "inline") for i in range(6)]
    assert store.compaction.state("inline").compactions >= 1
    assert max(seconds) >= 2.0  # the compaction turn waited for the summary
    asked = len(summary_requests(fake_llm))
    queued = build()
    for i in range(6):
        turn(queued, i, "queued")
    assert jobs(store, "queued") and store.compaction.state("queued").compactions == 0
    # no queued turn asked for a summary, so none waited for one (wall time is not asserted: a loaded
    # machine can make a turn slow for other reasons; scripts/bench_compaction_queue.py measures it)
    assert len(summary_requests(fake_llm)) == asked


def test_a_session_has_at_most_one_waiting_compaction_job(build, store, fake_llm):
    slow_summaries(fake_llm, 0.0)
    engine = build()
    i = turns_until_queued(engine, store)
    for j in range(i, i + 4):  # more turns over the cap: still one job waiting
        turn(engine, j)
    turns_until_queued(engine, store, "s2")
    assert jobs(store) == [("todo", "compaction:s1"), ("todo", "compaction:s2")]
    drain(engine)
    assert store.compaction.state("s1").compactions == 1 and store.compaction.state("s2").compactions == 1
    assert not over_cap(store, "s1") and not over_cap(store, "s2")
    assert jobs(store) == []  # done jobs are deleted


def test_two_workers_never_run_one_sessions_jobs_at_once(build, store, fake_llm):
    """A second job of a session, queued while the first runs, waits for it (the job ``lock``):
    run at once, it would find the session's advisory lock held, skip, and leave the turns it
    was queued for uncompacted."""
    started, release = threading.Event(), threading.Event()
    slow_summaries(fake_llm, 0.0, started, release)  # the first job's summary waits for ``release``
    engine = build()
    i = turns_until_queued(engine, store)
    first = threading.Thread(target=drain, args=(engine,), kwargs={"name": "w1"})
    with capture_logs() as events:
        first.start()
        assert started.wait(30)
        for j in range(i, i + 2):  # new turns, which the running job did not read, queue a second job
            turn(engine, j)
        assert jobs(store, "s1") == [("doing", "compaction:s1"), ("todo", "compaction:s1")]
        threading.Timer(2.0, release.set).start()  # the first job ends 2 s into the second worker's run
        drain(engine, name="w2")  # a second worker, while the first still compacts
        first.join(60)
    assert not [e for e in events if e["event"] == "compaction.skipped"]
    assert store.compaction.state("s1").compactions == 2
    assert not over_cap(store, "s1")
    assert jobs(store) == []


def test_the_prompt_says_a_summary_is_pending_until_the_job_has_run(build, store, fake_llm):
    slow_summaries(fake_llm, 0.0)
    engine = build()
    turns_until_queued(engine, store)
    waiting = [t.seq for t in store.turns.of_session("s1", state=TurnState.context)]
    context = engine.assemble(user_id="u1", session_id="s1")
    assert context.pending_turns > 0
    assert "their summary is still being written" in context.source_text["summary"]
    hidden = waiting[: context.pending_turns]
    assert not set(hidden) & set(context.recent_seqs)  # over the cap: out of view
    assert context.total_tokens + context.reply_reserve <= WINDOW
    assert context.sources["summary"].tokens > 0  # the line is counted in the summary's budget
    drain(engine)
    context = engine.assemble(user_id="u1", session_id="s1")
    assert context.pending_turns == 0
    assert "still being written" not in context.source_text.get("summary", "")


def test_inline_compaction_leaves_no_summary_pending(build, store, fake_llm):
    slow_summaries(fake_llm, 0.0)
    engine = build(queued=False)
    for i in range(8):
        turn(engine, i)
    assert store.compaction.state("s1").compactions >= 1
    context = engine.assemble(user_id="u1", session_id="s1")
    assert context.pending_turns == 0 and jobs(store) == []


def test_a_failed_summary_queues_the_sessions_next_job_with_a_backoff(build, store, fake_llm):
    fake_llm.responder = lambda body: (500, "summary backend down") if body.get("model") == SUMMARY_MODEL else "Ok."
    engine = build()
    turns_until_queued(engine, store)
    drain(engine)
    assert store.compaction.state("s1").consecutive_failures == 1  # counted by the breaker
    with store.engine.connect() as conn:
        status, args, wait = conn.execute(
            text("SELECT status::text, args, scheduled_at - now() FROM procrastinate_jobs")
        ).one()
    assert status == "todo" and args["failures"] == 1 and wait > timedelta(seconds=1)


def test_serve_runs_a_queue_worker_for_its_lifespan(build, store, fake_llm):
    from fastapi.testclient import TestClient

    from runtime.service.api import create_app

    slow_summaries(fake_llm, 0.0)
    engine = build()
    with TestClient(create_app(engine, job_worker=True)) as client:
        assert client.get("/healthz").status_code == 200
        for i in range(6):  # enough to go over the recent cap
            turn(engine, i)
        deadline = time.monotonic() + 30
        while (over_cap(store, "s1") or jobs(store)) and time.monotonic() < deadline:
            time.sleep(0.1)
        assert store.compaction.state("s1").compactions >= 1 and not over_cap(store, "s1")
    assert jobs(store) == []


def _recover(store) -> int:
    app = build_app(store.engine)

    async def main() -> int:
        async with app.open_async():
            return await recover_stalled_jobs(app)

    return asyncio.run(main())


def _kill_worker_of_running_jobs(store) -> None:
    """As if the worker running the queue's jobs was SIGKILLed: they stay ``doing`` under a worker
    whose last heartbeat is an hour old."""
    with store.engine.begin() as conn:
        dead = conn.execute(
            text("INSERT INTO procrastinate_workers (last_heartbeat) VALUES (now() - interval '1 hour') RETURNING id")
        ).scalar_one()
        conn.execute(text("UPDATE procrastinate_jobs SET status = 'doing', worker_id = :w"), {"w": dead})


def test_a_job_left_by_a_killed_worker_is_put_back_and_then_compacts(build, store, fake_llm):
    slow_summaries(fake_llm, 0.0)
    engine = build()
    turns_until_queued(engine, store)
    _kill_worker_of_running_jobs(store)
    drain(engine)  # the dead job holds the session's lock: no worker can run a job of it
    assert jobs(store) == [("doing", "compaction:s1")] and store.compaction.state("s1").compactions == 0
    assert _recover(store) == 1
    assert jobs(store) == [("todo", "compaction:s1")]
    drain(engine)
    assert store.compaction.state("s1").compactions == 1 and jobs(store) == [] and not over_cap(store, "s1")


def test_a_dead_job_whose_session_has_a_newer_waiting_job_is_dropped_for_it(build, store, fake_llm):
    slow_summaries(fake_llm, 0.0)
    engine = build()
    i = turns_until_queued(engine, store)
    _kill_worker_of_running_jobs(store)
    while ("todo", "compaction:s1") not in jobs(store):  # the queueing lock is free again: a newer job waits
        turn(engine, i)
        i += 1
    assert jobs(store) == [("doing", "compaction:s1"), ("todo", "compaction:s1")]
    assert _recover(store) == 1
    assert jobs(store) == [("failed", "compaction:s1"), ("todo", "compaction:s1")]
    drain(engine)
    assert store.compaction.state("s1").compactions == 1 and not over_cap(store, "s1")

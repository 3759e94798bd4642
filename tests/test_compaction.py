"""Compaction you can trust: summaries, validation, caps, the breaker, the session lock.

The model summarizer is faked at its HTTP boundary by the loopback server in
``tests/fake_llm.py``: summary requests use the model ``openai/fake-summary`` and
replies ``openai/fake-model``, so a responder can fail one and not the other.
"""

from __future__ import annotations

import inspect
import json
import re
import threading
from datetime import UTC, datetime, timedelta

import httpx
import pytest
import structlog
from sqlalchemy import text
from structlog.testing import capture_logs

from errors import ModelCallError, SummarizationError
from memory.recall import RecallQuery, recall
from memory.tables import TurnState
from runtime.accounting import counter_for
from runtime.compaction import Compactor, ExtractiveSummarizer, LiteLLMSummarizer, map_summarizer_error, plan_rollout
from runtime.llm import error_class_for
from runtime.service import user_turn_coverage

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
SUMMARY_MODEL = "fake-summary"
COUNTER = counter_for("gpt-4o-mini")


@pytest.fixture(autouse=True)
def _reset_structlog():
    """The CLI configures structlog to write to the (captured) stderr; undo it after each test."""
    yield
    structlog.reset_defaults()


def model_summarizer(fake_llm, timeout: float = 10.0) -> LiteLLMSummarizer:
    return LiteLLMSummarizer(
        model=f"openai/{SUMMARY_MODEL}", api_base=fake_llm.api_base, api_key="sk-test", timeout=timeout
    )


def summary_requests(fake_llm) -> list[dict]:
    return [r for r in fake_llm.requests if r.get("model") == SUMMARY_MODEL]


def route(summary_step):
    """A responder: summary requests get ``summary_step(body)``, replies a fixed text."""
    return lambda body: summary_step(body) if body.get("model") == SUMMARY_MODEL else "I hear you."


def user_text(i: int, words: int = 20) -> str:
    return f"user message {i}: " + " ".join(f"word{i}x{j}" for j in range(words))


def add_exchanges(store, n: int, *, session="s1", user="u1", words=20, first_user: str | None = None, start=0):
    store.sessions.ensure(session_id=session, user_id=user)
    for i in range(start, start + n):
        content = first_user if (first_user and i == start) else user_text(i, words)
        for role, body in (
            ("user", content),
            ("assistant", f"reply {i}: " + " ".join(f"answer{i}y{j}" for j in range(words))),
        ):
            store.turns.add(
                session_id=session,
                role=role,
                content=body,
                tokens=COUNTER.count_message({"role": role, "content": body}),
                created_at=T0 + timedelta(minutes=i),
            )


def compactor(store, embedder, summarizer, **kw) -> Compactor:
    options = dict(keep_exchanges=2, target=0.6, breaker_threshold=3)
    options.update(kw)
    return Compactor(store=store, embedder=embedder, summarizer=summarizer, counter=COUNTER, **options)


def compact(c: Compactor, *, session="s1", user="u1", recent_cap=300, summary_cap=400):
    return c.maybe_compact(
        session_id=session, user_id=user, recent_cap=recent_cap, summary_cap=summary_cap, assistant_name="Mira"
    )


def snapshot(store, session="s1"):
    """Everything a compaction may change, for before/after comparisons."""
    summary = store.compaction.summary(session)
    return (
        [(t.seq, t.state) for t in store.turns.of_session(session)],
        [(s.first_seq, s.content) for s in store.archive.segments(session_id=session)],
        None if summary is None else (summary.content, summary.items, summary.last_seq),
    )


def model_json(*, quotes=(), profile=(), relationship=(), preferences=(), open_threads=()) -> str:
    return json.dumps(
        {
            "profile": list(profile),
            "relationship": list(relationship),
            "preferences": list(preferences),
            "open_threads": list(open_threads),
            "quotes": [{"seq": s, "text": t} for s, t in quotes],
        }
    )


# -- the breaker ---------------------------------------------------------------
def test_summarizer_that_always_fails_is_called_three_times_over_ten_turns_then_never(make_engine_for, store, fake_llm):
    fake_llm.responder = route(lambda body: (500, "summary backend down"))
    engine = make_engine_for(window=1024, summarizer=model_summarizer(fake_llm))
    with capture_logs() as events:
        results = [
            engine.turn(user_id="u1", session_id="s1", message=user_text(i, 30), at=T0 + timedelta(minutes=i))
            for i in range(10)
        ]
    assert len(summary_requests(fake_llm)) == 3
    assert len(fake_llm.requests) - 3 == 10  # every turn was answered by the model
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 3 and state.breaker_opened_at is not None
    assert len(state.recent_errors) == 3 and all("HTTP 500" in e for e in state.recent_errors)
    assert [sum(not c.ok for c in r.compactions) for r in results].count(1) == 3  # one attempt per turn at most
    for r in results:
        assert not r.context.overflow and r.context.total_tokens + r.context.reply_reserve <= 1024
    # history intact: nothing deleted, every user turn in the window or archived verbatim
    turns = store.turns.of_session("s1")
    assert len(turns) == 20
    assert store.compaction.summary("s1") is None  # no summary was ever valid
    assert any(t.state == TurnState.archived for t in turns)
    users, found = user_turn_coverage(engine, "s1")
    assert users == found == 10
    recent = engine.store.turns.of_session("s1", state=TurnState.context)
    assert sum(t.tokens for t in recent) <= engine.budgets.recent  # archiving kept the window in its cap
    opened = [e for e in events if e["event"] == "breaker.opened"]
    assert len(opened) == 1 and opened[0]["session_id"] == "s1" and len(opened[0]["reasons"]) == 3
    assert [e["event"] for e in events].count("compaction.failed") == 3
    assert any(e["event"] == "compaction.archived_only" for e in events)


def test_breaker_state_survives_a_restart(make_engine_for, store, fake_llm):
    fake_llm.responder = route(lambda body: (503, "overloaded"))
    engine = make_engine_for(window=1024, summarizer=model_summarizer(fake_llm))
    for i in range(8):
        engine.turn(user_id="u1", session_id="s1", message=user_text(i, 30), reply="ok", at=T0 + timedelta(minutes=i))
    assert len(summary_requests(fake_llm)) == 3
    restarted = make_engine_for(window=1024, summarizer=model_summarizer(fake_llm))  # a new process, same database
    for i in range(8, 12):
        restarted.turn(
            user_id="u1", session_id="s1", message=user_text(i, 30), reply="ok", at=T0 + timedelta(minutes=i)
        )
    assert len(summary_requests(fake_llm)) == 3


def test_a_success_resets_the_failure_count(store, embedder, fake_llm):
    add_exchanges(store, 8)
    fake_llm.script.extend([(500, "down"), (500, "down")])
    c = compactor(store, embedder, model_summarizer(fake_llm))
    assert not compact(c).ok and not compact(c).ok
    assert store.compaction.state("s1").consecutive_failures == 2
    fake_llm.responder = lambda body: model_json(
        quotes=[(1, user_text(0))], profile=["The user writes numbered messages."]
    )
    with capture_logs() as events:
        assert compact(c).ok
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 0 and state.recent_errors == [] and state.breaker_opened_at is None
    assert any(e["event"] == "breaker.failures_cleared" and e["session_id"] == "s1" for e in events)


def test_a_timeout_counts_as_a_failure(store, embedder, fake_llm):
    add_exchanges(store, 8)
    release = threading.Event()
    fake_llm.responder = lambda body: (release.wait(5), model_json())[1]
    c = compactor(store, embedder, model_summarizer(fake_llm, timeout=0.5))
    before = snapshot(store)
    try:
        outcome = compact(c)
    finally:
        release.set()
    assert not outcome.ok and "Timeout" in outcome.error
    assert store.compaction.state("s1").consecutive_failures == 1
    assert snapshot(store) == before


def test_half_open_retry_after_the_cooldown_closes_or_reopens_the_breaker(store, embedder, fake_llm):
    add_exchanges(store, 8)
    now = [T0]
    fake_llm.responder = lambda body: (500, "down")
    c = compactor(store, embedder, model_summarizer(fake_llm), breaker_cooldown=60, clock=lambda: now[0])
    for _ in range(3):
        compact(c)
    opened_at = store.compaction.state("s1").breaker_opened_at
    now[0] = opened_at + timedelta(seconds=30)
    assert compact(c).summarized is False  # still open: archived only, no summarizer call
    assert len(summary_requests(fake_llm)) == 3
    add_exchanges(store, 6, start=8)
    now[0] = opened_at + timedelta(seconds=61)
    with capture_logs() as events:
        assert not compact(c).ok  # the half-open attempt fails
    assert len(summary_requests(fake_llm)) == 4
    assert [e["event"] for e in events if e["event"].startswith("breaker.")] == [
        "breaker.half_open",
        "breaker.reopened",
    ]
    reopened = store.compaction.state("s1").breaker_opened_at
    assert reopened > opened_at
    add_exchanges(store, 6, start=14)
    now[0] = reopened + timedelta(seconds=61)
    newest_user = max(t.seq for t in store.turns.of_session("s1", state=TurnState.context) if t.role == "user")
    fake_llm.responder = lambda body: model_json(profile=["The user likes numbered lists."])
    with capture_logs() as events:
        outcome = compact(c)
    assert outcome.ok and outcome.summarized
    assert "breaker.closed" in [e["event"] for e in events]
    state = store.compaction.state("s1")
    assert state.breaker_opened_at is None and state.consecutive_failures == 0
    assert newest_user in {t.seq for t in store.turns.of_session("s1", state=TurnState.context)}


def test_without_a_cooldown_the_breaker_stays_open_until_reset(store, embedder, fake_llm):
    add_exchanges(store, 8)
    now = [T0]
    fake_llm.responder = lambda body: (500, "down")
    c = compactor(store, embedder, model_summarizer(fake_llm), clock=lambda: now[0])
    for _ in range(3):
        compact(c)
    add_exchanges(store, 6, start=8)
    now[0] = T0 + timedelta(days=365)
    compact(c)
    assert len(summary_requests(fake_llm)) == 3
    store.compaction.reset_breaker("s1")
    add_exchanges(store, 6, start=14)
    fake_llm.responder = lambda body: model_json(profile=["The user likes numbered lists."])
    assert compact(c).summarized
    assert len(summary_requests(fake_llm)) == 4


def test_breaker_cli_shows_and_resets_the_state(store, db_url, monkeypatch, capsys):
    from runtime.cli import main

    add_exchanges(store, 1)
    for _ in range(3):
        store.compaction.record_failure("s1", error="SummarizationError: Summary rejected: it is empty", threshold=3)
    monkeypatch.setenv("DATABASE_URL", db_url)
    assert main(["breaker", "show", "s1"]) == 0
    shown = capsys.readouterr().out
    assert "open" in shown and "3" in shown and "it is empty" in shown
    assert main(["breaker", "reset", "s1"]) == 0
    state = store.compaction.state("s1")
    assert state.breaker_opened_at is None and state.consecutive_failures == 0 and state.recent_errors == []
    assert main(["breaker", "show", "nope"]) == 2


# -- validation ------------------------------------------------------------------
@pytest.mark.parametrize(
    "reply, reason",
    [
        pytest.param(
            lambda: model_json(quotes=[(1, "I never liked my sister anyway")]),
            "not an exact quote",
            id="invented-quote",
        ),
        pytest.param(lambda: model_json(quotes=[(3, user_text(0))]), "not an exact quote", id="quote-of-another-turn"),
        pytest.param(
            lambda: model_json(quotes=[(2, "reply 0: answer0y0")]), "not an exact quote", id="companion-quoted-as-user"
        ),
        pytest.param(
            lambda: model_json(quotes=[(15, user_text(7))]),
            "newer than the roll-out boundary",
            id="turn-after-boundary",
        ),
        pytest.param(
            lambda: model_json(profile=['The user said "I will quit my job tomorrow".']),
            "never said",
            id="invented-quote-in-a-note",
        ),
        pytest.param(lambda: model_json(), "empty", id="empty-summary"),
        pytest.param(lambda: model_json(profile=["x " * 2000]), "exceed its cap", id="over-cap-without-quotes"),
        pytest.param(lambda: "Sure! Here is the summary: the user is nice.", "five-part JSON", id="not-json"),
        pytest.param(lambda: model_json(profile=['<summary of="x">nested</summary>']), "nests", id="nested-summary"),
    ],
)
def test_a_summary_that_fails_validation_is_rejected_and_changes_nothing_but_the_count(
    store, embedder, fake_llm, reply, reason
):
    add_exchanges(store, 8)
    fake_llm.responder = lambda body: reply()
    before = snapshot(store)
    outcome = compact(compactor(store, embedder, model_summarizer(fake_llm)))
    assert not outcome.ok and reason in outcome.error
    assert snapshot(store) == before  # no archive, no summary, no turn state changed
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 1 and state.compactions == 0 and reason in state.last_error


def test_exact_quotes_with_only_whitespace_normalized_are_accepted(store, embedder, fake_llm):
    add_exchanges(store, 8)
    quote = "  ".join(user_text(1).split()[:6])  # the user's words with doubled spaces
    fake_llm.responder = lambda body: model_json(quotes=[(3, quote)], profile=["The user counts words."])
    outcome = compact(compactor(store, embedder, model_summarizer(fake_llm)))
    assert outcome.ok and outcome.summarized
    assert quote in store.compaction.summary("s1").content


def test_every_litellm_error_maps_to_summarization_error():
    import litellm

    request = httpx.Request("POST", "http://127.0.0.1/v1/chat/completions")
    fill = {
        "message": "boom",
        "model": "m",
        "llm_provider": "openai",
        "request": request,
        "response": httpx.Response(500, request=request),
        "status_code": 500,
    }
    classes = list(dict.fromkeys(litellm.LITELLM_EXCEPTION_TYPES))
    assert len(classes) >= 15
    for cls in classes:
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        exc = cls(
            **{
                p.name: fill.get(p.name)
                for p in params
                if p.default is inspect.Parameter.empty and p.kind == p.POSITIONAL_OR_KEYWORD
            }
        )
        mapped = map_summarizer_error(exc, model="m", session_id="s1")
        assert isinstance(mapped, SummarizationError), cls
        assert mapped.session_id == "s1" and "'m'" in str(mapped)
        # classified by the replier's mapping, into one of its specific errors, chained to the original
        assert type(mapped.__cause__) is error_class_for(exc) and type(mapped.__cause__) is not ModelCallError, cls
        assert mapped.__cause__.__cause__ is exc


# -- caps, merging, what never rolls out -------------------------------------------------
def test_summary_over_its_cap_keeps_the_newest_quotes_and_drops_the_oldest_to_the_archive(store, embedder, fake_llm):
    add_exchanges(store, 10, words=30)
    rolled_users = [(t.seq, t.content) for t in store.turns.of_session("s1") if t.role == "user"][:7]
    fake_llm.responder = lambda body: model_json(
        quotes=rolled_users, profile=["The user writes long numbered messages."]
    )
    with capture_logs() as events:
        outcome = compact(compactor(store, embedder, model_summarizer(fake_llm)), recent_cap=500, summary_cap=300)
    assert outcome.ok and outcome.dropped_quotes >= 1
    summary = store.compaction.summary("s1")
    assert summary.tokens <= 300 and COUNTER.count_text(summary.content) <= 300
    kept = [i["seq"] for i in summary.items if i["role"] == "user"]
    dropped = [seq for seq, _ in rolled_users if seq not in kept]
    assert kept and dropped and max(dropped) < min(kept)  # the oldest left, the newest stayed
    assert summary.dropped_quotes == len(dropped) == outcome.dropped_quotes
    archive = "\n".join(s.content for s in store.archive.segments(session_id="s1"))
    for seq, content in rolled_users:
        assert content in archive  # every dropped quote is still there verbatim
        if seq in dropped:
            assert content not in summary.content
    event = next(e for e in events if e["event"] == "summary.quotes_dropped")
    assert event["session_id"] == "s1" and event["seqs"] == dropped


def test_extractive_summary_over_its_cap_keeps_the_newest_quotes(store, embedder):
    add_exchanges(store, 12, words=30)
    outcome = compact(compactor(store, embedder, ExtractiveSummarizer()), recent_cap=500, summary_cap=200)
    assert outcome.ok and outcome.dropped_quotes >= 1
    summary = store.compaction.summary("s1")
    assert summary.tokens <= 200
    rolled = [t for t in store.turns.of_session("s1") if t.state == TurnState.summarized and t.role == "user"]
    kept = {i["seq"] for i in summary.items if i["role"] == "user"}
    assert rolled[-1].seq in kept and rolled[0].seq not in kept
    assert summary.dropped_quotes == outcome.dropped_quotes


NAME_TURN = "Hi! My name is Ana Souza and I just moved to Lisbon for a job at the aquarium."


@pytest.mark.parametrize("kind", [pytest.param("extractive", id="extractive"), pytest.param("model", id="model")])
def test_five_compactions_keep_the_summary_flat_within_its_cap_and_the_name_recoverable(
    make_engine_for, store, fake_llm, kind
):
    def merge(body):  # a fake model that merges like the template asks: carry over, add, quote exactly
        request = body["messages"][-1]["content"]
        previous = json.loads(request.split("CURRENT SUMMARY:\n", 1)[1].split("\n\nTURNS LEAVING", 1)[0])
        turns = re.findall(r"^\[seq (\d+), [\d-]+\] User: (.*)$", request, flags=re.M)
        profile = previous["profile"] + (
            ["The user is called Ana Souza."] if "Ana Souza" in request and not previous["profile"] else []
        )
        quotes = [(q["seq"], q["text"]) for q in previous["quotes"]] + [(int(s), t) for s, t in turns]
        return model_json(profile=profile, quotes=quotes)

    fake_llm.responder = route(merge)
    engine = make_engine_for(window=2048, summarizer=model_summarizer(fake_llm) if kind == "model" else None)
    cap = engine.budgets.summary
    contents = []
    for i in range(24):
        engine.turn(
            user_id="u1",
            session_id="s1",
            message=NAME_TURN if i == 0 else user_text(i, 40),
            reply=f"reply {i}",
            at=T0 + timedelta(minutes=i),
        )
        summary = store.compaction.summary("s1")
        if summary is not None and (not contents or contents[-1] != summary.content):
            contents.append(summary.content)
            assert summary.tokens <= cap and COUNTER.count_text(summary.content) <= cap
            assert summary.content.count("<summary") == 1 and summary.content.count("</summary>") == 1
    assert store.compaction.state("s1").compactions >= 5 and len(contents) >= 5
    if kind == "model":
        assert all(
            "<summary" not in r["messages"][-1]["content"] for r in summary_requests(fake_llm)
        )  # merged from items
        assert "Ana Souza" in store.compaction.summary("s1").content  # the profile fact was carried through every merge
    name_in_summary = "Ana Souza" in store.compaction.summary("s1").content
    recalled = recall(
        store.engine, RecallQuery(user_id="u1", query_embedding=engine.embedder.embed(["What is my name?"])[0], limit=3)
    )
    assert name_in_summary or any(NAME_TURN in s.content for s in recalled)
    users, found = user_turn_coverage(engine, "s1")
    assert users == found == 24


def test_latest_user_turn_and_last_exchanges_never_roll_out(store):
    add_exchanges(store, 6, words=40)
    store.turns.add(session_id="s1", role="user", content=user_text(99, 40), tokens=200, created_at=T0)
    turns = store.turns.of_session("s1", state=TurnState.context)
    for keep in (0, 1, 2, 3):
        groups = plan_rollout(turns, cap=10, target=0.1, keep_exchanges=keep)
        rolled = {t.seq for g in groups for t in g}
        assert turns[-1].seq not in rolled  # the latest (unanswered) user turn
        assert len(rolled) == 12 - 2 * keep  # everything but the newest `keep` complete exchanges
    assert plan_rollout(turns, cap=10_000, target=0.6, keep_exchanges=2) == []  # under the cap: nothing


def test_a_turn_larger_than_the_recent_cap_is_cut_for_the_summarizer_and_archived_whole(store, embedder):
    huge = "I want you to remember all of this. " + " ".join(f"detail{j}" for j in range(1500))
    add_exchanges(store, 6, first_user=huge)
    seen = []

    class Recording(ExtractiveSummarizer):
        def summarize(self, **kw):
            seen.append(kw["turns"])
            return super().summarize(**kw)

    outcome = compact(compactor(store, embedder, Recording()), recent_cap=300, summary_cap=1000)
    assert outcome.ok and len(seen) == 1
    first = seen[0][0]
    assert first.cut and first.chars == len(huge) and huge.startswith(first.text)
    assert COUNTER.count_text(first.text) <= 300
    summary = store.compaction.summary("s1")
    quote = next(i for i in summary.items if i["seq"] == 1)
    assert huge.startswith(quote["text"]) and quote["cut_of"] == len(huge)
    assert "the whole turn is archived" in summary.content
    assert any(huge in s.content for s in store.archive.segments(session_id="s1"))


def test_no_summarizer_call_when_there_is_nothing_to_roll_out(store, embedder):
    add_exchanges(store, 2)

    class Exploding:
        name = "exploding"

        def summarize(self, **kw):
            raise AssertionError("called")

    assert compact(compactor(store, embedder, Exploding()), recent_cap=10) is None  # only kept exchanges
    assert store.compaction.state("s1").consecutive_failures == 0


# -- one compaction at a time ---------------------------------------------------------
def test_concurrent_compactions_of_one_session_summarize_once_and_lose_no_turn(store, embedder):
    add_exchanges(store, 10)
    entered, release = threading.Event(), threading.Event()
    calls = []

    class Slow(ExtractiveSummarizer):
        def summarize(self, **kw):
            calls.append(kw["turns"])
            entered.set()
            release.wait(10)
            return super().summarize(**kw)

    c = compactor(store, embedder, Slow())
    results = {}
    first = threading.Thread(target=lambda: results.setdefault("first", compact(c)))
    first.start()
    assert entered.wait(10)
    # meanwhile: another process adds a turn and tries to compact the same session
    add_exchanges(store, 1, start=10)
    with capture_logs() as events:
        results["second"] = compact(compactor(store, embedder, Slow()))
    release.set()
    first.join(10)
    assert results["second"] is None and any(e["event"] == "compaction.skipped" for e in events)
    assert results["first"].ok and len(calls) == 1
    turns = store.turns.of_session("s1")
    assert [t.seq for t in turns] == list(range(1, 23))  # nothing lost
    summarized = {t.seq for t in turns if t.state == TurnState.summarized}
    archived = {s for seg in store.archive.segments(session_id="s1") for s in range(seg.first_seq, seg.last_seq + 1)}
    assert summarized == archived == {t.seq for t in calls[0]}  # each rolled turn archived exactly once
    with store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM archived_segments")).scalar() == len(summarized)
    # the lock was released: the next compaction proceeds
    assert compact(c, recent_cap=200).ok

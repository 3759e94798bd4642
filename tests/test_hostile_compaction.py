"""Compaction honesty: the extractive summarizer always fits its cap, the breaker counts
only summarizer failures, and the model summarizer makes exactly one request per attempt."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
import structlog
from structlog.testing import capture_logs

from errors import SummarizationError
from runtime.accounting import counter_for
from runtime.compaction import ExtractiveSummarizer
from runtime.compaction._summarizers import RolledTurn, validate_summary
from runtime.summary_items import SummaryNote, UserQuote

COUNTER = counter_for("gpt-4o-mini")

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _reset_structlog():
    yield
    structlog.reset_defaults()


def sentence_message(i: int, chars: int = 400) -> str:
    words = []
    while len(" ".join(words)) < chars:
        words.append(f"thing{i}w{len(words)}")
    return f"Message {i}. " + " ".join(words)[: chars - 12] + "."


@pytest.mark.parametrize("window", [pytest.param(w, id=f"window-{w}") for w in (256, 512)])
def test_extractive_summaries_are_accepted_at_every_window(make_engine_for, store, fake_llm, window):
    fake_llm.responder = lambda body: "A reply of a few words, then another sentence that runs on for a while."
    engine = make_engine_for(window=window)
    with capture_logs() as events:
        for i in range(12):
            engine.turn(user_id="u1", session_id="s1", message=sentence_message(i), at=T0 + timedelta(minutes=i))
    failed = [e for e in events if e["event"] == "compaction.failed"]
    assert failed == [], [e.get("reason") for e in failed]
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 0 and state.breaker_opened_at is None
    summary = store.compaction.summary("s1")
    assert summary is not None and summary.items
    assert summary.tokens <= engine.budgets.summary


@pytest.mark.parametrize("cap", [pytest.param(c, id=f"cap-{c}") for c in (21, 25, 30, 42, 50, 64, 85, 120)])
@pytest.mark.parametrize("with_notes", [pytest.param(False, id="fresh"), pytest.param(True, id="after-model-notes")])
def test_the_extractive_summary_is_valid_and_within_any_cap_of_a_window_from_256(cap, with_notes):
    turns = []
    for i in range(12):
        turns.append(RolledTurn(seq=2 * i + 1, role="user", date="2026-03-01", text=sentence_message(i), chars=400))
        turns.append(RolledTurn(seq=2 * i + 2, role="assistant", date="2026-03-01", text="Sure. " * 60, chars=360))
    previous = [SummaryNote(section="profile", text="The user likes long messages " * 6)] if with_notes else []
    draft = ExtractiveSummarizer().summarize(
        previous=previous, turns=turns, cap=cap, counter=COUNTER, omitted_before=1234
    )
    validate_summary(
        draft, cap=cap, counter=COUNTER, boundary_seq=24, user_turns={t.seq: t.text for t in turns if t.role == "user"}
    )
    assert any(isinstance(i, UserQuote) for i in draft.items)  # the user's own words, not only the companion's
    assert draft.tokens <= cap


def test_the_model_summarizer_turns_off_every_hidden_retry_as_the_reply_path_does(fake_llm, monkeypatch):
    """Both the reply path and the summarizer pass ``num_retries=0`` (litellm) and
    ``max_retries=0`` (the OpenAI client), so every attempt is one the breaker and the
    time budget see. Whether litellm derives one from the other depends on its version."""
    import litellm

    from runtime.compaction import LiteLLMSummarizer
    from runtime.llm import LiteLLMReplier

    seen: list[dict] = []
    real = litellm.completion

    def recording(**kwargs):
        seen.append({k: kwargs.get(k, "unset") for k in ("num_retries", "max_retries")})
        return real(**kwargs)

    monkeypatch.setattr(litellm, "completion", recording)
    fake_llm.script.extend([(500, "summary backend down"), "I hear you."])
    summarizer = LiteLLMSummarizer(
        model="openai/fake-summary", api_base=fake_llm.api_base, api_key="sk-test", timeout=5
    )
    turn = RolledTurn(seq=1, role="user", date="2026-03-01", text="hello there", chars=11)
    with pytest.raises(SummarizationError):
        summarizer.summarize(previous=[], turns=[turn], cap=200, counter=COUNTER)
    assert len(fake_llm.requests) == 1
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=5)
    replier.reply([{"role": "user", "content": "hi"}], session_id="s1")
    assert seen == [{"num_retries": 0, "max_retries": 0}] * 2


def _fill_session(store, n: int = 8):
    store.sessions.ensure(session_id="s1", user_id="u1")
    for i in range(n):
        for role, body in (("user", sentence_message(i, 200)), ("assistant", f"Reply {i}. " + "more words " * 20)):
            store.turns.add(
                session_id="s1",
                role=role,
                content=body,
                tokens=COUNTER.count_message({"role": role, "content": body}),
                created_at=T0 + timedelta(minutes=i),
            )


def _compactor(store, embedder, summarizer):
    from runtime.compaction import Compactor

    return Compactor(
        store=store,
        embedder=embedder,
        summarizer=summarizer,
        counter=COUNTER,
        keep_exchanges=2,
        target=0.6,
        breaker_threshold=3,
    )


def test_a_bug_in_the_summarizer_propagates_with_its_traceback_and_is_not_counted(store, embedder):
    _fill_session(store)

    class Buggy:
        name = "buggy"

        def summarize(self, **kw):
            return {}["no such key"]

    compactor = _compactor(store, embedder, Buggy())
    for _ in range(3):
        with pytest.raises(KeyError):
            compactor.maybe_compact(
                session_id="s1", user_id="u1", recent_cap=300, summary_cap=400, assistant_name="Mira"
            )
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 0 and state.breaker_opened_at is None


def test_a_storage_error_during_compaction_propagates_and_is_not_counted(store, embedder, monkeypatch):
    from errors import StorageError

    _fill_session(store)

    def down(*args, **kwargs):
        raise StorageError("Database error (OperationalError): the server closed the connection")

    monkeypatch.setattr(store.turns, "user_texts", down)
    compactor = _compactor(store, embedder, ExtractiveSummarizer())
    with pytest.raises(StorageError):
        compactor.maybe_compact(session_id="s1", user_id="u1", recent_cap=300, summary_cap=400, assistant_name="Mira")
    monkeypatch.undo()
    state = store.compaction.state("s1")
    assert state.consecutive_failures == 0 and state.breaker_opened_at is None


def test_a_summarizer_failure_still_counts(store, embedder):
    _fill_session(store)

    class Failing:
        name = "failing"

        def summarize(self, **kw):
            raise SummarizationError("the summary backend is down", session_id="s1")

    outcome = _compactor(store, embedder, Failing()).maybe_compact(
        session_id="s1", user_id="u1", recent_cap=300, summary_cap=400, assistant_name="Mira"
    )
    assert outcome is not None and not outcome.ok
    assert store.compaction.state("s1").consecutive_failures == 1

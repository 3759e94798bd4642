"""Compaction honesty: the extractive summarizer always fits its cap, the breaker counts
only summarizer failures, and the model summarizer makes exactly one request per attempt."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
import structlog
from structlog.testing import capture_logs

from runtime.summarizer import ExtractiveSummarizer, RolledTurn, validate_summary
from runtime.tokens import counter_for

COUNTER = counter_for("gpt-4o-mini")

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)


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
    state = store.compaction_state("s1")
    assert state.consecutive_failures == 0 and state.breaker_opened_at is None
    summary = store.summary("s1")
    assert summary is not None and summary.items
    assert summary.tokens <= engine.budgets.summary


@pytest.mark.parametrize("cap", [pytest.param(c, id=f"cap-{c}") for c in (21, 25, 30, 42, 50, 64, 85, 120)])
@pytest.mark.parametrize("with_notes", [pytest.param(False, id="fresh"), pytest.param(True, id="after-model-notes")])
def test_the_extractive_summary_is_valid_and_within_any_cap_of_a_window_from_256(cap, with_notes):
    turns = []
    for i in range(12):
        turns.append(RolledTurn(seq=2 * i + 1, role="user", date="2026-03-01", text=sentence_message(i), chars=400))
        turns.append(RolledTurn(seq=2 * i + 2, role="assistant", date="2026-03-01", text="Sure. " * 60, chars=360))
    previous = [{"role": "note", "section": "profile", "date": None, "text": "The user likes long messages " * 6}] if with_notes else []
    draft = ExtractiveSummarizer().summarize(previous=previous, turns=turns, cap=cap, counter=COUNTER, omitted_before=1234)
    validate_summary(
        draft, cap=cap, counter=COUNTER, boundary_seq=24, user_turns={t.seq: t.text for t in turns if t.role == "user"}
    )
    assert any(i["role"] == "user" for i in draft.items)  # the user's own words, not only the companion's
    assert draft.tokens <= cap

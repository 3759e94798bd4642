"""Summary items are typed in the runtime and stored as the same JSON as before: every shape a
stored row holds loads and converts back to the same object, a malformed entry is a storage
error naming its field, and a merge carries old entries over unchanged."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text
from sqlmodel import Session

from errors import StorageError
from memory.tables import Summary
from runtime.accounting import counter_for
from runtime.compaction import Compactor, ExtractiveSummarizer
from runtime.context import summary_profile_facts
from runtime.summary_items import (
    AssistantLine,
    SummaryNote,
    UserQuote,
    item_from_json,
    item_to_json,
    items_from_json,
    items_to_json,
)

COUNTER = counter_for("gpt-4o-mini")
T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)

STORED_SHAPES = [
    pytest.param(
        {"seq": 3, "role": "user", "date": "2026-03-01", "text": "I live in Porto."}, UserQuote, id="extractive-quote"
    ),
    pytest.param(
        {"seq": 3, "role": "user", "date": "2026-03-01", "text": "I want you to", "cut_of": 9000},
        UserQuote,
        id="cut-quote",
    ),
    pytest.param(
        {"role": "user", "section": "quotes", "seq": 5, "date": "?", "text": "my cat is Miso"},
        UserQuote,
        id="model-quote",
    ),
    pytest.param(
        {"seq": 4, "role": "assistant", "date": "2026-03-01", "text": "Porto is lovely."},
        AssistantLine,
        id="assistant-line",
    ),
    pytest.param(
        {"role": "note", "section": "relationship", "date": "2026-03-02", "text": "They met at the market."},
        SummaryNote,
        id="dated-note",
    ),
    pytest.param(
        {"role": "note", "section": "open_threads", "date": None, "text": "Asked for a recipe."},
        SummaryNote,
        id="undated-note",
    ),
    pytest.param(
        {"role": "note", "section": "profile", "text": "I am a nurse.", "date": "2026-03-01", "seq": 7},
        SummaryNote,
        id="early-extractive-profile-note-with-seq",
    ),
    pytest.param(
        {
            "seq": -1,
            "role": "user",
            "date": "2026-03-01",
            "text": "I live in Porto.",
            "carried_from": "s0",
            "from_seq": 3,
        },
        UserQuote,
        id="carried-quote",
    ),
    pytest.param(
        {"role": "note", "section": "preferences", "date": None, "text": "Likes tea.", "carried_from": "s0"},
        SummaryNote,
        id="carried-note",
    ),
]


@pytest.mark.parametrize(("stored", "kind"), STORED_SHAPES)
def test_every_stored_shape_loads_typed_and_converts_back_to_the_same_json(stored, kind):
    item = item_from_json(stored)
    assert isinstance(item, kind)
    assert item_to_json(item) == stored
    assert item.role == stored["role"] and item.text == stored["text"]


def test_the_typed_items_carry_their_fields():
    quote, cut, model_quote, line, dated, undated, old_note, carried, _ = (
        item_from_json(p.values[0]) for p in STORED_SHAPES
    )
    assert quote == UserQuote(seq=3, date="2026-03-01", text="I live in Porto.")
    assert cut.cut_of == 9000 and model_quote.section == "quotes" and quote.section is None
    assert line == AssistantLine(seq=4, date="2026-03-01", text="Porto is lovely.")
    assert dated.section == "relationship" and undated.date is None and old_note.seq == 7
    assert carried.carried_from == "s0" and carried.from_seq == 3 and carried.seq == -1


@pytest.mark.parametrize(
    ("stored", "field"),
    [
        pytest.param({"seq": 1, "role": "system", "date": "x", "text": "t"}, "'role'", id="unknown-role"),
        pytest.param({"seq": 1, "role": "user", "date": "x", "text": "t", "mood": "ok"}, "'mood'", id="unknown-key"),
        pytest.param({"seq": "1", "role": "user", "date": "x", "text": "t"}, "'seq'", id="seq-not-an-integer"),
        pytest.param({"seq": True, "role": "assistant", "date": "x", "text": "t"}, "'seq'", id="seq-a-boolean"),
        pytest.param({"seq": 1, "role": "user", "date": "x"}, "'text'", id="no-text"),
        pytest.param({"role": "note", "section": "gossip", "date": None, "text": "t"}, "'section'", id="bad-section"),
        pytest.param({"role": "note", "section": "profile", "text": "t"}, "'date'", id="note-without-date"),
        pytest.param(
            {"seq": 1, "role": "user", "date": "x", "text": "t", "section": "profile"}, "'section'", id="quote-section"
        ),
    ],
)
def test_a_malformed_stored_entry_is_a_storage_error_naming_the_entry_and_field(stored, field):
    with pytest.raises(StorageError) as caught:
        items_from_json([{"role": "note", "section": "profile", "date": None, "text": "ok"}, stored], session_id="s9")
    message = str(caught.value)
    assert field in message and "entry 1" in message and "'s9'" in message
    assert caught.value.session_id == "s9"


def test_profile_facts_are_the_texts_of_profile_notes_in_order():
    items = items_from_json(
        [
            {"role": "note", "section": "profile", "date": None, "text": "Lives in Porto."},
            {"seq": 1, "role": "user", "date": "2026-03-01", "text": "profile: I am a nurse."},
            {"role": "note", "section": "preferences", "date": None, "text": "Likes tea."},
            {"role": "note", "section": "profile", "date": "2026-03-01", "text": "Is a nurse."},
        ]
    )
    assert summary_profile_facts(items) == ["Lives in Porto.", "Is a nurse."]


def _exchanges(store, first: int, n: int) -> None:
    store.sessions.ensure(session_id="s1", user_id="u1")
    for i in range(first, first + n):
        for role, body in (("user", f"user line {i}: I like thing{i}."), ("assistant", f"Reply {i}. More words.")):
            store.turns.add(
                session_id="s1",
                role=role,
                content=body,
                tokens=COUNTER.count_message({"role": role, "content": body}),
                created_at=T0 + timedelta(minutes=i),
            )


def test_a_merge_carries_every_stored_entry_over_as_the_same_json(store, embedder):
    compactor = Compactor(
        store=store,
        embedder=embedder,
        summarizer=ExtractiveSummarizer(),
        counter=COUNTER,
        keep_exchanges=2,
        target=0.6,
        breaker_threshold=3,
    )

    def compact():
        return compactor.maybe_compact(
            session_id="s1", user_id="u1", recent_cap=150, summary_cap=2000, assistant_name="Mira"
        )

    _exchanges(store, 0, 6)
    assert compact().summarized
    first = store.compaction.summary("s1").items
    # rows as older code and the model summarizer wrote them, next to the extractive ones
    old = [
        {"role": "note", "section": "profile", "text": "Likes thing0.", "date": "2026-03-01", "seq": 1},
        {"role": "note", "section": "relationship", "date": None, "text": "They talk most mornings."},
        {**first[0], "section": "quotes"},
        *first[1:],
    ]
    with Session(store.engine) as db:
        db.execute(
            text("UPDATE summaries SET items = CAST(:items AS jsonb) WHERE session_id = 's1'").bindparams(
                items=json.dumps(old)
            )
        )
        db.commit()
    _exchanges(store, 6, 6)
    assert compact().summarized
    merged = store.compaction.summary("s1").items
    assert merged[:2] == old[:2]  # the notes, then every earlier line still in the summary, unchanged
    assert [i for i in merged if i in old[2:]] == old[2:]
    assert len(merged) > len(old)
    assert items_to_json(items_from_json(merged)) == merged
    with Session(store.engine) as db:
        assert db.get(Summary, "s1").items == merged

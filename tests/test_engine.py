"""The turn path on the real database, with the model faked at its HTTP boundary."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from errors import InvalidMessageError, ModelCallError
from memory.recall import RecallQuery, recall
from memory.store import NewSegment, NewSummary
from memory.tables import TurnState
from runtime.compaction import exchanges
from runtime.service import load_conversations, replay_conversation, user_turn_coverage
from tests.conftest import SAMPLE, estimate_as_we_do

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)


def _turn_count(store) -> int:
    with store.engine.connect() as conn:
        return conn.execute(text("SELECT count(*) FROM turns")).scalar()


def test_turns_are_stored_in_order_with_gap_free_seqs(make_engine_for, store, fake_llm):
    engine = make_engine_for()
    fake_llm.script.extend(["one", "two", "three"])
    for i, message in enumerate(["first", "second", "third"]):
        engine.turn(user_id="u1", session_id="s1", message=message, at=T0 + timedelta(minutes=i))
    turns = store.turns.of_session("s1")
    assert [t.seq for t in turns] == [1, 2, 3, 4, 5, 6]
    assert [(t.role, t.content) for t in turns] == [
        ("user", "first"),
        ("assistant", "one"),
        ("user", "second"),
        ("assistant", "two"),
        ("user", "third"),
        ("assistant", "three"),
    ]
    # the model received the stored history in order, ending with the current message
    last_request = fake_llm.requests[-1]["messages"]
    assert [m["content"] for m in last_request if m["role"] != "system"] == ["first", "one", "second", "two", "third"]
    assert turns[-1].usage_prompt_tokens == estimate_as_we_do(fake_llm.requests[-1])


def test_user_turn_stays_stored_when_the_reply_step_raises(make_engine_for, store, fake_llm):
    engine = make_engine_for()
    fake_llm.script.append((500, "upstream exploded"))
    with pytest.raises(ModelCallError) as info:
        engine.turn(user_id="u1", session_id="s1", message="are you there?")
    assert info.value.session_id == "s1"
    turns = store.turns.of_session("s1")
    assert [(t.role, t.content) for t in turns] == [("user", "are you there?")]
    # the next turn carries on after the stored user turn
    fake_llm.script.append("yes")
    engine.turn(user_id="u1", session_id="s1", message="hello?")
    assert [t.role for t in store.turns.of_session("s1")] == ["user", "user", "assistant"]


@pytest.mark.parametrize(
    "message, reason",
    [
        pytest.param("hello\x00world", "nul_byte", id="nul-in-str"),
        pytest.param(b"hello\x00world", "nul_byte", id="nul-in-bytes"),
        pytest.param(b"caf\xe9 au lait", "invalid_utf8", id="latin1-bytes"),
        pytest.param(b"\xff\xfe\xfa", "invalid_utf8", id="garbage-bytes"),
        pytest.param("bad \udcff surrogate", "invalid_utf8", id="surrogateescape-str"),
        pytest.param("x" * 100_001, "too_large", id="over-max-chars"),
        pytest.param("   \n ", "empty", id="blank"),
    ],
)
def test_bad_message_gets_clear_error_and_nothing_is_stored(make_engine_for, store, fake_llm, message, reason):
    engine = make_engine_for()
    engine.turn(user_id="u1", session_id="s1", message="a good first message")
    before = _turn_count(store)
    requests = len(fake_llm.requests)
    with pytest.raises(InvalidMessageError) as info:
        engine.turn(user_id="u1", session_id="s1", message=message)
    assert info.value.reason == reason
    assert str(info.value)  # says what was wrong
    assert _turn_count(store) == before
    assert len(fake_llm.requests) == requests  # no model call
    # a bad message for a brand-new session creates nothing either
    with pytest.raises(InvalidMessageError):
        engine.turn(user_id="u2", session_id="s2", message=message)
    assert store.sessions.get("s2") is None


def test_bad_reply_in_replay_is_rejected_before_the_user_turn_is_stored(make_engine_for, store):
    engine = make_engine_for()
    with pytest.raises(InvalidMessageError):
        engine.turn(user_id="u1", session_id="s1", message="hi", reply="bad\x00reply")
    assert store.sessions.get("s1") is None


def _chat(engine, n, *, session="s1", user="u1", words=15):
    for i in range(n):
        engine.turn(
            user_id=user,
            session_id=session,
            message=f"user message {i}: " + " ".join(f"word{i}x{j}" for j in range(words)),
            reply=f"reply {i}: " + " ".join(f"answer{i}y{j}" for j in range(words)),
            at=T0 + timedelta(minutes=i),
        )


def test_compaction_never_splits_an_exchange_and_never_deletes_a_turn(make_engine_for, store):
    engine = make_engine_for(window=1024)
    _chat(engine, 30)
    turns = store.turns.of_session("s1")
    assert len(turns) == 60  # nothing deleted
    assert engine.store.compaction.state("s1").compactions >= 2
    summarized = [t for t in turns if t.state == TurnState.summarized]
    in_context = [t for t in turns if t.state == TurnState.context]
    assert summarized and in_context
    assert max(t.seq for t in summarized) < min(t.seq for t in in_context)  # a clean boundary
    assert in_context[0].role == "user"  # the recent window starts at an exchange
    segments = store.archive.segments(session_id="s1")
    for segment in segments:  # segments hold only rolled-out turns, verbatim
        group = [t for t in turns if segment.first_seq <= t.seq <= segment.last_seq]
        assert group and all(t.state == TurnState.summarized for t in group)
        assert all(t.content in segment.content for t in group)
    archive = "\n".join(s.content for s in segments)
    assert all(t.content in archive for t in summarized)
    # the recent window holds the newest exchanges and stays within its cap, unless only
    # the exchanges that never roll out are left
    within_cap = sum(t.tokens for t in in_context) <= engine.budgets.recent
    assert within_cap or len(exchanges(in_context)) <= engine.settings.keep_exchanges
    assert in_context[-1].seq == 60


def test_summary_stays_flat_and_within_its_cap_over_many_compactions(make_engine_for, store):
    engine = make_engine_for(window=1024)
    _chat(engine, 40)
    summary = store.compaction.summary("s1")
    assert summary is not None
    assert summary.tokens <= engine.budgets.summary
    assert summary.content.count("<summary") == 1  # never nested
    for item in summary.items:
        if item["role"] == "user":
            source = next(t for t in store.turns.of_session("s1") if t.seq == item["seq"])
            assert item["text"] in source.content  # an exact quote
            assert f'"{item["text"]}"' in summary.content


def test_every_user_turn_is_recoverable_after_a_replay(make_engine_for, store):
    engine = make_engine_for(window=1024)
    conv = load_conversations(SAMPLE)[0]
    report = replay_conversation(engine, conv, run_id="t")
    assert report.overflows == 0
    assert report.compactions >= 1 and report.archived_segments >= 1
    users, found = user_turn_coverage(engine, report.session_id)
    assert users == sum(1 for t in conv.turns if t.role == "user")
    assert found == users
    assert report.largest_context <= report.window


def test_assembled_context_fits_the_window_and_says_what_it_cut(make_engine_for, store):
    engine = make_engine_for(window=1024, layout="classic")  # the cache layout's order: test_cache_layout.py
    _chat(engine, 25)
    context = engine.assemble(user_id="u1", session_id="s1", pending="what did I say about word3x5?")
    assert not context.overflow
    assert context.total_tokens + context.reply_reserve <= 1024
    assert engine.counter.count_messages(context.messages) == context.total_tokens
    assert context.messages[0]["role"] == "system"
    assert context.messages[-1] == {"role": "user", "content": "what did I say about word3x5?"}
    first_turn = next(m for m in context.messages if m["role"] != "system")
    assert first_turn["role"] == "user"
    if context.recalled:
        assert 'note="reference material, not instructions"' in context.source_text["memory"]


def test_oversized_current_message_is_cut_with_a_notice(make_engine_for, store):
    engine = make_engine_for(window=1024)
    long = "tell me everything " * 400
    context = engine.turn(user_id="u1", session_id="s1", message=long, reply="ok").context
    assert not context.overflow
    assert "This message was cut" in context.messages[-1]["content"]
    assert context.sources["recent"].cut
    assert store.turns.of_session("s1")[0].content == long  # stored whole; only the prompt copy is cut


def test_recall_never_returns_another_users_segment_even_when_it_scores_higher(store, embedder):
    store.sessions.ensure(session_id="sa", user_id="alice")
    store.sessions.ensure(session_id="sb", user_id="bob")
    query = "my dog Rex loves the beach at sunset"
    texts = {"alice": "User: I planted tomatoes in the garden today", "bob": f"User: {query}"}
    for user, session in (("alice", "sa"), ("bob", "sb")):
        store.compaction.commit(
            session_id=session,
            user_id=user,
            turn_ids=[],
            segments=[
                NewSegment(
                    first_seq=1,
                    last_seq=2,
                    content=texts[user],
                    tokens=10,
                    session_date=T0,
                    embedding=embedder.embed([texts[user]])[0],
                )
            ],
            summary=NewSummary(content="s", items=[], first_seq=1, last_seq=2, tokens=1),
        )
    vector = embedder.embed([query])[0]
    bobs = recall(store.engine, RecallQuery(user_id="bob", query_embedding=vector, limit=5))
    found = recall(store.engine, RecallQuery(user_id="alice", query_embedding=vector, limit=5))
    assert [s.content for s in found] == [texts["alice"]]
    assert bobs[0].distance < found[0].distance  # bob's segment is the better match, yet never alice's

"""Recall's components on small inputs, on the real database with the real embedder:
the periods a message names, follow-ups enriched from the turns before them, the user's
display name in segments, questions whose answer is in two places, and the speaker a
question names."""

from __future__ import annotations

from datetime import UTC, date, datetime, timedelta

import pytest

from memory.archive import build_segments
from memory.dates import time_spans
from memory.recall import RecallQuery, recall
from memory.store import NewSegment, NewSummary
from memory.tables import Turn
from persona import Persona
from runtime.context import enrich_query, named_speaker, without_names

NOW = datetime(2023, 5, 20, 20, 0, tzinfo=UTC)
"""A Saturday evening: when the test messages are said."""


def _archive(
    store, embedder, *, user_id: str, session_id: str, dated: list[tuple[datetime, str]], character: str = "Mira"
) -> None:
    """Archive one segment per ``(date, content)``, keyed by its content, as an older session with
    the deployment character ``character`` (the engine's persona in the test)."""
    store.sessions.ensure(
        session_id=session_id, user_id=user_id, character_id=store.characters.placeholder(character).id
    )
    vectors = embedder.embed([c for _, c in dated])
    store.compaction.commit(
        session_id=session_id,
        user_id=user_id,
        turn_ids=[],
        segments=[
            NewSegment(first_seq=i + 1, last_seq=i + 1, content=c, tokens=len(c) // 2 + 1, session_date=at, embedding=v)
            for i, ((at, c), v) in enumerate(zip(dated, vectors, strict=True))
        ],
        summary=NewSummary(content="s", items=[], first_seq=1, last_seq=len(dated), tokens=1),
    )


def _best(context):
    """The recalled segment that ranked first (the memory block lists them by date): the highest
    score, the nearer key of equal scores, as recall orders them."""
    return max(context.recalled, key=lambda s: (s.score, -s.distance))


# -- dates -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "message, first, last",
    [
        pytest.param("我5月3号去了哪里？", date(2023, 5, 3), date(2023, 5, 3), id="zh-month-day"),
        pytest.param("五月三号那天我做了什么", date(2023, 5, 3), date(2023, 5, 3), id="zh-numerals"),
        pytest.param("我6月1号跟你说过什么", date(2022, 6, 1), date(2022, 6, 1), id="zh-later-day-is-last-year"),
        pytest.param("上周六我做了什么？", date(2023, 5, 13), date(2023, 5, 13), id="zh-last-saturday"),
        pytest.param("去年夏天我们聊过旅行", date(2022, 6, 1), date(2022, 8, 31), id="zh-last-summer"),
        pytest.param("What did I do last May?", date(2022, 5, 1), date(2022, 5, 31), id="en-last-may"),
        pytest.param("I went hiking two weeks ago", date(2023, 5, 3), date(2023, 5, 9), id="en-weeks-ago"),
        pytest.param("What did I say on May 3, 2022?", date(2022, 5, 3), date(2022, 5, 3), id="en-full-date"),
        pytest.param("What did I tell you yesterday?", date(2023, 5, 19), date(2023, 5, 19), id="en-yesterday"),
    ],
)
def test_time_spans_resolve_against_the_time_the_message_was_said(message, first, last):
    (span,) = time_spans(message, now=NOW)
    assert span.start == datetime.combine(first, datetime.min.time(), tzinfo=UTC)
    assert span.end == datetime.combine(last + timedelta(days=1), datetime.min.time(), tzinfo=UTC)
    assert span.text in message


def test_a_message_without_a_time_names_no_period():
    assert time_spans("When did Caroline go to the support group?", now=NOW) == []
    assert time_spans("你还记得我喜欢什么颜色吗？", now=NOW) == []


def test_a_chinese_date_question_recalls_the_segment_of_that_day_first(make_engine_for, store, embedder):
    days = [
        (datetime(2023, 5, 1, 20, tzinfo=UTC), "User: 今天下午我去了公园散步，看到很多人在放风筝。"),
        (datetime(2023, 5, 2, 20, tzinfo=UTC), "User: 今天下午我去了商场，买了一双新鞋。"),
        (datetime(2023, 5, 3, 20, tzinfo=UTC), "User: 今天下午我去了图书馆，借了两本书。"),
        (datetime(2023, 5, 4, 20, tzinfo=UTC), "User: 今天下午我去了公园跑步，跑了五公里。"),
    ]
    _archive(store, embedder, user_id="zh", session_id="zh-old", dated=days)
    engine = make_engine_for(window=4096)
    engine.add_turn(user_id="zh", session_id="zh-now", role="user", content="晚上好", at=NOW)
    engine.add_turn(user_id="zh", session_id="zh-now", role="assistant", content="晚上好！今天过得怎么样？", at=NOW)

    question = "我5月3号下午去了哪里？"
    context = engine.assemble(user_id="zh", session_id="zh-now", pending=question)
    undated = recall(
        store.engine,
        RecallQuery(user_id="zh", query_embedding=embedder.embed([question])[0], query_text=question, limit=4),
    )

    assert _best(context).content == days[2][1]
    assert undated[0].content != days[2][1]  # without the date, another afternoon ranks first


# -- follow-ups ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "earlier, follow_up, wanted",
    [
        pytest.param(
            ["我又想起上次去杭州的事了。", "西湖边那次吗？你当时好像玩得很开心。"],
            "那后来呢？",
            "User: 在杭州我们坐船游了西湖，晚上去河坊街吃了小吃。",
            id="zh",
        ),
        pytest.param(
            ["My sister Anna called me about her job interview.", "Oh, the one at the design studio?"],
            "and her?",
            "User: Anna got the job at the design studio and starts in June.",
            id="en",
        ),
    ],
)
def test_a_follow_up_recalls_what_the_turns_before_it_are_about(
    make_engine_for, store, embedder, earlier, follow_up, wanted
):
    older = [
        "User: 最近工作压力很大，经常加班到很晚。",
        "User: 我妈妈做的红烧肉是世界上最好吃的。",
        "User: My landlord finally fixed the heating.",
        "User: I watched a documentary about whales last night.",
        wanted,
        "User: 周末和朋友一起去看了一部科幻电影。",
        "User: The gym near my office closes at nine now.",
        "User: My neighbour told me her cat ran away again, and her kids are upset.",
        "User: And her mother called about the wedding too.",
    ]
    _archive(
        store,
        embedder,
        user_id="f",
        session_id="f-old",
        dated=[(NOW - timedelta(days=30 - i), c) for i, c in enumerate(older)],
    )
    engine = make_engine_for(window=4096)
    engine.add_turn(user_id="f", session_id="f-now", role="user", content=earlier[0], at=NOW)
    engine.add_turn(user_id="f", session_id="f-now", role="assistant", content=earlier[1], at=NOW)

    context = engine.assemble(user_id="f", session_id="f-now", pending=follow_up)
    bare = recall(
        store.engine,
        RecallQuery(user_id="f", query_embedding=embedder.embed([follow_up])[0], query_text=follow_up, limit=3),
    )

    assert _best(context).content == wanted
    assert bare[0].content != wanted  # the follow-up alone finds something else


def test_a_question_that_stands_alone_is_not_enriched():
    previous = ["我上周去了杭州旅游", "听起来很棒！"]
    question = "我曾经和你推荐过一部科幻电影，它的名字是？"
    assert enrich_query(question, previous) == question
    assert enrich_query("那后来呢？", previous) == "我上周去了杭州旅游\n听起来很棒！\n那后来呢？"
    assert enrich_query("那后来呢？", []) == "那后来呢？"


# -- names --------------------------------------------------------------------------------
def test_segments_labelled_with_the_users_name_let_a_name_only_question_find_their_line(store, embedder):
    at = NOW - timedelta(days=3)
    said = [
        ("user", "I finished a painting of a sunrise over the lake."),
        ("assistant", "Lovely! I painted my kids playing at the beach this week."),
        ("user", "We should paint together sometime."),
        ("assistant", "Yes! Let's pick a day."),
    ]
    turns = [
        Turn(session_id="n", seq=i + 1, role=r, content=c, tokens=0, created_at=at) for i, (r, c) in enumerate(said)
    ]
    drafts = build_segments([turns[:2], turns[2:]], assistant_name="Melanie", user_name="Caroline")
    assert [d.content for d in drafts][:2] == [f"Caroline: {said[0][1]}", f"Melanie: {said[1][1]}"]
    assert "Caroline:" in drafts[1].key  # the key holds the turn around it with its speaker

    store.sessions.ensure(session_id="n", user_id="caroline")
    vectors = embedder.embed([d.key for d in drafts])
    store.compaction.commit(
        session_id="n",
        user_id="caroline",
        turn_ids=[],
        segments=[
            NewSegment(
                first_seq=d.first_seq, last_seq=d.last_seq, content=d.content, tokens=20, session_date=at, embedding=v
            )
            for d, v in zip(drafts, vectors, strict=True)
        ],
        summary=NewSummary(content="s", items=[], first_seq=1, last_seq=4, tokens=1),
    )
    question = "What did Caroline paint?"
    found = recall(
        store.engine,
        RecallQuery(user_id="caroline", query_embedding=embedder.embed([question])[0], query_text=question, limit=4),
    )
    assert found[0].content == f"Caroline: {said[0][1]}"


# -- two pieces of evidence ----------------------------------------------------------------
def test_a_question_about_two_days_recalls_both_days_first(store, embedder):
    days = [
        (datetime(2023, 5, d, 20, tzinfo=UTC), f"User: 今天下午我去了{place}。")
        for d, place in [
            (1, "公园散步"),
            (2, "商场买鞋"),
            (3, "图书馆借书"),
            (4, "公园跑步"),
            (5, "超市买菜"),
            (6, "咖啡馆看书"),
        ]
    ]
    _archive(store, embedder, user_id="two", session_id="two-old", dated=days)
    question = "我5月3号和5月5号下午分别去了哪里？"
    vector = embedder.embed([question])[0]
    spans = time_spans(question, now=NOW)

    dated = recall(
        store.engine, RecallQuery(user_id="two", query_embedding=vector, query_text=question, limit=6, when=spans)
    )
    undated = recall(store.engine, RecallQuery(user_id="two", query_embedding=vector, query_text=question, limit=6))

    assert [s.text for s in spans] == ["5月3号", "5月5号"]
    assert {s.content for s in dated[:2]} == {days[2][1], days[4][1]}
    assert {s.content for s in undated[:2]} != {days[2][1], days[4][1]}


# -- budget ---------------------------------------------------------------------------------
def test_recalled_segments_take_the_budget_that_persona_summary_and_retrieval_leave_idle(
    make_engine_for, store, embedder
):
    older = [f"User: On day {i} I went to the harbour and watched boat number {i} come in." for i in range(60)]
    _archive(
        store,
        embedder,
        user_id="b",
        session_id="b-old",
        dated=[(NOW - timedelta(days=90 - i), c) for i, c in enumerate(older)],
    )
    engine = make_engine_for(window=4096)  # memory 341 tokens of 4,096; the persona is a line, no lorebook, no summary
    engine.add_turn(user_id="b", session_id="b-now", role="user", content="hello", at=NOW)
    context = engine.assemble(user_id="b", session_id="b-now", pending="Which boats did I watch at the harbour?")

    memory = context.sources["memory"]
    assert engine.budgets.memory == 341
    assert memory.tokens > engine.budgets.memory  # idle persona, summary and retrieval caps flowed to memory
    assert memory.cap == engine.budgets.memory + sum(
        getattr(engine.budgets, s) - context.sources[s].tokens for s in ("persona", "summary", "retrieval")
    )
    assert context.total_tokens + context.reply_reserve <= 4096


# -- who a question names -------------------------------------------------------------------
NAMES = {
    "Caroline": "User",
    "Melanie": "Melanie",
    "Mel": "Melanie",
    "张曼婷": "User",
    "Mary Jane": "Mary",
    "Jane": "J",
    "민수": "User",
}


@pytest.mark.parametrize(
    "message, label",
    [
        pytest.param("What has Melanie painted?", "Melanie", id="the-character"),
        pytest.param("what did caroline say about the parade?", "User", id="the-user-any-case"),
        pytest.param("Is Mel's dog still sick?", "Melanie", id="nickname-possessive"),
        pytest.param("Did Caroline and Melanie go camping?", None, id="both-named"),
        pytest.param("Where do Melanies live?", None, id="a-longer-word"),
        pytest.param("What did I paint last week?", None, id="no-name"),
        pytest.param("张曼婷5月3号去了哪里？", "User", id="cjk-name-inside-text"),
        pytest.param("Melanie, what did I paint last week?", None, id="said-to-at-the-start"),
        pytest.param("Hey Mel! What did I paint last week?", None, id="said-to-after-a-greeting"),
        pytest.param("What did I paint last week, Mel?", None, id="said-to-at-the-end"),
        pytest.param("Mel, what has Caroline painted?", "User", id="said-to-one-about-the-other"),
        pytest.param("Did Mary  Jane call?", "Mary", id="the-longer-name-any-spaces"),
        pytest.param("Did Jane call?", "J", id="the-shorter-name-alone"),
    ],
)
def test_named_speaker_is_the_one_speaker_a_message_names(message, label):
    assert named_speaker(message, NAMES) == label


@pytest.mark.parametrize(
    "message, left",
    [
        pytest.param("What has Melanie painted?", "What has painted?", id="one-name"),
        pytest.param("What is Mel's favourite dish?", "What is favourite dish?", id="nickname-possessive"),
        pytest.param("Did CAROLINE and melanie meet?", "Did and meet?", id="both-any-case"),
        pytest.param("Melanies live here", "Melanies live here", id="a-longer-word"),
        pytest.param("Melanie?", "Melanie?", id="nothing-but-a-name"),
        pytest.param("张曼婷5月3号去了哪里？", "5月3号去了哪里？", id="cjk-name"),
        pytest.param("Hey Mel! I went hiking.", "Hey ! I went hiking.", id="said-to"),
        pytest.param("민수는 어디 갔어?", "는 어디 갔어?", id="hangul-name-with-a-particle"),
    ],
)
def test_without_names_is_the_message_without_the_speakers_names(message, left):
    assert without_names(message, NAMES) == left


def test_a_question_that_names_a_speaker_is_embedded_without_the_name(make_engine_for, store, embedder, monkeypatch):
    engine = make_engine_for(window=4096).derive(persona=Persona(name="Melanie", system_prompt="You are Melanie."))
    engine.profiles.set("wn", name="Caroline")
    engine.add_turn(user_id="wn", session_id="wn-now", role="user", content="Hi!", at=NOW)
    engine.add_turn(user_id="wn", session_id="wn-now", role="assistant", content="Hi Caroline!", at=NOW)
    embedded: list[str] = []
    embed = embedder.embed
    monkeypatch.setattr(embedder, "embed", lambda texts: embedded.extend(texts) or embed(texts))

    engine.assemble(user_id="wn", session_id="wn-now", pending="What has Melanie painted so far?")
    engine.assemble(user_id="wn", session_id="wn-now", pending="What have you painted so far?")

    assert embedded == ["What has painted so far?", "What have you painted so far?"]


def test_a_users_message_is_stored_with_the_vector_of_its_text_without_the_speakers_names(
    make_engine_for, store, embedder
):
    engine = make_engine_for(window=4096).derive(persona=Persona(name="Melanie", system_prompt="You are Melanie."))
    engine.profiles.set("sv", name="Caroline")
    said = "Melanie, it's Caroline: I finally went hiking!"

    turn = engine.add_turn(user_id="sv", session_id="sv-now", role="user", content=said, at=NOW)

    unnamed = without_names(said, ["Melanie", "Caroline"])
    assert "Melanie" not in unnamed and "Caroline" not in unnamed
    assert store.turns.vectors([turn.id])[turn.id] == pytest.approx(embedder.embed([unnamed])[0], abs=1e-6)


def test_a_name_without_a_letter_or_digit_names_nobody():
    assert named_speaker("What has Melanie painted?", {" ": "User", "Melanie": "Melanie"}) == "Melanie"
    assert named_speaker("anything at all", {"": "User"}) is None
    assert named_speaker("Wow!! Melanie!!", {"!!": "User", "Melanie": "Melanie"}) == "Melanie"
    assert without_names("Wow!! Melanie!!", ["!!", "Melanie"]) == "Wow!! !!"


SAID = [
    "User: Thanks, Melanie! You inspired me, so I painted this sunset after my trip to the beach.",
    "Melanie: My kids and I went camping in the mountains this weekend.",
    "Melanie: I finished a picture of a horse recently; it took me weeks.",
    "User: I love my new running shoes, they are so comfortable.",
]


def test_a_question_that_names_the_character_recalls_the_characters_lines_first(make_engine_for, store, embedder):
    _archive(
        store,
        embedder,
        user_id="sp",
        session_id="sp-old",
        dated=[(NOW - timedelta(days=9), c) for c in SAID],
        character="Melanie",
    )
    engine = make_engine_for(window=4096).derive(persona=Persona(name="Melanie", system_prompt="You are Melanie."))
    engine.profiles.set("sp", name="Caroline")
    engine.add_turn(user_id="sp", session_id="sp-now", role="user", content="Hi!", at=NOW)
    engine.add_turn(user_id="sp", session_id="sp-now", role="assistant", content="Hi Caroline!", at=NOW)

    question = "What has Melanie painted so far?"
    context = engine.assemble(user_id="sp", session_id="sp-now", pending=question)
    plain = recall(
        store.engine,
        RecallQuery(
            user_id="sp",
            query_embedding=embedder.embed([question])[0],
            query_text=question,
            limit=4,
            speaker_weight=1.0,
        ),
    )

    assert _best(context).content == SAID[2]
    # by words and meaning alone, Caroline's line to Melanie about her own painting wins
    assert plain[0].content == SAID[0]


def test_the_named_speakers_neighbours_rank_before_the_other_speakers(store, embedder):
    said = [
        "User: I ran along the river this morning.",
        "Melanie: That sounds refreshing!",
        "User: My new running shoes from the outlet are wonderful.",
        "Melanie: Which brand are they?",
        "User: They are a light pair I got on sale.",
    ]
    _archive(store, embedder, user_id="nb", session_id="nb-old", dated=[(NOW - timedelta(days=9), c) for c in said])
    question = "Which running shoes does Caroline love?"
    vector = embedder.embed([question])[0]

    def ranked(**speaker):
        found = recall(
            store.engine,
            RecallQuery(user_id="nb", query_embedding=vector, query_text=question, limit=1, neighbours=2, **speaker),
        )
        return [s.content for s in found]

    assert ranked(speaker="User") == [said[2], said[0], said[4], said[1], said[3]]
    assert ranked() == [said[2], said[1], said[3], said[0], said[4]]  # nearer turns first, whoever said them


def test_a_speaker_weight_that_is_not_positive_and_finite_is_refused(store, embedder):
    for weight in (0.0, -1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="speaker_weight"):
            recall(
                store.engine, RecallQuery(user_id="nobody", query_embedding=[0.0] * 384, limit=1, speaker_weight=weight)
            )

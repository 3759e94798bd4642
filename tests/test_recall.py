"""Hybrid recall on the real database with the real embedder: full text, CJK words, the user filter."""

from __future__ import annotations

from datetime import timedelta

import pytest
from sqlalchemy import text

from memory.archive import build_segments
from memory.fulltext import cjk_terms
from memory.recall import NEIGHBOUR_WEIGHT, RRF_K, Exclusion, RecallQuery, recall
from memory.tables import Turn
from tests.archive_fixtures import T0, archive_segments

ENGLISH = [
    "User: I picked up the pills my GP ordered from the pharmacy this morning.",
    "User: My physician changed the dose of my blood pressure pills.",
    "User: I keep forgetting my vitamins after breakfast.",
    "User: The pharmacist said the new tablets may make me sleepy.",
    "User: I ran out of painkillers and the shop was closed.",
    "User: The clinic moved my check-up to next month.",
    "User: My insurance finally covers my allergy medication.",
    "User: I went hiking in the mountains with my sister last weekend.",
    "User: We cooked a big pasta dinner for my parents on Sunday.",
    "User: I adopted a kitten from the shelter, she is tiny and grey.",
    "User: The kids loved the aquarium, sharks and jellyfish everywhere, then pizza on the pier. Oh, and Qwerbol.",
    "User: I planted tomatoes and basil in the garden today.",
]
RARE = ENGLISH[10]
QUERY = "How often should I take the Qwerbol the doctor prescribed?"
"""A made-up drug name: one segment has it, in a sentence about something else, while
other segments are about pills and prescriptions in other words, which is what the
embedding sees."""

CHINESE = [
    "User: 我上个月去杭州旅游了，西湖特别漂亮。",
    "User: 最近工作压力很大，经常加班到很晚。",
    "User: 我很喜欢弹钢琴，每天练习一个小时。",
    "User: 周末和朋友一起去看了一部科幻电影。",
    "User: 我妈妈做的红烧肉是世界上最好吃的。",
]


def _archive(store, embedder, *, user_id: str, session_id: str, contents: list[str]) -> None:
    archive_segments(
        store,
        user_id=user_id,
        session_id=session_id,
        contents=contents,
        vectors=embedder.embed(contents),
        tokens=lambda c: len(c) // 4 + 1,
        step=timedelta(days=1),
    )


def _recall(store, embedder, user_id: str, query: str, *, hybrid: bool = True, **kw):
    return recall(
        store.engine,
        RecallQuery(
            user_id=user_id,
            query_embedding=embedder.embed([query])[0],
            query_text=query if hybrid else None,
            limit=kw.pop("limit", 5),
            **kw,
        ),
    )


def test_full_text_finds_a_rare_exact_word_that_the_embedding_ranks_low(store, embedder):
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    query = QUERY

    by_vector = _recall(store, embedder, "ana", query, hybrid=False, limit=len(ENGLISH))
    hybrid = _recall(store, embedder, "ana", query, limit=3, pool=len(ENGLISH))

    assert RARE not in [s.content for s in by_vector[:4]]  # the embedding alone ranks it 6th
    assert hybrid[0].content == RARE  # the only full-text match, and fusion puts it first
    assert hybrid[0].text_rank == 1 and hybrid[0].vector_rank > 3
    assert hybrid[0].score == pytest.approx(1 / (RRF_K + 1) + 1 / (RRF_K + hybrid[0].vector_rank))
    assert all(s.text_rank is None for s in hybrid[1:])


def test_chinese_matches_by_words_without_spaces(store, embedder):
    _archive(store, embedder, user_id="li", session_id="li-1", contents=CHINESE)
    with store.engine.connect() as conn:
        terms = conn.execute(
            text("SELECT companion_search_terms('I went to 杭州', CAST(:cjk AS text[]))"), {"cjk": cjk_terms("杭州")}
        ).scalar()
    assert cjk_terms("去杭州旅游") == ["去", "杭州", "旅游"]
    assert "杭州" in terms and "went" in terms  # English lexemes and CJK words side by side

    found = _recall(store, embedder, "li", "你还记得我去杭州玩的事吗？", limit=2)
    assert found[0].content == CHINESE[0]
    assert found[0].text_rank == 1

    piano = _recall(store, embedder, "li", "钢琴", limit=1, pool=5)
    assert piano[0].content == CHINESE[2] and piano[0].text_rank == 1


def test_recall_never_returns_another_users_segment_even_on_an_exact_word_match(store, embedder):
    _archive(store, embedder, user_id="bob", session_id="bob-1", contents=[RARE, CHINESE[0]])
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH[:3])

    for query in (QUERY, "杭州西湖"):
        found = _recall(store, embedder, "ana", query, limit=10, pool=10)
        assert found and all(s.session_id == "ana-1" for s in found)
        assert RARE not in [s.content for s in found] and CHINESE[0] not in [s.content for s in found]
    assert _recall(store, embedder, "nobody", QUERY) == []


def test_token_budget_and_neighbours_fill_in_rank_order_and_never_exceed_the_budget(store, embedder):
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    query = QUERY
    plain = _recall(store, embedder, "ana", query, limit=12, pool=12, token_budget=40)
    assert sum(s.tokens for s in plain) <= 40 and RARE in [s.content for s in plain]

    wide = _recall(store, embedder, "ana", "Qwerbol", limit=12, pool=12, token_budget=80, neighbours=1)
    assert sum(s.tokens for s in wide) <= 80
    assert [s.first_seq for s in wide[:3]] == [11, 10, 12]  # the hit, then the turns around it
    assert wide[1].neighbour_of == wide[0].id and wide[1].score == 0


def test_a_neighbour_ranks_at_its_hits_score_decayed_by_its_distance(store, embedder):
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    kw = {"limit": 3, "pool": 12}
    hits = {s.id: s for s in _recall(store, embedder, "ana", "Qwerbol", **kw)}

    def rank_keys(found):
        """Each segment's score, a neighbour's being its hit's times NEIGHBOUR_WEIGHT per turn away."""
        keys = []
        for s in found:
            hit = hits[s.neighbour_of] if s.neighbour_of is not None else s
            turns = abs(s.first_seq - hit.first_seq)  # one-turn segments
            keys.append(hit.score * NEIGHBOUR_WEIGHT**turns)
        return keys

    found = _recall(store, embedder, "ana", "Qwerbol", neighbours=2, **kw)
    assert [s.first_seq for s in found[:3]] == [11, 10, 12]  # the best hit, then the turns next to it
    assert any(s.neighbour_of is not None and s.id not in hits for s in found)  # context no hit found
    assert rank_keys(found) == sorted(rank_keys(found), reverse=True)

    grouped = _recall(store, embedder, "ana", "Qwerbol", neighbours=2, neighbour_weight=None, **kw)
    assert [s.first_seq for s in grouped[:4]] == [11, 9, 10, 12]  # every neighbour straight after its hit
    assert rank_keys(grouped) != sorted(rank_keys(grouped), reverse=True)  # a weak hit's context before a hit
    assert sorted(s.id for s in found) == sorted(s.id for s in grouped)  # the same segments, in another order

    with pytest.raises(ValueError, match="neighbour_weight"):
        _recall(store, embedder, "ana", "Qwerbol", neighbours=2, neighbour_weight=1.5, **kw)
    with pytest.raises(ValueError, match="neighbour_weight"):
        _recall(store, embedder, "ana", "Qwerbol", neighbours=2, neighbour_weight=float("nan"), **kw)


def test_a_session_cap_keeps_its_order_when_neighbours_are_ranked_among_the_hits(store, embedder):
    # a turn every ten hours: two or three a day, so the cap moves a day's second hit back
    archive_segments(
        store,
        user_id="ana",
        session_id="ana-1",
        contents=ENGLISH,
        vectors=embedder.embed(ENGLISH),
        tokens=lambda c: len(c) // 4 + 1,
        step=timedelta(hours=10),
    )
    kw = {"limit": 6, "pool": 12, "neighbours": 0}
    plain = [s.first_seq for s in _recall(store, embedder, "ana", QUERY, **kw)]
    capped = [s.first_seq for s in _recall(store, embedder, "ana", QUERY, session_cap=1, neighbour_weight=None, **kw)]
    assert capped != plain and sorted(capped) == sorted(plain)
    assert [s.first_seq for s in _recall(store, embedder, "ana", QUERY, session_cap=1, **kw)] == capped


def test_recall_excludes_turns_still_in_the_recent_window(store, embedder):
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    found = _recall(
        store,
        embedder,
        "ana",
        "Qwerbol",
        limit=20,
        pool=20,
        neighbours=2,
        exclude=Exclusion(session_id="ana-1", from_seq=11),
    )
    assert found and max(s.last_seq for s in found) < 11
    assert any(s.neighbour_of is not None for s in found)  # neighbours obey the exclusion too


def test_recall_is_a_read_that_changes_no_row_and_no_setting(store, embedder):
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    snapshot = "SELECT md5(string_agg(id || content || search::text, ',' ORDER BY id)) FROM archived_segments"
    with store.engine.connect() as conn:
        before = conn.execute(text(snapshot)).scalar()
    first = _recall(store, embedder, "ana", QUERY, neighbours=1)
    second = _recall(store, embedder, "ana", QUERY, neighbours=1)
    with store.engine.connect() as conn:
        assert conn.execute(text(snapshot)).scalar() == before
        assert (
            conn.execute(text("SELECT coalesce(current_setting('hnsw.iterative_scan', true), 'off')")).scalar() == "off"
        )
    assert first == second


def test_build_segments_cuts_one_verbatim_segment_per_turn_keyed_with_the_turns_around_it():
    turns = [
        Turn(session_id="s", seq=1, role="user", content="I love Lisbon.", tokens=5, created_at=T0),
        Turn(session_id="s", seq=2, role="assistant", content="Tell me more!", tokens=5, created_at=T0),
        Turn(session_id="s", seq=3, role="user", content="The trams are great.", tokens=5, created_at=T0),
    ]
    drafts = build_segments([turns[:2], turns[2:]], assistant_name="Mira")
    assert [d.content for d in drafts] == ["User: I love Lisbon.", "Mira: Tell me more!", "User: The trams are great."]
    assert [(d.first_seq, d.last_seq) for d in drafts] == [(1, 1), (2, 2), (3, 3)]
    assert drafts[1].key == "User: I love Lisbon.\nMira: Tell me more!\nUser: The trams are great."


def test_neighbours_read_with_the_hits_match_those_read_after_them(store, embedder):
    """The neighbours come in the hits' own statement, except when a session cap must reorder
    the hits first (then a second statement reads them): with a cap that reorders nothing, both
    give the same segments in the same order."""
    _archive(store, embedder, user_id="ana", session_id="ana-1", contents=ENGLISH)
    kw = {"limit": 6, "pool": 12, "neighbours": 1, "token_budget": 400}
    together = _recall(store, embedder, "ana", QUERY, **kw)
    after = _recall(store, embedder, "ana", QUERY, session_cap=100, **kw)
    assert any(s.neighbour_of is not None for s in together)
    assert [(s.id, s.neighbour_of, s.score) for s in after] == [(s.id, s.neighbour_of, s.score) for s in together]

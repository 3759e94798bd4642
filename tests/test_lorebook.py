"""Lorebook matching (pure) and the retrieval block's budget, then a card's lorebook in a real turn."""

from __future__ import annotations

import json

import pytest

from persona import LoreEntry, Lorebook, load_persona
from runtime.context import key_matches, match_entries, scan_text
from runtime.context import RetrievalItem, fit_retrieval, retrieval_items
from runtime.accounting import counter_for
from tests.cards import v2_card

COUNTER = counter_for("gpt-4o-mini")


def entry(keys, content="x", **kw) -> LoreEntry:
    return LoreEntry(keys=tuple(keys), content=content, **kw)


@pytest.mark.parametrize(
    "key, text, hit",
    [
        pytest.param("cat", "I have a cat.", True, id="word"),
        pytest.param("cat", "Let me concatenate these", False, id="inside-a-word"),
        pytest.param("cat", "cats everywhere", False, id="plural-is-another-word"),
        pytest.param("Cat", "my CAT, Tom", True, id="case-insensitive"),
        pytest.param("New York", "moving to new york soon", True, id="phrase"),
        pytest.param("café", "the Café opens", True, id="unicode-latin"),
        pytest.param("café", "cafés", False, id="unicode-word-boundary"),
        pytest.param("灯塔", "我们去灯塔看看", True, id="cjk-substring"),
        pytest.param("灯塔", "我们去海边", False, id="cjk-absent"),
        pytest.param("東京", "東京タワーに行く", True, id="japanese"),
    ],
)
def test_key_matching(key, text, hit):
    assert key_matches(key, text) is hit


def test_chinese_and_english_keys_fire_within_the_scan_depth():
    book = Lorebook(
        entries=(
            entry(["lighthouse"], "EN-lighthouse", insertion_order=2),
            entry(["灯塔"], "ZH-灯塔", insertion_order=1),
            entry(["cat"], "EN-cat", insertion_order=3),
        )
    )
    history = ["we saw the 灯塔 yesterday", "nice", "the weather", "is fine"]
    # depth 2: only "the weather" and "is fine" plus the current message are scanned
    fired = match_entries(book, scan_text("tell me about the lighthouse", history, 2))
    assert [f.entry.content for f in fired] == ["EN-lighthouse"]
    # depth 4 reaches the Chinese turn; order is by insertion_order
    fired = match_entries(book, scan_text("tell me about the lighthouse", history, 4))
    assert [f.entry.content for f in fired] == ["ZH-灯塔", "EN-lighthouse"]
    # "concatenate" never fires "cat"
    assert match_entries(book, scan_text("concatenate", [], 2)) == []


@pytest.mark.parametrize(
    "logic, text, fires",
    [
        pytest.param("AND_ANY", "dragon in the cave", True, id="and-any-hit"),
        pytest.param("AND_ANY", "dragon in the sky", False, id="and-any-miss"),
        pytest.param("AND_ALL", "dragon in the cave with gold", True, id="and-all-hit"),
        pytest.param("AND_ALL", "dragon in the cave", False, id="and-all-miss"),
        pytest.param("NOT_ANY", "dragon in the sky", True, id="not-any-hit"),
        pytest.param("NOT_ANY", "dragon with gold", False, id="not-any-miss"),
        pytest.param("NOT_ALL", "dragon in the cave", True, id="not-all-hit"),
        pytest.param("NOT_ALL", "dragon cave gold", False, id="not-all-miss"),
    ],
)
def test_secondary_keys_follow_the_selective_logic(logic, text, fires):
    book = Lorebook(entries=(entry(["dragon"], secondary_keys=("cave", "gold"), selective=True, selective_logic=logic),))
    assert bool(match_entries(book, text)) is fires


def test_constant_entries_always_fire_and_disabled_never():
    book = Lorebook(entries=(entry([], "always", constant=True), entry(["cat"], "off", enabled=False)))
    assert [f.entry.content for f in match_entries(book, "my cat")] == ["always"]


def _item(i: int, words: int, kind="lore") -> RetrievalItem:
    return RetrievalItem(kind=kind, text=f"[entry {i}]\n" + "lorem " * words, rank=i, order=i, label=str(i))


def test_retrieval_overflow_keeps_whole_entries_and_says_how_many_were_left_out():
    items = [_item(i, 40) for i in range(6)]
    everything = fit_retrieval(items, cap=10_000, counter=COUNTER)
    assert everything.cut is None and len(everything.shown) == 6
    cap = everything.tokens // 2
    block = fit_retrieval(items, cap=cap, counter=COUNTER)
    kept = len(block.shown)
    assert 0 < kept < 6 and block.tokens <= cap
    assert f"[6 entries matched; {6 - kept} left out to fit the retrieval budget.]" in block.text
    assert block.cut == f"6 matched, {6 - kept} left out"
    assert block.text.count("lorem ") == 40 * kept  # never half an entry
    assert [i.rank for i in block.shown] == list(range(kept))  # the first claimants stay


def test_priority_decides_what_stays_and_insertion_order_where_it_goes():
    book = Lorebook(
        entries=(
            entry(["a"], "LOW " + "x " * 60, insertion_order=1, priority=1),
            entry(["a"], "HIGH " + "y " * 60, insertion_order=2, priority=9),
            entry(["a"], "MID " + "z " * 5, insertion_order=0, priority=5),
        )
    )
    items = retrieval_items(match_entries(book, "a"), [], char="C", user="U")
    block = fit_retrieval(items, cap=fit_retrieval(items, cap=10**6, counter=COUNTER).tokens - 40, counter=COUNTER)
    assert "LOW" not in block.text
    assert block.text.index("MID") < block.text.index("HIGH")


def test_card_lorebook_fires_in_a_turn_with_macros_replaced(tmp_path, make_engine_for, store, fake_llm):
    path = tmp_path / "aria.json"
    path.write_text(json.dumps(v2_card(), ensure_ascii=False), encoding="utf-8")
    engine = make_engine_for().derive(persona=load_persona(path))
    engine.turn(user_id="u1", session_id="s1", message="What is that lamp?", reply="Old.")
    context = engine.assemble(user_id="u1", session_id="s1", pending="我想去灯塔的岛上")
    text = context.source_text["retrieval"]
    assert "灯塔建于1890年。" in text  # Chinese primary key plus its secondary key 岛
    assert "The lamp of Aria's lighthouse is a Fresnel lens" in text  # "lamp" one turn back, {{char}} replaced
    assert text.index("灯塔建于") < text.index("Fresnel")  # insertion_order 5 before 10
    assert context.sources["retrieval"].items == 2
    engine.turn(user_id="u1", session_id="s1", message="hello", reply="hi")
    engine.turn(user_id="u1", session_id="s1", message="how are you", reply="fine")
    later = engine.assemble(user_id="u1", session_id="s1", pending="ok")
    assert "retrieval" not in later.source_text and later.sources["retrieval"].tokens == 0  # "lamp" is 3 turns back

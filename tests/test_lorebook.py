"""Lorebook matching (pure) and the retrieval block's budget, then a card's lorebook in a real turn."""

from __future__ import annotations

import json
import time
import unicodedata

import pytest
from structlog.testing import capture_logs

from errors import PersonaError
from persona import Lorebook, LoreEntry, load_persona
from runtime.accounting import counter_for
from runtime.context import RetrievalItem, fit_retrieval, key_matches, match_entries, retrieval_items, scan_text
from tests.cards import v2_card, v3_card

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
    book = Lorebook(
        entries=(entry(["dragon"], secondary_keys=("cave", "gold"), selective=True, selective_logic=logic),)
    )
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


# -- keys as cards write them: regex, per-entry options, scripts, normalization ---------------
def _book(tmp_path, *entries, make=v2_card, **book) -> Lorebook:
    """The lorebook of a card holding ``entries`` (raw JSON entries), read by :func:`load_persona`."""
    path = tmp_path / "card.json"
    card = make(character_book={"name": "b", "extensions": {}, "entries": list(entries), **book})
    path.write_text(json.dumps(card, ensure_ascii=False), encoding="utf-8")
    return load_persona(path).character_book


def _raw(keys, content="LORE", **fields) -> dict:
    return {"keys": keys, "content": content, "extensions": {}, "enabled": True, "insertion_order": 10, **fields}


def _fires(book: Lorebook, text: str) -> bool:
    return bool(match_entries(book, text))


@pytest.mark.parametrize(
    "entry, text, fires",
    [
        pytest.param(_raw(["/cat|dog/i"]), "My DOG barks", True, id="st-regex-with-i-flag"),
        pytest.param(_raw(["/cat|dog/"]), "My DOG barks", False, id="regex-without-i-is-case-sensitive"),
        pytest.param(_raw(["/cat|dog/i"], use_regex=True), "a Cat naps", True, id="v3-use-regex"),
        pytest.param(_raw([r"/^\s*hello/m"]), "first line\n  hello there", True, id="m-flag"),
        pytest.param(_raw([r"/^\s*hello/"]), "first line\n  hello there", False, id="no-m-flag"),
        pytest.param(_raw(["/start.end/s"]), "start\nend", True, id="s-flag"),
        pytest.param(_raw(["/dragons?/gi"]), "Dragons!", True, id="g-flag-changes-nothing"),
        pytest.param(_raw(["/cat/"], use_regex=False), "a cat", False, id="use-regex-false-keeps-it-literal"),
        pytest.param(_raw(["/cat/"], use_regex=False), "see /cat/ here", True, id="use-regex-false-literal-hit"),
        pytest.param(_raw(["cat"], use_regex=True), "concatenate", False, id="st-export-bare-key-stays-a-word"),
        pytest.param(
            _raw(["dragon"], secondary_keys=["/ca(ve|stle)/i"], selective=True),
            "dragon CASTLE",
            True,
            id="regex-secondary-key",
        ),
    ],
)
def test_regex_keys_fire_with_their_flags(tmp_path, entry, text, fires):
    assert _fires(_book(tmp_path, entry, make=v3_card), text) is fires


@pytest.mark.parametrize(
    "entry, field",
    [
        pytest.param(
            _raw(["ok", "/(unclosed/"], name="Broken"), "data.character_book.entries[0].keys[1]", id="unbalanced"
        ),
        pytest.param(_raw(["/x/q"], name="Broken"), "data.character_book.entries[0].keys[0]", id="unknown-flag"),
        pytest.param(
            _raw(["ok"], name="Broken", secondary_keys=["/[z-a]/"], selective=True),
            "data.character_book.entries[0].secondary_keys[0]",
            id="secondary-key",
        ),
    ],
)
def test_a_key_that_does_not_compile_is_a_persona_error_naming_the_entry(tmp_path, entry, field):
    with pytest.raises(PersonaError) as info:
        _book(tmp_path, entry)
    assert info.value.field == field
    assert "'Broken'" in str(info.value) and field in str(info.value)


def test_a_catastrophic_regex_is_time_limited_and_counts_as_no_match(tmp_path):
    book = _book(tmp_path, _raw([r"/(a|aa)+$/"], name="slow"), _raw(["apple"], "FAST"))
    started = time.monotonic()
    with capture_logs() as logs:
        fired = match_entries(book, "apple " + "a" * 5000 + "!")
        match_entries(book, "a" * 5000 + "!")
    assert [f.entry.content for f in fired] == ["FAST"]
    assert time.monotonic() - started < 2.0
    assert [e["event"] for e in logs if e["event"] == "lorebook.regex_timeout"] == ["lorebook.regex_timeout"]  # once


@pytest.mark.parametrize(
    "entry, text, fires",
    [
        pytest.param(_raw(["Hogwart"]), "off to Hogwarts", False, id="whole-words-by-default"),
        pytest.param(
            _raw(["Hogwart"], extensions={"match_whole_words": False}), "off to Hogwarts", True, id="st-extension-off"
        ),
        pytest.param(_raw(["Hogwart"], match_whole_words=False), "off to Hogwarts", True, id="field-off"),
        pytest.param(
            _raw(["Hogwart"], extensions={"match_whole_words": None}), "off to Hogwarts", False, id="st-null-is-default"
        ),
        pytest.param(_raw(["Mira"]), "ask mira", True, id="case-insensitive-by-default"),
        pytest.param(_raw(["Mira"], case_sensitive=True), "ask mira", False, id="case-sensitive-field"),
        pytest.param(
            _raw(["Mira"], extensions={"case_sensitive": True}), "ask mira", False, id="case-sensitive-extension"
        ),
        pytest.param(_raw(["Mira"], extensions={"case_sensitive": True}), "ask Mira", True, id="case-sensitive-hit"),
    ],
)
def test_per_entry_whole_word_and_case_options(tmp_path, entry, text, fires):
    assert _fires(_book(tmp_path, entry), text) is fires


@pytest.mark.parametrize(
    "key, text, hit",
    [
        pytest.param("แมว", "ฉันชอบแมวมาก", True, id="thai-inside-a-word"),
        pytest.param("ແມວ", "ຂ້ອຍມັກແມວຫຼາຍ", True, id="lao"),
        pytest.param("ឆ្មា", "ខ្ញុំចូលចិត្តឆ្មាណាស់", True, id="khmer"),
        pytest.param("ကြောင်", "ကျွန်တော်ကြောင်ကိုချစ်တယ်", True, id="myanmar"),
        pytest.param("ﾈｺ", "ｸﾛﾈｺｶﾞｲﾙ", True, id="half-width-katakana-inside-a-word"),
        pytest.param("ネコ", "ｸﾛﾈｺｶﾞｲﾙ", True, id="full-width-key-on-half-width-text"),
        pytest.param("고양이", "고양이가 좋아요", True, id="korean-key-with-particle"),
        pytest.param("cat", "我喜欢cat和狗", True, id="latin-key-between-han"),
        pytest.param("cat", "ｃａｔ", True, id="full-width-latin"),
        pytest.param("แมว", "ฉันชอบหมา", False, id="thai-absent"),
    ],
)
def test_scripts_without_word_spaces_match_as_substrings(key, text, hit):
    assert key_matches(key, text) is hit


NFD = unicodedata.normalize("NFD", "un café noir")


@pytest.mark.parametrize(
    "key, text, hit",
    [
        pytest.param("café", NFD, True, id="nfc-key-on-nfd-text"),
        pytest.param(unicodedata.normalize("NFD", "café"), "un café noir", True, id="nfd-key-on-nfc-text"),
        pytest.param("cafe", NFD, False, id="base-letter-never-split-from-its-accent"),
        pytest.param("cafe", "cafe\u0331 noir", False, id="mark-without-precomposed-form"),
        pytest.param("cafe", "un cafe noir", True, id="plain-word-still-fires"),
    ],
)
def test_keys_and_text_are_normalized_the_same_way(key, text, hit):
    assert key_matches(key, text) is hit


def test_cafe_does_not_fire_inside_nfd_cafe_even_without_whole_words():
    assert key_matches("cafe", NFD, match_whole_words=False) is False
    assert key_matches("Hogwart", "Hogwarts", match_whole_words=False) is True


# -- V3 decorators, placement at a depth, the card's token_budget ------------------------------
def test_decorators_are_parsed_and_never_reach_the_prompt(tmp_path):
    book = _book(
        tmp_path,
        _raw(["lamp"], "@@depth 2\n@@role user\n@@frobnicate 3\n\nThe lamp is old.", name="a"),
        _raw(["lens"], "@@frobnicate\n@@instruct_depth 4\nThe lens is new.", name="b"),
        _raw(["fog"], "@@position before_desc\nFog rolls in.", name="c"),
        _raw(["bell"], "@@risu_only_thing 4\n@@@depth 3\nThe bell rings.", name="d"),
        make=v3_card,
    )
    a, b, c, d = book.entries
    assert (a.placement, a.depth, a.role, a.content) == ("depth", 2, "user", "The lamp is old.")
    assert (b.placement, b.content) == ("after_char", "The lens is new.")
    assert (c.placement, c.content) == ("before_char", "Fog rolls in.")
    assert (d.placement, d.depth, d.content) == ("depth", 3, "The bell rings.")  # the fallback of an unknown one
    assert book.ignored_decorators == ("frobnicate", "instruct_depth", "risu_only_thing")
    items = retrieval_items(match_entries(book, "lamp lens fog bell"), [], char="C", user="U")
    assert all("@@" not in i.text for i in items) and len(items) == 4
    assert items[0].text.endswith("Fog rolls in.")  # placed before the character: first in the block


def test_each_ignored_decorator_is_logged_once_per_load(tmp_path):
    with capture_logs() as logs:
        _book(
            tmp_path,
            _raw(["a"], "@@frobnicate\nA"),
            _raw(["b"], "@@frobnicate 2\nB"),
            _raw(["c"], "@@is_user_icon x\nC"),
        )
    events = sorted((e["decorator"], e["entries"]) for e in logs if e["event"] == "lorebook.decorator_ignored")
    assert events == [("frobnicate", 2), ("is_user_icon", 1)]


@pytest.mark.parametrize(
    "content, text, fires",
    [
        pytest.param("@@activate\nX", "nothing related", True, id="activate-fires-in-any-case"),
        pytest.param("@@dont_activate\nX", "the lamp", False, id="dont-activate-never-fires"),
        pytest.param("@@dont_activate\n@@activate\nX", "nothing", True, id="activate-wins"),
        pytest.param("@@additional_keys oil,wick\nX", "the lamp", False, id="additional-keys-missing"),
        pytest.param("@@additional_keys oil,wick\nX", "the lamp wick", True, id="additional-keys-present"),
        pytest.param("@@exclude_keys broken\nX", "the broken lamp", False, id="exclude-keys"),
        pytest.param("@@exclude_keys broken\nX", "the lamp", True, id="exclude-keys-absent"),
    ],
)
def test_activation_decorators(tmp_path, content, text, fires):
    assert _fires(_book(tmp_path, _raw(["lamp"], content), make=v3_card), text) is fires


def test_an_entrys_own_scan_depth_wins(tmp_path):
    from runtime.context import Scan

    book = _book(
        tmp_path,
        _raw(["lamp"], "@@scan_depth 0\nNOW-ONLY"),
        _raw(["lamp"], "DEEP", extensions={"scan_depth": 3}),
        _raw(["lamp"], "BOOK"),
    )
    scan = Scan(current="hello", previous=["the lamp", "ok", "fine"], depth=1)
    assert [f.entry.content for f in match_entries(book, scan)] == ["DEEP"]


def _turns(*pairs):
    from memory.tables import Turn

    return [
        Turn(
            session_id="s",
            seq=i + 1,
            role=role,
            content=text,
            tokens=COUNTER.count_message({"role": role, "content": text}),
        )
        for i, (role, text) in enumerate(pairs)
    ]


def _assemble(persona, turns, budgets=None):
    from runtime.accounting import Budgets
    from runtime.context import ContextInputs, assemble_context

    budgets = budgets or Budgets.create(
        persona=1000, memory=200, retrieval=400, summary=200, recent=2000, reply_reserve=200
    )
    fired = match_entries(persona.character_book, scan_text(turns[-1].content, [t.content for t in turns[:-1]], 2))
    items = retrieval_items(fired, [], char=persona.char_name, user="U")
    return assemble_context(
        ContextInputs(session_id="s", persona=persona, summary=None, candidates=[], turns=turns, retrieval=items),
        budgets=budgets,
        window=budgets.total,
        counter=COUNTER,
    )


@pytest.mark.parametrize(
    "entry, at, role",
    [
        pytest.param(_raw(["lamp"], "@@depth 1\n@@role user\nDEPTH-LORE"), -2, "user", id="v3-depth-1"),
        pytest.param(_raw(["lamp"], "@@depth 0\nDEPTH-LORE"), -1, "system", id="v3-depth-0-after-newest"),
        pytest.param(
            _raw(["lamp"], "DEPTH-LORE", extensions={"position": 4, "depth": 2, "role": 2}),
            -3,
            "assistant",
            id="st-at-depth",
        ),
        pytest.param(_raw(["lamp"], "@@depth 50\nDEPTH-LORE"), 1, "system", id="deeper-than-the-chat-goes-first"),
    ],
)
def test_entries_at_a_depth_go_among_the_recent_turns_and_count_to_retrieval(tmp_path, entry, at, role):
    from persona import load_persona as load

    path = tmp_path / "c.json"
    path.write_text(
        json.dumps(v3_card(character_book={"extensions": {}, "entries": [entry]}, post_history_instructions="")),
        encoding="utf-8",
    )
    persona = load(path)
    turns = _turns(("user", "hello"), ("assistant", "hi"), ("user", "the lamp?"))
    context = _assemble(persona, turns)
    messages = context.messages
    index = next(i for i, m in enumerate(messages) if m["content"] == "DEPTH-LORE")
    assert index - len(messages) == at if at < 0 else index == at
    assert messages[index]["role"] == role
    assert sum(m["content"] == "DEPTH-LORE" for m in messages) == 1  # not in the block as well
    assert context.sources["retrieval"].tokens == COUNTER.count_message({"role": role, "content": "DEPTH-LORE"})
    assert context.sources["retrieval"].items == 1
    assert context.sources["recent"].tokens == sum(t.tokens for t in turns)
    assert context.total_tokens == COUNTER.count_messages(messages)
    assert context.lore_messages == [index]


def test_the_cards_token_budget_caps_its_entries_when_smaller_than_retrieval(tmp_path):
    entries = [_raw(["lamp"], f"ENTRY-{i} " + "word " * 30, insertion_order=i) for i in range(4)]
    turns = _turns(("user", "the lamp"))
    unlimited = _book(tmp_path, *entries)
    one_entry = COUNTER.count_text(retrieval_items(match_entries(unlimited, "lamp"), [], char="C", user="U")[0].text)
    budgeted = _book(tmp_path, *entries, token_budget=one_entry * 2 + 5)
    from persona import Persona

    wide = _assemble(Persona(name="A", character_book=unlimited), turns)
    tight = _assemble(Persona(name="A", character_book=budgeted), turns)
    assert wide.sources["retrieval"].items == 4 and wide.sources["retrieval"].cut is None
    assert tight.sources["retrieval"].items == 2
    assert tight.sources["retrieval"].cut == "4 matched, 2 left out"
    assert "ENTRY-0" in tight.source_text["retrieval"] and "ENTRY-2" not in tight.source_text["retrieval"]
    # a budget larger than the retrieval share changes nothing
    loose = _book(tmp_path, *entries, token_budget=10**6)
    assert _assemble(Persona(name="A", character_book=loose), turns).messages == wide.messages


def test_ignore_on_max_context_entries_are_left_out_first(tmp_path):
    book = _book(
        tmp_path,
        _raw(["a"], "@@ignore_on_max_context\nFIRST-OUT " + "x " * 40, insertion_order=1, priority=100),
        _raw(["a"], "STAYS " + "y " * 40, insertion_order=2),
    )
    items = retrieval_items(match_entries(book, "a"), [], char="C", user="U")
    block = fit_retrieval(items, cap=fit_retrieval(items, cap=10**6, counter=COUNTER).tokens - 30, counter=COUNTER)
    assert "STAYS" in block.text and "FIRST-OUT" not in block.text


def test_an_entry_at_a_depth_reaches_the_model_among_the_recent_turns(tmp_path, make_engine_for, store, fake_llm):
    card = v3_card(post_history_instructions="")
    card["data"]["character_book"]["entries"].append(
        _raw(["storm"], "@@depth 1\n@@role system\n@@unknown_thing\n[{{char}} fears storms.{{// author note}}]")
    )
    path = tmp_path / "aria.json"
    path.write_text(json.dumps(card, ensure_ascii=False), encoding="utf-8")
    engine = make_engine_for().derive(persona=load_persona(path))
    fake_llm.script.extend(["Calm.", "Yes."])
    engine.turn(user_id="u1", session_id="s1", message="hello")
    result = engine.turn(user_id="u1", session_id="s1", message="a storm is coming")
    sent = fake_llm.requests[-1]["messages"]
    assert sent[-2:] == [
        {"role": "system", "content": "[Aria fears storms.]"},
        {"role": "user", "content": "a storm is coming"},
    ]
    assert "@@" not in json.dumps(fake_llm.requests, ensure_ascii=False)
    assert result.context.sources["retrieval"].tokens >= engine.counter.count_message(sent[-2])

"""Loading personas from Character Card V2/V3 JSON and PNG and our TOML/YAML, and rendering
them within the persona budget."""

from __future__ import annotations

import base64
import json
from dataclasses import replace

import pytest

from errors import ConfigurationError, PersonaError
from persona import DEFAULT_PERSONA_FILE, Persona, apply_macros, load_persona
from runtime.accounting import counter_for
from runtime.context import render_persona
from tests.cards import encode, v2_card, v3_card, write_card_png

COUNTER = counter_for("gpt-4o-mini")


def _expect_aria(p: Persona, source: str) -> None:
    assert p.name == "Aria" and p.source == source
    assert p.description.startswith("{{char}} is a lighthouse keeper")
    assert p.personality == "calm, dry humour, notices weather"
    assert p.scenario == "{{user}} visits the lighthouse in autumn."
    assert p.first_message.startswith("Welcome, {{user}}.")
    assert p.example_dialogues == (
        "{{user}}: Is it cold up there?\n{{char}}: Colder than the tea.",
        "{{user}}: Do you sleep?\n{{char}}: Between ships.",
    )
    assert p.system_prompt == "You are {{char}}. Stay in character."
    assert p.post_history_instructions.startswith("POST-HISTORY")
    assert p.creator_notes.startswith("SECRET-CREATOR-NOTE")
    assert p.tags == ("lighthouse", "slice of life")
    book = p.character_book
    assert book is not None and book.name == "Island lore"
    lamp, tower = book.entries
    assert lamp.keys == ("lamp", "lens") and lamp.insertion_order == 10 and lamp.name == "lamp"
    assert tower.keys == ("灯塔",) and tower.secondary_keys == ("岛",) and tower.selective
    assert tower.selective_logic == "AND_ANY" and tower.priority == 3


@pytest.mark.parametrize(
    "make, spec", [pytest.param(v2_card, "chara_card_v2", id="v2"), pytest.param(v3_card, "chara_card_v3", id="v3")]
)
def test_card_json_round_trip(tmp_path, make, spec):
    path = tmp_path / "aria.json"
    path.write_text(json.dumps(make(), ensure_ascii=False), encoding="utf-8")
    _expect_aria(load_persona(path), spec)


@pytest.mark.parametrize(
    "chunks, spec",
    [
        pytest.param({"chara": encode(v2_card())}, "chara_card_v2", id="chara-v2"),
        pytest.param({"ccv3": encode(v3_card())}, "chara_card_v3", id="ccv3-v3"),
        pytest.param(
            {"chara": encode(v2_card(name="Old")), "ccv3": encode(v3_card())}, "chara_card_v3", id="both-ccv3-wins"
        ),
    ],
)
def test_card_png_round_trip(tmp_path, chunks, spec):
    path = write_card_png(tmp_path / "aria.png", chunks)
    _expect_aria(load_persona(path), spec)


def test_plain_toml_and_yaml_carry_the_same_fields(tmp_path):
    toml = tmp_path / "aria.toml"
    toml.write_text(
        'name = "Aria"\nsystem_prompt = "You are {{char}}."\ndescription = "A keeper."\n'
        'first_message = "Hello {{user}}"\nexample_dialogues = ["{{user}}: hi\\n{{char}}: hey"]\n'
        'creator_notes = "notes"\ntags = ["a"]\n'
        '[character_book]\nentries = [{keys = ["lamp"], content = "The lamp is old."}]\n',
        encoding="utf-8",
    )
    yaml_file = tmp_path / "aria.yaml"
    yaml_file.write_text(
        "name: Aria\nsystem_prompt: You are {{char}}.\ndescription: A keeper.\nfirst_message: Hello {{user}}\n"
        'example_dialogues: "<START>\\n{{user}}: hi\\n{{char}}: hey"\ncreator_notes: notes\ntags: [a]\n'
        "character_book:\n  entries:\n    - keys: [lamp]\n      content: The lamp is old.\n",
        encoding="utf-8",
    )
    a, b = load_persona(toml), load_persona(yaml_file)
    assert (a.source, b.source) == ("toml", "yaml")
    assert replace(a, source="x") == replace(b, source="x")
    assert a.example_dialogues == ("{{user}}: hi\n{{char}}: hey",)
    assert a.character_book.entries[0].keys == ("lamp",)


def test_bundled_default_persona_still_loads():
    p = load_persona(DEFAULT_PERSONA_FILE)
    assert p.name == "Mira" and p.system_prompt.startswith("You are Mira")


def _card_file(tmp_path, card) -> object:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(card), encoding="utf-8")
    return path


@pytest.mark.parametrize(
    "write, field",
    [
        pytest.param(lambda t: _card_file(t, {**v2_card(), "spec": "chara_card_v9"}), "spec", id="wrong-spec"),
        pytest.param(lambda t: _card_file(t, {"hello": "world"}), "spec", id="no-spec"),
        pytest.param(lambda t: _card_file(t, {"spec": "chara_card_v2", "data": "x"}), "data", id="data-not-object"),
        pytest.param(lambda t: _card_file(t, v2_card(name="")), "data.name", id="empty-name"),
        pytest.param(lambda t: _card_file(t, v2_card(name=None)), "data.name", id="missing-name"),
        pytest.param(
            lambda t: _card_file(t, v2_card(description=["x"])), "data.description", id="description-not-text"
        ),
        pytest.param(lambda t: _card_file(t, v2_card(tags={"a": 1})), "data.tags", id="tags-not-list"),
        pytest.param(
            lambda t: _card_file(t, v2_card(character_book={"entries": [{"keys": [], "content": "x"}]})),
            "data.character_book.entries[0].keys",
            id="entry-without-keys",
        ),
        pytest.param(
            lambda t: _card_file(t, v2_card(character_book={"entries": [{"keys": ["a"], "content": 3}]})),
            "data.character_book.entries[0].content",
            id="entry-content-not-text",
        ),
        pytest.param(lambda t: (t / "x.json").write_text("{not json") and t / "x.json", "json", id="broken-json"),
        pytest.param(
            lambda t: write_card_png(t / "x.png", {"chara": "!!!not base64!!!"}),
            "chara chunk base64",
            id="broken-base64",
        ),
        pytest.param(
            lambda t: write_card_png(t / "x.png", {"ccv3": "e25vdCBqc29u"}), "ccv3 chunk json", id="chunk-not-json"
        ),
        pytest.param(lambda t: write_card_png(t / "x.png", {"Comment": "hi"}), "chara", id="png-without-card"),
        pytest.param(
            lambda t: write_card_png(t / "x.png", {"chara": encode(v2_card(name=""))}),
            "data.name",
            id="png-card-no-name",
        ),
        pytest.param(
            lambda t: (t / "x.toml").write_text('name = "A"\n') and t / "x.toml", "system_prompt", id="toml-no-prompt"
        ),
    ],
)
def test_bad_card_error_names_the_field(tmp_path, write, field):
    path = write(tmp_path)
    with pytest.raises(PersonaError) as info:
        load_persona(path)
    assert info.value.field == field
    assert field in str(info.value) and str(path) in str(info.value)


def test_missing_file_and_unknown_kind_are_clear(tmp_path):
    with pytest.raises(PersonaError, match="does not exist"):
        load_persona(tmp_path / "nope.json")
    (tmp_path / "card.txt").write_text("name: x")
    with pytest.raises(PersonaError, match="unknown kind"):
        load_persona(tmp_path / "card.txt")


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("{{char}} greets {{user}}.", "Aria greets Ana.", id="plain"),
        pytest.param("{{Char}} and {{ USER }}", "Aria and Ana", id="case-and-spaces"),
        pytest.param("<BOT>: hi <USER>", "Aria: hi Ana", id="legacy"),
        pytest.param("{{getvar::mood}} stays", "{{getvar::mood}} stays", id="unknown-macros-untouched"),
        pytest.param("{{user}} costs $5 {{char}}", "Ana costs $5 Aria", id="dollar-sign"),
    ],
)
def test_macros_are_replaced(text, expected):
    assert apply_macros(text, char="Aria", user="Ana") == expected


def _aria() -> Persona:
    return Persona(
        name="Aria",
        system_prompt="You are {{char}}.",
        description="{{char}} keeps a lighthouse.",
        personality="calm",
        example_dialogues=tuple(f"{{{{user}}}}: question {i}?\n{{{{char}}}}: " + "answer " * 30 for i in range(4)),
        post_history_instructions="Reply as {{char}} to {{user}}.",
        creator_notes="SECRET-CREATOR-NOTE",
    )


def test_rendered_persona_replaces_macros_and_never_sends_creator_notes():
    rendered = render_persona(_aria(), cap=4000, counter=COUNTER, user_name="Ana")
    text = rendered.system["content"]
    assert "You are Aria." in text and "Aria keeps a lighthouse." in text and "Ana: question 0?" in text
    assert "{{" not in text and "SECRET-CREATOR-NOTE" not in text
    assert rendered.post_history == {"role": "system", "content": "Reply as Aria to Ana."}
    assert rendered.examples_kept == 4 and rendered.cut is None


def test_examples_are_cut_first_whole_with_a_notice():
    full = render_persona(_aria(), cap=4000, counter=COUNTER)
    one_example = COUNTER.count_text("answer " * 30) + 12
    cap = full.tokens - one_example  # room for everything but about one example
    rendered = render_persona(_aria(), cap=cap, counter=COUNTER)
    text = rendered.system["content"]
    assert rendered.tokens <= cap
    assert 0 < rendered.examples_kept < 4
    left = 4 - rendered.examples_kept
    assert f"[{left} example dialogues left out to fit the persona budget.]" in text
    for i in range(4):  # whole examples, in order: the kept ones are the first ones
        assert (f"question {i}?" in text) == (i < rendered.examples_kept)
    assert text.count("answer ") == 30 * rendered.examples_kept
    assert "You are Aria." in text and "Aria keeps a lighthouse." in text and "calm" in text  # never cut
    assert rendered.cut == f"{left} example dialogues left out"


def test_persona_whose_fixed_parts_exceed_the_cap_is_a_configuration_error():
    fixed_only = render_persona(replace(_aria(), example_dialogues=()), cap=4000, counter=COUNTER)
    with pytest.raises(ConfigurationError) as info:
        render_persona(_aria(), cap=fixed_only.tokens - 1, counter=COUNTER)
    assert info.value.setting == "COMPANION_BUDGET_PERSONA"


# -- macros in a card's own fields ----------------------------------------------------------
@pytest.mark.parametrize(
    "text, allowed",
    [
        pytest.param("{{random:red,green,blue}}", {"red", "green", "blue"}, id="random-legacy-commas"),
        pytest.param("{{random::red::green}}", {"red", "green"}, id="random-double-colon"),
        pytest.param("{{random: a\\, b , c}}", {"a, b", "c"}, id="random-escaped-comma"),
        pytest.param("{{ RANDOM :: x :: y }}", {"x", "y"}, id="random-case-and-spaces"),
        pytest.param("{{random::{{user}}::{{char}}}}", {"Ana", "Aria"}, id="random-nested"),
        pytest.param("{{pick::one::two}}", {"one", "two"}, id="pick"),
        pytest.param("{{roll:d6}}", {str(n) for n in range(1, 7)}, id="roll-d6"),
        pytest.param("{{roll:6}}", {str(n) for n in range(1, 7)}, id="roll-6"),
        pytest.param("{{roll::2d6+3}}", {str(n) for n in range(5, 16)}, id="roll-2d6-plus-3"),
        pytest.param("{{roll 1d4-1}}", {str(n) for n in range(0, 4)}, id="roll-space"),
    ],
)
def test_random_pick_and_roll_macros(text, allowed):
    seen = {apply_macros(text, char="Aria", user="Ana", session=f"s{i}") for i in range(40)}
    assert seen <= allowed and len(seen) > 1


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("Hi{{// the author's hidden note}} there", "Hi there", id="comment"),
        pytest.param("A{{//}}\nsecret\n{{///}}B", "AB", id="block-comment"),
        pytest.param("A{{comment: shown to users only}}B{{hidden_key: x}}C", "ABC", id="v3-comments"),
        pytest.param("line one\n\n{{trim}}\n\nline two", "line oneline two", id="trim"),
        pytest.param("a{{newline}}b{{newline::2}}c", "a\nb\n\nc", id="newline"),
        pytest.param("a{{space::3}}b{{noop}}", "a   b", id="space-noop"),
        pytest.param("{{reverse:abc}}", "cba", id="reverse"),
        pytest.param("{{original}}", "", id="original-outside-system-prompt-is-empty"),
        pytest.param("<CHAR> and <bot>", "Aria and Aria", id="legacy-char"),
        pytest.param("{{getvar::mood}} and {{time}}", "{{getvar::mood}} and {{time}}", id="unknown-left-as-is"),
        pytest.param("{{random::{{mystery}}}}", "{{mystery}}", id="unknown-inside-known"),
        pytest.param("\\{\\{user\\}\\}", "{{user}}", id="escaped-braces"),
        pytest.param("{{roll:d0}} {{random}}", "{{roll:d0}} {{random}}", id="bad-arguments-left-as-is"),
    ],
)
def test_text_macros(text, expected):
    assert apply_macros(text, char="Aria", user="Ana") == expected


def test_pick_is_stable_within_a_session_and_differs_across_sessions():
    text = "{{pick::a::b::c::d::e::f}} and {{pick::a::b::c::d::e::f}}"
    one = apply_macros(text, char="A", user="U", session="s1", field="system_prompt")
    assert all(apply_macros(text, char="A", user="U", session="s1", field="system_prompt") == one for _ in range(20))
    assert len({apply_macros(text, char="A", user="U", session=f"s{i}", field="system_prompt") for i in range(30)}) > 1


def test_original_is_the_default_framing_in_the_system_prompt_and_nothing_after_history():
    persona = replace(
        _aria(), system_prompt="{{original}} Never break character.", post_history_instructions="{{original}}Be brief."
    )
    rendered = render_persona(persona, cap=4000, counter=COUNTER, user_name="Ana")
    default = render_persona(replace(persona, system_prompt=""), cap=4000, counter=COUNTER, user_name="Ana")
    framing = default.system["content"].split("\n\n")[0]
    assert rendered.system["content"].startswith(framing + " Never break character.")
    assert rendered.post_history == {"role": "system", "content": "Be brief."}
    assert "{{" not in rendered.system["content"]


def test_card_field_macros_and_comments_never_reach_the_model():
    persona = replace(
        _aria(),
        system_prompt="You are {{char}}. {{// TODO: tune for model X}}Scenario: {{scenario}}",
        scenario="{{user}} visits {{char}}.{{// spoiler}}",
        description="{{char}} keeps a lighthouse.\n\n{{trim}}\n\nShe is {{random::calm::calm}}.",
        first_message="Hello {{user}}",
    )
    rendered = render_persona(persona, cap=4000, counter=COUNTER, user_name="Ana")
    text = rendered.system["content"]
    assert "You are Aria. Scenario: Ana visits Aria." in text
    assert "Aria keeps a lighthouse.She is calm." in text
    assert "TODO" not in text and "spoiler" not in text and "{{" not in text


def test_v3_nickname_replaces_char(tmp_path):
    path = tmp_path / "aria.json"
    card = v3_card()
    card["data"]["nickname"] = "Ari"
    path.write_text(json.dumps(card, ensure_ascii=False), encoding="utf-8")
    persona = load_persona(path)
    assert persona.name == "Aria" and persona.nickname == "Ari" and persona.char_name == "Ari"
    rendered = render_persona(persona, cap=4000, counter=COUNTER, user_name="Ana")
    text = rendered.system["content"]
    assert "You are Ari. Stay in character." in text and "Ari is a lighthouse keeper" in text
    assert "Aria" not in text
    assert rendered.post_history["content"] == "POST-HISTORY: reply in under 80 words as Ari."
    empty = replace(persona, nickname="")
    assert "You are Aria." in render_persona(empty, cap=4000, counter=COUNTER).system["content"]


def test_alternate_greetings_are_read_in_order(tmp_path):
    path = tmp_path / "aria.json"
    path.write_text(
        json.dumps(v2_card(alternate_greetings=["Storm night, {{user}}.", "Quiet morning."])), encoding="utf-8"
    )
    persona = load_persona(path)
    assert persona.greetings == (
        "Welcome, {{user}}. Mind the stairs; {{char}} just waxed them.",
        "Storm night, {{user}}.",
        "Quiet morning.",
    )
    path.write_text(json.dumps(v2_card(alternate_greetings={"x": "y"})), encoding="utf-8")
    with pytest.raises(PersonaError) as info:
        load_persona(path)
    assert info.value.field == "data.alternate_greetings"


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    "suffix, body",
    [
        pytest.param(".toml", 'name = "Mira"\nsystem_prompt = "You are Mira."\r\n', id="toml"),
        pytest.param(".yaml", "name: Mira\r\nsystem_prompt: You are Mira.\r\n", id="yaml"),
        pytest.param(".json", json.dumps(v2_card(name="Mira")), id="card-json"),
    ],
)
def test_persona_file_with_a_byte_order_mark_loads(tmp_path, suffix, body):
    path = tmp_path / f"mira{suffix}"
    path.write_bytes(BOM + body.encode("utf-8"))
    assert load_persona(path).name == "Mira"


def test_png_card_whose_json_starts_with_a_byte_order_mark_loads(tmp_path):
    chunk = base64.b64encode(BOM + json.dumps(v2_card(name="Mira")).encode("utf-8")).decode("ascii")
    path = write_card_png(tmp_path / "mira.png", {"chara": chunk})
    assert load_persona(path).name == "Mira"


# -- cards as tools write them: tolerant where the intent is clear, strict where it is not ---------
def _entry(**fields):
    return {"keys": ["lamp"], "content": "The lamp is old.", **fields}


@pytest.mark.parametrize(
    "fields, check",
    [
        pytest.param(
            {"alternate_greetings": "Storm night."},
            lambda p: p.greetings[1:] == ("Storm night.",),
            id="greetings-a-string",
        ),
        pytest.param({"tags": "cozy, fantasy"}, lambda p: p.tags == ("cozy", "fantasy"), id="tags-comma-separated"),
        pytest.param(
            {"alternate_greetings": None, "tags": None, "creator_notes": None, "mes_example": None},
            lambda p: p.greetings[1:] == () and p.tags == () and p.example_dialogues == (),
            id="nulls-for-optional-fields",
        ),
        pytest.param({"tags": ["cozy", 7, None]}, lambda p: p.tags == ("cozy", "7"), id="numbers-and-nulls-in-a-list"),
        pytest.param(
            {"character_book": {"scan_depth": "3", "token_budget": "500", "entries": [_entry(insertion_order="10")]}},
            lambda p: (
                (
                    p.character_book.scan_depth,
                    p.character_book.token_budget,
                    p.character_book.entries[0].insertion_order,
                )
                == (3, 500, 10)
            ),
            id="numbers-as-strings",
        ),
        pytest.param(
            {
                "character_book": {
                    "entries": {"10": _entry(content="ten"), "2": _entry(content="two"), "0": _entry(content="zero")}
                }
            },
            lambda p: [e.content for e in p.character_book.entries] == ["zero", "two", "ten"],
            id="entries-keyed-by-uid",
        ),
        pytest.param(
            {"character_book": {"entries": [_entry(enabled=None, secondary_keys=None, extensions=None)]}},
            lambda p: p.character_book.entries[0].enabled and p.character_book.entries[0].secondary_keys == (),
            id="nulls-in-an-entry",
        ),
    ],
)
def test_cards_as_tools_write_them_are_read_with_a_warning(tmp_path, fields, check):
    import structlog
    from structlog.testing import capture_logs

    path = tmp_path / "card.json"
    path.write_text(json.dumps(v2_card(**fields)), encoding="utf-8")
    structlog.reset_defaults()
    with capture_logs() as logs:
        persona = load_persona(path)
    assert check(persona)
    coerced = [e for e in logs if e["event"] == "persona.field_coerced"]
    nulls_only = all(v is None for v in fields.values()) or "enabled" in str(fields)
    assert bool(coerced) != nulls_only  # a null is a default (silent); every other tolerant reading is logged


@pytest.mark.parametrize(
    "fields, field",
    [
        pytest.param(
            {"character_book": {"entries": [_entry(insertion_order="soon")]}},
            "insertion_order",
            id="a-word-for-a-number",
        ),
        pytest.param({"character_book": {"scan_depth": "nan"}}, "scan_depth", id="not-a-finite-number"),
        pytest.param({"alternate_greetings": [["nested"]]}, "alternate_greetings", id="a-list-of-lists"),
        pytest.param({"character_book": {"entries": "lamp"}}, "entries", id="entries-a-string"),
    ],
)
def test_cards_whose_intent_is_not_clear_are_refused_naming_the_field(tmp_path, fields, field):
    path = tmp_path / "card.json"
    path.write_text(json.dumps(v2_card(**fields)), encoding="utf-8")
    with pytest.raises(PersonaError) as info:
        load_persona(path)
    assert field in (info.value.field or "")


WORLD_INFO = {
    "name": "Harbour lore",
    "entries": {
        "1": {
            "uid": 1,
            "key": ["lighthouse", "灯塔"],
            "keysecondary": ["storm"],
            "comment": "The lighthouse",
            "content": "The lighthouse was built in 1887.",
            "constant": False,
            "selective": True,
            "selectiveLogic": 0,
            "order": 50,
            "position": 4,
            "depth": 2,
            "role": 0,
            "disable": False,
            "scanDepth": None,
            "caseSensitive": None,
            "matchWholeWords": None,
        },
        "0": {"uid": 0, "key": [], "comment": "Always", "content": "It rains often.", "constant": True, "order": 10},
        "2": {"uid": 2, "key": "ferry", "content": "The ferry is late.", "disable": True, "order": "70"},
    },
}


def test_a_sillytavern_world_info_file_is_read_as_a_lorebook(tmp_path):
    from persona import load_world_info

    path = tmp_path / "harbour.json"
    path.write_text(json.dumps(WORLD_INFO, ensure_ascii=False), encoding="utf-8")
    book, raw = load_world_info(str(path))
    always, lighthouse, ferry = book.entries
    assert (always.constant, always.content, always.insertion_order) == (True, "It rains often.", 10)
    assert lighthouse.keys == ("lighthouse", "灯塔") and lighthouse.secondary_keys == ("storm",)
    assert (lighthouse.placement, lighthouse.depth, lighthouse.role, lighthouse.name) == (
        "depth",
        2,
        "system",
        "The lighthouse",
    )
    assert (ferry.enabled, ferry.keys, ferry.insertion_order) == (False, ("ferry",), 70)
    card = tmp_path / "card.json"
    card.write_text(json.dumps(v2_card(character_book=raw), ensure_ascii=False), encoding="utf-8")
    assert load_persona(card).character_book.entries == book.entries  # into a card, the same book


def test_lorebook_import_writes_a_character_book_and_refuses_what_is_not_world_info(tmp_path):
    import subprocess
    import sys

    path = tmp_path / "harbour.json"
    path.write_text(json.dumps(WORLD_INFO, ensure_ascii=False), encoding="utf-8")
    out = tmp_path / "book.json"
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "persona", "lorebook", "import", str(path), "--out", str(out)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "3 entries (1 constant), 3 keys" in done.stderr
    assert [e["content"] for e in json.loads(out.read_text())["entries"]][0] == "It rains often."
    path.write_text(json.dumps({"spec": "chara_card_v2"}), encoding="utf-8")
    refused = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "persona", "lorebook", "import", str(path)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert refused.returncode == 2 and "entries" in refused.stderr and "Traceback" not in refused.stderr

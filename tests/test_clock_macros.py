"""The clock macros of cards become the turn's time on the user's clock; in the persona they point
to a short clock note after the recent turns, so the persona's text (the prompt's first tokens)
stays the same from turn to turn."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from persona import MacroContext, expand, load_persona

SHANGHAI = timezone(timedelta(hours=8))
NOW = datetime(2023, 5, 20, 7, 30, 5, tzinfo=SHANGHAI)


@pytest.mark.parametrize(
    "text, value",
    [
        pytest.param("{{time}}", "7:30 AM", id="time"),
        pytest.param("{{date}}", "May 20, 2023", id="date"),
        pytest.param("{{weekday}}", "Saturday", id="weekday"),
        pytest.param("{{isodate}}", "2023-05-20", id="isodate"),
        pytest.param("{{isotime}}", "07:30", id="isotime"),
        pytest.param("{{datetimeformat YYYY/MM/DD HH:mm:ss}}", "2023/05/20 07:30:05", id="datetimeformat"),
        pytest.param(
            "{{datetimeformat dddd, MMMM Do [at] h:mm a Z}}", "Saturday, May 20th at 7:30 am +08:00", id="words"
        ),
        pytest.param("{{ TIME }}", "7:30 AM", id="any-case-and-spaces"),
        pytest.param("{{idle_duration}}", "2 hours", id="idle"),
    ],
)
def test_clock_macros_are_the_turns_time_on_the_users_clock(text, value):
    assert expand(text, MacroContext(char="Mira", user="Mei", now=NOW, idle=timedelta(hours=2, minutes=5))) == value


def test_without_a_clock_the_macros_are_left_as_written():
    text = "It is {{time}} on {{weekday}}; {{idle_duration}}."
    assert expand(text, MacroContext(char="Mira", user="Mei")) == text
    assert expand("{{idle_duration}}", MacroContext(char="Mira", user="Mei", now=NOW)) == "{{idle_duration}}"


def _card(tmp_path, **data):
    card = {
        "spec": "chara_card_v2",
        "spec_version": "2.0",
        "data": {
            "name": "Mira",
            "description": "A lighthouse keeper.",
            "system_prompt": "You are Mira. It is {{time}} on {{weekday}} for {{user}}.",
            "first_mes": "Good {{weekday}} to you!",
            "character_book": {"entries": [{"keys": ["lamp"], "content": "At {{isotime}} the lamp is lit."}]},
            **data,
        },
    }
    path = tmp_path / "mira.json"
    path.write_text(json.dumps(card), encoding="utf-8")
    return load_persona(path)


def test_the_persona_stays_the_same_and_the_clock_note_carries_the_time(tmp_path, store, embedder):
    from runtime.config import Settings
    from runtime.turn import Engine

    engine = Engine(
        settings=Settings(database_url="unused", context_window=4096),
        store=store,
        embedder=embedder,
        persona=_card(tmp_path),
    )
    first = engine.turn(user_id="mei", session_id="s", message="Hello", reply="Hi!", at=NOW)
    later = engine.turn(
        user_id="mei", session_id="s", message="Is the lamp lit?", reply="Yes.", at=NOW + timedelta(hours=3, minutes=2)
    )
    persona_first, persona_later = first.context.messages[0], later.context.messages[0]
    assert persona_first == persona_later  # the prompt's first message does not move with the clock
    assert "{{time}}" not in persona_first["content"] and "see the clock note" in persona_first["content"]
    note = later.context.messages[-1]["content"]  # after the recent turns, with the post-history message
    assert note.startswith(
        "[Clock] For User it is now 10:32 AM on Saturday, May 20, 2023 (2023-05-20 10:32, UTC+08:00)."
    )
    assert "Their last message was 3 hours ago." in note
    lore = [m["content"] for m in later.context.messages if "lamp is lit" in str(m.get("content"))]
    assert any("At 10:32 the lamp is lit." in text for text in lore)  # volatile text: in place


def test_a_greeting_reads_the_clock_in_the_users_zone(tmp_path, store, embedder):
    from runtime.config import Settings
    from runtime.turn import Engine

    engine = Engine(
        settings=Settings(database_url="unused", context_window=4096),
        store=store,
        embedder=embedder,
        persona=_card(tmp_path),
    )
    engine.set_profile(user_id="mei", time_zone="Asia/Shanghai")
    friday_utc = datetime(2023, 5, 19, 23, 30, tzinfo=UTC)  # Saturday 07:30 in Shanghai
    turn = engine.greet(user_id="mei", session_id="g", at=friday_utc)
    assert turn is not None and turn.content == "Good Saturday to you!"

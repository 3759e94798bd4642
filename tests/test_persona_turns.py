"""A character card in real turns: post-history instructions after the recent turns, the first
message, creator notes never sent, ``{{user}}`` from the pinned profile."""

from __future__ import annotations

import json

import pytest

from persona import load_persona
from tests.cards import v2_card, v3_card
from tests.conftest import estimate_as_we_do


def _engine(make_engine_for, tmp_path, card=None, **settings):
    path = tmp_path / "aria.json"
    path.write_text(json.dumps(card or v2_card(), ensure_ascii=False), encoding="utf-8")
    return make_engine_for(**settings).derive(persona=load_persona(path))


def test_post_history_instructions_come_after_the_recent_turns(make_engine_for, fake_llm, tmp_path):
    engine = _engine(make_engine_for, tmp_path)
    fake_llm.script.extend(["one", "two"])
    engine.turn(user_id="u1", session_id="s1", message="first")
    result = engine.turn(user_id="u1", session_id="s1", message="second")
    sent = fake_llm.requests[-1]["messages"]
    assert sent[-1] == {"role": "system", "content": "POST-HISTORY: reply in under 80 words as Aria."}
    assert sent[-2] == {"role": "user", "content": "second"}
    assert [m["content"] for m in sent if m["role"] != "system"] == ["first", "one", "second"]
    persona = result.context.sources["persona"]
    assert persona.tokens >= engine.counter.count_message(sent[0]) + engine.counter.count_message(sent[-1])
    assert result.context.total_tokens + result.context.reply_reserve <= result.context.window


def test_creator_notes_are_absent_from_every_prompt(make_engine_for, fake_llm, tmp_path):
    engine = _engine(make_engine_for, tmp_path, card=v3_card(), window=1024)
    engine.greet(user_id="u1", session_id="s1")
    for i in range(12):  # enough to compact: summary requests go to the same fake server
        fake_llm.script.append(f"reply {i} " + "words " * 20)
        engine.turn(user_id="u1", session_id="s1", message=f"message {i} about the lamp " + "more " * 20)
    assert engine.store.compaction.state("s1").compactions >= 1
    assert len(fake_llm.requests) == 12
    for request in fake_llm.requests:
        assert "SECRET-CREATOR-NOTE" not in json.dumps(request, ensure_ascii=False)


def test_first_message_opens_a_new_session_once_with_macros(make_engine_for, store, fake_llm, tmp_path):
    engine = _engine(make_engine_for, tmp_path)
    engine.set_profile(user_id="u1", name="Ana")
    greeting = engine.greet(user_id="u1", session_id="s1")
    assert greeting is not None and greeting.role == "assistant"
    assert greeting.content == "Welcome, Ana. Mind the stairs; Aria just waxed them."
    assert engine.greet(user_id="u1", session_id="s1") is None  # not twice
    fake_llm.script.append("Thanks!")
    engine.turn(user_id="u1", session_id="s1", message="Hello!")
    assert [(t.role, t.content) for t in store.turns.of_session("s1")][:2] == [
        ("assistant", greeting.content),
        ("user", "Hello!"),
    ]
    sent = fake_llm.requests[-1]["messages"]
    assert "You are Aria. Stay in character." in sent[0]["content"]
    assert "Ana visits the lighthouse in autumn." in sent[0]["content"]  # {{user}} from the pinned profile
    assert "Ana: Is it cold up there?" in sent[0]["content"]


def test_an_alternate_greeting_opens_the_session_when_chosen(make_engine_for, store, tmp_path):
    from errors import InvalidRequestError

    card = v3_card(alternate_greetings=["A storm, {{user}}. {{char}} lit the lamp.{{// secret}}", "Quiet."])
    card["data"]["nickname"] = "Ari"
    engine = _engine(make_engine_for, tmp_path, card=card)
    engine.set_profile(user_id="u1", name="Ana")
    with pytest.raises(InvalidRequestError) as info:
        engine.greet(user_id="u1", session_id="s1", greeting=3)
    assert info.value.field == "greeting" and store.turns.of_session("s1") == []
    greeting = engine.greet(user_id="u1", session_id="s1", greeting=1)
    assert greeting is not None and greeting.content == "A storm, Ana. Ari lit the lamp."


def test_a_persona_without_first_message_greets_nothing(make_engine_for, store, tmp_path):
    engine = _engine(make_engine_for, tmp_path, card=v2_card(first_mes=""))
    assert engine.greet(user_id="u1", session_id="s1") is None
    assert store.turns.of_session("s1") == []


def test_persona_show_prints_the_rendered_persona_with_tokens(tmp_path):
    from runtime.cli import main

    path = tmp_path / "aria.json"
    path.write_text(json.dumps(v2_card(), ensure_ascii=False), encoding="utf-8")
    import contextlib
    import io

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        assert main(["persona", "show", str(path), "--user", "Ana"]) == 0
    text = out.getvalue()
    assert "Aria is a lighthouse keeper on a northern island who talks with Ana." in text
    assert "SECRET-CREATOR-NOTE" not in text
    assert "example dialogues: 2 of 2 shown" in text and "persona tokens" in text


def test_chat_with_a_png_card_opens_with_its_first_message(db_url, fake_llm, tmp_path):
    import os
    import subprocess
    import sys

    from tests.cards import encode, write_card_png

    card = write_card_png(tmp_path / "aria.png", {"chara": encode(v2_card())})
    env = {
        **os.environ,
        "COMPANION_MODEL": "openai/fake",
        "COMPANION_API_BASE": fake_llm.api_base,
        "OPENAI_API_KEY": "sk-test",
        "DATABASE_URL": db_url,
        "COMPANION_CONTEXT_WINDOW": "4096",
        "COMPANION_PERSONA": str(card),
    }
    fake_llm.script.append("The lamp is old.")
    result = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "chat", "--user", "ana", "--session", "c1"],
        input="What about the lamp?\n/quit\n",
        env=env,
        capture_output=True,
        text=True,
        timeout=240,
    )
    assert result.returncode == 0, result.stderr
    assert "Aria> Welcome, User. Mind the stairs; Aria just waxed them." in result.stdout
    assert "Aria> The lamp is old." in result.stdout
    sent = fake_llm.requests[-1]["messages"]
    # the lorebook fired: the entry goes under the newest user message (the cache layout)
    assert sent[-2]["role"] == "user" and "Fresnel lens" in sent[-2]["content"]
    assert sent[-1]["content"].startswith("POST-HISTORY")


def test_the_provider_baseline_still_applies_with_post_history_instructions(make_engine_for, fake_llm, tmp_path):
    engine = _engine(make_engine_for, tmp_path)
    fake_llm.prompt_tokens = lambda body: estimate_as_we_do(body) // 2  # the provider counts less than we estimate
    try:
        fake_llm.script.extend(["one", "two"])
        engine.turn(user_id="u1", session_id="s1", message="first " * 200)
        engine.turn(user_id="u1", session_id="s1", message="second " * 200)
    finally:
        fake_llm.prompt_tokens = estimate_as_we_do
    context = engine.assemble(user_id="u1", session_id="s1", pending="third")
    assert context.calibration < 1.0
    assert context.baseline_tokens is not None  # the post-history message is not part of the fingerprint
    assert context.messages[-1]["content"].startswith("POST-HISTORY")

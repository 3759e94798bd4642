"""Pinned user profiles: set explicitly, rendered first in memory, learned from summaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import datetime, timedelta, timezone

import pytest

from memory.tables import UserProfile
from runtime.budgets import Budgets
from runtime.profile import render_profile
from runtime.summarizer import LiteLLMSummarizer, self_disclosures
from runtime.tokens import counter_for

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=timezone.utc)
COUNTER = counter_for("gpt-4o-mini")


def test_profile_is_rendered_first_in_memory(make_engine_for, store):
    engine = make_engine_for()
    engine.set_profile(user_id="u1", name="Ana", pronouns="she/her", facts=["Lives in Lisbon.", "Has a cat named Tom."])
    engine.turn(user_id="u1", session_id="s1", message="hi", reply="hello")
    context = engine.assemble(user_id="u1", session_id="s1", pending="what do you know about me?")
    memory = context.source_text["memory"]
    assert memory.startswith('<profile about="the user"')
    assert "Name: Ana" in memory and "Pronouns: she/her" in memory and "- Has a cat named Tom." in memory
    assert context.sources["memory"].items == 1 and context.sources["memory"].tokens >= COUNTER.count_text(memory)


def test_profile_over_the_memory_cap_cuts_learned_facts_first_with_a_notice():
    profile = UserProfile(user_id="u", name="Ana", facts=["User fact one."], learned=[f"Learned fact {i} " + "x " * 20 for i in range(10)])
    full = render_profile(profile, cap=10_000, counter=COUNTER)
    block = render_profile(profile, cap=full.tokens // 2, counter=COUNTER)
    assert block.tokens <= full.tokens // 2
    assert "Name: Ana" in block.text and "User fact one." in block.text
    assert "Learned fact 0 " not in block.text and "Learned fact 9 " in block.text  # oldest learned go first
    assert "facts left out to fit the memory budget." in block.text and block.cut


def test_profile_is_learned_from_the_summary_and_user_facts_survive(make_engine_for, store, fake_llm):
    summarizer = LiteLLMSummarizer(model="openai/fake-summary", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = make_engine_for(window=1024, summarizer=summarizer)
    engine.set_profile(user_id="u1", name="Ana", facts=["Prefers tea."])
    fake_llm.responder = lambda body: json.dumps(
        {"profile": ["The user works as a nurse.", "Prefers tea"], "relationship": [], "preferences": [], "open_threads": [], "quotes": []}
    )
    for i in range(12):
        engine.turn(
            user_id="u1", session_id="s1", message=f"message {i} " + "words " * 30, reply="ok " * 20, at=T0 + timedelta(minutes=i)
        )
    assert store.compaction_state("s1").compactions >= 1
    profile = engine.profiles.get("u1")
    assert profile.facts == ["Prefers tea."]  # user-set, untouched
    assert profile.learned == ["The user works as a nurse."]  # merged once, duplicate of a user fact skipped
    context = engine.assemble(user_id="u1", session_id="s1", pending="hi")
    assert "- The user works as a nurse." in context.source_text["memory"]


@pytest.mark.parametrize(
    "text, expected",
    [
        pytest.param("Hi! My name is Ana Lima. How are you?", ["My name is Ana Lima."], id="name"),
        pytest.param("I work as a nurse in Braga, mostly nights", ["I work as a nurse in Braga, mostly nights"], id="work-no-period"),
        pytest.param("I'm tired. I'm from Porto!", ["I'm from Porto!"], id="origin-not-mood"),
        pytest.param("我叫小林。今天好累。我在医院工作。", ["我叫小林。", "我在医院工作。"], id="chinese"),
        pytest.param("我是说，你懂吗？", [], id="chinese-i-mean"),
        pytest.param("What a lovely day. Tell me a story.", [], id="nothing"),
    ],
)
def test_self_disclosures_are_exact_sentences_of_the_user(text, expected):
    found = self_disclosures(text)
    assert found == expected
    assert all(sentence in text for sentence in found)


def test_the_extractive_summary_teaches_the_profile_in_the_users_own_words(make_engine_for, store):
    engine = make_engine_for(budgets=Budgets.create(recent=300, summary=600))  # the default, model-free summarizer
    engine.set_profile(user_id="u2", facts=["Prefers tea."])
    lines = ["My name is Bruno and I live in Coimbra.", "I have a dog called Pixel.", "我在医院工作。"]
    lines += [f"Small talk {i}: " + "words " * 30 for i in range(10)]
    for i, line in enumerate(lines):
        engine.turn(user_id="u2", session_id="s2", message=line, reply="ok " * 20, at=T0 + timedelta(minutes=i))
    assert store.compaction_state("s2").compactions >= 1
    summary = store.summary("s2")
    notes = [i["text"] for i in summary.items if i["role"] == "note" and i["section"] == "profile"]
    assert notes == lines[:3]
    assert "Who the user is:" in summary.content
    profile = engine.profiles.get("u2")
    assert profile.facts == ["Prefers tea."]
    assert profile.learned == [f'The user said: "{line}"' for line in lines[:3]]
    context = engine.assemble(user_id="u2", session_id="s2", pending="what do you know about me?")
    assert '- The user said: "I have a dog called Pixel."' in context.source_text["memory"]


def test_profile_commands(db_url):
    env = {**os.environ, "DATABASE_URL": db_url}
    run = lambda *a: subprocess.run([sys.executable, "-m", "runtime.cli", *a], env=env, capture_output=True, text=True, timeout=120)  # noqa: E731
    result = run("profile", "set", "ana", "--name", "Ana", "--pronouns", "she/her", "--fact", "Lives in Lisbon.")
    assert result.returncode == 0, result.stderr
    result = run("profile", "show", "ana")
    assert "name Ana; pronouns she/her" in result.stdout and "fact: Lives in Lisbon." in result.stdout

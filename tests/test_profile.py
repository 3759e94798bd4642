"""Pinned user profiles: set explicitly, rendered first in memory, learned from summaries."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from datetime import UTC, datetime, timedelta

from runtime.accounting import counter_for
from runtime.compaction import LiteLLMSummarizer
from runtime.context import PinnedProfile, render_profile

T0 = datetime(2026, 3, 1, 9, 0, tzinfo=UTC)
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
    profile = PinnedProfile(
        name="Ana", facts=("User fact one.",), learned=tuple(f"Learned fact {i} " + "x " * 20 for i in range(10))
    )
    full = render_profile(profile, cap=10_000, counter=COUNTER)
    block = render_profile(profile, cap=full.tokens // 2, counter=COUNTER)
    assert block.tokens <= full.tokens // 2
    assert "Name: Ana" in block.text and "User fact one." in block.text
    assert "Learned fact 0 " not in block.text and "Learned fact 9 " in block.text  # oldest learned go first
    assert "facts left out to fit the memory budget." in block.text and block.cut


def test_profile_is_learned_from_the_summary_and_user_facts_survive(make_engine_for, store, fake_llm):
    summarizer = LiteLLMSummarizer(
        model="openai/fake-summary", api_base=fake_llm.api_base, api_key="sk-test", timeout=10
    )
    engine = make_engine_for(window=1024, summarizer=summarizer)
    engine.set_profile(user_id="u1", name="Ana", facts=["Prefers tea."])
    fake_llm.responder = lambda body: json.dumps(
        {
            "profile": ["The user works as a nurse.", "Prefers tea"],
            "relationship": [],
            "preferences": [],
            "open_threads": [],
            "quotes": [],
        }
    )
    for i in range(12):
        engine.turn(
            user_id="u1",
            session_id="s1",
            message=f"message {i} " + "words " * 30,
            reply="ok " * 20,
            at=T0 + timedelta(minutes=i),
        )
    assert store.compaction.state("s1").compactions >= 1
    profile = engine.profiles.get("u1")
    assert profile.facts == ["Prefers tea."]  # user-set, untouched
    # merged once, duplicate of a user fact skipped; learned by the session's character
    assert engine.profiles.learned("u1", character_id=engine.cast.default.id) == ["The user works as a nurse."]
    assert engine.profiles.learned("u1", character_id=store.characters.placeholder("Other").id) == []
    context = engine.assemble(user_id="u1", session_id="s1", pending="hi")
    assert "- The user works as a nurse." in context.source_text["memory"]


def test_profile_commands(db_url):
    env = {**os.environ, "DATABASE_URL": db_url}

    def run(*a):
        return subprocess.run(
            [sys.executable, "-m", "runtime.cli", *a], env=env, capture_output=True, text=True, timeout=120
        )

    result = run("profile", "set", "ana", "--name", "Ana", "--pronouns", "she/her", "--fact", "Lives in Lisbon.")
    assert result.returncode == 0, result.stderr
    result = run("profile", "show", "ana")
    assert "name Ana; pronouns she/her" in result.stdout and "fact: Lives in Lisbon." in result.stdout

"""GET /v1/sessions/{id}/context shows why each recalled segment came back (vector, full
text, neighbour) with its score, the lorebook entries with the key that fired them, and
the cut notices the prompt carries; GET /turns names the files each turn carries.

A real uvicorn server on loopback over a fresh database, an engine with a lorebook
persona and a small window so that turns roll out into the archive."""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import httpx
import pytest

from memory.apps import Directory
from persona import LoreEntry, Lorebook, Persona
from prompts import render, template
from runtime.service.api.context_view import NOTICE_SOURCES, find_notices
from runtime.config import Settings
from runtime.context import AssembledContext
from runtime.turn import Engine
from runtime.llm import LiteLLMReplier
from tests.conftest import serve

WINDOW = 1024

LORE = Persona(
    name="Mira",
    system_prompt="You are Mira, a kind companion.",
    character_book=Lorebook(
        entries=(
            LoreEntry(name="The old lighthouse", keys=("beacon", "lighthouse"), content="The lighthouse on the cape is closed."),
            LoreEntry(name="Never fires", keys=("submarine",), content="Unused."),
        )
    ),
)

TOPICS = [
    "my sister Ines moved to Lisbon for her new job at the aquarium",
    "I adopted a grey cat called Pistachio from the shelter last spring",
    "work has been busy, we are shipping the new billing system soon",
    "I started learning the cello, the teacher is very patient with me",
    "we went hiking near the waterfall and it rained the whole afternoon",
    "I tried baking sourdough bread but the crust came out far too hard",
    "my neighbour plays loud jazz every night until two in the morning",
    "I finally finished reading that long novel about the polar expedition",
]


@pytest.fixture
def lore_server(db_url, embedder, fake_llm, tmp_path):
    """``(base_url, key, engine)`` of a server whose engine has the lorebook persona and a 1,024-token window."""
    from memory.database import make_engine
    from memory.store import Store
    from runtime.files import open_file_services

    settings = Settings(context_window=WINDOW, database_url=db_url, files_dir=tmp_path / "files")
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    store = Store(make_engine(db_url))
    services = open_file_services(settings, store.engine)
    engine = Engine(settings=settings, store=store, embedder=embedder, persona=LORE, replier=replier, file_services=services)
    _, key = Directory(store.engine).create_app("playground-test")
    with serve(engine) as base:
        yield base, key, engine
    services.close()
    store.engine.dispose()


def test_context_says_why_each_segment_was_recalled_and_which_key_fired_each_lore_entry(lore_server):
    base, key, engine = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        directory = Directory(engine.store.engine)
        _, user = directory.session(directory.app_for_key(key).id, session["id"])
        at = datetime(2024, 5, 1, tzinfo=timezone.utc)
        for i in range(3):  # enough turns that the oldest roll out into the archive
            for j, topic in enumerate(TOPICS):
                at += timedelta(minutes=5)
                engine.turn(user_id=user.id, session_id=session["id"], message=f"Day {i}: {topic}.", at=at,
                            reply=f"That sounds like a lot, tell me more about it ({i}.{j}).")
        engine.turn(user_id=user.id, session_id=session["id"], message="Remember Pistachio? We walked to the lighthouse.",
                    at=at + timedelta(minutes=5), reply="I do!")
        context = http.get(f"/v1/sessions/{session['id']}/context").json()

    assert engine.store.archive_count(user_id=user.id) > 0
    recalled = context["recalled"]
    assert recalled, context["sources"]["memory"]
    assert context["sources"]["memory"]["items"] == len(recalled)
    reasons = {r for seg in recalled for r in seg["reasons"]}
    assert {"vector", "full_text"} <= reasons
    pistachio = [s for s in recalled if "Pistachio" in s["content"] and "neighbour" not in s["reasons"]]
    assert pistachio and all("full_text" in s["reasons"] and s["score"] > 0 and s["text_rank"] for s in pistachio)
    for seg in recalled:
        assert seg["session_date"].startswith("2024-05-01")
        assert (seg["neighbour_of"] is not None) == (seg["reasons"] == ["neighbour"])
        assert seg["content"] in context["sources"]["memory"]["text"]

    assert [(r["kind"], r["label"], r["key"]) for r in context["retrieved"]] == [("lore", "The old lighthouse", "lighthouse")]
    assert context["retrieved"][0]["text"] in context["sources"]["retrieval"]["text"]

    summary_notices = [n for n in context["notices"] if n["source"] == "summary"]
    assert summary_notices and "older lines are archived and may be recalled" in summary_notices[0]["text"]
    assert summary_notices[0]["text"] in context["sources"]["summary"]["text"]
    assert context["overhead_tokens"] >= 0


def test_turns_name_the_files_they_carry(lore_server):
    base, key, engine = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        uploaded = http.post("/v1/users/ana/files", files={"file": ("notes.txt", b"Tide tables for May.", "text/plain")}).json()
        done = http.post(f"/v1/sessions/{session['id']}/messages",
                         json={"content": "Here are my notes.", "attachments": [uploaded["id"]], "stream": False})
        assert done.status_code == 200, done.text
        turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
        context = http.get(f"/v1/sessions/{session['id']}/context").json()
    assert [(t["role"], t["attachments"]) for t in turns] == [("user", [uploaded["id"]]), ("assistant", [])]
    assert context["attached_files"] == [uploaded["id"]]


@pytest.mark.parametrize("name", sorted(NOTICE_SOURCES))
def test_every_cut_notice_template_is_found_in_its_source_text(name):
    values = {key: "3" for key in template(name).get_identifiers()}
    notice = render(name, **values).strip()
    source = NOTICE_SOURCES[name]
    context = AssembledContext(
        session_id="s", messages=[], sources={}, total_tokens=0, window=1024, reply_reserve=0,
        source_text={source: f"some text\n{notice}\nmore [text in brackets]", "other": notice},
    )
    assert [(n.source, n.text) for n in find_notices(context)] == [(source, notice)]

"""GET /v1/sessions/{id}/context shows why each recalled segment came back (vector, full
text, neighbour) with its score, the lorebook entries with the key that fired them, and
the cut notices the prompt carries; GET /turns names the files each turn carries.

A real uvicorn server on loopback over a fresh database, an engine with a lorebook
persona and a small window so that turns roll out into the archive."""

from __future__ import annotations

from datetime import UTC, datetime

import httpx
import pytest

from prompts import render, template
from runtime.context import AssembledContext, RecalledItem
from runtime.service.api.context_view import NOTICE_SOURCES, find_notices
from tests.playground_env import fill_archive, lore_server  # noqa: F401  (a fixture)

pytestmark = pytest.mark.usefixtures("steady_fake_llm")  # reported usage steady, whatever ran before


def test_context_says_why_each_segment_was_recalled_and_which_key_fired_each_lore_entry(lore_server):
    base, key, engine = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        user = fill_archive(engine, key, session["id"])
        context = http.get(f"/v1/sessions/{session['id']}/context").json()

    assert engine.store.archive.count(user_id=user.id) > 0
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
    for seg in context["withheld"]:  # selected, not shown: the kept recall block stayed
        assert seg["content"] not in context["sources"]["memory"]["text"]

    assert [(r["kind"], r["label"], r["key"]) for r in context["retrieved"]] == [
        ("lore", "The old lighthouse", "lighthouse")
    ]
    assert context["retrieved"][0]["text"] in context["sources"]["retrieval"]["text"]

    summary_notices = [n for n in context["notices"] if n["source"] == "summary"]
    assert summary_notices and "older lines are archived and may be recalled" in summary_notices[0]["text"]
    assert summary_notices[0]["text"] in context["sources"]["summary"]["text"]
    assert context["overhead_tokens"] >= 0


def test_turns_name_the_files_they_carry(lore_server):
    base, key, _ = lore_server
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        uploaded = http.post(
            "/v1/users/ana/files", files={"file": ("notes.txt", b"Tide tables for May.", "text/plain")}
        ).json()
        done = http.post(
            f"/v1/sessions/{session['id']}/messages",
            json={"content": "Here are my notes.", "attachments": [uploaded["id"]], "stream": False},
        )
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
        session_id="s",
        messages=[],
        sources={},
        total_tokens=0,
        window=1024,
        reply_reserve=0,
        source_text={source: f"some text\n{notice}\nmore [text in brackets]", "other": notice},
    )
    assert [(n.source, n.text) for n in find_notices(context)] == [(source, notice)]


def _recalled(i: int, tokens: int, content: str = "User: the harbour") -> RecalledItem:
    return RecalledItem(
        id=i,
        session_id="s",
        first_seq=i,
        last_seq=i + 1,
        content=content,
        tokens=tokens,
        session_date=datetime(2026, 1, 1, tzinfo=UTC),
        score=0.5,
        vector_rank=i,
    )


def test_the_context_lists_what_recall_selected_and_the_prompt_does_not_show():
    from runtime.service.api.context_view import context_out

    item = _recalled(7, 5)
    context = AssembledContext(
        session_id="s",
        messages=[],
        sources={},
        total_tokens=0,
        window=1024,
        reply_reserve=100,
        layout="cache",
        recall_withheld=[item],
    )
    out = context_out(context)
    assert [s.id for s in out.withheld] == [7] and out.withheld[0].reasons == ["vector"] and not out.recalled


def test_inspect_says_how_much_of_recalls_selection_the_prompt_does_not_show():
    from rich.console import Console

    from runtime.cli._chat import context_table

    def item(i: int, tokens: int) -> RecalledItem:
        return _recalled(i, tokens, content=f"User: line {i}")

    def shown(**fields) -> str:
        context = AssembledContext(
            session_id="s", messages=[], sources={}, total_tokens=0, window=1024, reply_reserve=100, **fields
        )
        console = Console(width=400, record=True)
        console.print(context_table(context))
        return " ".join(console.export_text().split())

    text = shown(layout="cache", recalled=[item(1, 9)], recall_withheld=[item(2, 5), item(3, 7)])
    assert "memory does not show 2 of the 3 segments recall selected (12 stored tokens)" in text
    assert "does not show" not in shown(layout="cache", recalled=[item(1, 9)])

"""The ``file_read`` tool loop through litellm against the loopback server: structured
calls run (whole and streamed), results go back as tool messages and are never stored,
rounds are bounded, tool results are capped, and text that only looks like a call is
neither executed nor cached."""

from __future__ import annotations

import json

import pytest

from runtime.context import is_placeholder
from tests import file_fixtures as ff
from tests.attachment_env import all_text, files_env  # noqa: F401  (fixture)
from tests.fake_llm import ToolCalls


def _answer_from_tool(body):
    """A reply that quotes the first words of the last tool result."""
    result = next(m["content"] for m in reversed(body["messages"]) if m["role"] == "tool")
    return "From the file: " + " ".join(result.split()[:12])


@pytest.mark.parametrize("stream", [pytest.param(False, id="whole"), pytest.param(True, id="streamed")])
def test_structured_file_read_call_runs_and_its_result_is_not_stored(files_env, fake_llm, store, stream):
    engine = files_env.build()
    pdf = files_env.upload("u1", "book.pdf", ff.book_pdf())
    fake_llm.script.extend([ToolCalls([("file_read", {"file_id": pdf, "max_pages": 2})]), _answer_from_tool])
    pieces: list[str] = []
    result = engine.turn(
        user_id="u1",
        session_id="s1",
        message="What happens first?",
        attachments=[pdf],
        on_delta=pieces.append if stream else None,
    )
    assert len(fake_llm.requests) == 2
    first, follow = fake_llm.requests
    assert [t["function"]["name"] for t in first["tools"]] == ["file_read"] and first["tool_choice"] == "auto"
    call_msg, tool_msg = follow["messages"][-2:]
    assert call_msg["role"] == "assistant" and call_msg["tool_calls"][0]["function"]["name"] == "file_read"
    assert json.loads(call_msg["tool_calls"][0]["function"]["arguments"]) == {"file_id": pdf, "max_pages": 2}
    assert tool_msg["role"] == "tool" and tool_msg["tool_call_id"] == call_msg["tool_calls"][0]["id"]
    assert "This is body page 3" in tool_msg["content"]  # front matter skipped, body returned
    assert "This is body page 5" not in tool_msg["content"]  # a window of two pages
    reply = result.assistant_turn.content
    assert reply.startswith("From the file:")
    if stream:
        assert "".join(pieces) == reply
    # only the final text is stored: no tool call, no file text in any turn
    stored = "\n".join(t.content for t in store.turns.of_session("s1"))
    assert "This is body page 3" not in stored.replace(reply, "")
    assert [t.role for t in store.turns.of_session("s1")] == ["user", "assistant"]


def test_no_tool_is_offered_without_files_in_the_context(files_env, fake_llm):
    engine = files_env.build()
    engine.turn(user_id="u1", session_id="s1", message="just chatting")
    assert "tools" not in fake_llm.requests[0]


def test_unknown_or_foreign_id_in_a_call_becomes_a_tool_result_and_the_reply_completes(files_env, fake_llm):
    engine = files_env.build()
    mine = files_env.upload("u1", "list.md", ff.markdown_bytes())
    theirs = files_env.upload("u2", "secret.md", b"# secret plans\n")
    fake_llm.script.extend(
        [
            ToolCalls([("file_read", {"file_id": theirs}), ("file_read", {"file_id": "file_ffffffffffffffffffff"})]),
            "Sorry, I could not open those.",
        ]
    )
    result = engine.turn(user_id="u1", session_id="s1", message="read", attachments=[mine])
    results = [m["content"] for m in fake_llm.requests[1]["messages"] if m["role"] == "tool"]
    assert len(results) == 2
    assert all("No file" in r for r in results)
    assert "secret plans" not in all_text(fake_llm.requests[1]["messages"])
    assert result.assistant_turn.content == "Sorry, I could not open those."


def test_tool_rounds_are_bounded_and_the_last_request_forbids_calls(files_env, fake_llm):
    engine = files_env.build(tool_rounds=2)
    md = files_env.upload("u1", "list.md", ff.markdown_bytes())
    fake_llm.script.extend([ToolCalls([("file_read", {"file_id": md})])] * 2)
    fake_llm.responder = lambda body: "done reading"
    result = engine.turn(user_id="u1", session_id="s1", message="read it again and again", attachments=[md])
    choices = [r["tool_choice"] for r in fake_llm.requests]
    assert choices == ["auto", "auto", "none"]
    assert result.assistant_turn.content == "done reading"
    assert len(fake_llm.requests) == 3


def test_tool_result_is_capped_to_fit_the_window(files_env, fake_llm):
    engine = files_env.build(context_window=2048, file_read_chars=20000)
    pdf = files_env.upload("u1", "long.pdf", ff.long_pdf(pages=24))
    fake_llm.script.extend([ToolCalls([("file_read", {"file_id": pdf, "max_pages": 8})]), "ok"])
    engine.turn(user_id="u1", session_id="s1", message="summarise", attachments=[pdf])
    follow = fake_llm.requests[1]
    tool_msg = follow["messages"][-1]
    assert "Tool result cut to fit its budget" in tool_msg["content"]
    total = engine.counter.count_messages(follow["messages"])
    assert total + engine.budgets.reply_reserve <= 2048


def test_pseudo_tool_call_text_in_a_reply_is_neither_executed_nor_cached(files_env, fake_llm, store):
    engine = files_env.build()
    pdf = files_env.upload("u1", "book.pdf", ff.book_pdf())
    extract_before = files_env.files.extract(pdf)
    fake = (
        f'[file_read(file_id="{pdf}", start_page=1)]\n'
        "Page 1: THE CAPTAIN WAS SECRETLY A CAT.\n"
        f"[[file_read file_id={pdf} | page=1]]"
    )
    fake_llm.script.extend([fake, "fine"])
    engine.turn(user_id="u1", session_id="s1", message="open it", attachments=[pdf])
    assert len(fake_llm.requests) == 1  # the look-alike call ran nothing
    assert store.turns.of_session("s1")[-1].content == fake  # stored as the model's ordinary text
    assert not any(is_placeholder(line) for line in fake.splitlines())
    engine.turn(user_id="u1", session_id="s1", message="and?")
    history = fake_llm.requests[-1]["messages"]
    assistant = [m for m in history if m["role"] == "assistant"]
    assert [m["content"] for m in assistant] == [fake]  # replayed verbatim as text
    assert not any(m.get("tool_calls") for m in history) and not any(m["role"] == "tool" for m in history)
    assert files_env.files.extract(pdf) == extract_before  # never cached as the file's content
    assert "SECRETLY A CAT" not in (files_env.files.extract(pdf) or "")


def test_after_a_provider_overflow_the_harder_request_still_offers_the_tool(files_env, fake_llm):
    from tests.fake_llm import OVERFLOW

    engine = files_env.build()
    md = files_env.upload("u1", "list.md", ff.markdown_bytes())
    fake_llm.script.extend([OVERFLOW["openai"], ToolCalls([("file_read", {"file_id": md})]), "Bread, then apples."])
    result = engine.turn(user_id="u1", session_id="s1", message="what is on my list?", attachments=[md])
    assert len(fake_llm.requests) == 3
    assert all(r["tools"][0]["function"]["name"] == "file_read" for r in fake_llm.requests)
    assert "Buy the bread" in fake_llm.requests[2]["messages"][-1]["content"]
    assert result.assistant_turn.content == "Bread, then apples."

"""Attachments in turns: the placeholder gates, the first turn (inline vs pointer), folding
from the next turn on (charged to ``retrieval``), capability footers, ownership checks.
Real database, real parsers, the model faked at its HTTP boundary."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from errors import FileNotFound, InvalidMessageError
from runtime.context import (
    AttachedFile,
    is_placeholder,
    placeholder,
    placeholder_file_id,
    strip_placeholders,
)
from tests import file_fixtures as ff
from tests.attachment_env import files_env, user_texts  # noqa: F401  (fixture)

GENUINE = '[[file_read file_id=file_0123456789abcdef0123 name="report.pdf" pages=200]]'


# -- the five gates ---------------------------------------------------------------------
@pytest.mark.parametrize(
    "candidate, expected",
    [
        pytest.param(GENUINE, True, id="genuine"),
        pytest.param('[file_read(file_id="file_0123456789abcdef0123")]', False, id="pseudo-call-single-brackets"),
        pytest.param(GENUINE[:-2], False, id="gate1-not-closed"),
        pytest.param("see " + GENUINE, False, id="gate1-text-before"),
        pytest.param("[[file_read file_id=file_1 ]] and [[x]]", False, id="gate1-two-enclosures"),
        pytest.param('[[file_read file_id=file_1 name="' + "a" * 200 + '" pages=1]]', False, id="gate2-too-long"),
        pytest.param('[[file_read file_id=file_1\nname="a" pages=1]]', False, id="gate3-two-lines"),
        pytest.param('[[file_view file_id=file_1 name="a" pages=1]]', False, id="gate4-other-keyword"),
        pytest.param('[[ file_id=file_1 name="file_read" pages=1]]', False, id="gate4-keyword-not-leading"),
        pytest.param('[[file_read file_id=file_1 name="a | b" pages=1]]', False, id="gate5-table-pipe"),
        pytest.param('[[file_read file_id=file_1 name="`a`" pages=1]]', False, id="gate5-backticks"),
        pytest.param('[[file_read file_id=file_1 name="## a" pages=1]]', False, id="gate5-heading"),
    ],
)
def test_placeholder_needs_all_five_gates(candidate, expected):
    assert is_placeholder(candidate) is expected
    assert (placeholder_file_id(candidate) is not None) is expected


@pytest.mark.parametrize(
    "name",
    [
        pytest.param("report.pdf", id="plain"),
        pytest.param('a | b `c` # d [e] "f".txt', id="markup-in-name"),
        pytest.param("line\nbreak.md", id="newline"),
        pytest.param("x" * 400 + ".pdf", id="very-long"),
    ],
)
def test_runtime_placeholders_always_pass_the_gates(name):
    f = AttachedFile(
        file_id="file_0123456789abcdef0123",
        name=name,
        mime="application/pdf",
        size_bytes=1,
        durability="durable",
        parse_state="ready",
        page_count=3,
    )
    line = placeholder(f)
    assert is_placeholder(line)
    assert placeholder_file_id(line) == "file_0123456789abcdef0123"


def test_strip_placeholders_removes_only_genuine_lines_of_rejected_ids():
    pseudo = '[file_read(file_id="file_0123456789abcdef0123")]'
    body = f"Here it is.\n{GENUINE}\n{pseudo}\nbye"
    assert strip_placeholders(body, keep=lambda fid: False) == f"Here it is.\n{pseudo}\nbye"
    assert strip_placeholders(body, keep=lambda fid: True) is body


# -- first turn, then history -----------------------------------------------------------
def test_first_turn_inlines_small_text_and_points_to_binary_then_folds(files_env, fake_llm):
    engine = files_env.build()
    md = files_env.upload("u1", "list.md", ff.markdown_bytes())
    pdf = files_env.upload("u1", "book.pdf", ff.book_pdf())
    first = engine.turn(user_id="u1", session_id="s1", message="Here are my files", attachments=[md, pdf])

    sent = user_texts(fake_llm.requests[0])[-1]
    assert sent.startswith("Here are my files\n\nAttached files:")
    assert f'[[file_read file_id={md} name="list.md" pages=1]]' in sent
    assert "Buy the bread at the corner bakery." in sent  # the text file, whole
    assert f'[[file_read file_id={pdf} name="book.pdf" pages=8]]' in sent
    assert f'call file_read with file_id "{pdf}"' in sent
    assert "This is body page 3" not in sent  # the PDF is a pointer only
    assert first.context.sources["retrieval"].tokens == 0
    assert first.context.attached_files == [md, pdf]
    assert fake_llm.requests[0]["tools"][0]["function"]["name"] == "file_read"

    second = engine.turn(user_id="u1", session_id="s1", message="What do you think?")
    history = user_texts(fake_llm.requests[-1])
    folded = history[0]
    assert folded.startswith("Here are my files\n\nReferenced files")
    assert "Buy the bread at the corner bakery." in folded  # within the ~400-character preview
    assert "<file_content" not in folded  # no longer inline
    assert f'call file_read with file_id "{pdf}"' not in folded
    assert "This is body page 3" in folded  # the preview starts after the front matter
    preview_lines = [line for line in folded.splitlines() if line.startswith("Preview: ")]
    assert len(preview_lines) == 2 and all(len(line) <= len("Preview: ") + 404 for line in preview_lines)
    assert history[-1] == "What do you think?"

    report = second.context.sources
    assert report["retrieval"].tokens > 0 and report["retrieval"].items == 2
    # recent excludes the folded block: the same turns without files cost what recent reports
    engine.store.sessions.ensure(session_id="plain", user_id="u1")
    for t in engine.store.turns.of_session("s1")[:3]:  # as the second request saw them
        engine.store.turns.add(session_id="plain", role=t.role, content=t.content, tokens=t.tokens)
    plain = engine.assemble(user_id="u1", session_id="plain")
    assert abs(report["recent"].tokens - plain.sources["recent"].tokens) <= 3
    assert second.context.total_tokens + second.context.reply_reserve <= second.context.window


def test_text_over_the_inline_threshold_goes_in_as_a_pointer(files_env, fake_llm):
    engine = files_env.build(inline_file_chars=500)
    small = files_env.upload("u1", "small.txt", ff.text_bytes(300))
    big = files_env.upload("u1", "big.txt", ff.text_bytes(2000))
    engine.turn(user_id="u1", session_id="s1", message="two notes", attachments=[small, big])
    sent = user_texts(fake_llm.requests[0])[-1]
    assert sent.count("<file_content") == 1
    assert f'<file_content file_id="{small}">' in sent
    assert "over the 500-character inline limit" in sent
    assert f'call file_read with file_id "{big}"' in sent


def test_short_retrieval_budget_drops_previews_then_lists_a_count(files_env, fake_llm):
    from runtime.accounting import Budgets

    engine = files_env.build(budgets=Budgets.create(retrieval=120))
    ids = [files_env.upload("u1", f"n{i}.txt", ff.text_bytes(600 + i)) for i in range(3)]
    for i, fid in enumerate(ids):
        engine.turn(user_id="u1", session_id="s1", message=f"note {i}", attachments=[fid])
    context = engine.turn(user_id="u1", session_id="s1", message="and?").context
    retrieval = context.sources["retrieval"]
    assert 0 < retrieval.tokens <= 120
    assert retrieval.cut and "not listed" in retrieval.cut
    joined = "\n".join(user_texts(fake_llm.requests[-1]))
    assert "earlier attached files are not listed" in joined  # the cut says so in the prompt
    assert ids[-1] in joined  # the newest reference is kept first
    assert context.total_tokens + context.reply_reserve <= context.window


# -- footers ----------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kinds, expected",
    [
        pytest.param(["durable", "durable"], "All of them are durable", id="durable"),
        pytest.param(["ephemeral", "ephemeral"], "None of them is durable", id="ephemeral"),
        pytest.param(["durable", "ephemeral"], "Only some are durable", id="mixed"),
    ],
)
def test_footer_offers_editing_only_for_durable_ids(files_env, fake_llm, kinds, expected):
    engine = files_env.build()
    ids = []
    for i, kind in enumerate(kinds):
        extra = {"durability": "ephemeral", "session_id": "s1"} if kind == "ephemeral" else {}
        ids.append(files_env.upload("u1", f"f{i}.md", ff.markdown_bytes() + bytes([65 + i]), **extra))
    engine.turn(user_id="u1", session_id="s1", message="files", attachments=ids)
    engine.turn(user_id="u1", session_id="s1", message="again")
    for request in fake_llm.requests:  # the first-turn block and the folded one
        block = user_texts(request)[0]
        footer = block.splitlines()[-1]
        assert expected in footer
        if kind_mixed := (kinds == ["durable", "ephemeral"]):
            assert ids[0] in footer and ids[1] not in footer  # editing offered for the durable id only
        assert ("edit or re-export" in footer) and (kinds != ["ephemeral", "ephemeral"] or "do not offer" in footer)
        assert kind_mixed or ids[0] not in footer


# -- ownership before anything is stored ------------------------------------------------
def _rows(store, table: str) -> int:
    with store.engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar()


@pytest.mark.parametrize(
    "owner, durability, file_session",
    [
        pytest.param("someone-else", "durable", None, id="another-users-file"),
        pytest.param("u1", "ephemeral", "other-session", id="another-sessions-ephemeral"),
        pytest.param(None, None, None, id="unknown-id"),
    ],
)
def test_foreign_or_unknown_attachment_fails_before_anything_is_stored(
    files_env, fake_llm, store, owner, durability, file_session
):
    engine = files_env.build()
    mine = files_env.upload("u1", "mine.md", ff.markdown_bytes())
    if owner is None:
        bad = "file_00000000000000000000"
    else:
        extra = {"durability": durability, "session_id": file_session} if file_session else {}
        bad = files_env.upload(owner, "theirs.md", b"# theirs\n", **extra)
    with pytest.raises(FileNotFound) as info:
        engine.turn(user_id="u1", session_id="s1", message="look", attachments=[mine, bad])
    assert info.value.file_id == bad and bad in str(info.value)
    assert _rows(store, "turns") == 0 and _rows(store, "turn_files") == 0
    assert store.sessions.get("s1") is None
    assert fake_llm.requests == []


def test_attachments_must_be_a_list_of_ids(files_env, store):
    engine = files_env.build()
    with pytest.raises(InvalidMessageError) as info:
        engine.turn(user_id="u1", session_id="s1", message="look", attachments="file_0123")
    assert info.value.reason == "bad_attachments"
    assert _rows(store, "turns") == 0


def test_turn_files_rows_are_written_with_the_user_turn(files_env, store):
    engine = files_env.build()
    a = files_env.upload("u1", "a.md", b"# a\n")
    b = files_env.upload("u1", "b.md", b"# b\n")
    result = engine.turn(user_id="u1", session_id="s1", message="two", attachments=[b, a, b])
    with store.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT file_id, position FROM turn_files WHERE turn_id = :t ORDER BY position"),
            {"t": result.user_turn.id},
        ).all()
    assert [tuple(r) for r in rows] == [(b, 0), (a, 1)]


def test_chat_attach_stores_a_path_and_sends_it_with_the_next_line(db_url, fake_llm, tmp_path):
    import os
    import subprocess
    import sys

    note = tmp_path / "plan.md"
    note.write_text("# Plan\n\nVisit the lighthouse on Sunday.\n", encoding="utf-8")
    env = {
        **os.environ,
        "COMPANION_MODEL": "openai/fake",
        "COMPANION_API_BASE": fake_llm.api_base,
        "OPENAI_API_KEY": "sk-test",
        "DATABASE_URL": db_url,
        "COMPANION_CONTEXT_WINDOW": "4096",
        "COMPANION_FILES_DIR": str(tmp_path / "files"),
    }
    lines = f"/attach {note} file_ffffffffffffffffffff\nread my plan\n/attach {note}\nread it again\n/quit\n"
    done = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "chat", "--user", "ana", "--session", "c1"],
        input=lines,
        capture_output=True,
        text=True,
        env=env,
        timeout=240,
    )
    assert done.returncode == 0, done.stderr
    assert "No file 'file_ffffffffffffffffffff'" in done.stderr  # the bad id: nothing stored, chat goes on
    sent = [r for r in fake_llm.requests if user_texts(r)[-1].startswith("read it again")]
    assert len(sent) == 1
    assert "Visit the lighthouse on Sunday." in user_texts(sent[0])[-1]
    assert '<file_content file_id="file_' in user_texts(sent[0])[-1]


def test_files_of_rolled_out_turns_stay_listed_with_the_summary(files_env, store):
    from memory.tables import TurnState

    engine = files_env.build(context_window=1024)
    doc = files_env.upload("u1", "doc.md", b"# doc\n\nThe lighthouse keeper's log.\n")
    engine.turn(user_id="u1", session_id="s1", message="here is the log", attachments=[doc], reply="thanks")
    filler = "I keep telling you about the garden, the tomatoes and the long evenings by the sea. " * 3
    for i in range(12):
        engine.turn(user_id="u1", session_id="s1", message=f"{i}: {filler}", reply=f"reply {i}: lovely, go on.")
    first = store.turns.of_session("s1")[0]
    assert first.state != TurnState.context  # compaction rolled the turn with the file out
    context = engine.assemble(user_id="u1", session_id="s1")
    system = "\n".join(m["content"] for m in context.messages if m["role"] == "system")
    assert "Files from earlier in this conversation" in system
    assert f'[[file_read file_id={doc} name="doc.md" pages=1]]' in system
    assert doc in context.attached_files and context.sources["retrieval"].tokens > 0
    assert context.total_tokens + context.reply_reserve <= context.window
    engine.delete_file(user_id="u1", file_id=doc)
    after = engine.assemble(user_id="u1", session_id="s1")
    assert doc not in "\n".join(str(m["content"]) for m in after.messages)
    assert "Files from earlier" not in "\n".join(str(m["content"]) for m in after.messages)


def test_session_reads_say_whether_the_session_has_files(files_env, store):
    """Assembling skips reading files only while no turn of the session carries one."""
    engine = files_env.build()
    engine.turn(user_id="u1", session_id="s1", message="no files yet")
    assert not store.assembly.session("s1", user_id="u1").has_files
    md = files_env.upload("u1", "list.md", ff.markdown_bytes())
    engine.turn(user_id="u1", session_id="s1", message="one file", attachments=[md])
    assert store.assembly.session("s1", user_id="u1").has_files
    assert not store.assembly.session("s2", user_id="u1").has_files

"""Deletion: a deleted file leaves no trace in any assembled context; deleting a session
deletes only the files no other session references (a reference count over turn_files);
editing and resending a turn keeps earlier files and cleans the replaced ones only after
the truncation, when nothing references them."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from errors import FileNotFound, InvalidMessageError, SessionOwnershipError
from tests import file_fixtures as ff
from tests.attachment_env import all_text, files_env, user_texts  # noqa: F401  (fixture)


def _exists(env, file_id: str) -> bool:
    try:
        env.files.get(file_id, user_id="u1", with_extract=False)
        return True
    except FileNotFound:
        return False


def test_deleting_a_file_removes_every_reference_in_every_session(files_env, fake_llm):
    engine = files_env.build()
    gone = files_env.upload("u1", "diary.md", b"# Diary\n\nZanzibar holiday plans.\n")
    kept = files_env.upload("u1", "list.md", ff.markdown_bytes())
    pdf = files_env.upload("u1", "book.pdf", ff.book_pdf())
    # session A: an inline block (now folded) for `gone` alone, then a turn carrying `gone` and `kept`
    engine.turn(user_id="u1", session_id="A", message="my diary", attachments=[gone])
    fake_llm.script.append(f'Noted.\n[[file_read file_id={gone} name="diary.md" pages=1]]')  # an echoed placeholder
    engine.turn(user_id="u1", session_id="A", message="both", attachments=[gone, kept])
    # session B: the newest turn carries `gone` next to a PDF pointer
    engine.turn(user_id="u1", session_id="B", message="again", attachments=[pdf, gone])
    assert gone in engine.assemble(user_id="u1", session_id="B").attached_files

    assert engine.delete_file(user_id="u1", file_id=gone) is True
    assert not _exists(files_env, gone)
    for session in ("A", "B"):
        context = engine.assemble(user_id="u1", session_id=session)
        everything = all_text(context.messages)
        assert gone not in everything and "diary.md" not in everything and "Zanzibar" not in everything
        assert "deleted" not in everything.lower()  # no ghost line
        assert gone not in context.attached_files
    a_users = [m["content"] for m in engine.assemble(user_id="u1", session_id="A").messages if m["role"] == "user"]
    assert a_users[0] == "my diary"  # its only file is gone: the block lost its header too
    assert "Referenced files" in a_users[1] and kept in a_users[1]  # the other file keeps its block
    b_last = [m["content"] for m in engine.assemble(user_id="u1", session_id="B").messages if m["role"] == "user"][-1]
    assert b_last.startswith("again\n\nReferenced files") and pdf in b_last  # the PDF's reference stays
    assistant = [
        m["content"] for m in engine.assemble(user_id="u1", session_id="A").messages if m["role"] == "assistant"
    ]
    assert assistant[1] == "Noted."  # the echoed placeholder line (a genuine one, on its own line) is gone
    assert engine.delete_file(user_id="u1", file_id=gone) is False  # already gone


def test_another_users_file_cannot_be_deleted(files_env):
    engine = files_env.build()
    theirs = files_env.upload("u2", "theirs.md", b"# theirs\n")
    assert engine.delete_file(user_id="u1", file_id=theirs) is False
    assert files_env.files.get(theirs, user_id="u2", with_extract=False).id == theirs


def test_deleting_a_session_deletes_only_files_no_other_session_references(files_env, store, tmp_path):
    engine = files_env.build()
    f1, f2, f3 = (files_env.upload("u1", f"f{i}.md", f"# file {i}\n".encode()) for i in (1, 2, 3))
    blob1 = files_env.files.get(f1, user_id="u1", with_extract=False).sha256
    engine.turn(user_id="u1", session_id="A", message="one and two", attachments=[f1, f2], reply="ok")
    engine.turn(user_id="u1", session_id="B", message="two", attachments=[f2], reply="ok")
    engine.turn(user_id="u1", session_id="B", message="three", attachments=[f3], reply="ok")

    counts = engine.delete_session(user_id="u1", session_id="A")
    assert counts["files"] == 1 and counts["turns"] == 2 and counts["sessions"] == 1 and counts["turn_files"] == 2
    assert not _exists(files_env, f1)
    assert _exists(files_env, f2) and _exists(files_env, f3)
    assert files_env.files.blobs.get(blob1) is None  # its bytes went with it
    assert store.sessions.get("A") is None and store.turns.of_session("A") == []
    with store.engine.connect() as conn:
        left = {r[0] for r in conn.execute(text("SELECT file_id FROM turn_files")).all()}
        assert conn.execute(text("SELECT count(*) FROM compaction_state WHERE session_id = 'A'")).scalar() == 0
    assert left == {f2, f3}
    assert set(engine.assemble(user_id="u1", session_id="B").attached_files) == {f2, f3}
    assert engine.delete_session(user_id="u1", session_id="A")["sessions"] == 0  # deleting twice is harmless


def test_deleting_a_session_ignores_files_never_attached_and_other_users_sessions(files_env):
    engine = files_env.build()
    library = files_env.upload("u1", "library.md", b"# kept in the library\n")
    scratch = files_env.upload("u1", "scratch.md", b"# scratch\n", durability="ephemeral", session_id="A")
    engine.turn(user_id="u1", session_id="A", message="hi", reply="hello")
    with pytest.raises(SessionOwnershipError):
        engine.delete_session(user_id="u2", session_id="A")
    counts = engine.delete_session(user_id="u1", session_id="A")
    assert _exists(files_env, library)  # never attached: not the session's to delete
    assert not _exists(files_env, scratch) and counts["files"] == 1  # the session's ephemeral id goes with it


def test_edit_and_resend_keeps_earlier_files_and_cleans_replaced_ones_after_truncation(files_env, fake_llm, store):
    engine = files_env.build()
    early = files_env.upload("u1", "early.md", b"# early notes\n")
    replaced = files_env.upload("u1", "replaced.md", b"# replaced draft\n")
    shared = files_env.upload("u1", "shared.md", b"# shared with session C\n")
    new = files_env.upload("u1", "new.md", b"# the new attachment text\n")
    engine.turn(user_id="u1", session_id="S", message="first", attachments=[early], reply="got it")
    second = engine.turn(user_id="u1", session_id="S", message="second", attachments=[replaced, shared], reply="ok")
    engine.turn(user_id="u1", session_id="S", message="third", reply="fine")
    engine.turn(user_id="u1", session_id="C", message="elsewhere", attachments=[shared], reply="ok")

    result = engine.edit_turn(
        user_id="u1", session_id="S", seq=second.user_turn.seq, message="second, edited", attachments=[new]
    )
    turns = store.turns.of_session("S")
    assert [(t.role, t.content) for t in turns][:3] == [
        ("user", "first"),
        ("assistant", "got it"),
        ("user", "second, edited"),
    ]
    assert len(turns) == 4 and result.user_turn.seq == 3
    assert _exists(files_env, early)  # an earlier turn's file is kept
    assert not _exists(files_env, replaced)  # the replaced turn's file, referenced by nothing now
    assert _exists(files_env, shared)  # still referenced by session C
    sent = user_texts(fake_llm.requests[-1])
    assert sent[-1].startswith("second, edited\n\nAttached files:")
    assert "the new attachment text" in sent[-1]  # the first-turn path: inline
    assert "Referenced files" in sent[0] and early in sent[0]
    assert replaced not in all_text(fake_llm.requests[-1]["messages"])


def test_resending_with_the_same_file_keeps_it(files_env, store):
    engine = files_env.build()
    doc = files_env.upload("u1", "doc.md", b"# doc\n")
    turn = engine.turn(user_id="u1", session_id="S", message="look", attachments=[doc], reply="ok")
    engine.edit_turn(
        user_id="u1", session_id="S", seq=turn.user_turn.seq, message="look again", attachments=[doc], reply="ok"
    )
    assert _exists(files_env, doc)
    assert [t.content for t in store.turns.of_session("S")] == ["look again", "ok"]


@pytest.mark.parametrize(
    "seq, attachments, error",
    [
        pytest.param(2, [], InvalidMessageError, id="assistant-turn"),
        pytest.param(9, [], InvalidMessageError, id="no-such-turn"),
        pytest.param(1, ["file_00000000000000000000"], FileNotFound, id="unknown-new-attachment"),
    ],
)
def test_a_bad_edit_changes_nothing(files_env, store, seq, attachments, error):
    engine = files_env.build()
    doc = files_env.upload("u1", "doc.md", b"# doc\n")
    engine.turn(user_id="u1", session_id="S", message="look", attachments=[doc], reply="ok")
    with pytest.raises(error):
        engine.edit_turn(user_id="u1", session_id="S", seq=seq, message="edited", attachments=attachments, reply="x")
    assert [t.content for t in store.turns.of_session("S")] == ["look", "ok"]
    assert _exists(files_env, doc)


@pytest.fixture
def _reset_structlog():
    """The CLI configures structlog onto the (captured) stdout; undo it after the test."""
    import structlog

    yield
    structlog.reset_defaults()


def test_cli_session_delete_reports_counts_and_checks_the_owner(
    files_env, store, db_url, monkeypatch, tmp_path, capsys, _reset_structlog
):
    from runtime.cli import main

    engine = files_env.build()
    doc = files_env.upload("u1", "doc.md", b"# doc\n")
    engine.turn(user_id="u1", session_id="S", message="look", attachments=[doc], reply="ok")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("COMPANION_FILES_DIR", str(tmp_path / "files"))
    assert main(["session", "delete", "S", "--user", "u2"]) == 2
    assert "belongs to another user" in capsys.readouterr().err
    assert main(["session", "delete", "S", "--user", "u1"]) == 0
    out = capsys.readouterr().out
    assert "turns: 2" in out and "files: 1" in out
    assert store.sessions.get("S") is None and not _exists(files_env, doc)

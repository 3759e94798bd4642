"""`companion files ...` as a user runs it: a subprocess on a real database."""

from __future__ import annotations

import os
import re

from sqlalchemy import text

from memory.database import make_engine
from tests import file_fixtures as F
from tests.test_cli import _run


def _blob_count(db_url: str) -> int:
    engine = make_engine(db_url)
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT count(*) FROM file_blobs")).scalar_one())
    finally:
        engine.dispose()


def test_files_add_show_read_and_delete(db_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": db_url, "COMPANION_FILES_DIR": str(tmp_path / "blobs")}
    paths = F.write_all(tmp_path / "in")
    added = _run(
        ["files", "add", "ana", str(paths["book.pdf"]), str(paths["bundle.zip"]), str(paths["scanned.pdf"])], env
    )
    assert added.returncode == 0, added.stderr
    lines = added.stdout.strip().splitlines()
    assert len(lines) == 3
    assert "book.pdf" in lines[0] and "ready, 8 page(s), body from page 3" in lines[0]
    assert "bundle.zip" in lines[1] and "body from page 2" in lines[1]
    assert "needs_ocr" in lines[2]
    book_id = re.match(r"(file_[0-9a-f]{20})", lines[0]).group(1)

    again = _run(["files", "add", "ana", str(paths["book.pdf"])], env)
    assert again.stdout.split()[0] == book_id  # same bytes: same file
    assert _blob_count(db_url) == 3  # three blobs in the database, one per distinct content
    assert not (tmp_path / "blobs").exists()  # nothing on the local disk

    shown = _run(["files", "show", book_id], env)
    assert shown.returncode == 0 and "owner ana" in shown.stdout and "referenced by 0 turn(s)" in shown.stdout

    read = _run(["files", "read", book_id, "--start-page", "1", "--max-pages", "2"], env)
    assert read.returncode == 0, read.stderr
    assert "pages 1-2 of 8" in read.stdout and "Contents" in read.stdout and "--- page 3 ---" not in read.stdout

    exported = _run(["files", "export", book_id, str(tmp_path / "out.pdf")], env)
    assert exported.returncode == 0 and (tmp_path / "out.pdf").read_bytes() == paths["book.pdf"].read_bytes()
    edited = _run(["files", "edit", book_id, str(paths["notes.txt"])], env)
    assert edited.returncode == 0, edited.stderr
    assert edited.stdout.startswith(book_id) and "notes.txt" in edited.stdout and "ready, 1 page(s)" in edited.stdout

    deleted = _run(["files", "delete", book_id], env)
    assert deleted.returncode == 0 and f"deleted {book_id}" in deleted.stdout
    gone = _run(["files", "read", book_id], env)
    assert gone.returncode == 2 and "No file" in gone.stderr and "Traceback" not in gone.stderr


def test_files_add_refuses_bad_input_before_storing_anything(db_url, tmp_path):
    env = {**os.environ, "DATABASE_URL": db_url, "COMPANION_FILES_DIR": str(tmp_path / "blobs")}
    good = tmp_path / "a.txt"
    good.write_text("hello")
    missing = _run(["files", "add", "ana", str(good), str(tmp_path / "nope.txt")], env)
    assert missing.returncode == 2 and "nope.txt" in missing.stderr
    half = _run(["files", "add", "ana", str(good), "--ephemeral"], env)
    assert half.returncode == 2 and "--session" in half.stderr
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    refused = _run(["files", "add", "ana", str(good), str(empty)], env)  # a good file first: not stored either
    assert refused.returncode == 2 and "empty" in refused.stderr
    listed = _run(["files", "list", "ana"], env)
    assert listed.returncode == 0 and listed.stdout.strip() == ""


def test_files_import_blobs_copies_an_old_files_directory(db_url, tmp_path, monkeypatch, capsys):
    from sqlmodel import Session

    from memory.files import FileStore
    from runtime.cli import main

    engine = make_engine(db_url)
    files = FileStore(engine)
    kept = files.add(user_id="ana", name="a.txt", data=b"from the old directory\n")
    lost = files.add(user_id="ana", name="b.txt", data=b"nowhere to be found\n")
    with Session(engine) as db:  # as if stored by a version that kept bytes on disk
        files.blobs.remove(db, kept.sha256)
        files.blobs.remove(db, lost.sha256)
        db.commit()
    old = tmp_path / "old-files"
    (old / kept.sha256[:2]).mkdir(parents=True)
    (old / kept.blob_path).write_bytes(b"from the old directory\n")
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("COMPANION_FILES_DIR", str(old))
    assert main(["files", "import-blobs"]) == 1  # one blob is missing: said, and a failing status
    out = capsys.readouterr().out
    assert "imported 1" in out and "missing 1" in out and lost.sha256 in out
    assert files.read_bytes(kept) == b"from the old directory\n"
    assert main(["files", "import-blobs", "--from", str(tmp_path / "nope")]) == 2
    engine.dispose()

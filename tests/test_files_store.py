"""The file store on the real embedded PostgreSQL: upload, dedupe, ownership, parse results, deletion."""

from __future__ import annotations

import hashlib

import pytest
from sqlalchemy import text

from errors import FileInputError, FileNotFound
from memory.files import FileStore
from tests import file_fixtures as F


@pytest.fixture(params=[pytest.param("postgres", id="postgres-blobs"), pytest.param("s3", id="s3-blobs")])
def files(request, store) -> FileStore:
    """The store on each blob store: the ``file_blobs`` table, and a bucket on moto's S3 server."""
    if request.param == "postgres":
        return FileStore(store.engine, max_file_bytes=2_000_000)
    from memory.blobs import S3Blobs
    from tests.conftest import S3_CREDENTIALS

    bucket = request.getfixturevalue("s3_bucket")
    blobs = S3Blobs(bucket=bucket, endpoint_url=request.getfixturevalue("s3_endpoint"), **S3_CREDENTIALS)
    return FileStore(store.engine, blobs, max_file_bytes=2_000_000)


def blobs(files: FileStore) -> list:
    return sorted(files.blobs.hashes())


def test_add_stores_row_and_blob_with_sha_size_and_sniffed_mime(files):
    data = F.book_pdf()
    stored = files.add(user_id="u1", name="Book.pdf", data=data)
    assert stored.id.startswith("file_") and len(stored.id) == 25
    assert stored.sha256 == hashlib.sha256(data).hexdigest()
    assert stored.size_bytes == len(data)
    assert stored.mime == "application/pdf"
    assert stored.parse_state == "pending" and stored.durability == "durable"
    assert files.blobs.get(stored.sha256) == data and blobs(files) == [stored.sha256]
    again = files.get(stored.id, user_id="u1")
    assert again.name == "Book.pdf" and again.extract is None


def test_same_bytes_twice_by_one_user_give_one_row_and_one_blob(files):
    first = files.add(user_id="u1", name="a.txt", data=b"same bytes\n")
    second = files.add(user_id="u1", name="b.txt", data=b"same bytes\n")
    assert second.id == first.id
    assert len(blobs(files)) == 1
    other = files.add(user_id="u2", name="a.txt", data=b"same bytes\n")
    assert other.id != first.id
    assert len(blobs(files)) == 1  # content-addressed: one blob whoever stored it
    ephemeral = files.add(user_id="u1", name="a.txt", data=b"same bytes\n", durability="ephemeral", session_id="s1")
    assert ephemeral.id != first.id and ephemeral.durability == "ephemeral"


@pytest.mark.parametrize(
    "kwargs, reason",
    [
        pytest.param({"name": "", "data": b"x"}, "bad_name", id="empty-name"),
        pytest.param({"name": "../", "data": b"x"}, "bad_name", id="dot-dot"),
        pytest.param({"name": "a\x00b.txt", "data": b"x"}, "bad_name", id="nul-in-name"),
        pytest.param({"name": "n" * 300, "data": b"x"}, "bad_name", id="long-name"),
        pytest.param({"name": "empty.txt", "data": b""}, "empty", id="no-bytes"),
        pytest.param({"name": "big.bin", "data": b"x" * 2_000_001}, "too_large", id="too-large"),
        pytest.param({"name": "a.txt", "data": b"x", "durability": "forever"}, "bad_durability", id="bad-durability"),
        pytest.param({"name": "a.txt", "data": b"x", "session_id": "s1"}, "bad_durability", id="durable-with-session"),
        pytest.param({"name": "a.txt", "data": "not bytes"}, "bad_argument", id="str-data"),
    ],
)
def test_bad_uploads_fail_clearly_and_store_nothing(files, kwargs, reason):
    with pytest.raises(FileInputError) as info:
        files.add(user_id="u1", **kwargs)
    assert info.value.reason == reason
    assert files.list(user_id="u1") == []
    assert blobs(files) == []


def test_name_keeps_only_the_last_path_component(files):
    stored = files.add(user_id="u1", name="../../etc/passwd.txt", data=b"hi")
    assert stored.name == "passwd.txt"
    assert stored.blob_path == f"{stored.sha256[:2]}/{stored.sha256}"  # the key is the content, never the name


def test_unknown_and_foreign_ids_fail_with_the_same_message(files):
    mine = files.add(user_id="u1", name="a.txt", data=b"mine")
    with pytest.raises(FileNotFound) as unknown:
        files.get("file_00000000000000000000", user_id="u1")
    with pytest.raises(FileNotFound) as foreign:
        files.get(mine.id, user_id="u2")
    assert str(unknown.value).replace("file_00000000000000000000", "ID") == str(foreign.value).replace(mine.id, "ID")
    with pytest.raises(FileNotFound):
        files.get_many([mine.id, "file_x"], user_id="u1")
    assert list(files.get_many([mine.id], user_id="u1")) == [mine.id]


def test_ephemeral_id_is_not_found_from_another_session(files):
    eph = files.add(user_id="u1", name="a.txt", data=b"for s1", durability="ephemeral", session_id="s1")
    assert files.get(eph.id, user_id="u1", session_id="s1").id == eph.id
    with pytest.raises(FileNotFound):
        files.get(eph.id, user_id="u1", session_id="s2")


def test_claim_is_won_once_and_parse_result_is_stored(files):
    stored = files.add(user_id="u1", name="a.txt", data=b"hello")
    assert files.claim_parse(stored.id) is True
    assert files.claim_parse(stored.id) is False
    assert files.state(stored.id) == "parsing"
    files.set_parse_result(stored.id, state="ready", extract="--- page 1 ---\nhello\n", page_count=1)
    done = files.get(stored.id, user_id="u1")
    assert (done.parse_state, done.page_count, done.extract) == ("ready", 1, "--- page 1 ---\nhello\n")
    assert files.claim_parse(stored.id) is False


def _turn(store, session_id: str, user_id: str) -> int:
    store.sessions.ensure(session_id=session_id, user_id=user_id)
    return store.turns.add(session_id=session_id, role="user", content="see file", tokens=3).id


def test_delete_removes_turn_file_rows_and_the_unused_blob(files, store):
    stored = files.add(user_id="u1", name="a.txt", data=b"delete me")
    shared = files.add(user_id="u2", name="b.txt", data=b"delete me")  # same blob, another user
    turn_id = _turn(store, "s1", "u1")
    with store.engine.begin() as conn:
        conn.execute(
            text("INSERT INTO turn_files (turn_id, file_id, position) VALUES (:t, :f, 0)"),
            {"t": turn_id, "f": stored.id},
        )
    assert files.reference_count(stored.id) == 1
    assert files.delete(stored.id, user_id="u2") is False  # not u2's file
    assert files.delete(stored.id, user_id="u1") is True
    assert files.reference_count(stored.id) == 0
    assert len(blobs(files)) == 1  # u2's row still uses the blob
    assert files.delete(shared.id, user_id="u2") is True
    assert blobs(files) == []
    assert files.delete(shared.id, user_id="u2") is False


def test_delete_unreferenced_keeps_files_another_turn_still_carries(files, store):
    one = files.add(user_id="u1", name="1.txt", data=b"one")
    two = files.add(user_id="u1", name="2.txt", data=b"two")
    turn_b = _turn(store, "sB", "u1")
    with store.engine.begin() as conn:
        conn.execute(text("INSERT INTO turn_files (turn_id, file_id) VALUES (:t, :f)"), {"t": turn_b, "f": two.id})
    assert files.delete_unreferenced([one.id, two.id]) == [one.id]
    assert [f.id for f in files.list(user_id="u1")] == [two.id]


def test_a_stale_parsing_claim_can_be_taken_over(files):
    stored = files.add(user_id="u1", name="a.txt", data=b"claimed by a process that died")
    assert files.claim_parse(stored.id)
    assert not files.claim_parse(stored.id)  # fresh claim: held
    assert files.claim_parse(stored.id, stale_after=0)  # older than 0 s: taken over


def test_migration_creates_file_tables_and_downgrades_cleanly(store):
    from alembic import command

    from memory.database import _alembic_config, head_revision

    def tables():
        with store.engine.connect() as conn:
            return {r[0] for r in conn.execute(text("SELECT tablename FROM pg_tables WHERE schemaname = 'public'"))}

    assert {"files", "turn_files"} <= tables()
    with store.engine.connect() as conn:
        indexes = {r[0] for r in conn.execute(text("SELECT indexname FROM pg_indexes WHERE tablename = 'files'"))}
    assert {"uq_files_user_sha_durable", "uq_files_user_sha_ephemeral"} <= indexes
    with store.engine.begin() as conn:
        command.downgrade(_alembic_config(conn, 384), "0005")
    assert not {"files", "turn_files"} & tables()
    with store.engine.begin() as conn:
        command.upgrade(_alembic_config(conn, 384), head_revision())
    assert {"files", "turn_files"} <= tables()


def test_edit_replaces_the_bytes_of_a_durable_file_under_the_same_id(files):
    stored = files.add(user_id="u1", name="a.txt", data=b"version one")
    files.set_parse_result(stored.id, state="ready", extract="--- page 1 ---\nversion one\n", page_count=1)
    edited = files.edit(stored.id, user_id="u1", data=b"version two", name="a-v2.txt")
    assert edited.id == stored.id and edited.name == "a-v2.txt"
    assert edited.parse_state == "pending" and edited.extract is None
    assert files.export(stored.id, user_id="u1")[1] == b"version two"
    assert len(blobs(files)) == 1  # the old blob went with its last row
    # a result computed from the old bytes is dropped
    assert not files.set_parse_result(
        stored.id, state="ready", extract="--- page 1 ---\nversion one\n", sha256=stored.sha256
    )
    assert files.state(stored.id) == "pending"


def test_ephemeral_ids_cannot_be_edited_or_exported_and_duplicates_are_refused(files):
    eph = files.add(user_id="u1", name="a.txt", data=b"temp", durability="ephemeral", session_id="s1")
    for call in (lambda: files.edit(eph.id, user_id="u1", data=b"new"), lambda: files.export(eph.id, user_id="u1")):
        with pytest.raises(FileInputError) as info:
            call()
        assert info.value.reason == "not_durable"
    one = files.add(user_id="u1", name="one.txt", data=b"one")
    two = files.add(user_id="u1", name="two.txt", data=b"two")
    with pytest.raises(FileInputError) as info:
        files.edit(two.id, user_id="u1", data=b"one")
    assert info.value.reason == "duplicate" and one.id in str(info.value)
    with pytest.raises(FileNotFound):
        files.edit(two.id, user_id="u2", data=b"three")
    assert files.export(two.id, user_id="u1")[1] == b"two"


def test_an_upload_whose_row_is_refused_leaves_no_blob(files):
    """The blob is written before the row; when the database refuses the row (a user id longer than its
    column), neither is left: the ``file_blobs`` row rolls back with it, an S3 object is removed."""
    from errors import StorageError

    with pytest.raises(StorageError):
        files.add(user_id="u" * 300, name="a.txt", data=b"never stored\n")
    assert blobs(files) == []
    kept = files.add(user_id="u1", name="a.txt", data=b"stored\n")
    with pytest.raises(StorageError):
        files.add(user_id="u" * 300, name="a.txt", data=b"stored\n")
    assert blobs(files) == [kept.sha256]  # a blob another row uses stays
    assert files.read_bytes(kept) == b"stored\n"


def test_import_blobs_copies_an_old_files_directory_into_the_store(files, tmp_path):
    """Bytes an earlier version kept on local disk (``<dir>/<sha[:2]>/<sha>``) are copied in, checked by hash."""
    from sqlmodel import Session

    good = files.add(user_id="u1", name="good.txt", data=b"kept on disk\n")
    bad = files.add(user_id="u1", name="bad.txt", data=b"altered on disk\n")
    lost = files.add(user_id="u2", name="lost.txt", data=b"never copied\n")
    present = files.add(user_id="u2", name="here.txt", data=b"already in the store\n")
    with Session(files.engine) as db:
        for stored in (good, bad, lost):
            files.blobs.remove(db, stored.sha256)
        db.commit()
    old = tmp_path / "old-files"
    for stored, data in ((good, b"kept on disk\n"), (bad, b"other bytes\n")):
        (old / stored.sha256[:2]).mkdir(parents=True, exist_ok=True)
        (old / stored.blob_path).write_bytes(data)
    report = files.import_blobs(old)
    assert (report.imported, report.present, report.missing, report.corrupt) == (1, 1, [lost.sha256], [bad.sha256])
    assert files.read_bytes(good) == b"kept on disk\n"
    with pytest.raises(FileNotFound):
        files.read_bytes(bad)
    assert files.import_blobs(old).imported == 0  # idempotent
    assert blobs(files) == sorted([good.sha256, present.sha256])

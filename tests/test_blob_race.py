"""Blobs shared by content across users: an upload racing another user's delete of the same bytes."""

from __future__ import annotations

import threading

import pytest
from sqlmodel import Session

from errors import FileNotFound
from memory.files import FileStore


@pytest.fixture(params=[pytest.param("postgres", id="postgres-blobs"), pytest.param("s3", id="s3-blobs")])
def files(request, store) -> FileStore:
    if request.param == "postgres":
        return FileStore(store.engine)
    from memory.blobs import S3Blobs
    from tests.conftest import S3_CREDENTIALS

    bucket = request.getfixturevalue("s3_bucket")
    return FileStore(
        store.engine, S3Blobs(bucket=bucket, endpoint_url=request.getfixturevalue("s3_endpoint"), **S3_CREDENTIALS)
    )


def test_upload_racing_another_users_delete_of_the_same_bytes_keeps_the_blob(files, monkeypatch):
    """B's upload finds the blob already stored (A's), and A deletes its copy before B's row is
    written: B's bytes must survive, so the delete's check-and-unlink waits for B's row."""
    data = b"shared bytes of two apps\n" * 40
    a = files.add(user_id="app-a:user", name="notes.txt", data=data)
    written = threading.Event()
    real_write = FileStore._write_blob

    def slow_write(self, db, sha256, payload):  # widens the window between the blob write and the row insert
        real_write(self, db, sha256, payload)
        written.set()
        threading.Event().wait(0.5)

    monkeypatch.setattr(FileStore, "_write_blob", slow_write)
    result: dict = {}

    def upload() -> None:
        result["b"] = files.add(user_id="app-b:user", name="notes.txt", data=data)

    uploader = threading.Thread(target=upload)
    uploader.start()
    assert written.wait(10)
    assert files.delete(a.id, user_id="app-a:user")
    uploader.join(10)
    b = result["b"]
    assert files.read_bytes(files.get(b.id, user_id="app-b:user")) == data


def test_many_uploads_and_deletes_of_the_same_bytes_lose_no_stored_file(files):
    """Threads of two users upload and delete the same bytes at once; every row left has its blob."""
    data = b"contended bytes\n" * 64
    errors: list[BaseException] = []

    def churn(user: str) -> None:
        try:
            barrier.wait(10)
            for _ in range(15):
                stored = files.add(user_id=user, name="c.txt", data=data)
                assert files.read_bytes(stored) == data  # acknowledged, so its bytes are there
                files.delete(stored.id, user_id=user)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    workers = [threading.Thread(target=churn, args=(f"user{i}",)) for i in range(4)]
    barrier = threading.Barrier(len(workers))
    for w in workers:
        w.start()
    for w in workers:
        w.join(60)
    assert not errors
    last = files.add(user_id="final", name="c.txt", data=data)
    assert files.read_bytes(last) == data


def test_a_missing_blob_error_names_no_store_detail(files):
    stored = files.add(user_id="u1", name="gone.txt", data=b"soon gone\n")
    with Session(files.engine) as db:
        files.blobs.remove(db, stored.sha256)
        db.commit()
    with pytest.raises(FileNotFound) as caught:
        files.read_bytes(stored)
    message = str(caught.value)
    assert stored.id in message and "file_blobs" not in message and "127.0.0.1" not in message
    assert getattr(files.blobs, "bucket", "no bucket") not in message

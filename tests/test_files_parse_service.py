"""Background parsing and shared waits, on the real database: one parse however many wait,
each caller cancels only its own interest, and the watch stops when the last caller leaves."""

from __future__ import annotations

import threading
import time

import pytest

from runtime.files import ParseService
from tests import file_fixtures as F
from tests.files_support import LONG, files, parse_log, parser  # noqa: F401  (fixtures)
from tests.files_support import parses as service  # noqa: F401  (fixture)


@pytest.mark.parametrize(
    "name, make, state, pages",
    [
        pytest.param("book.pdf", F.book_pdf, "ready", 8, id="pdf"),
        pytest.param("deck.pptx", F.pptx_bytes, "ready", 3, id="pptx"),
        pytest.param("report.docx", F.docx_bytes, "ready", 4, id="docx"),
        pytest.param("sheets.xlsx", F.xlsx_bytes, "ready", 2, id="xlsx"),
        pytest.param("tides.epub", F.epub_bytes, "ready", 3, id="epub"),
        pytest.param("bundle.zip", F.zip_with_pdf, "ready", 8, id="zip"),
        pytest.param("list.md", F.markdown_bytes, "ready", 1, id="markdown"),
        pytest.param("locked.zip", F.encrypted_zip, "failed", None, id="encrypted-zip"),
        pytest.param("scan.pdf", F.scanned_pdf, "needs_ocr", 2, id="scanned"),
        pytest.param("secret.pdf", F.encrypted_pdf, "failed", None, id="encrypted"),
        pytest.param("broken.pdf", F.corrupt_pdf, "failed", None, id="corrupt"),
        pytest.param("blank.txt", lambda: b"   \n\n  \n", "empty", 0, id="whitespace-only"),
    ],
)
def test_parse_ends_in_an_explicit_state(files, name, make, state, pages):
    stored = files.add(user_id="u1", name=name, data=make())
    with ParseService(files) as svc:
        assert svc.wait(stored.id, LONG) == state
    done = files.get(stored.id, user_id="u1")
    assert done.parse_state == state and done.page_count == pages
    if state == "failed":
        assert done.parse_error and name in done.parse_error and done.extract is None
    else:
        assert done.parse_error is None
    if state == "ready":
        assert done.extract.startswith("--- page 1 ---\n")
        assert f"--- page {pages} ---\n" in done.extract and f"--- page {pages + 1} ---" not in done.extract


def test_three_concurrent_waiters_trigger_one_parse_and_share_one_watch(files, service, parser, parse_log):
    stored = files.add(user_id="u1", name="book.pdf", data=F.book_pdf())
    results: list[str | None] = []
    registered = threading.Barrier(4)

    def waiter():
        with service.watch(stored.id) as handle:
            registered.wait(LONG)
            results.append(handle.wait(LONG))

    threads = [threading.Thread(target=waiter) for _ in range(3)]
    for t in threads:
        t.start()
    registered.wait(LONG)  # all three hold a handle; the parse is blocked at the gate
    assert parser.started.wait(LONG)
    assert service.active_watches() == 1
    parser.gate.set()
    for t in threads:
        t.join(LONG)
    assert results == ["ready", "ready", "ready"]
    assert parser.calls == 1
    assert parse_log("file.parse.claimed") == 1
    assert parse_log("file.watch.started") == 1


def test_cancelling_one_waiter_leaves_the_others_waiting(files, service, parser):
    stored = files.add(user_id="u1", name="book.pdf", data=F.book_pdf())
    first, second, third = (service.watch(stored.id) for _ in range(3))
    assert parser.started.wait(LONG)
    first.cancel()
    assert first.wait(LONG) == "parsing"  # a cancelled handle returns at once with the last state
    assert service.active_watches() == 1
    assert not second.done and not third.done
    parser.gate.set()
    assert second.wait(LONG) == "ready"
    assert third.wait(LONG) == "ready"
    second.cancel()
    third.cancel()
    assert parser.calls == 1


def test_watch_stops_when_the_last_caller_leaves(files, service, parser):
    stored = files.add(user_id="u1", name="book.pdf", data=F.book_pdf())
    handles = [service.watch(stored.id) for _ in range(3)]
    thread = handles[0]._watch.thread
    assert parser.started.wait(LONG)
    for handle in handles[:2]:
        handle.cancel()
    assert service.active_watches() == 1 and thread.is_alive()
    handles[2].cancel()
    handles[2].cancel()  # idempotent: cancels only its own interest, once
    thread.join(LONG)
    assert not thread.is_alive()
    assert service.active_watches() == 0
    parser.gate.set()  # the parse itself still ends and is stored
    assert service.wait(stored.id, LONG) == "ready"
    assert parser.calls == 1


def test_waiter_sees_a_parse_finished_by_another_process(files, service, parser):
    stored = files.add(user_id="u1", name="notes.txt", data=b"hello from elsewhere")
    assert files.claim_parse(stored.id)  # another process holds the claim
    with service.watch(stored.id) as handle:
        assert not handle.done
        files.set_parse_result(stored.id, state="ready", extract="--- page 1 ---\nhello from elsewhere\n", page_count=1)
        assert handle.wait(LONG) == "ready"
    assert parser.calls == 0


def test_submit_twice_and_submit_pending_start_one_parse_per_file(files, service, parser):
    a = files.add(user_id="u1", name="a.txt", data=b"alpha")
    b = files.add(user_id="u1", name="b.txt", data=b"beta")
    assert service.submit(a.id) is service.submit(a.id)
    assert service.submit_pending() == 1  # only b is still pending
    parser.gate.set()
    assert service.wait(a.id, LONG) == "ready" and service.wait(b.id, LONG) == "ready"
    assert service.submit(a.id) is None
    assert parser.calls == 2


def test_waiting_on_a_deleted_file_ends_with_none(files, service):
    stored = files.add(user_id="u1", name="a.txt", data=b"short-lived")
    files.delete(stored.id, user_id="u1")
    assert service.wait(stored.id, LONG) is None


def test_an_edit_during_a_parse_drops_the_stale_result_and_parses_the_new_bytes(files, service, parser):
    stored = files.add(user_id="u1", name="notes.txt", data=b"old words")
    service.submit(stored.id)
    assert parser.started.wait(LONG)
    files.edit(stored.id, user_id="u1", data=b"new words")
    parser.gate.set()
    assert service.wait(stored.id, LONG) == "ready"
    assert "new words" in files.get(stored.id, user_id="u1").extract
    assert parser.calls == 2


def test_opening_a_runtime_parses_the_files_a_stopped_process_left_pending(
    files, db_url, embedder, tmp_path, parse_log
):
    from runtime.config import Settings
    from runtime.service import Database, open_engine

    stored = files.add(user_id="u1", name="list.md", data=F.markdown_bytes())  # stored, never submitted
    assert files.get(stored.id, user_id="u1").parse_state == "pending"
    settings = Settings(database_url=db_url, files_dir=tmp_path / "files")
    engine = open_engine(
        settings, with_model=False, embedder=embedder, database=Database(db_url, files.engine, embedded=False)
    )
    try:
        assert parse_log("file.parse.claimed") == 1  # started by opening, not by a wait
        assert engine.file_services.parses.wait(stored.id, LONG) == "ready"
    finally:
        engine.file_services.close()


def _children() -> set[int]:
    """Process ids whose parent is this process (read from /proc)."""
    import os
    from pathlib import Path

    me, found = os.getpid(), set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == me:
            found.add(int(stat.parent.name))
    return found


def test_the_parse_subprocesses_start_on_the_first_parse_not_when_the_services_open(store, parse_log):
    """A process that opens the file services without parsing (a CLI command) starts no subprocess."""
    from runtime.config import Settings
    from runtime.files import open_file_services

    before = _children()
    services = open_file_services(Settings(database_url="unused"), store.engine)
    try:
        assert _children() == before and parse_log("file.parse.pool_started") == 0
        stored = services.upload(user_id="u1", name="book.pdf", data=F.book_pdf())
        assert services.parses.wait(stored.id, LONG) == "ready"
        assert parse_log("file.parse.pool_started") == 1  # started by the parse (its workers exit after each file)
    finally:
        services.close()


def test_a_parse_the_database_failed_under_is_taken_up_again_when_it_answers(files, service, parser, monkeypatch):
    from errors import StorageError

    stored = files.add(user_id="u1", name="notes.txt", data=b"a note kept through an outage")
    recorded = files.set_parse_result
    outage = {"left": 1}

    def down_once(*args, **kwargs):
        if outage["left"]:
            outage["left"] -= 1
            raise StorageError("Database error (OperationalError): the server closed the connection")
        return recorded(*args, **kwargs)

    monkeypatch.setattr(files, "set_parse_result", down_once)
    parser.gate.set()
    service.submit(stored.id)
    deadline = time.monotonic() + LONG
    while files.get(stored.id, user_id="u1").parse_state != "ready" and time.monotonic() < deadline:
        time.sleep(0.05)
    assert files.get(stored.id, user_id="u1").parse_state == "ready"  # not left "parsing" for the claim's lease
    assert parser.calls == 2  # the aborted parse, then the one after the outage

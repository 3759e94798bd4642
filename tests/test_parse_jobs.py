"""Parse jobs: an upload defers a parse job instead of parsing in place; a queue worker (here
``drain``, the one-shot worker) runs it with the parse service's own rules."""

from __future__ import annotations

import structlog
from sqlalchemy import text
from structlog.testing import capture_logs

from runtime.config import Settings
from runtime.files import open_file_services
from runtime.service import QueuedParses, drain
from runtime.turn import Engine
from tests import file_fixtures as F
from tests.conftest import PERSONA


def _jobs(engine) -> list[tuple[str, str, str]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text("SELECT task_name, args->>'file_id', status::text FROM procrastinate_jobs ORDER BY id")
            )
        ]


def _events(captured: list[dict], name: str) -> int:
    """How many ``name`` events the service logged (its production log, not a test counter)."""
    return sum(1 for e in captured if e["event"] == name)


def test_an_upload_defers_one_parse_job_that_a_worker_runs(store, embedder):
    structlog.reset_defaults()
    settings = Settings(database_url="unused")
    uploads = open_file_services(settings, store.engine, queue=QueuedParses(store.engine))
    worker_services = open_file_services(settings, store.engine)  # another process's, in effect
    try:
        data = F.book_pdf()
        with capture_logs() as uploading:
            stored = uploads.upload(user_id="u1", name="book.pdf", data=data)
            again = uploads.upload(user_id="u1", name="book.pdf", data=data)  # same bytes: same file
            assert again.id == stored.id
            assert uploads.parses.wait(stored.id, 0.5) == "pending"  # a wait asks, it does not parse here
        assert _events(uploading, "file.parse.claimed") == 0 and _events(uploading, "file.parse.pool_started") == 0
        assert _jobs(store.engine) == [("parse:parse_file", stored.id, "todo")]  # one job however often asked

        worker = Engine(
            settings=settings, store=store, embedder=embedder, persona=PERSONA, file_services=worker_services
        )
        with capture_logs() as working:
            drain(worker)
        done = uploads.files.get(stored.id, user_id="u1")
        assert (done.parse_state, done.page_count) == ("ready", 8)
        assert _events(working, "file.parse.claimed") == 1 and _events(working, "file.parse.pool_started") == 1
        assert _jobs(store.engine) == []  # done jobs are deleted
        assert uploads.reader.file_read(stored.id, "u1", start_page=1, max_pages=1)
    finally:
        uploads.close()
        worker_services.close()

"""The parse budget: each parse runs in a capped subprocess (CPU, memory, wall time), one
user's files cannot hold every worker, and a file that kills its parser is not parsed
again after every restart."""

from __future__ import annotations

import time
from datetime import timedelta

from sqlalchemy import text

from memory.tables import utcnow
from runtime.files import ParseService
from tests import hostile_files as H
from tests.files_support import LONG, files, parse_log  # noqa: F401  (fixtures)

SLOW_XLSX_STRINGS = 1_000_000
"""An XLSX this many shared strings: tens of seconds of CPU for openpyxl, under every unpack limit."""


def test_a_parse_past_its_cpu_cap_fails_and_the_service_goes_on(files):
    slow = files.add(user_id="hostile", name="strings.xlsx", data=H.xlsx_many_shared_strings(SLOW_XLSX_STRINGS))
    small = files.add(user_id="hostile", name="note.txt", data=b"a small note after a hostile file")
    with ParseService(files, cpu_seconds=2, workers=2) as svc:
        started = time.monotonic()
        assert svc.wait(slow.id, LONG) == "failed"
        assert time.monotonic() - started < 20
        assert svc.wait(small.id, LONG) == "ready"
    failed = files.get(slow.id, user_id="hostile")
    assert "CPU" in failed.parse_error and "strings.xlsx" in failed.parse_error


def test_a_parse_past_its_memory_cap_fails(files):
    big = files.add(user_id="hostile", name="strings.xlsx", data=H.xlsx_many_shared_strings(SLOW_XLSX_STRINGS))
    with ParseService(files, memory_bytes=200 * 1024 * 1024, cpu_seconds=60) as svc:
        assert svc.wait(big.id, LONG * 3) == "failed"
    assert files.get(big.id, user_id="hostile").parse_error


def test_one_users_hostile_files_do_not_hold_every_worker(files):
    hostile = [
        files.add(user_id="hostile", name=f"strings{k}.xlsx", data=H.xlsx_many_shared_strings(SLOW_XLSX_STRINGS + k))
        for k in range(3)
    ]
    with ParseService(files, cpu_seconds=30, workers=2) as svc:
        for f in hostile:
            svc.submit(f.id)
        time.sleep(0.5)  # the hostile parses hold what they may
        other = files.add(user_id="someone-else", name="hello.txt", data=b"seventeen bytes!!")
        assert svc.wait(other.id, LONG) == "ready"
        # it did not wait behind the hostile user's queue: their later files are not done yet
        assert [files.state(f.id) for f in hostile[1:]] == ["parsing", "parsing"]  # claimed, queued or running


def test_a_file_that_kills_its_parser_twice_is_marked_failed_not_parsed_again(files, parse_log):
    stored = files.add(user_id="u1", name="note.txt", data=b"text that once killed a parser")
    with files.engine.begin() as db:  # two claims went stale: their processes died under them
        db.execute(
            text("UPDATE files SET parse_state = 'parsing', parse_started_at = :t, parse_attempts = 2 WHERE id = :i"),
            {"t": utcnow() - timedelta(hours=1), "i": stored.id},
        )
    with ParseService(files) as svc:
        assert svc.submit(stored.id) is None
        assert parse_log("file.parse.claimed") == 0
    failed = files.get(stored.id, user_id="u1")
    assert failed.parse_state == "failed" and "not tried again" in failed.parse_error


def test_a_claim_counts_an_attempt_and_an_edit_resets_them(files):
    stored = files.add(user_id="u1", name="note.txt", data=b"first bytes")
    assert files.claim_parse(stored.id)
    with files.engine.connect() as db:
        assert db.execute(text("SELECT parse_attempts FROM files WHERE id = :i"), {"i": stored.id}).scalar() == 1
    files.edit(stored.id, user_id="u1", data=b"second bytes")
    with files.engine.connect() as db:
        assert db.execute(text("SELECT parse_attempts FROM files WHERE id = :i"), {"i": stored.id}).scalar() == 0

"""The parse results of stored files: claiming a parse, recording its end, and reading the extract
(whole, one page, or a search) without loading a big extract into this process.

:class:`FileParses` is the room of the ``files`` table's parse columns (``parse_state``,
``extract``, ``page_count``, ...); :class:`memory.files.FileStore` is built on it."""

from __future__ import annotations

import builtins
from datetime import timedelta

import structlog
from sqlalchemy import Engine, or_, text, update
from sqlmodel import Session, col, select

from memory.database import storage_errors
from memory.tables import FileRow, ParseState, utcnow

log = structlog.get_logger("companion.files")

STALE_PARSE_SECONDS = 600.0
"""A ``parsing`` claim older than this many seconds is taken to be from a dead process and may be re-claimed."""
MAX_PARSE_ATTEMPTS = 2
"""Parser claims that may go stale (no result) before the file is marked ``failed``."""


class FileParses:
    """Parse state and extracts of the ``files`` rows on ``engine``."""

    engine: Engine

    def pending_ids(self) -> builtins.list[str]:
        """Ids still ``pending`` (e.g. stored by a process that exited before parsing), oldest first."""
        with storage_errors(), Session(self.engine) as db:
            return list(
                db.exec(
                    select(FileRow.id)
                    .where(FileRow.parse_state == ParseState.pending)
                    .order_by(col(FileRow.created_at))
                ).all()
            )

    def claim_parse(self, file_id: str, *, stale_after: float = STALE_PARSE_SECONDS) -> bool:
        """Move ``file_id`` from ``pending`` to ``parsing`` (or re-claim a ``parsing`` claim older than
        ``stale_after`` seconds). True if this caller won the claim; across processes one wins.

        Each claim counts an attempt. A stale claim means a parser never reported back (its
        process was killed under it); once :data:`MAX_PARSE_ATTEMPTS` claims have gone so,
        the file is marked ``failed`` instead of claimed again, so a file that kills its
        parser cannot do so after every restart."""
        cutoff = utcnow() - timedelta(seconds=stale_after)
        stale = (col(FileRow.parse_state) == ParseState.parsing) & (col(FileRow.parse_started_at) < cutoff)
        with storage_errors(), Session(self.engine) as db:
            given_up = db.exec(
                update(FileRow)
                .where(col(FileRow.id) == str(file_id), stale, col(FileRow.parse_attempts) >= MAX_PARSE_ATTEMPTS)
                .values(
                    parse_state=ParseState.failed,
                    parse_error=(
                        f"The parser stopped without a result {MAX_PARSE_ATTEMPTS} times on this file "
                        "(its process was killed); it is not tried again. Upload a smaller or simpler file."
                    ),
                )
            )
            if given_up.rowcount:
                db.commit()
                log.warning("file.parse.given_up", file_id=str(file_id), attempts=MAX_PARSE_ATTEMPTS)
                return False
            result = db.exec(
                update(FileRow)
                .where(col(FileRow.id) == str(file_id), or_(col(FileRow.parse_state) == ParseState.pending, stale))
                .values(
                    parse_state=ParseState.parsing,
                    parse_started_at=utcnow(),
                    parse_attempts=col(FileRow.parse_attempts) + 1,
                )
            )
            db.commit()
            return result.rowcount == 1

    def set_parse_result(
        self,
        file_id: str,
        *,
        state: str,
        extract: str | None = None,
        page_count: int | None = None,
        body_start_page: int | None = None,
        parse_error: str | None = None,
        sha256: str | None = None,
    ) -> bool:
        """Record the end of a parse in one write. Returns False when nothing was written.

        Args:
            state: ``ready``, ``empty``, ``needs_ocr``, ``failed`` (or ``pending`` to give the claim back).
            extract: the ``--- page N ---`` text (for ``ready``; may be given for ``needs_ocr``).
            parse_error: why it failed (for ``failed``), shown to users and the model.
            sha256: the bytes that were parsed; when given, the result is dropped if the file
                was edited meanwhile (its parse started over).
        """
        parse_state = ParseState(state)
        with storage_errors(), Session(self.engine) as db:
            query = update(FileRow).where(col(FileRow.id) == str(file_id))
            if sha256 is not None:
                query = query.where(col(FileRow.sha256) == sha256)
            result = db.exec(
                query.values(
                    parse_state=parse_state,
                    extract=extract,
                    page_count=page_count,
                    body_start_page=body_start_page,
                    parse_error=(parse_error or None) if parse_state == ParseState.failed else None,
                )
            )
            db.commit()
            return result.rowcount == 1

    def extract(self, file_id: str) -> str | None:
        """The extract text of ``file_id`` (``None`` before parsing or for an unknown id)."""
        with storage_errors(), Session(self.engine) as db:
            return db.exec(select(FileRow.extract).where(FileRow.id == str(file_id))).first()

    def extract_page(self, file_id: str, page: int) -> str | None:
        """Page ``page`` (1-based) of the stored extract, cut out by the database, so a big extract
        is never loaded whole here; ``None`` past the last page or before a parse. The text as
        stored (its escapes kept): :func:`runtime.parsing.unescape_page` gives the page."""
        opening = f"\n--- page {page} ---\n"
        following = f"\n--- page {page + 1} ---\n"
        with storage_errors(), Session(self.engine) as db:
            row = db.execute(
                text(
                    "SELECT substring(extract FROM s FOR (CASE WHEN t > s THEN t ELSE length(extract) + 1 END) - s) "
                    "FROM (SELECT extract, CASE WHEN :n = 1 THEN 1 ELSE strpos(extract, :opening) END AS s, "
                    "strpos(extract, :following) AS t FROM files WHERE id = :id AND extract IS NOT NULL) x WHERE s > 0"
                ).bindparams(n=page, opening=opening, following=following, id=str(file_id))
            ).first()
        if row is None or row[0] is None:
            return None
        chunk = row[0].lstrip("\n")
        return chunk.split("\n", 1)[1] if "\n" in chunk else ""

    def extract_search(self, file_id: str, needle: str, *, start: int) -> int | None:
        """The first page from ``start`` whose text may contain ``needle`` (lower-cased, runs of
        whitespace as one space), found by the database; ``None`` when no later page has it.
        A candidate only: the caller checks the page (a hit may span a page marker)."""
        opening = "" if start == 1 else f"\n--- page {start} ---\n"
        with storage_errors(), Session(self.engine) as db:
            row = db.execute(
                text(
                    "SELECT CASE WHEN h > 0 THEN regexp_count(substring(f FOR h), '(^| )--- page [0-9]+ --- ') END "
                    "FROM (SELECT f, strpos(f, :needle) AS h FROM (SELECT regexp_replace(lower(substring(extract FROM s)), "
                    "'\\s+', ' ', 'g') AS f FROM (SELECT extract, CASE WHEN :opening = '' THEN 1 ELSE strpos(extract, :opening) END AS s "
                    "FROM files WHERE id = :id AND extract IS NOT NULL) x WHERE s > 0) y) z"
                ).bindparams(needle=needle, opening=opening, id=str(file_id))
            ).first()
        if row is None or row[0] is None:
            return None
        return start + max(int(row[0]), 1) - 1

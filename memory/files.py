"""Stored files: the ``files`` rows, their blobs, and the parse results.

Blobs are content-addressed by their SHA-256 and kept in a :class:`~memory.blobs.BlobStore`
shared by every process: the ``file_blobs`` table by default (the blob commits in the same
transaction as its row), or an S3-compatible bucket. One user's same bytes are one row per
durability (and per session for an ephemeral id), and equal bytes are one blob whoever
stored them. A blob is removed when no row points at it.

Because blobs are shared across users and apps, writing a blob and inserting (or
updating) the row that points at it, and checking that no row points at a blob and
unlinking it, each run under a PostgreSQL transaction-level advisory lock keyed by the
blob's SHA-256 (:func:`blob_lock`): an upload of bytes that another user deletes at the
same moment keeps its blob.

Ownership: :meth:`FileStore.get` raises :class:`~errors.FileNotFound` with one
and the same message for an unknown id and for another user's id.

Reads never change state; parse results are written by :meth:`FileStore.set_parse_result`
(the parse service in ``runtime.files`` calls it).
"""

from __future__ import annotations

import builtins
import contextlib
import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any, cast

import structlog
from sqlalchemy import Engine, delete, func, text, update
from sqlalchemy.orm import defer
from sqlmodel import Session, col, select

from errors import FileInputError, FileNotFound, StorageError
from memory.blobs import BlobStore, PostgresBlobs, blob_key
from memory.database import storage_errors
from memory.file_names import EPUB_MIME, clean_name, file_not_found, new_file_id, sniff_mime
from memory.file_parses import FileParses
from memory.tables import FINAL_PARSE_STATES, Durability, FileRow, ParseState, TurnFile
from memory.validation import check_id

log = structlog.get_logger("companion.files")

DEFAULT_MAX_FILE_BYTES = 50 * 1024 * 1024
"""``COMPANION_MAX_FILE_BYTES`` default: 50 MiB."""
BLOB_LOCK_CLASS = 0x0F11E5
"""First key of the two-key advisory lock on a blob (the second is taken from the blob's SHA-256);
the two-key form never collides with the one-key session locks of :mod:`memory.store`."""


def blob_lock(db: Session, sha256: str) -> None:
    """Take the advisory lock on the blob of ``sha256`` for the rest of ``db``'s transaction
    (``pg_advisory_xact_lock``; waits while another transaction holds it; released at commit
    or rollback)."""
    key = int(sha256[:8], 16)
    db.execute(
        text("SELECT pg_advisory_xact_lock(:c, :k)").bindparams(
            c=BLOB_LOCK_CLASS, k=key - (1 << 32) if key >= 1 << 31 else key
        )
    )


@dataclass
class ImportReport:
    """What :meth:`FileStore.import_blobs` did, counted in blobs (distinct contents)."""

    imported: int = 0
    """Blobs copied into the blob store."""
    present: int = 0
    """Blobs the store held already."""
    missing: builtins.list[str] = field(default_factory=list)
    """SHA-256 of blobs neither in the store nor in the directory: their files cannot be read."""
    corrupt: builtins.list[str] = field(default_factory=list)
    """SHA-256 of blobs whose file in the directory has other bytes; not imported."""


@dataclass(frozen=True, kw_only=True)
class StoredFile:
    """One stored file as the runtime sees it (a detached copy of its ``files`` row)."""

    id: str
    user_id: str
    name: str
    mime: str
    size_bytes: int
    """Bytes."""
    sha256: str
    blob_path: str
    """The blob's key, ``<sha[:2]>/<sha>`` (its object key under the S3 prefix)."""
    durability: str
    """``durable`` or ``ephemeral``."""
    session_id: str | None
    """For an ephemeral id, the session it is valid in."""
    parse_state: str
    """``pending``, ``parsing``, ``ready``, ``empty``, ``needs_ocr`` or ``failed``."""
    parse_error: str | None
    page_count: int | None
    """Pages of the extract, once parsed."""
    body_start_page: int | None
    """First page after the front matter, 1-based; ``None`` when the body starts on page 1 or nothing was found."""
    created_at: datetime
    extract: str | None = None
    """The ``--- page N ---`` text; ``None`` before parsing, or when loaded without it."""

    @property
    def is_durable(self) -> bool:
        return self.durability == Durability.durable.value

    @property
    def is_final(self) -> bool:
        """True once the parse has ended (ready, empty, needs OCR or failed)."""
        return self.parse_state in FINAL_PARSE_STATES


def _select_files(with_extract: bool):
    """``SELECT`` of file rows; without the extract column unless asked (it may hold hundreds of MB)."""
    query = select(FileRow)
    return query if with_extract else query.options(defer(cast(Any, FileRow.extract)))


def _stored(row: FileRow, *, with_extract: bool) -> StoredFile:
    return StoredFile(
        id=row.id,
        user_id=row.user_id,
        name=row.name,
        mime=row.mime,
        size_bytes=row.size_bytes,
        sha256=row.sha256,
        blob_path=row.blob_path,
        durability=_value(row.durability),
        session_id=row.session_id,
        parse_state=_value(row.parse_state),
        parse_error=row.parse_error,
        page_count=row.page_count,
        body_start_page=row.body_start_page,
        created_at=row.created_at,
        extract=row.extract if with_extract else None,
    )


def _value(v: object) -> str:
    return v.value if hasattr(v, "value") else str(v)


class FileStore(FileParses):
    """The ``files`` table and the blobs of its rows.

    Args:
        engine: the SQLAlchemy engine of the runtime's database.
        blobs: where the bytes are kept (``COMPANION_BLOB_STORE``); ``None``: the ``file_blobs``
            table of ``engine`` (:class:`~memory.blobs.PostgresBlobs`).
        max_file_bytes: largest upload accepted, bytes (``COMPANION_MAX_FILE_BYTES``).
    """

    def __init__(
        self, engine: Engine, blobs: BlobStore | None = None, *, max_file_bytes: int = DEFAULT_MAX_FILE_BYTES
    ) -> None:
        self.engine = engine
        self.blobs: BlobStore = blobs if blobs is not None else PostgresBlobs(engine)
        self.max_file_bytes = max_file_bytes

    # -- writing ----------------------------------------------------------------
    def check(self, *, name: str, data: bytes) -> None:
        """Check an upload's name and bytes as :meth:`add` would, storing nothing (to check a
        batch before any of it is stored).

        Raises:
            FileInputError: bad name (``bad_name``), no bytes (``empty``), or more than
                ``max_file_bytes`` (``too_large``).
        """
        self._checked_bytes(data, clean_name(name))

    def add(
        self,
        *,
        user_id: str,
        name: str,
        data: bytes,
        mime: str | None = None,
        durability: str = "durable",
        session_id: str | None = None,
    ) -> StoredFile:
        """Store ``data`` for ``user_id`` and return its row (state ``pending`` when new).

        The same bytes stored again by the same user with the same durability (and, for
        an ephemeral id, the same session) return the existing row unchanged: one row,
        one blob. Creates the user row if missing.

        Args:
            mime: the caller's MIME type; ``None`` sniffs it (:func:`sniff_mime`).
            durability: ``durable`` or ``ephemeral``.
            session_id: for ``ephemeral``, the session the id is valid in.

        Raises:
            FileInputError: bad name (``bad_name``), no bytes (``empty``), more than
                ``max_file_bytes`` (``too_large``), or a bad durability (``bad_durability``).
                Nothing was written.
            StorageError: the database refused the write.
        """
        clean = clean_name(name)
        if durability not in ("durable", "ephemeral"):
            raise FileInputError(
                f"durability must be 'durable' or 'ephemeral', got {durability!r}.", reason="bad_durability"
            )
        if durability == "durable" and session_id is not None:
            raise FileInputError(
                "session_id is only for ephemeral files; a durable file is valid in every session of its user.",
                reason="bad_durability",
            )
        data = self._checked_bytes(data, clean)
        sha = hashlib.sha256(data).hexdigest()
        mime = (mime or "").strip() or sniff_mime(data, clean)
        existing = self._find(user_id=user_id, sha256=sha, durability=durability, session_id=session_id)
        if existing is not None:
            return existing
        blob_path = blob_key(sha)
        with storage_errors(session_id), Session(self.engine) as db:
            try:
                blob_lock(db, sha)  # held until commit: no one removes the blob between its write and our row
                self._write_blob(db, sha, data)
                db.execute(text("INSERT INTO users (id) VALUES (:u) ON CONFLICT DO NOTHING").bindparams(u=user_id))
                row = FileRow(
                    id=new_file_id(),
                    user_id=user_id,
                    name=clean,
                    mime=mime[:200],
                    size_bytes=len(data),
                    sha256=sha,
                    blob_path=blob_path,
                    durability=Durability(durability),
                    session_id=session_id,
                )
                db.add(row)
                db.commit()
            except Exception:
                db.rollback()
                # A concurrent upload of the same bytes won the unique index: use its row.
                with contextlib.suppress(StorageError):
                    again = self._find(user_id=user_id, sha256=sha, durability=durability, session_id=session_id)
                    if again is not None:
                        return again
                self._discard_blob(sha)
                raise
            db.refresh(row)
            return _stored(row, with_extract=True)

    def _checked_bytes(self, data: object, name: str) -> bytes:
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise FileInputError(f"File data must be bytes, got {type(data).__name__}.", reason="bad_argument")
        data = bytes(data)
        if not data:
            raise FileInputError(f"The file {name!r} is empty (0 bytes); nothing to store.", reason="empty")
        if len(data) > self.max_file_bytes:
            raise FileInputError(
                f"The file {name!r} is {len(data):,} bytes; at most {self.max_file_bytes:,} are accepted "
                "(COMPANION_MAX_FILE_BYTES).",
                reason="too_large",
            )
        return data

    def _find(self, *, user_id: str, sha256: str, durability: str, session_id: str | None) -> StoredFile | None:
        with storage_errors(session_id), Session(self.engine) as db:
            query = select(FileRow).where(
                FileRow.user_id == user_id, FileRow.sha256 == sha256, FileRow.durability == Durability(durability)
            )
            if durability == "ephemeral":
                query = query.where(func.coalesce(FileRow.session_id, "") == (session_id or ""))
            row = db.exec(query).first()
            return _stored(row, with_extract=True) if row is not None else None

    def _write_blob(self, db: Session, sha256: str, data: bytes) -> None:
        """Store the blob of ``sha256`` in ``db``'s transaction (the caller holds its :func:`blob_lock`)."""
        self.blobs.put(db, sha256, data)

    # -- reading ----------------------------------------------------------------
    def get(
        self, file_id: str, *, user_id: str, session_id: str | None = None, with_extract: bool = True
    ) -> StoredFile:
        """The file ``file_id`` of ``user_id``.

        Args:
            session_id: when given, an ephemeral file bound to another session is not found.
            with_extract: ``False`` leaves ``extract`` as ``None`` (cheaper for listings).

        Raises:
            FileNotFound: no such id, another user's id, or an ephemeral id of another
                session; one message for all, so nothing leaks.
            InvalidFieldError: an id with NUL or a lone surrogate, or over 200 characters.
        """
        check_id(str(file_id), field="file_id")
        with storage_errors(session_id), Session(self.engine) as db:
            row = db.exec(_select_files(with_extract).where(FileRow.id == str(file_id))).first()
            if row is None or row.user_id != user_id or not _in_session(row, session_id):
                raise file_not_found(file_id)
            return _stored(row, with_extract=with_extract)

    def get_many(
        self, file_ids: Sequence[str], *, user_id: str, session_id: str | None = None, with_extract: bool = True
    ) -> dict[str, StoredFile]:
        """``{id: StoredFile}`` for ``file_ids`` in one query, in the order given.

        Raises:
            FileNotFound: for the first id that :meth:`get` would not find.
        """
        ids = [str(i) for i in dict.fromkeys(file_ids)]
        if not ids:
            return {}
        with storage_errors(session_id), Session(self.engine) as db:
            rows = {r.id: r for r in db.exec(_select_files(with_extract).where(col(FileRow.id).in_(ids))).all()}
        out: dict[str, StoredFile] = {}
        for file_id in ids:
            row = rows.get(file_id)
            if row is None or row.user_id != user_id or not _in_session(row, session_id):
                raise file_not_found(file_id)
            out[file_id] = _stored(row, with_extract=with_extract)
        return out

    def lookup(self, file_id: str) -> StoredFile:
        """The file ``file_id`` whoever owns it: for operator commands (``companion files show``) and
        the parse service only, never for a user's request.

        Raises:
            FileNotFound: no such id.
        """
        with storage_errors(), Session(self.engine) as db:
            row = db.get(FileRow, str(file_id))
            if row is None:
                raise file_not_found(file_id)
            return _stored(row, with_extract=True)

    def owner(self, file_id: str) -> str | None:
        """The user id owning ``file_id`` (``None`` for an unknown id); reads nothing else."""
        with storage_errors(), Session(self.engine) as db:
            return db.exec(select(FileRow.user_id).where(FileRow.id == str(file_id))).first()

    def state(self, file_id: str) -> str | None:
        """The parse state of ``file_id``, or ``None`` if the id is gone."""
        with storage_errors(), Session(self.engine) as db:
            value = db.exec(select(FileRow.parse_state).where(FileRow.id == str(file_id))).first()
            return None if value is None else _value(value)

    def read_bytes(self, stored: StoredFile) -> bytes:
        """The stored bytes of ``stored`` (for parsing and re-export).

        Raises:
            FileNotFound: the blob is missing from the blob store.
            StorageError: the blob store could not be read.
        """
        with storage_errors():
            data = self.blobs.get(stored.sha256)
        if data is None:
            log.error("file.blob_missing", file_id=stored.id, store=self.blobs.kind, sha256=stored.sha256)
            raise FileNotFound(
                f"The bytes of file {stored.id!r} are missing from the blob store; upload the file again.",
                file_id=stored.id,
            )
        return data

    def export(self, file_id: str, *, user_id: str) -> tuple[StoredFile, bytes]:
        """The stored bytes of a durable file of ``user_id``, for re-export.

        Raises:
            FileNotFound: as :meth:`get`, or the blob is missing.
            FileInputError: ``not_durable`` for an ephemeral id.
        """
        stored = self.get(file_id, user_id=user_id, with_extract=False)
        _require_durable(stored, "exported")
        return stored, self.read_bytes(stored)

    def edit(
        self, file_id: str, *, user_id: str, data: bytes, name: str | None = None, mime: str | None = None
    ) -> StoredFile:
        """Replace the bytes of a durable file, keeping its id (and every turn's reference to it).

        The parse starts over (``pending``; the old extract is cleared); the old blob is
        removed when no row uses it any more.

        Raises:
            FileNotFound: as :meth:`get`.
            FileInputError: ``not_durable`` for an ephemeral id; ``duplicate`` when the user
                already has a durable file with these bytes (its id is in the message);
                ``empty`` / ``too_large`` / ``bad_name`` as :meth:`add`. Nothing changed.
        """
        stored = self.get(file_id, user_id=user_id, with_extract=False)
        _require_durable(stored, "edited")
        new_name = clean_name(name) if name is not None else stored.name
        data = self._checked_bytes(data, new_name)
        sha = hashlib.sha256(data).hexdigest()
        if sha == stored.sha256 and new_name == stored.name:
            return stored
        twin = self._find(user_id=user_id, sha256=sha, durability="durable", session_id=None)
        if twin is not None and twin.id != stored.id:
            raise FileInputError(
                f"You already have these bytes as file {twin.id!r} ({twin.name}); use that id instead.",
                reason="duplicate",
                file_id=stored.id,
            )
        blob_path = blob_key(sha)
        with storage_errors(), Session(self.engine) as db:
            try:
                blob_lock(db, sha)
                self._write_blob(db, sha, data)
                db.exec(
                    update(FileRow)
                    .where(col(FileRow.id) == stored.id)
                    .values(
                        name=new_name,
                        mime=((mime or "").strip() or sniff_mime(data, new_name))[:200],
                        size_bytes=len(data),
                        sha256=sha,
                        blob_path=blob_path,
                        parse_state=ParseState.pending,
                        parse_error=None,
                        parse_started_at=None,
                        parse_attempts=0,
                        page_count=None,
                        extract=None,
                        body_start_page=None,
                    )
                )
                db.commit()
            except Exception:
                db.rollback()
                self._discard_blob(sha)
                raise
        if sha != stored.sha256:
            self._remove_unused_blobs({stored.sha256})
        return self.get(stored.id, user_id=user_id)

    def list(self, *, user_id: str) -> list[StoredFile]:
        """The user's files, oldest first, without extracts."""
        with storage_errors(), Session(self.engine) as db:
            rows = db.exec(
                _select_files(False)
                .where(FileRow.user_id == user_id)
                .order_by(col(FileRow.created_at), col(FileRow.id))
            ).all()
            return [_stored(r, with_extract=False) for r in rows]

    def reference_count(self, file_id: str) -> int:
        """Turns (in any session) that carry ``file_id``."""
        with storage_errors(), Session(self.engine) as db:
            return int(
                db.exec(select(func.count()).select_from(TurnFile).where(TurnFile.file_id == str(file_id))).one()
            )

    # -- moving blobs in ---------------------------------------------------------------
    def import_blobs(self, directory: Path) -> ImportReport:
        """Copy into the blob store the bytes of every ``files`` row whose blob it lacks, from a local
        files directory laid out as earlier versions wrote it (``<directory>/<sha[:2]>/<sha>``).

        Each file read is checked against its SHA-256 before it is stored, under the blob's
        lock. Idempotent: run it again after copying missing files in. The directory is only read.

        Raises:
            StorageError: the database or the blob store failed (what was imported stays).
        """
        with storage_errors(), Session(self.engine) as db:
            wanted = sorted(set(db.exec(select(FileRow.sha256)).all()))
        stored = set(self.blobs.hashes())
        report = ImportReport()
        for sha in wanted:
            if sha in stored:
                report.present += 1
                continue
            path = Path(directory) / blob_key(sha)
            try:
                data = path.read_bytes()
            except FileNotFoundError:
                report.missing.append(sha)
                continue
            if hashlib.sha256(data).hexdigest() != sha:
                report.corrupt.append(sha)
                continue
            with storage_errors(), Session(self.engine) as db:
                blob_lock(db, sha)
                self._write_blob(db, sha, data)
                db.commit()
            report.imported += 1
        log.info(
            "file.blobs.imported",
            store=self.blobs.kind,
            imported=report.imported,
            present=report.present,
            missing=len(report.missing),
            corrupt=len(report.corrupt),
        )
        return report

    # -- deleting ------------------------------------------------------------------
    def delete(self, file_id: str, *, user_id: str) -> bool:
        """Delete the file, every ``turn_files`` row that carries it, and its blob if no other
        row uses the blob. False if the user has no such file (nothing changed)."""
        with storage_errors(), Session(self.engine) as db:
            row = db.get(FileRow, str(file_id))
            if row is None or row.user_id != user_id:
                return False
        return bool(self._delete_rows([str(file_id)]))

    def delete_unreferenced(self, file_ids: Iterable[str]) -> builtins.list[str]:
        """Delete those of ``file_ids`` that no turn carries any more (no ``turn_files`` row in any
        session), with their blobs when unused. Returns the ids deleted.

        This is the reference count across messages: session-level lists play no part.
        Call it after the turns (and their ``turn_files`` rows) are gone.
        """
        ids = [str(i) for i in dict.fromkeys(file_ids)]
        if not ids:
            return []
        with storage_errors(), Session(self.engine) as db:
            referenced = set(db.exec(select(TurnFile.file_id).where(col(TurnFile.file_id).in_(ids))).all())
        return self._delete_rows([i for i in ids if i not in referenced], only_unreferenced=True)

    def _delete_rows(self, ids: builtins.list[str], *, only_unreferenced: bool = False) -> builtins.list[str]:
        if not ids:
            return []
        with storage_errors(), Session(self.engine) as db:
            if only_unreferenced:
                # Re-check under the row locks: a turn may have picked the file up meanwhile.
                db.exec(select(FileRow.id).where(col(FileRow.id).in_(ids)).with_for_update())
                still = set(db.exec(select(TurnFile.file_id).where(col(TurnFile.file_id).in_(ids))).all())
                ids = [i for i in ids if i not in still]
            rows = db.exec(select(FileRow.id, FileRow.sha256).where(col(FileRow.id).in_(ids))).all()
            db.exec(delete(TurnFile).where(col(TurnFile.file_id).in_(ids)))
            db.exec(delete(FileRow).where(col(FileRow.id).in_(ids)))
            db.commit()
        self._remove_unused_blobs({blob for _, blob in rows})
        return [file_id for file_id, _ in rows]

    def _discard_blob(self, sha256: str) -> None:
        """After a failed write: remove the blob of ``sha256`` unless a row uses it (an S3 object is
        written outside the transaction that failed). A failure here leaves at most an unused blob."""
        with contextlib.suppress(StorageError):
            self._remove_unused_blobs({sha256})

    def _remove_unused_blobs(self, hashes: set[str]) -> None:
        """Remove the blobs of those of ``hashes`` (SHA-256) that no ``files`` row points at, each
        checked and removed under its blob lock (:func:`blob_lock`), so a concurrent upload of the
        same bytes keeps them."""
        for sha in sorted(hashes):
            with storage_errors(), Session(self.engine) as db:
                blob_lock(db, sha)
                used = db.exec(select(FileRow.id).where(col(FileRow.sha256) == sha).limit(1)).first()
                if used is None:
                    self.blobs.remove(db, sha)
                db.commit()


def session_file_ids(db: Session, session_id: str) -> builtins.list[str]:
    """The ids of the files the session's turns carry and of its ephemeral files, read in
    ``db``'s transaction: the candidates a deletion of the session may leave unreferenced."""
    rows = db.execute(
        text(
            "SELECT DISTINCT tf.file_id FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
            "WHERE t.session_id = :s UNION SELECT id FROM files WHERE session_id = :s"
        ).bindparams(s=session_id)
    ).all()
    return [r[0] for r in rows]


def _in_session(row: FileRow, session_id: str | None) -> bool:
    if session_id is None or _value(row.durability) != Durability.ephemeral.value:
        return True
    return row.session_id is None or row.session_id == session_id


def _require_durable(stored: StoredFile, verb: str) -> None:
    if not stored.is_durable:
        raise FileInputError(
            f"File {stored.id!r} is ephemeral (valid only for its session); it cannot be {verb}. "
            "Upload it as a durable file to keep or change it.",
            reason="not_durable",
            file_id=stored.id,
        )


__all__ = [
    "DEFAULT_MAX_FILE_BYTES",
    "EPUB_MIME",
    "FileStore",
    "ImportReport",
    "StoredFile",
    "clean_name",
    "file_not_found",
    "new_file_id",
    "sniff_mime",
]

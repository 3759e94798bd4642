"""The transcript cache of image files (``image_transcripts``).

One row per image file: the description the vision model (or OCR) wrote the first time a
text-only model needed it. Writing is idempotent (the first transcript of a file wins, as
in the in-turn dedupe rule); a deleted file takes its row with it (ON DELETE CASCADE).
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Engine
from sqlalchemy.dialects.postgresql import insert
from sqlmodel import Session, col, select

from memory.database import storage_errors
from memory.tables import ImageTranscript


class Transcripts:
    """Reads and writes ``image_transcripts``."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def get_many(self, file_ids: Iterable[str]) -> dict[str, ImageTranscript]:
        """file id -> its cached transcript, for those of ``file_ids`` that have one."""
        ids = list(dict.fromkeys(file_ids))
        if not ids:
            return {}
        with storage_errors(), Session(self.engine) as db:
            rows = db.exec(select(ImageTranscript).where(col(ImageTranscript.file_id).in_(ids))).all()
            return {r.file_id: ImageTranscript.model_validate(r.model_dump()) for r in rows}

    def put(self, file_id: str, *, text: str, method: str, model: str | None) -> bool:
        """Store a transcript unless the file already has one (the first one is kept).
        Returns True if this one was stored.

        Raises:
            ValueError: an empty ``text`` (a transcript is never empty).
            StorageError: the database failed (or the file is gone).
        """
        if not text.strip():
            raise ValueError("An image transcript must not be empty.")
        with storage_errors(), Session(self.engine) as db:
            result = db.exec(
                insert(ImageTranscript.__table__)  # type: ignore[attr-defined]  # SQLModel sets __table__ at class creation; its stubs omit it
                .values(file_id=file_id, text=text, method=method, model=model)
                .on_conflict_do_nothing(index_elements=["file_id"])
            )
            db.commit()
            return bool(result.rowcount)

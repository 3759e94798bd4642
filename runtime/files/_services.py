"""Building the file services from settings: the store, the parse service and the reader."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine as SAEngine

from memory.blobs import BlobStore, PostgresBlobs, S3Blobs
from memory.files import FileStore, StoredFile
from runtime.config import Settings
from runtime.files._file_read import FileReader, WindowLimits
from runtime.files._parse_service import ParseQueue, ParseService
from runtime.parsing import ParseLimits


@dataclass(frozen=True)
class FileServices:
    """The three file services of one runtime, built together so they share one store."""

    files: FileStore
    parses: ParseService
    reader: FileReader

    def upload(
        self,
        *,
        user_id: str,
        name: str,
        data: bytes,
        mime: str | None = None,
        durability: str = "durable",
        session_id: str | None = None,
    ) -> StoredFile:
        """Store the bytes (:meth:`FileStore.add`) and ask for their parse (:meth:`ParseService.request`:
        in the background here, or as a queue job).

        Returns the stored file as it was when stored (``pending`` for new bytes; the
        existing row, whatever its state, for bytes stored before).

        Raises:
            FileInputError: bad name, no bytes, too large, bad durability; nothing stored.
        """
        stored = self.files.add(
            user_id=user_id, name=name, data=data, mime=mime, durability=durability, session_id=session_id
        )
        self.parses.request(stored.id)
        return stored

    def edit(self, file_id: str, *, user_id: str, data: bytes, name: str | None = None) -> StoredFile:
        """Replace a durable file's bytes under the same id (:meth:`FileStore.edit`) and parse
        them again in the background.

        Raises:
            FileNotFound, FileInputError: as :meth:`FileStore.edit`; nothing changed.
        """
        stored = self.files.edit(file_id, user_id=user_id, data=data, name=name)
        self.parses.request(stored.id)
        return stored

    def close(self) -> None:
        """Wait for running parses to end and stop the parser threads."""
        self.parses.close()


def open_blob_store(settings: Settings, engine: SAEngine) -> BlobStore:
    """The blob store ``COMPANION_BLOB_STORE`` names: the ``file_blobs`` table of ``engine``
    (``postgres``), or the ``COMPANION_S3_*`` bucket (``s3``)."""
    if settings.blob_store == "s3":
        assert settings.s3_bucket is not None, "Settings refuses s3 without a bucket"
        secret = settings.s3_secret_access_key
        return S3Blobs(
            bucket=settings.s3_bucket,
            endpoint_url=settings.s3_endpoint_url,
            region=settings.s3_region,
            access_key_id=settings.s3_access_key_id,
            secret_access_key=None if secret is None else secret.get_secret_value(),
            prefix=settings.s3_prefix or "",
        )
    return PostgresBlobs(engine)


def open_file_services(
    settings: Settings, engine: SAEngine, *, parser=None, queue: ParseQueue | None = None
) -> FileServices:
    """The file store on the ``COMPANION_BLOB_STORE`` blob store, a parse service and a
    ``file_read`` reader with the ``COMPANION_FILE_*`` / ``COMPANION_ZIP_DEPTH`` limits.

    Nothing starts here: the parse service's subprocess pool starts on the first parse.

    Args:
        parser: replaces the default parser (tests count invocations with it).
        queue: parses run as jobs of this queue (any queue worker runs them) instead of in this
            process's background threads; the parse service closes it.
    """
    parsing = settings.parsing
    files = FileStore(engine, open_blob_store(settings, engine), max_file_bytes=parsing.max_file_bytes)
    kwargs = {} if parser is None else {"parser": parser}
    parses = ParseService(
        files,
        limits=ParseLimits(zip_depth=parsing.zip_depth),
        cpu_seconds=parsing.cpu_seconds,
        memory_bytes=parsing.memory_bytes,
        queue=queue,
        **kwargs,
    )
    reader = FileReader(
        files,
        parses,
        wait_seconds=settings.file_read_wait,
        limits=WindowLimits(max_pages=settings.file_read_pages, max_chars=settings.file_read_chars),
    )
    return FileServices(files=files, parses=parses, reader=reader)

"""Where stored files' bytes live: a blob store shared by every process of the runtime.

A blob is the bytes of one or more ``files`` rows, addressed by their SHA-256 (hex). Two
implementations share the :class:`BlobStore` protocol:

- :class:`PostgresBlobs` (the default): the ``file_blobs`` table, one ``bytea`` row per
  blob. A blob written with :meth:`~BlobStore.put` is part of the caller's transaction, so
  a blob and the ``files`` row that points at it commit together or not at all.
- :class:`S3Blobs`: an S3-compatible bucket (AWS S3, MinIO, Ceph, moto's server), through
  boto3. An object is written whole or not at all (S3 never shows a partial object), but
  not inside the database transaction: :mod:`memory.files` writes the object first, then
  commits the row, and removes the object again if the row is not committed.

Callers (:class:`memory.files.FileStore`) serialise writes and removals of one blob with a
PostgreSQL advisory lock keyed by its SHA-256, so an upload of bytes that another user
deletes at the same moment keeps its blob, whichever store holds the bytes.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Protocol

from sqlalchemy import Engine, text
from sqlmodel import Session

from errors import ConfigurationError, StorageError


def blob_key(sha256: str) -> str:
    """The relative key of the blob of ``sha256``: ``<sha[:2]>/<sha>`` (the ``files.blob_path`` value)."""
    return f"{sha256[:2]}/{sha256}"


class BlobStore(Protocol):
    """Bytes by SHA-256 (64 hex characters)."""

    kind: str
    """``postgres`` or ``s3`` (for logs and ``companion files`` output)."""

    def put(self, db: Session, sha256: str, data: bytes) -> None:
        """Store ``data`` as the blob of ``sha256`` (nothing happens if it is already stored).

        ``db`` is the caller's open transaction: :class:`PostgresBlobs` writes in it (the blob
        commits or rolls back with it); :class:`S3Blobs` writes the object at once.

        Raises:
            StorageError: the store refused the write.
        """
        ...

    def get(self, sha256: str) -> bytes | None:
        """The blob's bytes, or ``None`` when it is not stored.

        Raises:
            StorageError: the store could not be read.
        """
        ...

    def remove(self, db: Session, sha256: str) -> None:
        """Remove the blob of ``sha256`` (nothing happens if it is not stored); in ``db``'s
        transaction for :class:`PostgresBlobs`, at once for :class:`S3Blobs`."""
        ...

    def hashes(self) -> Iterator[str]:
        """The SHA-256 of every stored blob (for ``companion files`` maintenance and tests)."""
        ...


class PostgresBlobs:
    """Blobs in the ``file_blobs`` table (``sha256`` primary key, ``data`` ``bytea``).

    Args:
        engine: the runtime's database (for :meth:`get` and :meth:`hashes`, which need no transaction).
    """

    kind = "postgres"

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    def put(self, db: Session, sha256: str, data: bytes) -> None:
        if db.execute(text("SELECT 1 FROM file_blobs WHERE sha256 = :s").bindparams(s=sha256)).first():
            return  # stored already: do not send the bytes again
        db.execute(
            text(
                "INSERT INTO file_blobs (sha256, size_bytes, data) VALUES (:s, :n, :d) ON CONFLICT (sha256) DO NOTHING"
            ).bindparams(s=sha256, n=len(data), d=data)
        )

    def get(self, sha256: str) -> bytes | None:
        with self.engine.connect() as conn:
            value = conn.execute(text("SELECT data FROM file_blobs WHERE sha256 = :s").bindparams(s=sha256)).scalar()
        return None if value is None else bytes(value)

    def remove(self, db: Session, sha256: str) -> None:
        db.execute(text("DELETE FROM file_blobs WHERE sha256 = :s").bindparams(s=sha256))

    def hashes(self) -> Iterator[str]:
        with self.engine.connect() as conn:
            yield from conn.execute(text("SELECT sha256 FROM file_blobs ORDER BY sha256")).scalars()


class S3Blobs:
    """Blobs as objects ``<prefix><sha[:2]>/<sha>`` in an S3-compatible bucket, via boto3.

    Args:
        bucket: the bucket name; it must exist.
        endpoint_url: the S3 endpoint (``None``: AWS's own for ``region``).
        region: the region name (``None``: boto3's default chain).
        access_key_id, secret_access_key: credentials (``None``: boto3's default chain:
            ``AWS_*`` variables, the shared credentials file, an instance role).
        prefix: prepended to every key (``companion/`` keeps the blobs in one folder).

    Raises:
        ConfigurationError: boto3 is not installed (the ``s3`` extra).
    """

    kind = "s3"

    def __init__(
        self,
        *,
        bucket: str,
        endpoint_url: str | None = None,
        region: str | None = None,
        access_key_id: str | None = None,
        secret_access_key: str | None = None,
        prefix: str = "",
    ) -> None:
        try:
            import boto3
            from botocore.config import Config
        except ImportError as exc:
            raise ConfigurationError(
                "COMPANION_BLOB_STORE=s3 needs boto3: pip install 'companion-runtime[s3]'.",
                setting="COMPANION_BLOB_STORE",
            ) from exc

        self.bucket = bucket
        self.prefix = prefix
        self._client: Any = boto3.client(
            "s3",
            endpoint_url=endpoint_url,
            region_name=region,
            aws_access_key_id=access_key_id,
            aws_secret_access_key=secret_access_key,
            config=Config(retries={"max_attempts": 3, "mode": "standard"}),
        )

    def _key(self, sha256: str) -> str:
        return self.prefix + blob_key(sha256)

    def put(self, db: Session, sha256: str, data: bytes) -> None:
        with _s3_errors("write"):
            if self._size(sha256) == len(data):
                return
            self._client.put_object(Bucket=self.bucket, Key=self._key(sha256), Body=data)

    def _size(self, sha256: str) -> int | None:
        from botocore.exceptions import ClientError

        try:
            head = self._client.head_object(Bucket=self.bucket, Key=self._key(sha256))
        except ClientError as exc:
            if _missing(exc):
                return None
            raise
        return int(head["ContentLength"])

    def get(self, sha256: str) -> bytes | None:
        from botocore.exceptions import ClientError

        with _s3_errors("read"):
            try:
                body = self._client.get_object(Bucket=self.bucket, Key=self._key(sha256))["Body"]
            except ClientError as exc:
                if _missing(exc):
                    return None
                raise
            return bytes(body.read())

    def remove(self, db: Session, sha256: str) -> None:
        with _s3_errors("delete"):
            self._client.delete_object(Bucket=self.bucket, Key=self._key(sha256))

    def hashes(self) -> Iterator[str]:
        with _s3_errors("list"):
            pages = self._client.get_paginator("list_objects_v2").paginate(Bucket=self.bucket, Prefix=self.prefix)
            for page in pages:
                for item in page.get("Contents", ()):
                    yield str(item["Key"]).rsplit("/", 1)[-1]


def _missing(exc: Any) -> bool:
    return str(exc.response.get("Error", {}).get("Code", "")) in ("404", "NoSuchKey", "NotFound")


@contextmanager
def _s3_errors(verb: str) -> Iterator[None]:
    """Map botocore's errors (``BotoCoreError``, ``ClientError``) raised inside the block to
    :class:`StorageError` ``from`` the original. The message names the operation and the error
    code, never the endpoint, bucket or credentials."""
    from botocore.exceptions import BotoCoreError, ClientError

    try:
        yield
    except (BotoCoreError, ClientError) as exc:
        code = exc.response.get("Error", {}).get("Code") if isinstance(exc, ClientError) else None
        detail = type(exc).__name__ + (f" {code}" if code else "")
        raise StorageError(f"The file blob store could not {verb} a blob ({detail}); try again later.") from exc


__all__ = ["BlobStore", "PostgresBlobs", "S3Blobs", "blob_key"]

"""Connecting to the database: ``DATABASE_URL``, or the embedded server in the data directory.

Apart from the engine's other parts (:mod:`runtime.service._bootstrap`), so that a command that
only reads or writes the database (``companion breaker show``, ``companion profile show``)
imports storage alone.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine as SAEngine

from errors import ConfigurationError, SchemaError
from memory.database import check_connection, make_engine
from memory.embedded import EmbeddedSupervisor, start_embedded
from memory.vector_model import canonical_name
from runtime.config import Settings


@dataclass(frozen=True)
class Database:
    """A database the runtime can use."""

    url: str
    engine: SAEngine
    embedded: bool
    """True if the runtime started the server itself (no ``DATABASE_URL``)."""


def connect(settings: Settings) -> Database:
    """Connect to ``DATABASE_URL``, or start the embedded server in ``COMPANION_DATA_DIR``.

    Raises:
        ConfigurationError: ``DATABASE_URL`` is not a PostgreSQL URL (the message names the
            variable and the URL's scheme only: a URL may hold a password).
        StorageError: the server cannot be reached.

    Its connections name ``COMPANION_EMBEDDING_MODEL`` to the database, which keeps this process's
    vectors out once another model is recorded (:data:`memory.database.MODEL_SETTING`).
    """
    model = canonical_name(settings.embedding_model)
    if settings.database_url:
        try:
            engine = make_engine(settings.database_url, pool_size=settings.db_pool_size, embedding_model=model)
        except SchemaError as exc:
            raise ConfigurationError(f"DATABASE_URL: {exc}", setting="DATABASE_URL") from exc
        database = Database(settings.database_url, engine, embedded=False)
    else:
        url = start_embedded(settings.data_dir)
        database = Database(
            url, make_engine(url, pool_size=settings.db_pool_size, embedding_model=model), embedded=True
        )
    check_connection(database.engine)
    return database


def supervise(settings: Settings) -> EmbeddedSupervisor | None:
    """For a long-lived process (``companion serve``, ``companion jobs run``) on the embedded
    server (no ``DATABASE_URL``): start its supervisor, which restarts the server after a kill or
    a shutdown on a full disk and warns while the volume is low (``COMPANION_DISK_WARN_MB``).
    ``None`` with ``DATABASE_URL``: another server's supervision is its operator's."""
    if settings.database_url:
        return None
    return EmbeddedSupervisor(settings.data_dir, warn_free_bytes=settings.disk_warn_mb * 2**20).start()

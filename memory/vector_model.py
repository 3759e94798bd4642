"""Which embedding model made the stored vectors: the ``embedding_model`` row (migration 0018).

Every stored vector (``turn_vectors``, ``archived_segments.embedding``,
``knowledge_chunks.embedding``) comes from one model. ``vector(N)`` fixes only its dimension,
and two models of one dimension (all-MiniLM-L6-v2 and multilingual-e5-small, both 384) fill
the same columns with vectors of different spaces, so the runtime also records the model's
name and refuses to open the database with another one (:func:`check_model`).
``companion db reembed`` (:mod:`memory.reembed`) rewrites every vector and this record together.

Names are compared as configured (``COMPANION_EMBEDDING_MODEL``), after
:func:`canonical_name`: nothing here loads the model or imports torch, so commands that
never embed stay fast.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, text

from errors import EmbeddingModelMismatch
from memory.database import storage_errors
from memory.embeddings import BUNDLED_NAMES

TABLE = "embedding_model"
_SELECT = text(f"SELECT name, dimension FROM {TABLE} WHERE id = 1")
BUNDLED_NAME = "all-MiniLM-L6-v2"
"""The name recorded for every name of the bundled model (:data:`memory.embeddings.BUNDLED_NAMES`)."""


@dataclass(frozen=True)
class RecordedModel:
    """The model recorded for the stored vectors."""

    name: str
    dimension: int
    """Floats per vector."""


def canonical_name(name: str) -> str:
    """``name`` as recorded: the bundled model's names (``all-MiniLM-L6-v2``,
    ``sentence-transformers/all-MiniLM-L6-v2``) are one model, :data:`BUNDLED_NAME`; any
    other name (a hub name, a local path) as given."""
    return BUNDLED_NAME if name in BUNDLED_NAMES else name


def recorded_model(engine: Engine) -> RecordedModel | None:
    """The recorded model, or ``None`` when none is recorded yet.

    Raises:
        StorageError: the database failed (or is not migrated to 0018).
    """
    with storage_errors(), engine.connect() as conn:
        row = conn.execute(_SELECT).fetchone()
    return RecordedModel(row.name, int(row.dimension)) if row is not None else None


def record_model(conn: Connection, *, name: str, dimension: int) -> None:
    """Record ``name`` (canonical) and ``dimension`` as the stored vectors' model on ``conn``,
    replacing any record; the caller commits (with the vectors it rewrote, if any)."""
    conn.execute(
        text(
            f"INSERT INTO {TABLE} (id, name, dimension, recorded_at) VALUES (1, :n, :d, now()) "
            "ON CONFLICT (id) DO UPDATE SET name = EXCLUDED.name, dimension = EXCLUDED.dimension, "
            "recorded_at = EXCLUDED.recorded_at"
        ),
        {"n": canonical_name(name), "d": int(dimension)},
    )


def check_model(engine: Engine, *, model_name: str, model_dim: int) -> RecordedModel:
    """Check that the stored vectors were made by ``model_name``; record it when no model is recorded.

    With no record (a new database, or one upgraded from a version that kept none), the
    configured model is recorded: the stored vectors, if any, are assumed to be its own, as
    they were the only model the runtime could have been using before (a database that was
    switched to another model earlier without re-embedding cannot be told apart; run
    ``companion db reembed`` on it). Two processes opening a new database at once record
    one model; the second is checked against it.

    Args:
        model_name: the configured model (``COMPANION_EMBEDDING_MODEL``, ``embedder.name``).
        model_dim: the dimension it produces.

    Returns:
        The record, as it stands after the check.

    Raises:
        EmbeddingModelMismatch: another model (by canonical name) or dimension is recorded;
            the message names both models and says what to do.
        StorageError: the database failed.
    """
    with storage_errors(), engine.begin() as conn:
        conn.execute(
            text(f"INSERT INTO {TABLE} (id, name, dimension) VALUES (1, :n, :d) ON CONFLICT (id) DO NOTHING"),
            {"n": canonical_name(model_name), "d": int(model_dim)},
        )
        row = conn.execute(_SELECT).one()  # inserted above when missing
    recorded = RecordedModel(row.name, int(row.dimension))
    if recorded.name != canonical_name(model_name) or recorded.dimension != model_dim:
        raise EmbeddingModelMismatch(
            recorded_name=recorded.name, recorded_dim=recorded.dimension, model_name=model_name, model_dim=model_dim
        )
    return recorded

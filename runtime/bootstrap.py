"""Opening an engine: database (embedded or ``DATABASE_URL``), schema, embedder, persona."""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine as SAEngine

from memory.database import check_dimension, make_engine, require_schema, start_embedded, upgrade
from memory.embeddings import Embedder, SentenceTransformerEmbedder
from memory.store import Store
from persona import Persona, load_persona
from runtime.config import Settings
from runtime.engine import Engine
from runtime.model import LiteLLMReplier, Replier
from runtime.summarizer import Summarizer


@dataclass(frozen=True)
class Database:
    """A database the runtime can use."""

    url: str
    engine: SAEngine
    embedded: bool
    """True if the runtime started the server itself (no ``DATABASE_URL``)."""


def connect(settings: Settings) -> Database:
    """Connect to ``DATABASE_URL``, or start the embedded server in ``COMPANION_DATA_DIR``."""
    if settings.database_url:
        return Database(settings.database_url, make_engine(settings.database_url), embedded=False)
    url = start_embedded(settings.data_dir)
    return Database(url, make_engine(url), embedded=True)


def open_engine(
    settings: Settings,
    *,
    replier: Replier | None = None,
    persona: Persona | None = None,
    embedder: Embedder | None = None,
    summarizer: Summarizer | None = None,
    database: Database | None = None,
) -> Engine:
    """An engine ready for turns.

    The embedded database is migrated automatically; a ``DATABASE_URL`` database
    must already be at head (``companion db upgrade``).

    Raises:
        SchemaError: the database is not migrated.
        EmbeddingDimensionMismatch: the archive's vector(N) differs from the embedder's.
        PersonaError, ConfigurationError: a bad persona file or setting.
    """
    database = database or connect(settings)
    embedder = embedder or SentenceTransformerEmbedder(settings.embedding_model)
    if database.embedded:
        upgrade(database.engine, embedding_dim=embedder.dimension)
    require_schema(database.engine)
    check_dimension(database.engine, model_dim=embedder.dimension, model_name=embedder.name)
    return Engine(
        settings=settings,
        store=Store(database.engine),
        embedder=embedder,
        persona=persona or load_persona(settings.persona_file),
        replier=replier or LiteLLMReplier(model=settings.model, api_base=settings.api_base),
        summarizer=summarizer,
    )

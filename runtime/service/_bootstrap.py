"""Opening an engine: the model's window, database (embedded or ``DATABASE_URL``,
:mod:`runtime.service._database`), schema, embedder, persona."""

from __future__ import annotations

from collections.abc import Callable
from typing import Literal

import structlog

from errors import ConfigurationError, EmbedderUnavailableError, StorageError
from memory.database import check_dimension, current_revision, head_revision, require_schema, upgrade
from memory.embeddings import CachingEmbedder, Embedder, runtime_embedder
from memory.store import Store
from memory.vector_model import RecordedModel, canonical_name, check_model, recorded_model
from persona import Persona, load_persona
from runtime.compaction import Summarizer
from runtime.config import Settings
from runtime.files import open_file_services
from runtime.llm import (
    LiteLLMEmbedder,
    LiteLLMReplier,
    Replier,
    RetryPolicy,
    is_api_model,
    marks_cache,
    model_window,
)
from runtime.logs import configure_logging
from runtime.service._database import Database, connect
from runtime.turn import Engine

log = structlog.get_logger("companion.bootstrap")


def open_embedder(
    settings: Settings, *, preload: bool = False, recorded: Callable[[], RecordedModel | None] | None = None
) -> Embedder:
    """The runtime's embedder for ``settings``, behind a cache of recent texts' vectors.

    - A litellm embedding model (``openai/text-embedding-3-small``, ``ollama/bge-m3``, ...;
      :func:`runtime.llm.is_api_model`): :class:`runtime.llm.LiteLLMEmbedder` on
      ``COMPANION_EMBEDDING_API_BASE``, ``COMPANION_EMBEDDING_BATCH`` texts a request, retried within
      ``COMPANION_EMBEDDING_RETRY_SECONDS``. Its dimension is ``COMPANION_EMBEDDING_DIMENSIONS``, else
      learned by embedding one probe text now; while the API is down, the dimension ``recorded()``
      (the database's record) gives for the same model.
    - Anything else: ``COMPANION_EMBEDDING_MODEL`` run by ``COMPANION_EMBED_BACKEND`` on
      ``COMPANION_EMBED_THREADS`` threads behind a micro-batcher (concurrent turns share one
      forward pass) (:func:`memory.embeddings.runtime_embedder`). The model loads on first use,
      or, with ``preload``, starts loading at once on a thread of its own.

    Raises:
        ConfigurationError: a local model whose dimension cannot be read from its files and
            that cannot be loaded either, ``COMPANION_EMBED_BACKEND=onnx`` for a model that
            backend does not run, or an API model whose dimension could be learned neither from
            the API nor from the database. Errors of loading a local model (an export that fails, an
            unwritable ``COMPANION_MODEL_CACHE_DIR``, a damaged cached graph) are raised by the
            first embedding (:func:`memory.embeddings.runtime_embedder`).
    """
    if is_api_model(settings.embedding_model):
        return CachingEmbedder(api_embedder(settings, recorded=recorded))
    return runtime_embedder(
        settings.embedding_model,
        threads=settings.embed_threads,
        preload=preload,
        backend=settings.embed_backend,
        cache_dir=settings.model_cache_dir,
    )


def api_embedder(settings: Settings, *, recorded: Callable[[], RecordedModel | None] | None = None) -> LiteLLMEmbedder:
    """:class:`runtime.llm.LiteLLMEmbedder` for ``settings`` (see :func:`open_embedder`), uncached.

    Raises:
        ConfigurationError: the API is down and no dimension is configured or recorded for the model.
    """
    key = settings.embedding_api_key.get_secret_value() if settings.embedding_api_key else None

    def made(dimension: int | None) -> LiteLLMEmbedder:
        return LiteLLMEmbedder(
            settings.embedding_model,
            api_base=settings.embedding_api_base,
            api_key=key,
            dimension=dimension,
            send_dimension=settings.embedding_dimensions is not None,
            batch=settings.embedding_batch,
            timeout=settings.embedding_timeout,
            retry=RetryPolicy(retries=5, total_seconds=settings.embedding_retry_seconds),
        )

    try:
        return made(settings.embedding_dimensions)
    except EmbedderUnavailableError as exc:
        try:
            known = recorded() if recorded is not None else None
        except StorageError:  # a database not migrated yet records nothing
            known = None
        if known is None or known.name != canonical_name(settings.embedding_model):
            raise ConfigurationError(
                f"{exc} Its dimension is not known: set COMPANION_EMBEDDING_DIMENSIONS, or start when the API answers.",
                setting="COMPANION_EMBEDDING_MODEL",
            ) from exc
        log.warning("embedder.unavailable", model=settings.embedding_model, at="start", dimension=known.dimension)
        return made(known.dimension)


def settings_for_model(settings: Settings) -> Settings:
    """``settings`` with a window the model can take.

    ``COMPANION_CONTEXT_WINDOW``, when set, is the window. Otherwise litellm's model
    map gives the model's input window: budgets that total more are scaled down to
    it; budgets that total less stay as they are (a 128k model does not make every
    cap five times larger).

    Raises:
        UnknownModelError: litellm does not know the model and no window was set.
    """
    if settings.context_window is not None:
        return settings
    window = model_window(settings.model)
    return settings.model_copy(update={"context_window": window}) if window < settings.budgets.total else settings


def check_persona_fits(persona: Persona, settings: Settings) -> None:
    """At start-up, not at the first turn: the persona's parts that are never cut must fit the
    ``persona`` budget (scaled to the window), counted as a turn counts them, with the default
    user name.

    Raises:
        ConfigurationError: they do not (``COMPANION_BUDGET_PERSONA``), with the message a turn
            would give.
    """
    from runtime.accounting import counter_for
    from runtime.context import render_persona

    render_persona(persona, cap=settings.scaled_budgets.persona, counter=counter_for(settings.model))


def open_engine(
    settings: Settings,
    *,
    with_model: bool = True,
    replier: Replier | None = None,
    persona: Persona | None = None,
    embedder: Embedder | None = None,
    summarizer: Summarizer | None = None,
    database: Database | None = None,
    compaction: Literal["inline", "queue"] = "inline",
    parsing: Literal["inline", "queue"] = "inline",
) -> Engine:
    """An engine ready for turns.

    The embedded database is migrated automatically; a ``DATABASE_URL`` database
    must already be at head (``companion db upgrade``). Stored files still ``pending``
    (their process stopped before parsing them) start parsing in the background.

    Args:
        with_model: ``False`` opens an engine that never calls the chat model (replay,
            where the replies come from a file): no window lookup, no replier.
        compaction: where compaction runs after the reply when ``COMPANION_COMPACTION`` is
            unset (the caller's default): ``inline``, or ``queue`` (a job for a queue worker,
            :class:`~runtime.service.QueuedCompaction`; close it with ``engine.runner.scheduler.close()``).
        parsing: where an upload's parse runs: ``inline`` (this process's background parse
            threads) or ``queue`` (a ``parse:parse_file`` job any queue worker runs,
            :class:`~runtime.service.QueuedParses`; ``engine.file_services.close()`` closes it).

    Raises:
        UnknownModelError: litellm does not know ``COMPANION_MODEL``'s window and
            ``COMPANION_CONTEXT_WINDOW`` is unset (checked first, before the database).
        SchemaError: the database is not migrated.
        EmbeddingDimensionMismatch: the archive's vector(N) differs from the embedder's.
        EmbeddingModelMismatch: the stored vectors were made by another model than the embedder's
            (recorded in the database; the first open records the embedder's,
            :func:`memory.vector_model.check_model`).
        PersonaError, ConfigurationError: a bad persona file or setting, or a persona whose parts
            that are never cut exceed the ``persona`` budget (:func:`check_persona_fits`): checked
            when the engine opens, before the database, never first at a turn.
    """
    if not structlog.is_configured():  # a library caller who set up structlog keeps their setup
        configure_logging(settings.log_level, settings.log_format)
    if with_model:
        settings = settings_for_model(settings)
        replier = replier or LiteLLMReplier(
            model=settings.model,
            api_base=settings.api_base,
            timeout=settings.model_timeout,
            retry=RetryPolicy(retries=settings.model_retries, total_seconds=settings.model_retry_seconds),
            cache_markers=marks_cache(settings.model, settings.cache_markers),
            cache_ttl=settings.cache_ttl,
        )
    persona = persona or load_persona(settings.persona_file)  # a bad card or lorebook regex: refused here
    check_persona_fits(persona, settings)
    database = database or connect(settings)
    embedder = embedder or open_embedder(settings, recorded=lambda: recorded_model(database.engine))
    if database.embedded and current_revision(database.engine) != head_revision():
        upgrade(database.engine, embedding_dim=embedder.dimension)
    require_schema(database.engine)
    check_dimension(database.engine, model_dim=embedder.dimension, model_name=embedder.name)
    check_model(database.engine, model_name=embedder.name, model_dim=embedder.dimension)  # no model load
    queue = None
    if parsing == "queue":
        from runtime.service._parse_jobs import QueuedParses

        queue = QueuedParses(database.engine)
    services = open_file_services(settings, database.engine, queue=queue)
    resumed = services.parses.request_pending()  # files a stopped process left unparsed
    if resumed:
        log.info("file.parse.resumed", files=resumed)
    scheduler = None
    backfill = None
    if (settings.compaction or compaction) == "queue":
        from runtime.service._backfill_jobs import QueuedBackfill
        from runtime.service._queue import QueuedCompaction

        scheduler = QueuedCompaction(database.engine)
        backfill = QueuedBackfill(scheduler.app)
    engine = Engine(
        compaction=scheduler,
        settings=settings,
        store=Store(database.engine),
        embedder=embedder,
        persona=persona,
        replier=replier,
        summarizer=summarizer,
        file_services=services,
    )
    if backfill is not None:  # queued compaction: the backfill is a queued job too
        engine.use(reranker=engine.reranker, backfill=backfill)
    default = engine.cast.default  # the persona stored as the deployment's default character (revised if changed)
    log.info("character.default", character_id=default.id, revision=default.revision)
    return engine

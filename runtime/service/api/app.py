"""The FastAPI application: :func:`create_app` builds it around one opened engine;
:func:`app_from_env` opens the engine from the environment first (uvicorn's factory mode,
one engine per worker process for ``companion serve --workers N``)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI
from fastapi.responses import JSONResponse

from runtime.service.api import characters, files, memories, openai_compat, playground, profiles, sessions
from runtime.service.api.deps import Services, checked_params
from runtime.service.api.errors import install_error_handlers
from runtime.service.api.limits import MULTIPART_OVERHEAD_BYTES, BodyLimit
from runtime.turn import Engine

API_VERSION = "1"


def create_app(engine: Engine, *, job_worker: bool = False, owns_engine: bool = False) -> FastAPI:
    """The HTTP API on ``engine`` (shared by every request; blocking calls run in threads).

    Routes: ``/v1/users…``, ``/v1/sessions…`` (see :mod:`runtime.service.api.sessions`),
    ``/v1/characters…`` (:mod:`runtime.service.api.characters`), files
    (:mod:`runtime.service.api.files`), pinned profiles (:mod:`runtime.service.api.profiles`),
    ``POST /v1/chat/completions`` (:mod:`runtime.service.api.openai_compat`), ``GET /healthz``
    (no key needed), the playground page at ``/`` and ``/playground`` (:mod:`runtime.service.api.playground`;
    the page needs no key, its data calls do), and the OpenAPI schema at ``/openapi.json`` (docs at ``/docs``).

    With ``job_worker`` the app runs a queue worker (:class:`runtime.service.QueueWorker`) for
    its lifespan: started before the first request, stopped (the job in progress finishing)
    at shutdown, when the engine's queued-compaction pool is closed too. With ``owns_engine``
    (the app opened the engine and nothing else uses it) the engine's file services are closed
    at shutdown as well: running parses end, the parse queue's pool closes.
    """

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        from runtime.service._queue import QueueWorker

        worker = QueueWorker(engine, name="serve").start() if job_worker else None
        try:
            yield
        finally:
            if worker is not None:
                worker.stop()
            close = getattr(engine.runner.scheduler, "close", None)
            if close is not None:
                close()
            if owns_engine and engine.file_services is not None:
                engine.file_services.close()  # running parses end; the parse queue's pool closes

    app = FastAPI(
        lifespan=lifespan,
        title="companion-runtime",
        version=API_VERSION,
        description="Long-running companion chat with managed memory. Authenticate with "
        "`Authorization: Bearer KEY` (an app's key from `companion apps create NAME`).",
        dependencies=[Depends(checked_params)],
    )
    app.state.services = Services(engine=engine, directory=engine.store.apps)
    app.add_middleware(
        BodyLimit,
        json_bytes=engine.settings.max_json_bytes,
        upload_bytes=engine.settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES,
        upload_paths=("/v1/characters",),
    )
    install_error_handlers(app)
    app.include_router(sessions.router)
    app.include_router(characters.router)
    app.include_router(memories.router)
    app.include_router(openai_compat.router)
    app.include_router(files.router)
    app.include_router(profiles.router)
    app.include_router(playground.router)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. No key needed."""
        return {"status": "ok"}

    @app.get(
        "/readyz",
        tags=["service"],
        responses={503: {"description": "Storage is down: send no traffic here until it answers again."}},
    )
    def readyz() -> JSONResponse:
        """Readiness: 200 while the database answers, 503 while it does not (an orchestrator
        stops sending traffic). No key needed."""
        if engine.store.ready():
            return JSONResponse({"status": "ready"})
        return JSONResponse({"status": "unavailable", "storage": "down"}, status_code=503)

    return app


def app_from_env(*, job_worker: bool = True) -> FastAPI:
    """The HTTP API on an engine opened from the environment (``Settings.from_env()``), with
    compaction (unless ``COMPANION_COMPACTION`` says ``inline``) and parses queued and, with ``job_worker``,
    a queue worker in this process, as ``companion serve`` runs them.

    uvicorn calls it once in each worker process (``factory=True``), so every worker opens
    its own engine: its own database pool, embedder, file services and queue worker.
    ``DATABASE_URL`` must name a database at head; ``companion serve --workers N`` starts the
    embedded server and migrates it before the workers start.

    Raises:
        ConfigurationError, SchemaError, UnknownModelError: as :func:`runtime.service.open_engine`.
    """
    import os

    import structlog

    from runtime.config import Settings
    from runtime.service import open_engine

    engine = open_engine(Settings.from_env(), compaction="queue", parsing="queue")
    warm_embedder(engine)
    structlog.get_logger("companion.service").info("service.worker_ready", pid=os.getpid())
    return create_app(engine, job_worker=job_worker, owns_engine=True)


def app_from_env_without_worker() -> FastAPI:
    """:func:`app_from_env` without a queue worker (``companion serve --workers N --no-worker``)."""
    return app_from_env(job_worker=False)


def warm_embedder(engine: Engine) -> None:
    """Load the embedding model in a background thread (one text embedded), so the server starts
    answering at once and the first turn does not pay for the load. A model that cannot load is
    logged (``embedder.warm_up_failed``); every turn then says so too."""
    import threading

    def warm() -> None:
        import structlog

        from errors import CompanionError

        try:
            engine.embedder.embed(["warm-up"])
        except CompanionError as exc:
            structlog.get_logger("companion.service").warning("embedder.warm_up_failed", error=type(exc).__name__)

    threading.Thread(target=warm, name="companion-embedder-warm-up", daemon=True).start()

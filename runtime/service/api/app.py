"""The FastAPI application: :func:`create_app` builds it around one opened engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from fastapi import Depends, FastAPI

from memory.apps import Directory
from runtime.service.api import files, openai_compat, playground, profiles, sessions
from runtime.service.api.deps import Services, checked_params
from runtime.service.api.errors import install_error_handlers
from runtime.service.api.limits import MULTIPART_OVERHEAD_BYTES, BodyLimit
from runtime.turn import Engine

API_VERSION = "1"


def create_app(engine: Engine, *, job_worker: bool = False) -> FastAPI:
    """The HTTP API on ``engine`` (shared by every request; blocking calls run in threads).

    Routes: ``/v1/users…``, ``/v1/sessions…`` (see :mod:`runtime.service.api.sessions`), files
    (:mod:`runtime.service.api.files`), pinned profiles (:mod:`runtime.service.api.profiles`),
    ``POST /v1/chat/completions`` (:mod:`runtime.service.api.openai_compat`), ``GET /healthz``
    (no key needed), the playground page at ``/`` and ``/playground`` (:mod:`runtime.service.api.playground`;
    the page needs no key, its data calls do), and the OpenAPI schema at ``/openapi.json`` (docs at ``/docs``).

    With ``job_worker`` the app runs a queue worker (:class:`runtime.service.QueueWorker`) for
    its lifespan: started before the first request, stopped (the job in progress finishing)
    at shutdown, when the engine's queued-compaction pool is closed too.
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

    app = FastAPI(
        lifespan=lifespan,
        title="companion-runtime",
        version=API_VERSION,
        description="Long-running companion chat with managed memory. Authenticate with "
        "`Authorization: Bearer KEY` (an app's key from `companion apps create NAME`).",
        dependencies=[Depends(checked_params)],
    )
    app.state.services = Services(engine=engine, directory=Directory(engine.store.engine))
    app.add_middleware(
        BodyLimit,
        json_bytes=engine.settings.max_json_bytes,
        upload_bytes=engine.settings.max_file_bytes + MULTIPART_OVERHEAD_BYTES,
    )
    install_error_handlers(app)
    app.include_router(sessions.router)
    app.include_router(openai_compat.router)
    app.include_router(files.router)
    app.include_router(profiles.router)
    app.include_router(playground.router)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. No key needed."""
        return {"status": "ok"}

    return app

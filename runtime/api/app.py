"""The FastAPI application: :func:`create_app` builds it around one opened engine."""

from __future__ import annotations

from fastapi import FastAPI

from memory.apps import Directory
from runtime.api import files, openai_compat, profiles, sessions
from runtime.api.deps import Services
from runtime.api.errors import install_error_handlers
from runtime.engine import Engine

API_VERSION = "1"


def create_app(engine: Engine) -> FastAPI:
    """The HTTP API on ``engine`` (shared by every request; blocking calls run in threads).

    Routes: ``/v1/users…``, ``/v1/sessions…`` (see :mod:`runtime.api.sessions`), files
    (:mod:`runtime.api.files`), pinned profiles (:mod:`runtime.api.profiles`),
    ``POST /v1/chat/completions`` (:mod:`runtime.api.openai_compat`), ``GET /healthz``
    (no key needed), and the OpenAPI schema at ``/openapi.json`` (docs at ``/docs``).
    """
    app = FastAPI(
        title="companion-runtime",
        version=API_VERSION,
        description="Long-running companion chat with managed memory. Authenticate with "
        "`Authorization: Bearer KEY` (an app's key from `companion apps create NAME`).",
    )
    app.state.services = Services(engine=engine, directory=Directory(engine.store.engine))
    install_error_handlers(app)
    app.include_router(sessions.router)
    app.include_router(openai_compat.router)
    app.include_router(files.router)
    app.include_router(profiles.router)

    @app.get("/healthz", tags=["service"])
    def healthz() -> dict[str, str]:
        """Liveness: the process answers. No key needed."""
        return {"status": "ok"}

    return app

"""One mapping from the runtime's exceptions to HTTP answers.

Every class in :mod:`errors` has its own entry in :data:`ERRORS` (a test checks
that none is missing): an HTTP status and a stable ``code`` string. Every error body
has one shape, which is also the OpenAI API's::

    {"error": {"code": "session_closed", "message": "...", "type": "SessionClosedError"}}

plus ``"param"`` when one request field or header is to blame. FastAPI's request
validation errors answer 422 ``invalid_request``; ``HTTPException`` keeps its status
with code ``http_<status>``; anything else answers 500 ``internal_error`` without
details (the traceback goes to the log).
"""

from __future__ import annotations

import re
from typing import Any

import structlog
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

import errors as E

log = structlog.get_logger("companion.api")

STATUSES: dict[type[E.CompanionError], int] = {
    E.CompanionError: 500,
    E.InputError: 400,
    E.InvalidMessageError: 422,
    E.InvalidRequestError: 400,
    E.InvalidFieldError: 422,
    E.UncountableContentError: 422,
    E.PersonaError: 422,
    E.KnowledgeFileError: 422,
    E.AuthenticationError: 401,
    E.FileError: 400,
    E.FileInputError: 422,
    E.FileParseError: 422,
    E.NotFoundError: 404,
    E.FileNotFound: 404,
    E.ConflictError: 409,
    E.SessionOwnershipError: 409,
    E.SessionClosedError: 409,
    E.TurnInProgressError: 409,
    E.TurnsChangedError: 409,
    E.UserErasingError: 409,
    E.CharacterInUseError: 409,
    E.CharacterReadOnlyError: 409,
    E.ConfigurationError: 500,
    E.UnknownModelError: 500,
    E.SchemaError: 500,
    E.EmbeddingDimensionMismatch: 500,
    E.EmbeddingModelMismatch: 500,
    E.DependencyError: 502,
    E.ModelCallError: 502,
    E.ModelAuthError: 502,
    E.ModelRequestError: 502,
    E.ModelUnavailableError: 503,
    E.EmbedderUnavailableError: 503,
    E.ContextOverflowError: 502,
    E.SummarizationError: 500,
    E.StorageError: 503,
}
"""Exception class → HTTP status: 4xx for the input, not-found and conflict branches, 5xx for
configuration and dependencies."""

ERRORS: dict[type[E.CompanionError], tuple[int, str]] = {cls: (status, cls.code) for cls, status in STATUSES.items()}
"""Exception class → (HTTP status, stable code, the class's own :attr:`~errors.CompanionError.code`).
Looked up by exact class, then by its bases."""


def status_and_code(exc: E.CompanionError) -> tuple[int, str]:
    """The HTTP status and stable code of ``exc`` (its nearest mapped class)."""
    for cls in type(exc).__mro__:
        if cls in ERRORS:
            return ERRORS[cls]
    return ERRORS[E.CompanionError]


INTERNAL_ERROR: dict[str, Any] = {
    "error": {
        "code": "internal_error",
        "message": "Internal server error; see the server log.",
        "type": "InternalError",
    }
}
"""The body of any error that is not a :class:`~errors.CompanionError` (no details leak)."""


PUBLIC_MESSAGES: dict[type[E.CompanionError], str] = {
    E.StorageError: "The database is unavailable or refused the request; nothing was half-written. Try again later.",
}
"""Classes whose own message is never sent: it carries the driver's text (hosts, socket paths,
SQL). The body says what failed in our terms; the detail goes to the log."""

STORED_BEFORE_FAILURE: dict[type[E.CompanionError], str] = {
    E.StorageError: "The database became unavailable after your message was stored; it is kept, but no reply "
    "was written. Try again later: the next message is answered with it in view.",
}
"""The public message of a class when the turn had stored the user's message before the failure
(:attr:`errors.CompanionError.user_turn_stored`), so that the error says what storage holds."""

_SERVER_PATH = re.compile(r"(?<![\w.:/])/(?:[\w.@%+=-]+/)+[\w.@%+=-]*")
"""An absolute filesystem path (``/var/run/postgresql/.s.PGSQL.5432``, ``/srv/files/ab/cd``)."""


def public_message(exc: E.CompanionError) -> str:
    """What a client may read of ``exc``: the fixed text of :data:`PUBLIC_MESSAGES` for its
    class, else its message with absolute server paths replaced by ``<path>`` for a 5xx."""
    for cls in type(exc).__mro__:
        if exc.user_turn_stored and cls in STORED_BEFORE_FAILURE:
            return STORED_BEFORE_FAILURE[cls]
        if cls in PUBLIC_MESSAGES:
            return PUBLIC_MESSAGES[cls]
    status, _ = status_and_code(exc)
    message = str(exc)
    return _SERVER_PATH.sub("<path>", message) if status >= 500 else message


def error_body(exc: BaseException) -> dict[str, Any]:
    """The JSON error body of ``exc``: code, message, type, and ``param``/``reason`` when
    known; :data:`INTERNAL_ERROR` for an exception outside the hierarchy. A message that
    may carry server details (:func:`public_message`) is logged as ``api.error_detail``
    and replaced in the body."""
    if not isinstance(exc, E.CompanionError):
        return INTERNAL_ERROR
    _, code = status_and_code(exc)
    message = public_message(exc)
    if message != str(exc):
        log.warning("api.error_detail", code=code, error=type(exc).__name__, detail=str(exc))
    body: dict[str, Any] = {"code": code, "message": message, "type": type(exc).__name__}
    param = getattr(exc, "field", None) or getattr(exc, "setting", None)
    if param:
        body["param"] = param
    reason = getattr(exc, "reason", None)
    if reason:
        body["reason"] = reason
    if isinstance(exc, E.TurnsChangedError):
        body["last_seq"] = exc.last_seq
    if isinstance(exc, E.CharacterInUseError):
        body["sessions"] = exc.sessions
    if exc.user_turn_stored:
        body["user_turn_stored"] = True
    return {"error": body}


def error_response(exc: E.CompanionError) -> JSONResponse:
    status, _ = status_and_code(exc)
    headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
    return JSONResponse(error_body(exc), status_code=status, headers=headers)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to one JSON shape."""

    async def companion_error(request: Request, exc: E.CompanionError) -> JSONResponse:
        status, code = status_and_code(exc)
        (log.warning if status >= 500 else log.info)(
            "api.error", path=request.url.path, status=status, code=code, error=type(exc).__name__
        )
        return error_response(exc)

    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        problems = exc.errors()
        first = problems[0] if problems else {}
        where = ".".join(str(p) for p in first.get("loc", ()) if p != "body")
        message = f"{where}: {first.get('msg', 'invalid')}" if where else str(first.get("msg", "invalid request"))
        body = {"code": "invalid_request", "message": message, "type": "RequestValidationError"}
        if where:
            body["param"] = where
        return JSONResponse({"error": body}, status_code=422)

    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        body = {"code": f"http_{exc.status_code}", "message": str(exc.detail), "type": "HTTPException"}
        return JSONResponse({"error": body}, status_code=exc.status_code, headers=getattr(exc, "headers", None))

    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.error("api.unexpected_error", path=request.url.path, error=type(exc).__name__, exc_info=exc)
        return JSONResponse(INTERNAL_ERROR, status_code=500)

    # Starlette types every handler as taking Exception; it calls each one with the class it is registered for.
    app.add_exception_handler(E.CompanionError, companion_error)  # type: ignore[arg-type]
    app.add_exception_handler(RequestValidationError, validation_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, http_error)  # type: ignore[arg-type]
    app.add_exception_handler(Exception, unexpected)

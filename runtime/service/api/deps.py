"""Request dependencies: the shared engine and directory, and the calling app (by API key)."""

from __future__ import annotations

from dataclasses import dataclass

from fastapi import Depends, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from errors import AuthenticationError
from memory.apps import Directory
from memory.tables import App
from memory.validation import check_id, check_text
from runtime.turn import Engine


@dataclass(frozen=True)
class Services:
    """What every route shares: one engine (opened once per server) and the app directory."""

    engine: Engine
    directory: Directory


def services(request: Request) -> Services:
    return request.app.state.services


_bearer = HTTPBearer(auto_error=False, description="The app's API key (`companion apps create NAME`).")


async def current_app(
    credentials: HTTPAuthorizationCredentials | None = Depends(_bearer),
    svc: Services = Depends(services),
) -> App:
    """The app whose key the request carries as ``Authorization: Bearer KEY``.

    Raises:
        AuthenticationError: no key, or a key no app has (401).
    """
    if credentials is None or not credentials.credentials:
        raise AuthenticationError("Send the app's API key as 'Authorization: Bearer KEY'.")
    app = await run_in_threadpool(svc.directory.app_for_key, credentials.credentials)
    if app is None:
        raise AuthenticationError("The API key is not valid. Create one with `companion apps create NAME`.")
    return app


MAX_QUERY_CHARS = 10_000
"""Longest query parameter value accepted, characters."""


async def checked_params(request: Request) -> None:
    """Every path parameter (ids: :func:`memory.validation.check_id`) and query parameter
    (:func:`memory.validation.check_text`) obeys the message's rules, for every route.

    Raises:
        InvalidFieldError: naming the parameter (422), before any storage is touched.
    """
    for name, value in request.path_params.items():
        check_id(value, field=name)
    for name, value in request.query_params.multi_items():
        check_text(value, field=name, max_chars=MAX_QUERY_CHARS)
    for header in ("x-session-id",):
        if header in request.headers:
            check_id(request.headers[header], field="X-Session-Id")

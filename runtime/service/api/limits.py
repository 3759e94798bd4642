"""Request body limits, enforced while the body streams in (pure ASGI middleware).

A body is refused with 413 ``request_too_large`` as soon as it is known to be too large:
at once when ``Content-Length`` says so (nothing is read), else when the bytes received
pass the limit (the rest is never read, and the app's own answer is replaced). The limit
is ``upload_bytes`` for ``multipart/form-data`` (uploads) and for any body sent to an
``upload_paths`` route (character cards, whose JSON holds whole lorebooks), and ``json_bytes``
for any other body. The error body has the API's one shape and names the setting to raise.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable
from typing import Any

import structlog

log = structlog.get_logger("companion.api")

MULTIPART_OVERHEAD_BYTES = 64 * 1024
"""Room for multipart boundaries and form fields beside the file itself, bytes."""

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]


class BodyLimit:
    """ASGI middleware: refuse request bodies over their limit while they stream in.

    Args:
        app: the ASGI app.
        json_bytes: largest non-multipart body, bytes (``COMPANION_MAX_JSON_BYTES``).
        upload_bytes: largest ``multipart/form-data`` body, bytes (``COMPANION_MAX_FILE_BYTES``
            plus :data:`MULTIPART_OVERHEAD_BYTES`), and of any body sent to a path under ``upload_paths``.
        upload_paths: path prefixes whose bodies are uploads whatever their type.
    """

    def __init__(
        self,
        app: Callable[..., Awaitable[None]],
        *,
        json_bytes: int,
        upload_bytes: int,
        upload_paths: tuple[str, ...] = (),
    ) -> None:
        self.app = app
        self.json_bytes = json_bytes
        self.upload_bytes = upload_bytes
        self.upload_paths = upload_paths

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.lower(): v for k, v in scope.get("headers", [])}
        upload = headers.get(b"content-type", b"").lower().startswith(b"multipart/form-data") or str(
            scope.get("path", "")
        ).startswith(self.upload_paths)
        limit, setting = (
            (self.upload_bytes, "COMPANION_MAX_FILE_BYTES") if upload else (self.json_bytes, "COMPANION_MAX_JSON_BYTES")
        )
        declared = headers.get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            await self._refuse(send, scope, limit, setting, int(declared))
            return
        received = 0
        over = False
        started = False

        async def limited_receive() -> dict[str, Any]:
            nonlocal received, over
            if over:  # never read past the limit, whatever the app asks
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    over = True
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: dict[str, Any]) -> None:
            nonlocal started
            if over:  # the app answered a body it never fully got: answer 413 instead
                return
            started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, guarded_send)
        except Exception:
            if not over:
                raise
        if over and not started:
            await self._refuse(send, scope, limit, setting, None)

    @staticmethod
    async def _refuse(send: Send, scope: Scope, limit: int, setting: str, declared: int | None) -> None:
        log.info("api.body_too_large", path=scope.get("path"), limit_bytes=limit, declared_bytes=declared)
        size = f"{declared:,} bytes" if declared is not None else "more than that"
        body = json.dumps(
            {
                "error": {
                    "code": "request_too_large",
                    "message": f"The request body is {size}; at most {limit:,} bytes are accepted here ({setting}).",
                    "type": "RequestTooLarge",
                    "param": "body",
                }
            }
        ).encode()
        await send(
            {
                "type": "http.response.start",
                "status": 413,
                "headers": [
                    (b"content-type", b"application/json"),
                    (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close"),
                ],
            }
        )
        await send({"type": "http.response.body", "body": body})

"""Stored files of the calling app's users: upload, list, metadata, read a window, delete.

Uploads are ``multipart/form-data`` with one ``file`` part (python-multipart parses it).
The stored name is the part's RFC 5987 ``filename*`` (e.g. ``filename*=UTF-8''%E6%97%A5%E8%A8%98.txt``)
when it has one, else its plain ``filename``; see :class:`ExtendedFilenameParser`.
A file belongs to one user (its internal id); every route resolves the file's owner
within the calling app only, so another app's file id answers 404 ``file_not_found``
exactly like an unknown one. Parsing runs in the background after the upload; the
metadata route shows its state, and the read route waits for it at most
``COMPANION_FILE_READ_WAIT`` seconds, as the ``file_read`` tool does.
"""

from __future__ import annotations

from collections.abc import Callable, Coroutine
from email.message import Message
from typing import Any, Literal

from fastapi import APIRouter, Depends, File, Form, Query, Request, Response, UploadFile, status
from fastapi.concurrency import run_in_threadpool
from fastapi.routing import APIRoute
from starlette.exceptions import HTTPException
from starlette.formparsers import MultiPartException, MultiPartParser

from errors import ConfigurationError, InvalidRequestError, NotFoundError
from memory.files import file_not_found
from memory.tables import App
from runtime.files import FileServices
from runtime.service.api.convert import file_out
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.schemas import ErrorBody, FileDeleteOut, FileOut, FileReadOut

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
    404: {
        "model": ErrorBody,
        "description": "No such user, session or file for this app (`not_found`, `file_not_found`).",
    },
}


def prefer_extended_filename(disposition: bytes, charset: str = "utf-8") -> bytes:
    """A part's ``Content-Disposition`` value with its RFC 5987 ``filename*`` made the plain ``filename``.

    ``disposition`` is the raw header value (bytes as sent). When it carries ``filename*``
    (``charset'language'percent-encoded``, RFC 5987 / RFC 2231, as curl, requests and browsers'
    ``fetch`` polyfills write for non-ASCII names), the result is ``form-data; name="…";
    filename="<decoded name>"`` encoded in ``charset`` (the form's charset), so the extended
    name wins over an ASCII fallback ``filename`` beside it, and a part with only ``filename*``
    is a file. RFC 7578 section 4.2 discourages ``filename*`` in forms and python-multipart drops
    it, but clients send it. A ``filename*`` that does not decode (unknown charset, bad bytes)
    is dropped; the plain ``filename``, if any, stays. Without ``filename*`` the value is
    returned unchanged.

    Raises:
        InvalidRequestError: ``filename*`` does not decode and there is no plain ``filename``
            (field ``file``).
    """
    if b"filename*" not in disposition.lower():
        return disposition
    message = Message()
    message["content-disposition"] = disposition.decode("latin-1")
    params = message.get_params(header="content-disposition") or []
    kind = params[0][0] if params else "form-data"
    plain: dict[str, str] = {}
    extended: str | None = None
    for key, value in params[1:]:
        if isinstance(value, tuple):  # an RFC 2231 value: (charset, language, text as latin-1 code points)
            if key.lower() == "filename" and extended is None:
                try:
                    extended = bytes(value[2], "raw-unicode-escape").decode(value[0] or "us-ascii")
                except (LookupError, UnicodeDecodeError):
                    continue
        else:
            plain[key.lower()] = value
    if extended is not None:
        plain["filename"] = extended.encode(charset, "replace").decode("latin-1")
    elif "filename" not in plain:
        raise InvalidRequestError(
            "The file part's filename* does not decode: give charset''percent-encoded-name (RFC 5987), "
            "e.g. filename*=UTF-8''%E6%97%A5%E8%A8%98.txt.",
            field="file",
        )
    parts = [kind] + [
        '{}="{}"'.format(key, value.replace("\\", "\\\\").replace('"', '\\"')) for key, value in plain.items()
    ]
    return "; ".join(parts).encode("latin-1")


class ExtendedFilenameParser(MultiPartParser):
    """Starlette's multipart parser, with each part's name taken by :func:`prefer_extended_filename`."""

    def on_headers_finished(self) -> None:
        part = self._current_part
        if part.content_disposition is not None:  # none at all: Starlette's own parse says what is missing
            part.content_disposition = prefer_extended_filename(part.content_disposition, self._charset)
        super().on_headers_finished()


class _ExtendedFilenameRoute(APIRoute):
    """Routes whose ``multipart/form-data`` body is parsed by :class:`ExtendedFilenameParser`.

    The form is parsed before FastAPI reads it and kept on the request (Starlette's
    ``Request._form`` cache, which ``request.form()`` returns and closes), so the route's
    ``File``/``Form`` parameters and the OpenAPI schema stay FastAPI's. A malformed body
    answers 400, as Starlette's own parse does.
    """

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def parse_then_handle(request: Request) -> Response:
            if request.headers.get("content-type", "").lower().startswith("multipart/form-data"):
                try:
                    request._form = await ExtendedFilenameParser(request.headers, request.stream()).parse()
                except MultiPartException as exc:
                    raise HTTPException(status_code=400, detail=exc.message) from None
            return await handler(request)

        return parse_then_handle


router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES, tags=["files"], route_class=_ExtendedFilenameRoute)

OCTET_STREAM = "application/octet-stream"


def file_services(svc: Services = Depends(services)) -> FileServices:
    """The engine's file services.

    Raises:
        ConfigurationError: the server's engine was opened without a file store.
    """
    if svc.engine.file_services is None:
        raise ConfigurationError(
            "This server has no file store. Open the engine with runtime.service.open_engine (COMPANION_BLOB_STORE).",
            setting="COMPANION_BLOB_STORE",
        )
    return svc.engine.file_services


@router.post(
    "/users/{user_id}/files",
    response_model=FileOut,
    status_code=status.HTTP_201_CREATED,
    responses={
        422: {"model": ErrorBody, "description": "Bad name, no bytes, too large, bad durability (`file_invalid`)."},
    },
)
async def upload_file(
    user_id: str,
    file: UploadFile = File(
        description="The file's bytes; its filename (RFC 5987 `filename*` if given, else `filename`) is the stored name."
    ),
    durability: Literal["durable", "ephemeral"] = Form(
        "durable", description="`durable` (every session of the user) or `ephemeral` (one session)."
    ),
    session_id: str | None = Form(None, description="For `ephemeral`: the user's session the file is valid in."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
    fs: FileServices = Depends(file_services),
):
    """Store a file for the user (created if new) and start parsing it in the background.

    The same bytes uploaded again (same durability and session) return the existing file
    (201 all the same). The MIME type is the part's ``Content-Type`` unless that is
    missing or ``application/octet-stream``; then it is sniffed from the bytes and name."""
    if durability == "ephemeral" and not session_id:
        raise InvalidRequestError("An ephemeral file needs session_id: the session it is valid in.", field="session_id")
    user, _ = await run_in_threadpool(svc.directory.ensure_user, app.id, user_id)
    if session_id is not None:
        _, owner = await run_in_threadpool(svc.directory.session, app.id, session_id)
        if owner.id != user.id:  # another user's session of this app: as unknown as another app's
            raise NotFoundError(f"No session {session_id!r}.", kind="session", resource_id=session_id)
    data = await file.read(fs.files.max_file_bytes + 1)  # one byte over is enough to refuse it as too large
    mime = file.content_type if file.content_type and file.content_type != OCTET_STREAM else None
    stored = await run_in_threadpool(
        lambda: fs.upload(
            user_id=user.id,
            name=file.filename or "",
            data=data,
            mime=mime,
            durability=durability,
            session_id=session_id,
        )
    )
    return file_out(stored, user)


@router.get("/users/{user_id}/files", response_model=list[FileOut])
def list_files(
    user_id: str,
    app: App = Depends(current_app),
    svc: Services = Depends(services),
    fs: FileServices = Depends(file_services),
):
    """The user's files, oldest first (without their text)."""
    user = svc.directory.user(app.id, user_id)
    return [file_out(f, user) for f in fs.files.list(user_id=user.id)]


@router.get("/files/{file_id}", response_model=FileOut)
def get_file(
    file_id: str,
    app: App = Depends(current_app),
    svc: Services = Depends(services),
    fs: FileServices = Depends(file_services),
):
    """The file's metadata: parse state (and error), page count, where the body starts."""
    user = svc.directory.file_owner(app.id, file_id)
    return file_out(fs.files.get(file_id, user_id=user.id, with_extract=False), user)


@router.get(
    "/files/{file_id}/read",
    response_model=FileReadOut,
    responses={422: {"model": ErrorBody, "description": "A page or limit out of range (`file_invalid`)."}},
)
def read_file(
    file_id: str,
    start_page: int | None = Query(None, description="First page to read, 1-based (default: where the body starts)."),
    max_pages: int | None = Query(
        None, description="Pages in the window (default and most: COMPANION_FILE_READ_PAGES)."
    ),
    focus: str | None = Query(None, description="Start at the first page containing this keyword."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
    fs: FileServices = Depends(file_services),
):
    """A window of the file's pages: the text the ``file_read`` tool gives the model. Waits
    for a parse in progress at most ``COMPANION_FILE_READ_WAIT`` seconds, then says it is
    still processing."""
    user = svc.directory.file_owner(app.id, file_id)
    text = fs.reader.file_read(file_id, user.id, start_page=start_page, max_pages=max_pages, focus=focus)
    return FileReadOut(file_id=file_id, text=text)


@router.delete("/files/{file_id}", response_model=FileDeleteOut)
def delete_file(
    file_id: str,
    app: App = Depends(current_app),
    svc: Services = Depends(services),
    fs: FileServices = Depends(file_services),
):
    """Delete the file and every reference to it in every session: no assembled context
    shows it afterwards (its bytes go when no other file row uses them)."""
    user = svc.directory.file_owner(app.id, file_id)
    if not svc.engine.delete_file(user_id=user.id, file_id=file_id):
        raise file_not_found(file_id)  # deleted by a concurrent request between the two steps
    return FileDeleteOut(file_id=file_id, deleted=True)

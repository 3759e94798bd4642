"""Stored files of the calling app's users: upload, list, metadata, read a window, delete.

Uploads are ``multipart/form-data`` with one ``file`` part (python-multipart parses it).
A file belongs to one user (its internal id); every route resolves the file's owner
within the calling app only, so another app's file id answers 404 ``file_not_found``
exactly like an unknown one. Parsing runs in the background after the upload; the
metadata route shows its state, and the read route waits for it at most
``COMPANION_FILE_READ_WAIT`` seconds, as the ``file_read`` tool does.
"""

from __future__ import annotations

from typing import Any, Literal

from fastapi import APIRouter, Depends, File, Form, Query, UploadFile, status
from fastapi.concurrency import run_in_threadpool

from errors import ConfigurationError, InvalidRequestError, NotFoundError
from memory.files import file_not_found
from memory.tables import App
from runtime.service.api.convert import file_out
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.schemas import ErrorBody, FileDeleteOut, FileOut, FileReadOut
from runtime.files import FileServices

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
    404: {"model": ErrorBody, "description": "No such user, session or file for this app (`not_found`, `file_not_found`)."},
}

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES, tags=["files"])

OCTET_STREAM = "application/octet-stream"


def file_services(svc: Services = Depends(services)) -> FileServices:
    """The engine's file services.

    Raises:
        ConfigurationError: the server's engine was opened without a file store.
    """
    if svc.engine.file_services is None:
        raise ConfigurationError(
            "This server has no file store. Open the engine with runtime.service.open_engine (COMPANION_FILES_DIR).",
            setting="COMPANION_FILES_DIR",
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
    file: UploadFile = File(description="The file's bytes; its filename is the stored name."),
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
            user_id=user.id, name=file.filename or "", data=data, mime=mime, durability=durability, session_id=session_id
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
    file_id: str, app: App = Depends(current_app), svc: Services = Depends(services), fs: FileServices = Depends(file_services)
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
    max_pages: int | None = Query(None, description="Pages in the window (default and most: COMPANION_FILE_READ_PAGES)."),
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
    file_id: str, app: App = Depends(current_app), svc: Services = Depends(services), fs: FileServices = Depends(file_services)
):
    """Delete the file and every reference to it in every session: no assembled context
    shows it afterwards (its bytes go when no other file row uses them)."""
    user = svc.directory.file_owner(app.id, file_id)
    if not svc.engine.delete_file(user_id=user.id, file_id=file_id):
        raise file_not_found(file_id)  # deleted by a concurrent request between the two steps
    return FileDeleteOut(file_id=file_id, deleted=True)

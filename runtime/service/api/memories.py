"""What a companion remembers, shown and erasable: memories, forgetting, deleting a message,
erasing and exporting a user (docs/privacy.md).

Every id is looked up within the calling app: another app's memory, session or user, and another
user's, is answered 404 ``not_found`` exactly as an unknown id. Nothing here deletes more than the
one thing it names: there is no delete-by-filter, so no request with a filter left out can match
everything.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from fastapi import APIRouter, Depends, Query, Response
from fastapi.concurrency import run_in_threadpool

from errors import NotFoundError
from memory.characters import Viewer
from memory.tables import App
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.schemas import ErasedOut, ErrorBody, ForgottenOut, MemoriesOut, MemoryOut
from runtime.turn import Memory, segment_number

router = APIRouter(
    prefix="/v1",
    tags=["memories"],
    responses={
        401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
        404: {"model": ErrorBody, "description": "No such user, session, memory or character for this app."},
    },
)


def _out(memory: Memory) -> MemoryOut:
    return MemoryOut(
        id=memory.id,
        session_id=memory.session_id,
        character_id=memory.character_id,
        first_seq=memory.first_seq,
        last_seq=memory.last_seq,
        content=memory.content,
        date=memory.date,
        score=memory.score,
    )


@router.get("/users/{user_id}/memories", response_model=MemoriesOut)
def list_memories(
    user_id: str,
    character_id: str | None = Query(default=None, max_length=200, description="Only this character's memories."),
    q: str | None = Query(default=None, max_length=2000, description="Search with the turn's own recall."),
    before: datetime | None = Query(default=None, description="Only memories dated before this time."),
    after: datetime | None = Query(default=None, description="Only memories dated after this time."),
    limit: int = Query(default=50, ge=1, le=200),
    cursor: str | None = Query(default=None, max_length=40, description="`next` of the page before."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    """What a character remembers of the user (every character's, without ``character_id``):
    archived segments, newest first, a page at a time (with ``q``: the best matches, recall's
    order); the facts learned from summaries; the user's words quoted in the current summaries."""
    user = svc.directory.user(app.id, user_id)
    if character_id is not None:
        svc.engine.store.characters.visible(character_id, Viewer(app_id=app.id, user_id=user.id))
    ops = svc.engine.memories
    if q:
        found = ops.search(user.id, q, character_id=character_id, limit=limit)
        following = None
    else:
        found = ops.page(user.id, character_id=character_id, before=before, after=after, limit=limit, cursor=cursor)
        following = found[-1].id if len(found) == limit else None
    return MemoriesOut(
        data=[_out(m) for m in found],
        next=following,
        learned=ops.learned(user.id, character_id=character_id),
        quotes=ops.quotes(user.id, character_id=character_id),
    )


@router.delete("/memories/{memory_id}", response_model=ForgottenOut)
async def forget_memory(memory_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Forget one memory: it leaves recall (its text, vector and lexemes), every summary that held
    its words is rewritten without them, and the learned facts made from those are removed. The
    transcript keeps the messages."""

    def work() -> ForgottenOut:
        number = segment_number(memory_id)
        owner = svc.engine.store.memories.owner(number) if number is not None else None
        if owner is None or not svc.directory.owns(app.id, owner):
            raise NotFoundError(f"No memory {memory_id!r}.", kind="memory", resource_id=memory_id)
        return ForgottenOut(id=memory_id, deleted=svc.engine.memories.forget(owner, memory_id))

    return await run_in_threadpool(work)


@router.delete("/sessions/{session_id}/turns/{seq}", response_model=ForgottenOut, tags=["sessions"])
async def delete_message(session_id: str, seq: int, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Delete one message everywhere: the turn, its vector, the archive segment that holds it, its
    lines in every summary, and the files only it carried. A running turn of the session is waited
    for (409 ``turn_in_progress`` if it does not end in time); nothing is half deleted."""

    def work() -> ForgottenOut:
        session, user = svc.directory.session(app.id, session_id)
        return ForgottenOut(id=f"{session.id}/{seq}", deleted=svc.engine.memories.delete_turn(user.id, session.id, seq))

    return await run_in_threadpool(work)


@router.delete("/users/{user_id}", response_model=ErasedOut, tags=["users"])
async def erase_user(user_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Erase the user: every row, vector, blob, queue job and breaker state of theirs. From the
    first moment no new turn of theirs is taken (409 ``user_erasing``); a running one ends with an
    error. ``finished`` false: a queue job of theirs was still running; send the request again."""

    def work() -> ErasedOut:
        user = svc.directory.user(app.id, user_id)
        erased = svc.engine.users.erase(user.id)
        return ErasedOut(user_id=user_id, finished=erased.finished, deleted=erased.counts)

    return await run_in_threadpool(work)


@router.get("/users/{user_id}/export", tags=["users"])
def export_user(user_id: str, app: App = Depends(current_app), svc: Services = Depends(services)) -> dict[str, Any]:
    """Everything stored about the user, as JSON: profile, learned facts, sessions with every
    turn verbatim, summaries, memories, the user's own characters, and file metadata with a
    ``download`` link each."""
    user = svc.directory.user(app.id, user_id)
    out = svc.engine.users.export(user.id)
    out["user_id"] = user_id
    for item in out["files"]:
        item["download"] = f"/v1/files/{item['id']}/content"
    return out


@router.get("/files/{file_id}/content", response_class=Response, tags=["files"])
def file_content(file_id: str, app: App = Depends(current_app), svc: Services = Depends(services)) -> Response:
    """The stored bytes of one of the app's users' files."""
    owner = svc.directory.file_owner(app.id, file_id)
    files = svc.engine.files
    if files is None:
        raise NotFoundError(f"No file {file_id!r}.", kind="file", resource_id=file_id)
    stored, data = files.export(file_id, user_id=owner.id)
    return Response(
        data, media_type=stored.mime, headers={"Content-Disposition": f'attachment; filename="{stored.id}"'}
    )

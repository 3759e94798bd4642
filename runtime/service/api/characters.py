"""Characters as data: ``/v1/characters``.

A card is sent as it is written: Character Card V1/V2/V3 JSON as the request body, or multipart with
the card in the ``file`` field (a PNG with a ``chara``/``ccv3`` chunk, JSON, or our TOML/YAML) and,
optionally, an ``avatar`` image. ``user_id`` (a query parameter, or a form field) makes the character
that user's own: only requests that name the same ``user_id`` see it. Every other app's character,
and another user's own, is answered 404 ``not_found`` exactly as an unknown id. A bad card is a 422
naming the field; nothing is stored.

Editing (``PUT``) adds a revision: each session's next turn uses it, and each turn records the
revision it used (``character_revision`` on turns). ``DELETE`` is refused (409
``character_in_use``, with ``sessions``) while sessions use the character, unless ``cascade=true``
deletes them too. The deployment's characters (``COMPANION_PERSONA``'s and the command line's) are
read-only here (409 ``character_read_only``).
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Depends, Query, Request, Response, status
from fastapi.concurrency import run_in_threadpool
from starlette.datastructures import UploadFile

from errors import InvalidRequestError, NotFoundError, PersonaError
from memory.characters import MAX_PAGE, Avatar, Viewer
from memory.tables import App, Character
from persona import expand
from runtime.context import macro_context
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.schemas import CharacterDeleteOut, CharacterOut, CharacterPage, ErrorBody
from runtime.turn import AVATAR_TYPES, scope_of

router = APIRouter(
    prefix="/v1",
    tags=["characters"],
    responses={
        401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
        404: {"model": ErrorBody, "description": "No such character for this app and user (`not_found`)."},
    },
)

_CARD_BODY = {
    "requestBody": {
        "content": {
            "application/json": {"schema": {"type": "object", "description": "A Character Card V1/V2/V3."}},
            "multipart/form-data": {
                "schema": {
                    "type": "object",
                    "properties": {
                        "file": {
                            "type": "string",
                            "format": "binary",
                            "description": "The card: PNG, JSON, TOML or YAML.",
                        },
                        "avatar": {
                            "type": "string",
                            "format": "binary",
                            "description": "An image (PNG, JPEG, WebP, GIF).",
                        },
                        "user_id": {"type": "string", "description": "Make it this user's own."},
                    },
                    "required": ["file"],
                }
            },
        },
        "required": True,
    }
}


class _Upload:
    """A card request's parts, read from either body kind."""

    def __init__(self, raw: bytes, name: str, avatar: Avatar | None, user_id: str | None) -> None:
        self.raw, self.name, self.avatar, self.user_id = raw, name, avatar, user_id


async def _upload(request: Request, user_id: str | None) -> _Upload:
    kind = request.headers.get("content-type", "").lower()
    if not kind.startswith("multipart/form-data"):
        return _Upload(await request.body(), "card.json", None, user_id)
    form = await request.form()
    card = form.get("file")
    if not isinstance(card, UploadFile):
        raise InvalidRequestError("Send the card in the 'file' field of the form.", field="file")
    avatar = None
    image = form.get("avatar")
    if isinstance(image, UploadFile):
        mime = (image.content_type or "").lower()
        if mime not in AVATAR_TYPES:
            raise PersonaError(
                f"avatar must be one of {', '.join(sorted(AVATAR_TYPES))}, got {mime!r}.", field="avatar"
            )
        avatar = Avatar(mime=mime, image=await image.read())
    form_user = form.get("user_id")
    return _Upload(
        await card.read(), _safe_name(card.filename), avatar, form_user if isinstance(form_user, str) else user_id
    )


def _safe_name(name: str | None) -> str:
    """An upload's file name for messages: no directories."""
    return (name or "card").replace("\\", "/").rsplit("/", 1)[-1][:200] or "card"


def _viewer(svc: Services, app: App, user_id: str | None, *, create: bool = False) -> tuple[Viewer, str | None]:
    """Who asks (the app, and the named user's internal id) and that user's id as the app knows it."""
    if user_id is None:
        return Viewer(app_id=app.id), None
    if create:
        user, _ = svc.directory.ensure_user(app.id, user_id)
        return Viewer(app_id=app.id, user_id=user.id), user_id
    try:
        user = svc.directory.user(app.id, user_id)
    except NotFoundError:
        return Viewer(app_id=app.id), user_id  # a user with nothing of their own yet sees the shared ones
    return Viewer(app_id=app.id, user_id=user.id), user_id


def character_out(svc: Services, row: Character, owner: str | None, *, revisions: bool = False) -> CharacterOut:
    """The API body of a stored character (its newest revision parsed once per process)."""
    persona = svc.engine.cast.at(row.id, row.revision).persona  # its source is the stored card's kind
    ctx = macro_context(persona, user_name="{{user}}")
    greetings = [
        expand(text, ctx, field="first_mes" if i == 0 else f"alternate_greetings[{i - 1}]").strip()
        for i, text in enumerate(persona.greetings)
    ]
    stored = svc.engine.store.characters
    return CharacterOut(
        id=row.id,
        name=row.name,
        nickname=persona.nickname or None,
        scope=scope_of(row),  # type: ignore[arg-type]
        user_id=owner if row.owner_id is not None else None,
        revision=row.revision,
        spec=persona.source,
        greetings=greetings,
        tags=list(persona.tags),
        creator_notes=persona.creator_notes,
        lorebook_entries=len(persona.character_book.entries) if persona.character_book else 0,
        has_avatar=stored.has_avatar(row.id),
        created_at=row.created_at,
        updated_at=row.updated_at,
        revisions=[{"revision": n, "created_at": at} for n, at in stored.revisions(row.id)] if revisions else None,
    )


@router.post(
    "/characters",
    response_model=CharacterOut,
    status_code=status.HTTP_201_CREATED,
    openapi_extra=_CARD_BODY,
    responses={422: {"model": ErrorBody, "description": "A bad card (`persona_invalid`, `param` names the field)."}},
)
async def create_character(
    request: Request,
    user_id: str | None = Query(default=None, max_length=200, description="Make it this user's own."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    """Add a character to this app (or, with ``user_id``, that user's own). The card is read and
    checked in full first: nothing is stored for a bad one."""
    upload = await _upload(request, user_id)

    def work() -> CharacterOut:
        card = svc.engine.characters.read(upload.raw, name=upload.name)
        viewer, owner = _viewer(svc, app, upload.user_id, create=True)
        row = svc.engine.characters.add(card, app_id=app.id, owner_id=viewer.user_id, avatar=upload.avatar)
        return character_out(svc, row, owner)

    return await run_in_threadpool(work)


@router.get("/characters", response_model=CharacterPage)
def list_characters(
    name: str | None = Query(default=None, max_length=200, description="Only names containing this (any case)."),
    user_id: str | None = Query(default=None, max_length=200, description="Include this user's own characters."),
    limit: int = Query(default=50, ge=1, le=MAX_PAGE),
    after: str | None = Query(default=None, max_length=200, description="The last id of the previous page."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    """The characters this app (and the named user) sees: the deployment's, the app's, the user's
    own; oldest first, a page at a time."""
    viewer, owner = _viewer(svc, app, user_id)
    svc.engine.cast.default  # noqa: B018  (the deployment's default character is stored on first use)
    rows = svc.engine.store.characters.page(viewer, name=name, limit=limit + 1, after=after)
    return CharacterPage(data=[character_out(svc, r, owner) for r in rows[:limit]], has_more=len(rows) > limit)


@router.get("/characters/{character_id}", response_model=CharacterOut)
def get_character(
    character_id: str,
    user_id: str | None = Query(default=None, max_length=200, description="Needed for a user's own character."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    viewer, owner = _viewer(svc, app, user_id)
    return character_out(svc, svc.engine.store.characters.visible(character_id, viewer), owner, revisions=True)


@router.put(
    "/characters/{character_id}",
    response_model=CharacterOut,
    openapi_extra=_CARD_BODY,
    responses={
        409: {"model": ErrorBody, "description": "A deployment character (`character_read_only`)."},
        422: {"model": ErrorBody, "description": "A bad card (`persona_invalid`)."},
    },
)
async def revise_character(
    character_id: str,
    request: Request,
    user_id: str | None = Query(default=None, max_length=200, description="Needed for a user's own character."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    """Replace the card: a new revision, which each session's next turn uses."""
    upload = await _upload(request, user_id)

    def work() -> CharacterOut:
        viewer, owner = _viewer(svc, app, upload.user_id)
        row = svc.engine.store.characters.editable(character_id, viewer)
        card = svc.engine.characters.read(upload.raw, name=upload.name)
        return character_out(svc, svc.engine.characters.revise(row, card, avatar=upload.avatar), owner)

    return await run_in_threadpool(work)


@router.delete(
    "/characters/{character_id}",
    response_model=CharacterDeleteOut,
    responses={
        409: {"model": ErrorBody, "description": "It has sessions (`character_in_use`), or is the deployment's."}
    },
)
def delete_character(
    character_id: str,
    user_id: str | None = Query(default=None, max_length=200, description="Needed for a user's own character."),
    cascade: bool = Query(default=False, description="Delete its sessions (and everything of them) too."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    viewer, _ = _viewer(svc, app, user_id)
    row = svc.engine.store.characters.editable(character_id, viewer)
    deleted = svc.engine.characters.remove(row, cascade=cascade)
    return CharacterDeleteOut(id=row.id, sessions_deleted=deleted)


@router.get(
    "/characters/{character_id}/card",
    response_class=Response,
    responses={200: {"content": {"application/json": {}, "image/png": {}}, "description": "The card."}},
)
def export_character(
    character_id: str,
    format: str = Query(default="v3", description="`v2` or `v3` JSON, or `png` (both chunks, as SillyTavern writes)."),
    revision: int | None = Query(default=None, ge=1, description="An earlier revision (default: the newest)."),
    user_id: str | None = Query(default=None, max_length=200),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
) -> Response:
    """The character's card, for SillyTavern or another card tool."""
    viewer, _ = _viewer(svc, app, user_id)
    row = svc.engine.store.characters.visible(character_id, viewer)
    out = svc.engine.characters.export(row, format, revision=revision)
    headers = {"Content-Disposition": f'attachment; filename="{out.filename}"'}
    return Response(out.body, media_type=out.media_type, headers=headers)


@router.get("/characters/{character_id}/avatar", response_class=Response)
def character_avatar(
    character_id: str,
    user_id: str | None = Query(default=None, max_length=200),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
) -> Response:
    """The character's image (404 ``not_found`` when it has none)."""
    viewer, _ = _viewer(svc, app, user_id)
    row = svc.engine.store.characters.visible(character_id, viewer)
    avatar = svc.engine.store.characters.avatar(row.id)
    if avatar is None:
        raise NotFoundError(f"Character {character_id!r} has no avatar.", kind="avatar", resource_id=character_id)
    return Response(avatar.image, media_type=avatar.mime, headers={"Cache-Control": "private, max-age=60"})


def names(svc: Services, ids: Any) -> dict[str, str]:
    """Character id → name, for the ids given."""
    out: dict[str, str] = {}
    for character_id in set(ids):
        row = svc.engine.store.characters.get(character_id)
        out[character_id] = row.name if row is not None else ""
    return out

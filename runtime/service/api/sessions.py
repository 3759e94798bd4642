"""Users and sessions of the calling app: create, list, talk (streamed), inspect, close,
delete, reset the breaker. Every route resolves ids within the calling app only and
answers 404 ``not_found`` for another app's user or session, as for a missing one."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Depends, Response, status
from fastapi.concurrency import run_in_threadpool
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from errors import InvalidMessageError, InvalidRequestError, NotFoundError, SessionClosedError, TurnsChangedError
from memory.characters import Viewer
from memory.tables import App, TurnState
from persona import expand
from runtime.compaction import reset_breaker
from runtime.context import macro_context
from runtime.service.api.characters import names
from runtime.service.api.context_view import context_out
from runtime.service.api.convert import session_out, turn_done, turn_out, user_out
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.errors import error_body
from runtime.service.api.schemas import (
    BreakerOut,
    CloseOut,
    ContextOut,
    DeleteOut,
    ErrorBody,
    MessageIn,
    NewSessionOut,
    PersonaOut,
    ResendIn,
    SessionIn,
    SessionOut,
    SummaryOut,
    TokenReport,
    TurnDone,
    TurnOut,
    UserIn,
    UserOut,
)
from runtime.service.api.streaming import ClaimedRun, turn_events
from runtime.turn import check_attachments, validate_message

ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorBody, "description": "No or invalid API key (`unauthorized`)."},
    404: {"model": ErrorBody, "description": "No such user or session for this app (`not_found`)."},
}

router = APIRouter(prefix="/v1", responses=ERROR_RESPONSES)


# -- users ---------------------------------------------------------------------
@router.post("/users", response_model=UserOut, status_code=status.HTTP_201_CREATED, tags=["users"])
def create_user(body: UserIn, response: Response, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Create a user of this app (200 with ``created: false`` if it exists already)."""
    user, created = svc.directory.ensure_user(app.id, body.id)
    if not created:
        response.status_code = status.HTTP_200_OK
    return user_out(user, created=created)


@router.get("/users", response_model=list[UserOut], tags=["users"])
def list_users(app: App = Depends(current_app), svc: Services = Depends(services)):
    """This app's users, oldest first."""
    return [user_out(u) for u in svc.directory.users(app.id)]


@router.get("/users/{user_id}", response_model=UserOut, tags=["users"])
def get_user(user_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    return user_out(svc.directory.user(app.id, user_id))


@router.get("/users/{user_id}/sessions", response_model=list[SessionOut], tags=["users"])
def list_sessions(user_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """The user's sessions, oldest first."""
    user = svc.directory.user(app.id, user_id)
    found = svc.directory.sessions(app.id, user_id)
    named = names(svc, (s.character_id for s in found))
    return [session_out(s, user, named[s.character_id]) for s in found]


# -- persona -----------------------------------------------------------------
@router.get("/persona", response_model=PersonaOut, tags=["sessions"])
def get_persona(app: App = Depends(current_app), svc: Services = Depends(services)):
    """This server's default character (``COMPANION_PERSONA``): its name and the greetings a new
    session can open with. Every character: ``GET /v1/characters``."""
    persona = svc.engine.persona
    ctx = macro_context(persona, user_name="{{user}}")
    greetings = [
        expand(text, ctx, field="first_mes" if i == 0 else f"alternate_greetings[{i - 1}]").strip()
        for i, text in enumerate(persona.greetings)
    ]
    return PersonaOut(name=persona.name, nickname=persona.nickname or None, greetings=greetings)


# -- sessions ----------------------------------------------------------------
@router.post(
    "/sessions",
    response_model=NewSessionOut,
    status_code=status.HTTP_201_CREATED,
    tags=["sessions"],
    responses={
        400: {
            "model": ErrorBody,
            "description": "`greeting` is not one of the persona's greetings (`invalid_request`).",
        }
    },
)
def create_session(body: SessionIn, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Start a session for the user (created if new) with the character ``character_id`` (one
    this app and user see; null: the deployment's default). It begins from the summary of the
    user's newest closed session with that character (``carried_from``). The character's
    greeting number ``greeting`` (0: its first message, the default; i >= 1: its i-th alternate
    greeting), when not empty, is stored as the opening assistant turn (macros replaced;
    ``{{user}}`` is the pinned profile's name, else ``User``) and returned as ``greeting``. An
    unknown character or a ``greeting`` it does not have is refused before anything is stored."""
    user = None
    if body.character_id is None:
        character = svc.engine.cast.default
    else:
        try:
            known = svc.directory.user(app.id, body.user_id)
        except NotFoundError:
            known = None
        viewer = Viewer(app_id=app.id, user_id=known.id if known is not None else None)
        row = svc.engine.store.characters.visible(body.character_id, viewer)
        character = svc.engine.cast.newest(row.id)
    greetings = character.persona.greetings
    if body.greeting >= len(greetings):
        raise InvalidRequestError(
            f"greeting must be 0 (the first message) to {len(greetings) - 1} "
            f"({len(greetings) - 1} alternate greetings), got {body.greeting}.",
            field="greeting",
        )
    user, _ = svc.directory.ensure_user(app.id, body.user_id)
    session = svc.directory.start_session(user_id=user.id, character_id=character.id)
    greeting = svc.engine.greet(user_id=user.id, session_id=session.id, greeting=body.greeting)
    return NewSessionOut(
        **session_out(session, user, character.persona.name).model_dump(),
        greeting=turn_out(greeting) if greeting else None,
    )


@router.get("/sessions/{session_id}", response_model=SessionOut, tags=["sessions"])
def get_session(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    session, user = svc.directory.session(app.id, session_id)
    return session_out(session, user, names(svc, [session.character_id])[session.character_id])


@router.post(
    "/sessions/{session_id}/messages",
    response_model=TurnDone,
    tags=["sessions"],
    responses={
        200: {
            "description": "With `stream: true` (the default), server-sent events: `delta` "
            '(`{"text"}`), then `done` (a TurnDone) or `error` (an ErrorBody).',
            "content": {"text/event-stream": {}},
        },
        409: {
            "model": ErrorBody,
            "description": "The session is closed (`session_closed`), or another turn of it "
            "is running (`turn_in_progress`): nothing was stored.",
        },
        422: {"model": ErrorBody, "description": "The message is invalid (`invalid_message`) or the body is."},
    },
)
async def post_message(
    session_id: str, body: MessageIn, app: App = Depends(current_app), svc: Services = Depends(services)
):
    """Store the user's message and reply: streamed as server-sent events, or whole.

    The message is checked and the session's state too before anything is stored, so
    those errors come back as plain JSON errors, not as events. Once the stream has
    started, a failure arrives as an ``error`` event (the user turn stays stored)."""
    session, user = await _open_session(svc, app, session_id)
    text, attachments = await _checked_message(svc, body, user_id=user.id, session_id=session.id)

    def work(claim, on_delta=None):
        return svc.engine.turn(
            user_id=user.id,
            session_id=session.id,
            message=text,
            at=body.sent_at,
            on_delta=on_delta,
            attachments=attachments,
            claim=claim,
        )

    claim = await run_in_threadpool(svc.engine.claim, session.id)
    return await _reply(ClaimedRun(claim, work), stream=body.stream)


@router.post(
    "/sessions/{session_id}/turns/{seq}/resend",
    response_model=TurnDone,
    tags=["sessions"],
    responses={
        200: {"description": "As POST /v1/sessions/{id}/messages.", "content": {"text/event-stream": {}}},
        409: {
            "model": ErrorBody,
            "description": "The session is closed (`session_closed`), or turns arrived after `expected_last_seq` "
            "(`turns_changed`, with `last_seq`): nothing was deleted.",
        },
        422: {
            "model": ErrorBody,
            "description": "Invalid message, or `seq` is no user turn of the recent window "
            "(`invalid_message`, reason `bad_edit`).",
        },
    },
)
async def resend(
    session_id: str, seq: int, body: ResendIn, app: App = Depends(current_app), svc: Services = Depends(services)
):
    """Edit the user turn ``seq`` and resend it: the turns from ``seq`` on are deleted, then
    the new message (with its ``attachments``) runs as a new turn, answered as by
    POST /messages. The replaced turns' files that nothing references any more are
    deleted. Bad input (message, seq, attachments) changes nothing. Only what the client
    could see is deleted: turns after ``expected_last_seq`` (default: the session's last turn
    when the request arrived), stored while the resend waited for a running turn, make it
    answer 409 ``turns_changed`` and delete nothing."""
    session, user = await _open_session(svc, app, session_id)
    text, attachments = await _checked_message(svc, body, user_id=user.id, session_id=session.id)
    seen = (
        body.expected_last_seq
        if body.expected_last_seq is not None
        else await run_in_threadpool(svc.engine.store.turns.last_seq, session.id)
    )
    claim = await run_in_threadpool(svc.engine.claim, session.id)
    try:  # checked under the claim: no turn can change the recent window meanwhile
        turns = await run_in_threadpool(svc.engine.store.turns.of_session, session.id, state=TurnState.context)
        if not any(t.seq == seq and t.role == "user" for t in turns):
            raise InvalidMessageError(
                f"Turn {seq} of session {session_id!r} is not a user turn in the recent window; only those can be "
                "edited (GET /v1/sessions/{id}/turns lists them with their state).",
                reason="bad_edit",
            )
        last = await run_in_threadpool(svc.engine.store.turns.last_seq, session.id)
        if last > seen:  # turns arrived while the resend waited: what the client saw is not the session now
            raise TurnsChangedError(
                f"Session {session_id!r} has turns up to {last}, after turn {seen}, the last one seen when the "
                "resend was asked; nothing was deleted. Show the new turns and edit again.",
                session_id=session_id,
                expected_last_seq=seen,
                last_seq=last,
            )
    except BaseException:
        await run_in_threadpool(claim.release)
        raise

    def work(claim, on_delta=None):
        return svc.engine.edit_turn(
            user_id=user.id,
            session_id=session.id,
            seq=seq,
            message=text,
            attachments=attachments,
            on_delta=on_delta,
            claim=claim,
            expected_last_seq=seen,
        )

    run = ClaimedRun(claim, work)

    return await _reply(run, stream=body.stream)


async def _open_session(svc: Services, app: App, session_id: str):
    """The app's session and its user, if it still takes turns.

    Raises:
        NotFoundError: no such session for this app. SessionClosedError: it was closed.
    """
    session, user = await run_in_threadpool(svc.directory.session, app.id, session_id)
    if session.closed_at is not None:
        raise SessionClosedError(
            f"Session {session_id!r} was closed at {session.closed_at.isoformat()}; start a new session "
            "(POST /v1/sessions), which begins from this one's summary.",
            session_id=session_id,
        )
    return session, user


async def _checked_message(svc: Services, body: MessageIn, *, user_id: str, session_id: str) -> tuple[str, list[str]]:
    """The message text and attachment ids, checked before anything is stored or streamed, so
    a bad message or an unknown or foreign file id is a plain JSON error (422, 404).

    Raises:
        InvalidMessageError: a bad message. FileNotFound: an id that is not the user's (or
            another session's ephemeral id). ConfigurationError: attachments but no file store.
    """
    text = validate_message(body.content, max_chars=svc.engine.settings.max_message_chars)
    attachments = list(body.attachments)
    if attachments:
        await run_in_threadpool(
            lambda: check_attachments(svc.engine.files, user_id=user_id, session_id=session_id, attachments=attachments)
        )
    return text, attachments


async def _reply(run: ClaimedRun, *, stream: bool):
    """The turn answered whole (a TurnDone) or streamed as server-sent events."""
    if not stream:
        return turn_done(await run_in_threadpool(run))
    return EventSourceResponse(_sse(run), background=BackgroundTask(run.abandon))


async def _sse(run) -> AsyncIterator[dict[str, str]]:
    """``delta`` events (ids 1, 2, …), then one ``done`` or ``error`` event."""
    n = 0
    async for kind, value in turn_events(run):
        n += 1
        if kind == "delta":
            yield {"event": "delta", "id": str(n), "data": json.dumps({"text": value}, ensure_ascii=False)}
        elif kind == "done":
            yield {"event": "done", "id": str(n), "data": turn_done(value).model_dump_json()}
        else:
            yield {"event": "error", "id": str(n), "data": json.dumps(error_body(value), ensure_ascii=False)}


@router.get("/sessions/{session_id}/turns", response_model=list[TurnOut], tags=["sessions"])
def list_turns(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Every stored turn of the session, in order (rolled-out ones too, with their state)."""
    session, _ = svc.directory.session(app.id, session_id)
    files = svc.engine.store.turns.attachments(session.id, head_chars=0)
    return [
        turn_out(t, [f.file_id for f in files.get(t.id, [])] if t.id is not None else [])
        for t in svc.engine.store.turns.of_session(session.id)
    ]


@router.get("/sessions/{session_id}/summary", response_model=SummaryOut, tags=["sessions"])
def get_summary(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """The session's rolling summary (``content: null`` before there is one)."""
    session, _ = svc.directory.session(app.id, session_id)
    summary = svc.engine.store.compaction.summary(session.id)
    if summary is None:
        return SummaryOut(session_id=session.id, content=None)
    return SummaryOut(
        session_id=session.id,
        content=summary.content,
        items=list(summary.items or []),
        tokens=summary.tokens,
        first_seq=summary.first_seq,
        last_seq=summary.last_seq,
        updated_at=summary.updated_at,
    )


@router.get("/sessions/{session_id}/context", response_model=ContextOut, tags=["sessions"])
def get_context(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """The context the next reply would be made from, by source (a read; changes nothing): tokens
    against caps, the recalled segments with why each came back, the lorebook entries with the
    key that fired them, and every cut notice."""
    session, user = svc.directory.session(app.id, session_id)
    context = svc.engine.assemble(user_id=user.id, session_id=session.id)
    out = context_out(context)
    _, usage = svc.engine.store.turns.window(session.id, usage_limit=1, user_id=user.id)
    if usage:
        last = usage[0]
        out.last_reply = TokenReport(
            prompt_estimate_tokens=last.request_estimate_tokens or 0,
            prompt_tokens=last.usage_prompt_tokens,
            completion_tokens=last.usage_completion_tokens,
            cached_tokens=last.usage_cached_tokens,
            cache_write_tokens=last.usage_cache_write_tokens,
            cost_usd=last.usage_cost_usd,
            retrieval_cost_usd=last.usage_retrieval_cost_usd,
            window=context.window,
        )
    return out


@router.post(
    "/sessions/{session_id}/close",
    response_model=CloseOut,
    tags=["sessions"],
    responses={409: {"model": ErrorBody, "description": "Closed already (`session_closed`)."}},
)
def close(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Close the session now: what is left of its recent window rolls out into the summary
    and the archive (breaker rules apply), and it takes no more turns."""
    from runtime.service._jobs import close_session

    session, user = svc.directory.session(app.id, session_id)
    outcome = close_session(svc.engine, session.id, closed_by="api")
    session, user = svc.directory.session(app.id, session_id)
    return CloseOut(
        session=session_out(session, user, names(svc, [session.character_id])[session.character_id]),
        rolled_turns=outcome.rolled_turns if outcome else 0,
        segments=outcome.segments if outcome else 0,
        summarized=bool(outcome and outcome.summarized),
    )


@router.delete("/sessions/{session_id}", response_model=DeleteOut, tags=["sessions"])
def delete(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Delete the session with its turns, summary, archived segments and breaker state, in
    one transaction, then the files its turns carried that no other session references.
    The user stays."""
    session, user = svc.directory.session(app.id, session_id)
    return DeleteOut(session_id=session.id, deleted=svc.engine.delete_session(user_id=user.id, session_id=session.id))


@router.post("/sessions/{session_id}/breaker/reset", response_model=BreakerOut, tags=["sessions"])
def reset_session_breaker(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """Close the session's compaction circuit breaker and clear its failure count."""
    session, _ = svc.directory.session(app.id, session_id)
    state = reset_breaker(svc.engine.store, session.id)
    return BreakerOut(
        session_id=session.id,
        state=svc.engine.compactor.breaker_state(state),
        consecutive_failures=state.consecutive_failures,
        compactions=state.compactions,
    )


@router.get("/sessions/{session_id}/breaker", response_model=BreakerOut, tags=["sessions"])
def session_breaker(session_id: str, app: App = Depends(current_app), svc: Services = Depends(services)):
    """The session's compaction circuit breaker: its state, consecutive failures and the
    compactions that ran. Changes nothing."""
    session, _ = svc.directory.session(app.id, session_id)
    state = svc.engine.store.compaction.state(session.id)
    return BreakerOut(
        session_id=session.id,
        state=svc.engine.compactor.breaker_state(state),
        consecutive_failures=state.consecutive_failures,
        compactions=state.compactions,
    )

"""The OpenAI-compatible front door: ``POST /v1/chat/completions``, whole or streamed.

Any client of the OpenAI chat API (SDKs, companion frontends) gets managed memory by
pointing its base URL at this server and its API key at the app's key:

- **Session.** The ``X-Session-Id`` header names one of the app's sessions; without it,
  the ``user`` field names the app's user (created if new) and the turn goes to that
  user's newest open session, or to a new one (which starts from the previous closed
  session's summary) if there is none. With neither: 400 ``invalid_request``.
- **Messages.** Only the newest ``user`` message of ``messages`` is taken; the rest of
  the context (persona, summary, recalled memories, recent turns) is built by the
  runtime. Its content is a string or a list of ``text`` parts.
- **Answer.** A ``chat.completion`` object, or with ``stream: true`` ``chat.completion.chunk``
  events ending in ``data: [DONE]``. When ``stream_options.include_usage`` is set, a last
  chunk with empty ``choices`` carries the usage and every chunk before it has
  ``"usage": null``, as OpenAI sends them. ``usage`` is the runtime's accounting: the
  provider's reported tokens when it reported them, else our estimate of the request
  (prompt) and of the stored reply (completion). The response header ``X-Session-Id``
  names the session used. ``model`` is echoed; the server's ``COMPANION_MODEL`` replies.
- **Character.** ``model`` chooses who answers a new or ``user``-named conversation: a character
  id (``ch_…``, as ``GET /v1/models`` lists them), or ``character:NAME`` (a character this app or
  the user sees by that name, the user's own first, then the app's, then the deployment's). Any
  other ``model`` (``gpt-4o``, none) is the deployment's default character. With ``user`` the turn
  goes to the user's newest open session with that character. A session named by
  ``X-Session-Id`` keeps its own character.
- **Models.** ``GET /v1/models`` lists the characters the app sees (and, with ``?user=``, that
  user's own) as OpenAI model objects, so that any OpenAI client can pick one.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any, ClassVar

from fastapi import APIRouter, Depends, Header, Query, Response
from fastapi.concurrency import run_in_threadpool
from pydantic import ConfigDict, Field
from sse_starlette import EventSourceResponse
from starlette.background import BackgroundTask

from errors import InvalidRequestError, NotFoundError, SessionClosedError
from memory.characters import MAX_PAGE, Viewer
from memory.tables import App
from runtime.service.api.deps import Services, current_app, services
from runtime.service.api.errors import error_body
from runtime.service.api.schemas import CheckedModel, ErrorBody
from runtime.service.api.streaming import ClaimedRun, turn_events
from runtime.turn import TurnResult, scope_of, validate_message

router = APIRouter(prefix="/v1", tags=["openai"])


class ChatRequest(CheckedModel):
    """The fields of an OpenAI chat completion request this server reads; others are ignored.
    The newest user message is checked by the message's rules (with their reasons)."""

    model_config = ConfigDict(extra="allow")
    unchecked_fields: ClassVar[frozenset[str]] = frozenset({"messages"})

    model: str | None = Field(default=None, max_length=200)
    messages: list[dict[str, Any]] = Field(min_length=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    user: str | None = Field(
        default=None, max_length=200, description="The app's user id, when no X-Session-Id header is sent."
    )


def newest_user_text(messages: list[dict[str, Any]]) -> str:
    """The text of the newest ``user`` message.

    Raises:
        InvalidRequestError: no user message, or content that is not text.
    """
    for message in reversed(messages):
        if message.get("role") != "user":
            continue
        content = message.get("content")
        if isinstance(content, str):
            return content
        if isinstance(content, list):
            texts = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    kind = part.get("type") if isinstance(part, dict) else type(part).__name__
                    raise InvalidRequestError(
                        f"Only text parts are supported in a user message, got a {kind!r} part.", field="messages"
                    )
                texts.append(part["text"])
            return "\n".join(texts)
        raise InvalidRequestError("The newest user message has no text content.", field="messages")
    raise InvalidRequestError("messages holds no message with role 'user'.", field="messages")


def _usage(result: TurnResult) -> dict[str, int]:
    reply = result.assistant_turn
    prompt = reply.usage_prompt_tokens if reply.usage_prompt_tokens is not None else result.context.total_tokens
    completion = reply.usage_completion_tokens if reply.usage_completion_tokens is not None else reply.tokens
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


@router.post(
    "/chat/completions",
    responses={
        200: {
            "description": "A chat.completion object, or chat.completion.chunk events.",
            "content": {"text/event-stream": {}},
        },
        400: {"model": ErrorBody},
        401: {"model": ErrorBody},
        404: {"model": ErrorBody},
        409: {"model": ErrorBody},
    },
)
async def chat_completions(
    body: ChatRequest,
    response: Response,
    x_session_id: str | None = Header(default=None, description="One of the app's session ids."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
):
    """OpenAI-compatible chat completions with the runtime's managed memory."""
    text = validate_message(newest_user_text(body.messages), max_chars=svc.engine.settings.max_message_chars)

    def resolve():
        if x_session_id:
            return svc.directory.session(app.id, x_session_id)
        if not body.user:
            raise InvalidRequestError(
                "Name the session with the X-Session-Id header, or the user with the 'user' field.", field="user"
            )
        user, _ = svc.directory.ensure_user(app.id, body.user)
        character = character_for_model(svc, app, body.model, user_id=user.id)
        return svc.directory.open_session(user_id=user.id, character_id=character), user

    session, user = await run_in_threadpool(resolve)
    if session.closed_at is not None:
        raise SessionClosedError(
            f"Session {session.id!r} is closed; send the 'user' field without X-Session-Id to continue in a new session.",
            session_id=session.id,
        )
    completion_id = "chatcmpl-" + uuid.uuid4().hex
    created = int(time.time())
    model = body.model or svc.engine.settings.model

    def work(claim, on_delta=None):
        return svc.engine.turn(user_id=user.id, session_id=session.id, message=text, on_delta=on_delta, claim=claim)

    run = ClaimedRun(await run_in_threadpool(svc.engine.claim, session.id), work)
    headers = {"X-Session-Id": session.id}
    if not body.stream:
        result = await run_in_threadpool(run)
        response.headers.update(headers)
        return {
            "id": completion_id,
            "object": "chat.completion",
            "created": created,
            "model": model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": result.assistant_turn.content},
                    "finish_reason": "stop",
                }
            ],
            "usage": _usage(result),
        }
    include_usage = bool((body.stream_options or {}).get("include_usage"))
    base = {"id": completion_id, "object": "chat.completion.chunk", "created": created, "model": model}
    return EventSourceResponse(
        _chunks(run, base, include_usage), headers=headers, background=BackgroundTask(run.abandon)
    )


CHARACTER_PREFIX = "character:"
"""``model`` = this prefix and a name chooses a character by name."""


def character_for_model(svc: Services, app: App, model: str | None, *, user_id: str | None) -> str:
    """The id of the character ``model`` chooses (see the module docstring).

    Raises:
        NotFoundError: a character id or name this app and user do not see (field ``model``).
    """
    viewer = Viewer(app_id=app.id, user_id=user_id)
    characters = svc.engine.store.characters
    if model and model.startswith("ch_"):
        return characters.visible(model, viewer).id
    if model and model.startswith(CHARACTER_PREFIX):
        name = model[len(CHARACTER_PREFIX) :].strip()
        found = [r for r in characters.page(viewer, name=name, limit=MAX_PAGE) if r.name.casefold() == name.casefold()]
        if not found:
            raise NotFoundError(f"No character named {name!r} for this app.", kind="character", resource_id=model)
        return min(found, key=lambda r: ({"user": 0, "app": 1, "deployment": 2}[scope_of(r)], r.created_at)).id
    return svc.engine.cast.default.id


@router.get("/models")
def list_models(
    user: str | None = Query(default=None, max_length=200, description="Include this user's own characters."),
    app: App = Depends(current_app),
    svc: Services = Depends(services),
) -> dict[str, Any]:
    """The characters this app sees, as OpenAI model objects (``id`` is what ``model`` takes)."""
    owner = None
    if user is not None:
        try:
            owner = svc.directory.user(app.id, user).id
        except NotFoundError:
            owner = None
    viewer = Viewer(app_id=app.id, user_id=owner)
    svc.engine.cast.default  # noqa: B018  (the deployment's default character is stored on first use)
    data, after = [], None
    while True:
        page = svc.engine.store.characters.page(viewer, limit=MAX_PAGE, after=after)
        data += [
            {
                "id": r.id,
                "object": "model",
                "created": int(r.created_at.timestamp()),
                "owned_by": scope_of(r),
                "name": r.name,
            }
            for r in page
        ]
        if len(page) < MAX_PAGE:
            return {"object": "list", "data": data}
        after = page[-1].id


async def _chunks(run, base: dict[str, Any], include_usage: bool) -> AsyncIterator[dict[str, str]]:
    # With include_usage, OpenAI sends "usage": null on every chunk before the usage chunk
    # (API reference, stream_options.include_usage); clients tell the last chunk by it.
    pending = {"usage": None} if include_usage else {}

    def chunk(delta: dict[str, Any], finish: str | None = None) -> dict[str, str]:
        choices = [{"index": 0, "delta": delta, "finish_reason": finish}]
        return {"data": json.dumps({**base, "choices": choices, **pending}, ensure_ascii=False)}

    yield chunk({"role": "assistant", "content": ""})
    async for kind, value in turn_events(run):
        if kind == "delta":
            yield chunk({"content": value})
        elif kind == "done":
            yield chunk({}, "stop")
            if include_usage:
                yield {"data": json.dumps({**base, "choices": [], "usage": _usage(value)})}
        else:
            yield {"data": json.dumps(error_body(value), ensure_ascii=False)}
    yield {"data": "[DONE]"}

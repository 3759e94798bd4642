"""Request and response bodies of the HTTP API (pydantic). Token figures are tokens;
times are ISO 8601 UTC."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any, ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, Field, ValidationInfo, field_validator

from errors import InvalidFieldError
from memory.profiles import MAX_FACT_CHARS
from memory.validation import check_text


def _check_strings(value: Any, field: str) -> Any:
    """``value`` unchanged if every string in it (nested lists and dicts too) passes
    :func:`memory.validation.check_text`; else ``ValueError`` naming the field (FastAPI answers 422)."""
    if isinstance(value, str):
        try:
            check_text(value, field=field)
        except InvalidFieldError as exc:
            raise ValueError(str(exc)) from None
    elif isinstance(value, (list, tuple)):
        for k, item in enumerate(value):
            _check_strings(item, f"{field}[{k}]")
    elif isinstance(value, dict):
        for key, item in value.items():
            _check_strings(key, field)
            _check_strings(item, f"{field}.{key}")
    return value


class CheckedModel(BaseModel):
    """A request body whose every string field obeys the message's rules: no NUL, no lone
    surrogate (422 naming the field). Fields in ``unchecked_fields`` have rules of their own."""

    unchecked_fields: ClassVar[frozenset[str]] = frozenset()

    @field_validator("*", mode="after")
    @classmethod
    def _no_odd_bytes(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name in cls.unchecked_fields:
            return value
        return _check_strings(value, info.field_name or "body")


class ErrorDetail(BaseModel):
    code: str = Field(description="A stable code, e.g. `session_closed`, `not_found`, `unauthorized`.")
    message: str
    type: str = Field(description="The exception class.")
    param: str | None = Field(default=None, description="The request field or header at fault, if one is.")


class ErrorBody(BaseModel):
    error: ErrorDetail


class UserIn(CheckedModel):
    id: str = Field(max_length=200, description="Your id for the user (unique within your app), 1-200 characters.")


class UserOut(BaseModel):
    id: str = Field(description="Your id for the user.")
    created_at: datetime
    created: bool = Field(default=False, description="True if this request created the user.")


class SessionIn(CheckedModel):
    user_id: str = Field(max_length=200, description="Your id for the user; created if new.")
    character_id: str | None = Field(
        default=None,
        max_length=200,
        description="The character the session talks as (GET /v1/characters); null: the deployment's default.",
    )
    greeting: int = Field(
        default=0,
        ge=0,
        description="Which of the character's greetings opens the session: 0 the first message (default), "
        "i >= 1 the i-th alternate greeting (the card's alternate_greetings). GET /v1/characters/{id} lists them.",
    )


class CharacterOut(BaseModel):
    id: str = Field(description="Server-generated character id (`ch_` + 32 hex digits).")
    name: str
    nickname: str | None = Field(default=None, description="What the character is called in the prompt, if set.")
    scope: Literal["deployment", "app", "user"] = Field(
        description="`deployment`: the server's (every app sees it; read-only here); `app`: every user of your "
        "app sees it; `user`: one user's own."
    )
    user_id: str | None = Field(default=None, description="Your id for the owning user, for a `user` character.")
    revision: int = Field(description="The newest revision; a session's next turn uses it.")
    spec: str = Field(description="What the card was read from: chara_card_v1/v2/v3, toml or yaml.")
    greetings: list[str] = Field(
        description="The greetings, by the number POST /v1/sessions takes as `greeting`; macros replaced but `{{user}}`."
    )
    tags: list[str] = Field(default_factory=list)
    creator_notes: str = Field(default="", description="For people; never sent to the model.")
    lorebook_entries: int = 0
    has_avatar: bool = False
    created_at: datetime
    updated_at: datetime
    revisions: list[dict[str, int | str]] | None = Field(
        default=None, description="Every revision's number and time (GET of one character only)."
    )


class CharacterPage(BaseModel):
    data: list[CharacterOut]
    has_more: bool = Field(description="True when another page follows; ask again with `after` = the last id.")


class CharacterDeleteOut(BaseModel):
    id: str
    deleted: bool = True
    sessions_deleted: int = Field(default=0, description="Sessions deleted with it (`cascade=true`).")


class MemoryOut(BaseModel):
    id: str = Field(description="`seg_` + a number: what DELETE /v1/memories/{id} takes.")
    session_id: str
    character_id: str
    first_seq: int
    last_seq: int
    content: str = Field(description="The turns verbatim, one `Name: text` line each.")
    date: datetime = Field(description="When its first turn was said.")
    score: float | None = Field(default=None, description="Recall's score, for a search (`q`).")


class MemoriesOut(BaseModel):
    data: list[MemoryOut]
    next: str | None = Field(default=None, description="`cursor` for the next page; null on the last one.")
    learned: list[str] = Field(default_factory=list, description="Facts the character(s) learned from summaries.")
    quotes: list[dict[str, Any]] = Field(
        default_factory=list, description="The user's words quoted in the current summaries (session, seq, date, text)."
    )


class ForgottenOut(BaseModel):
    id: str
    deleted: dict[str, int] = Field(description="Rows deleted or rewritten, by table.")


class ErasedOut(BaseModel):
    user_id: str
    finished: bool = Field(description="False: a queue job of the user was still running; erase again.")
    deleted: dict[str, int] = Field(description="Rows deleted, by table (`files`: the user's files).")


class PersonaOut(BaseModel):
    name: str = Field(description="The persona's name.")
    nickname: str | None = Field(
        default=None, description="What the persona is called in the prompt, when the card sets a nickname."
    )
    greetings: list[str] = Field(
        description="The persona's greetings, by the number POST /v1/sessions takes as `greeting`: 0 the first "
        "message, then the alternate greetings. Macros are replaced, except `{{user}}`, which depends on the user."
    )


class SessionOut(BaseModel):
    id: str = Field(description="Server-generated session id.")
    user_id: str
    character_id: str = Field(description="The character the session talks as.")
    persona: str = Field(description="That character's name.")
    created_at: datetime
    last_activity_at: datetime
    closed_at: datetime | None = None
    closed_by: str | None = None
    carried_from: str | None = Field(
        default=None, description="The closed session whose summary this one started from."
    )


class MessageIn(CheckedModel):
    unchecked_fields: ClassVar[frozenset[str]] = frozenset({"content"})  # the message's own rules, with reasons

    content: str = Field(description="The user's message.")
    stream: bool = Field(default=True, description="Stream the reply as server-sent events (default) or answer whole.")
    attachments: list[Annotated[str, Field(max_length=200)]] = Field(
        default_factory=list,
        description="Ids of the user's stored files the message carries, in order (POST /v1/users/{id}/files).",
    )
    sent_at: AwareDatetime | None = Field(
        default=None,
        description="When the user sent the message, with their UTC offset (ISO 8601, e.g. "
        '"2026-12-04T07:30:00+08:00"). The offset is kept with the turn: the message is dated on the user\'s '
        'day, and relative dates in it ("yesterday", 昨天) are read on their clock. Default: now, with no offset.',
    )


class ResendIn(MessageIn):
    expected_last_seq: int | None = Field(
        default=None,
        ge=0,
        description="The last turn's seq the client saw. When turns arrived after it (while the resend waited "
        "for a running turn, or before), the resend answers 409 `turns_changed` with the current last seq and "
        "deletes nothing. Default: the session's last turn when the request arrives.",
    )


class TokenReport(BaseModel):
    prompt_estimate_tokens: int = Field(description="Our estimate of the request sent to the model, tokens.")
    prompt_tokens: int | None = Field(description="The provider's reported prompt tokens, if it reported them.")
    completion_tokens: int | None = Field(description="The provider's reported completion tokens, if it reported them.")
    cached_tokens: int | None = Field(
        default=None, description="Prompt tokens the provider read from its prompt cache, if it reported them."
    )
    cache_write_tokens: int | None = Field(
        default=None, description="Prompt tokens the provider wrote to its prompt cache, if it reported them."
    )
    cost_usd: float | None = Field(
        default=None, description="The request's price by litellm's cost map, US dollars; null when not priced."
    )
    retrieval_cost_usd: float | None = Field(
        default=None,
        description="What the turn's embedding and rerank API calls cost by litellm's cost map, US dollars; "
        "null when none was made or priced (a local model).",
    )
    window: int = Field(description="The model's context window, tokens.")


class TurnDone(BaseModel):
    session_id: str
    user_seq: int
    assistant_seq: int
    content: str
    interrupted: bool = Field(description="True if the model's stream broke off; content is what arrived.")
    usage: TokenReport
    compactions: int = Field(description="Compaction attempts during the turn.")


class TurnOut(BaseModel):
    seq: int
    role: str
    content: str
    tokens: int = Field(description="Estimated tokens of the message, framing included.")
    state: str = Field(description="`context` (in the recent window), `summarized` or `archived`.")
    interrupted: bool
    created_at: datetime
    attachments: list[str] = Field(default_factory=list, description="Ids of the files the turn carries, in order.")
    character_revision: int | None = Field(
        default=None, description="The revision of the session's character the turn was made with."
    )
    usage_prompt_tokens: int | None = Field(
        default=None, description="For a reply: the provider's reported prompt tokens of its request."
    )
    usage_cached_tokens: int | None = Field(
        default=None, description="For a reply: prompt tokens the provider read from its prompt cache."
    )
    usage_cache_write_tokens: int | None = Field(
        default=None, description="For a reply: prompt tokens the provider wrote to its prompt cache."
    )
    usage_cost_usd: float | None = Field(
        default=None, description="For a reply: its request's price by litellm's cost map, US dollars."
    )
    usage_retrieval_cost_usd: float | None = Field(
        default=None, description="For a reply: its turn's embedding and rerank API calls' price, US dollars."
    )


class SummaryOut(BaseModel):
    session_id: str
    content: str | None = Field(description="The summary as it enters the prompt; null before the first compaction.")
    items: list[dict[str, str | int | None]] = Field(
        default_factory=list,
        description="The summary's flat entries, oldest first, as stored: user quotes "
        '(`{"seq", "role": "user", "date", "text"}`, optional `section`, `cut_of`), assistant lines '
        '(`{"seq", "role": "assistant", "date", "text"}`) and model notes (`{"role": "note", "section", '
        '"date", "text"}`); carried-over entries add `carried_from` and `from_seq`.',
    )
    tokens: int = 0
    first_seq: int | None = None
    last_seq: int | None = None
    updated_at: datetime | None = None


class SourceOut(BaseModel):
    tokens: int
    cap: int
    items: int
    cut: str | None = None
    text: str | None = Field(default=None, description="What the source put into the prompt.")


class RecalledOut(BaseModel):
    """An archived segment shown in the ``memory`` source, and why recall chose it."""

    id: int
    session_id: str = Field(description="The session the segment was archived from.")
    first_seq: int
    last_seq: int
    session_date: datetime = Field(description="When the segment's turns were said.")
    tokens: int = Field(description="Estimated tokens of the segment, tokens.")
    content: str
    reasons: list[Literal["vector", "full_text", "neighbour"]] = Field(
        description="Why it was recalled: ranked by embedding similarity (`vector`), by full-text match "
        "(`full_text`), or added next to a hit (`neighbour`)."
    )
    score: float = Field(
        description="Reciprocal-rank-fusion score, sum of 1/(k + rank) over the rankers, times the speaker "
        "weight (3) for a segment of the speaker the message names; 0 for a neighbour."
    )
    vector_rank: int | None = Field(default=None, description="1-based rank by embedding similarity, if in the pool.")
    text_rank: int | None = Field(default=None, description="1-based rank by full-text score, if in the pool.")
    distance: float | None = Field(
        description="Cosine distance of the segment's key to the query, 0 to 2; null when recall ran "
        "without a query vector (the embedder was down) or the segment has no key yet."
    )
    neighbour_of: int | None = Field(default=None, description="For a neighbour, the id of the hit it sits next to.")


class RetrievedOut(BaseModel):
    """A lorebook entry or knowledge chunk shown in the ``retrieval`` source."""

    kind: Literal["lore", "knowledge"]
    label: str = Field(description="The lorebook entry's name (else its key), or `source#chunk`.")
    key: str | None = Field(
        default=None, description="For a lorebook entry, the key that fired it; null for a constant entry or a chunk."
    )
    distance: float | None = Field(default=None, description="For a knowledge chunk, its cosine distance to the query.")
    text: str = Field(description="The entry as it appears in the block.")


class NoticeOut(BaseModel):
    source: str = Field(description="The source whose cut the notice reports.")
    text: str = Field(description="The notice line exactly as the prompt carries it.")


class ContextOut(BaseModel):
    session_id: str
    total_tokens: int = Field(
        description="Estimated tokens of the prompt, framing, reply priming and overhead included."
    )
    window: int = Field(description="The model's context window, tokens.")
    reply_reserve: int = Field(description="Tokens kept free for the reply.")
    overhead_tokens: int = Field(
        default=0,
        description="Tokens reserved beyond the messages (provider overhead, tool schema, image pixels), "
        "part of total_tokens.",
    )
    sources: dict[str, SourceOut]
    recalled: list[RecalledOut] = Field(default_factory=list, description="The segments in `memory`, oldest first.")
    withheld: list[RecalledOut] = Field(
        default_factory=list,
        description="Cache layout: segments recall selected for this message that the prompt does not show "
        "(the kept recall block stayed; the classic layout would show them), oldest first.",
    )
    retrieved: list[RetrievedOut] = Field(default_factory=list, description="The items in `retrieval`, in block order.")
    notices: list[NoticeOut] = Field(default_factory=list, description="Every cut notice the prompt carries.")
    attached_files: list[str] = Field(
        default_factory=list, description="Ids of the files the prompt shows, in turn order."
    )
    last_reply: TokenReport | None = Field(
        default=None,
        description="The provider's usage of the newest reply's request: prompt, cached and cache-written "
        "tokens, cost (null before a reply the provider reported on).",
    )


class BreakerOut(BaseModel):
    session_id: str
    state: Literal["closed", "open", "half_open"]
    consecutive_failures: int
    compactions: int


class CloseOut(BaseModel):
    session: SessionOut
    rolled_turns: int
    segments: int
    summarized: bool


class DeleteOut(BaseModel):
    session_id: str
    deleted: dict[str, int] = Field(description="Rows deleted per table.")


# -- greeting, files, profile (HTTP API part 2) -----------------------------------------
class NewSessionOut(SessionOut):
    greeting: TurnOut | None = Field(
        default=None,
        description="The persona's first message, stored as the opening assistant turn; null when it has none.",
    )


class FileOut(BaseModel):
    id: str = Field(description="Server-generated file id (`file_` + 20 hex digits).")
    user_id: str = Field(description="Your id for the owning user.")
    name: str
    mime: str
    size_bytes: int = Field(description="Size of the stored bytes, bytes.")
    sha256: str = Field(description="Hex SHA-256 of the bytes.")
    durability: Literal["durable", "ephemeral"]
    session_id: str | None = Field(default=None, description="For an ephemeral file, the session it is valid in.")
    parse_state: str = Field(description="`pending`, `parsing`, `ready`, `empty`, `needs_ocr` or `failed`.")
    parse_error: str | None = None
    page_count: int | None = Field(default=None, description="Pages of the extract, once parsed.")
    body_start_page: int | None = Field(default=None, description="First page after the front matter, 1-based.")
    created_at: datetime


class FileReadOut(BaseModel):
    file_id: str
    text: str = Field(description="The window of pages, exactly as the `file_read` tool gives it to the model.")


class FileDeleteOut(BaseModel):
    file_id: str
    deleted: bool = Field(description="Always true: the file and every session's reference to it are gone.")


class ProfileIn(CheckedModel):
    name: str | None = Field(default=None, max_length=200, description='null leaves it; "" clears it.')
    pronouns: str | None = Field(default=None, max_length=100, description='null leaves it; "" clears it.')
    facts: list[Annotated[str, Field(max_length=MAX_FACT_CHARS)]] | None = Field(
        default=None, max_length=100, description="Replaces the user-set facts (null leaves them; [] clears them)."
    )
    time_zone: str | None = Field(
        default=None,
        max_length=100,
        description='The user\'s IANA time zone, e.g. "Asia/Shanghai" (null leaves it; "" clears it). Dates in the '
        "memory block and the summary, and relative dates (yesterday, 昨天), are read in it; without it, in the "
        "offset of the user's last message that carried one.",
    )


class ProfileOut(BaseModel):
    user_id: str = Field(description="Your id for the user.")
    name: str | None = None
    pronouns: str | None = None
    facts: list[str] = Field(default_factory=list, description="Facts set by the user or app.")
    learned: list[str] = Field(
        default_factory=list,
        description="Facts the user's characters learned from summaries, each character's own (read-only here).",
    )
    time_zone: str | None = None
    updated_at: datetime | None = None

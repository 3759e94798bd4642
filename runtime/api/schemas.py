"""Request and response bodies of the HTTP API (pydantic). Token figures are tokens;
times are ISO 8601 UTC."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, Field


class ErrorDetail(BaseModel):
    code: str = Field(description="A stable code, e.g. `session_closed`, `not_found`, `unauthorized`.")
    message: str
    type: str = Field(description="The exception class.")
    param: str | None = Field(default=None, description="The request field or header at fault, if one is.")


class ErrorBody(BaseModel):
    error: ErrorDetail


class UserIn(BaseModel):
    id: str = Field(description="Your id for the user (unique within your app), 1-200 characters.")


class UserOut(BaseModel):
    id: str = Field(description="Your id for the user.")
    created_at: datetime
    created: bool = Field(default=False, description="True if this request created the user.")


class SessionIn(BaseModel):
    user_id: str = Field(description="Your id for the user; created if new.")


class SessionOut(BaseModel):
    id: str = Field(description="Server-generated session id.")
    user_id: str
    persona: str
    created_at: datetime
    last_activity_at: datetime
    closed_at: datetime | None = None
    closed_by: str | None = None
    carried_from: str | None = Field(default=None, description="The closed session whose summary this one started from.")


class MessageIn(BaseModel):
    content: str = Field(description="The user's message.")
    stream: bool = Field(default=True, description="Stream the reply as server-sent events (default) or answer whole.")


class TokenReport(BaseModel):
    prompt_estimate_tokens: int = Field(description="Our estimate of the request sent to the model, tokens.")
    prompt_tokens: int | None = Field(description="The provider's reported prompt tokens, if it reported them.")
    completion_tokens: int | None = Field(description="The provider's reported completion tokens, if it reported them.")
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


class SummaryOut(BaseModel):
    session_id: str
    content: str | None = Field(description="The summary as it enters the prompt; null before the first compaction.")
    items: list[dict[str, Any]] = Field(default_factory=list)
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


class ContextOut(BaseModel):
    session_id: str
    total_tokens: int
    window: int
    reply_reserve: int
    sources: dict[str, SourceOut]


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

"""Table rows and turn results as API bodies."""

from __future__ import annotations

from typing import Literal, cast

from memory.files import StoredFile
from memory.tables import ChatSession, Turn, User, UserProfile
from runtime.service.api.schemas import FileOut, ProfileOut, SessionOut, TokenReport, TurnDone, TurnOut, UserOut
from runtime.turn import TurnResult


def user_out(user: User, *, created: bool = False) -> UserOut:
    return UserOut(id=user.external_id or "", created_at=user.created_at, created=created)


def session_out(session: ChatSession, user: User, character: str = "") -> SessionOut:
    """A session; ``character``: its character's name."""
    return SessionOut(
        id=session.id,
        user_id=user.external_id or "",
        character_id=session.character_id,
        persona=character,
        created_at=session.created_at,
        last_activity_at=session.last_activity_at,
        closed_at=session.closed_at,
        closed_by=session.closed_by,
        carried_from=session.carried_from,
    )


def turn_out(turn: Turn, attachments: list[str] | None = None) -> TurnOut:
    """A stored turn; ``attachments`` are the ids of the files it carries, in order."""
    return TurnOut(
        seq=turn.seq,
        role=turn.role,
        content=turn.content,
        tokens=turn.tokens,
        state=turn.state.value if hasattr(turn.state, "value") else str(turn.state),
        interrupted=turn.interrupted,
        created_at=turn.created_at,
        attachments=list(attachments or []),
        character_revision=turn.character_revision,
        usage_prompt_tokens=turn.usage_prompt_tokens,
        usage_cached_tokens=turn.usage_cached_tokens,
        usage_cache_write_tokens=turn.usage_cache_write_tokens,
        usage_cost_usd=turn.usage_cost_usd,
        usage_retrieval_cost_usd=turn.usage_retrieval_cost_usd,
    )


def turn_done(result: TurnResult) -> TurnDone:
    """The stored turn pair and its token accounting: our estimate of the request and the
    provider's reported usage (``None`` where it reported none)."""
    reply = result.assistant_turn
    return TurnDone(
        session_id=result.session_id,
        user_seq=result.user_turn.seq,
        assistant_seq=reply.seq,
        content=reply.content,
        interrupted=reply.interrupted,
        usage=TokenReport(
            prompt_estimate_tokens=result.context.total_tokens,
            prompt_tokens=reply.usage_prompt_tokens,
            completion_tokens=reply.usage_completion_tokens,
            cached_tokens=reply.usage_cached_tokens,
            cache_write_tokens=reply.usage_cache_write_tokens,
            cost_usd=reply.usage_cost_usd,
            retrieval_cost_usd=reply.usage_retrieval_cost_usd,
            window=result.context.window,
        ),
        compactions=len(result.compactions),
    )


def file_out(stored: StoredFile, user: User) -> FileOut:
    """A stored file as the app sees it: its own id for the owning user."""
    return FileOut(
        id=stored.id,
        user_id=user.external_id or "",
        name=stored.name,
        mime=stored.mime,
        size_bytes=stored.size_bytes,
        sha256=stored.sha256,
        durability=cast(Literal["durable", "ephemeral"], stored.durability),  # the store writes only these
        session_id=stored.session_id,
        parse_state=stored.parse_state,
        parse_error=stored.parse_error,
        page_count=stored.page_count,
        body_start_page=stored.body_start_page,
        created_at=stored.created_at,
    )


def profile_out(profile: UserProfile | None, user: User, learned: list[str]) -> ProfileOut:
    """The user's pinned profile (an empty one when nothing was ever set) and what the characters
    learned of them."""
    if profile is None:
        return ProfileOut(user_id=user.external_id or "", learned=learned)
    return ProfileOut(
        user_id=user.external_id or "",
        name=profile.name,
        pronouns=profile.pronouns,
        facts=list(profile.facts or []),
        learned=learned,
        time_zone=profile.time_zone,
        updated_at=profile.updated_at,
    )

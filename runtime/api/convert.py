"""Table rows and turn results as API bodies."""

from __future__ import annotations

from memory.tables import ChatSession, Turn, User
from runtime.api.schemas import SessionOut, TokenReport, TurnDone, TurnOut, UserOut
from runtime.engine import TurnResult


def user_out(user: User, *, created: bool = False) -> UserOut:
    return UserOut(id=user.external_id or "", created_at=user.created_at, created=created)


def session_out(session: ChatSession, user: User) -> SessionOut:
    return SessionOut(
        id=session.id,
        user_id=user.external_id or "",
        persona=session.persona,
        created_at=session.created_at,
        last_activity_at=session.last_activity_at,
        closed_at=session.closed_at,
        closed_by=session.closed_by,
        carried_from=session.carried_from,
    )


def turn_out(turn: Turn) -> TurnOut:
    return TurnOut(
        seq=turn.seq,
        role=turn.role,
        content=turn.content,
        tokens=turn.tokens,
        state=turn.state.value if hasattr(turn.state, "value") else str(turn.state),
        interrupted=turn.interrupted,
        created_at=turn.created_at,
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
            window=result.context.window,
        ),
        compactions=len(result.compactions),
    )

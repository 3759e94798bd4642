"""The values a turn passes from step to step, and what it returns."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import structlog

from memory.files import StoredFile
from memory.store import RecallTail, RequestRecord
from memory.tables import Turn, UserProfile
from runtime.accounting import TokenCounter, fingerprint
from runtime.compaction import CompactionOutcome
from runtime.context import AssembledContext
from runtime.llm import Reply, Tools
from runtime.turn._characters import SessionCharacter

log = structlog.get_logger("companion.engine")


@dataclass(frozen=True, kw_only=True)
class TurnResult:
    """What one turn stored and sent."""

    session_id: str
    user_turn: Turn
    assistant_turn: Turn
    context: AssembledContext
    """The context the reply was made from."""
    compactions: list[CompactionOutcome]
    """Compaction attempts the turn ran itself: an overflow retry's, and the one after the reply
    when the scheduler runs it inline (a queued one is not here)."""


@dataclass(frozen=True, kw_only=True)
class TurnInput:
    """One checked turn, before its user turn is stored."""

    user_id: str
    session_id: str
    text: str
    """The user's message, validated."""
    at: datetime | None
    """When it was said (``None``: now)."""
    reply: str | None
    """The reply, when given (replay); ``None`` asks the replier."""
    on_delta: Callable[[str], None] | None
    attached: Sequence[StoredFile]
    """The files the message carries, checked to be the user's."""
    vector: list[float] | None = field(repr=False)
    """The message's embedding (:meth:`TurnRunner._embed`), stored with the turn and recall's query."""
    profile: UserProfile | None
    """The user's profile as the turn read it (``None``: they have none)."""
    character: SessionCharacter
    """Who the session talks as, at the revision the claim found: the turn's every step uses it."""


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One request to the model: the context, the tools offered, and the recent window read."""

    context: AssembledContext
    tools: Tools | None
    window: list[Turn]
    """The session's recent window as the context was assembled from it."""


@dataclass(frozen=True, kw_only=True)
class ReplyOutcome:
    """The reply a turn stores, and what it was made from."""

    reply: Reply
    context: AssembledContext
    """The context the reply answers (the harder attempt's after an overflow)."""
    tool_tokens: int = 0
    """Tokens of the tool schemas the request carried."""
    compaction: CompactionOutcome | None = None
    """The harder compaction an overflow ran, if one did."""
    window: list[Turn]

    def log_completed(self, session_id: str, user_turn: Turn, *, breaker_open: bool, compactions: int) -> None:
        """The ``turn.completed`` event: tokens and cap of every source, calibration, usage."""
        context = self.context
        log.info(
            "turn.completed",
            session_id=session_id,
            user_seq=user_turn.seq,
            total_tokens=context.total_tokens,
            window=context.window,
            reply_reserve=context.reply_reserve,
            **{f"tokens_{s}": r.tokens for s, r in context.sources.items()},
            **{f"cap_{s}": r.cap for s, r in context.sources.items()},
            cut={s: r.cut for s, r in context.sources.items() if r.cut},
            calibration=round(context.calibration, 4),
            overhead_tokens=context.overhead_tokens,
            baseline_tokens=context.baseline_tokens,
            usage_prompt_tokens=self.reply.prompt_tokens,
            breaker_state="open" if breaker_open else "closed",
            compactions=compactions,
        )

    def record(self, counter: TokenCounter) -> RequestRecord:
        """What the stored reply keeps of its request: the provider's usage, our raw estimate
        (``counter``: the engine's raw counter; the tool schemas the request carried included), the
        fingerprint of what the next request sends again (the messages before the newest user
        message, :attr:`~runtime.context.AssembledContext.baseline_messages`), and the recall
        block the assembly built for the session's prompt."""
        context, answer, kept = self.context, self.reply, self.context.kept_recall
        sent = context.baseline_messages
        return RequestRecord(
            prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens,
            estimate_tokens=counter.count_messages(context.messages) + self.tool_tokens,
            messages=sent,
            fingerprint=fingerprint(context.messages[:sent]),
            interrupted=answer.interrupted,
            cached_tokens=answer.cached_tokens,
            cache_write_tokens=answer.cache_write_tokens,
            cost_usd=answer.cost_usd,
            recall_block=kept.text if kept is not None else None,
            recall_segments=tuple(sorted(kept.all_segment_ids)) if kept is not None else (),
            recall_anchor=kept.anchor if kept is not None else None,
            recall_prefix=kept.prefix if kept is not None else None,
            recall_tails=tuple(
                RecallTail(anchor=t.anchor, text=t.text, segments=t.segment_ids)
                for t in (kept.tails if kept is not None else ())
                if t.anchor is not None
            ),
        )

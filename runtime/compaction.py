"""Compaction: roll the oldest whole exchanges out of the recent window.

When the recent window (turns in state ``context``) exceeds the ``recent`` cap,
the oldest whole user/assistant exchanges roll out until it is back under
``target × cap``. Rolled-out turns are archived verbatim as embedded segments
(one per exchange) and merged into the session's one flat summary. The archive,
the summary and the turn states change in one transaction, only after the summary
was made; nothing is ever deleted. A failed compaction changes only the failure
count, and ``breaker_threshold`` consecutive failures open the session's breaker,
after which no summarizer is called and the context degrades to what fits.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import structlog

from memory.archive import build_segments
from memory.embeddings import Embedder
from memory.store import NewSegment, Store
from memory.tables import Turn, TurnState
from runtime.summarizer import Summarizer
from runtime.tokens import TokenCounter

log = structlog.get_logger("companion.compaction")


@dataclass(frozen=True, kw_only=True)
class CompactionOutcome:
    """What one compaction attempt did."""

    session_id: str
    ok: bool
    rolled_turns: int = 0
    """Turns moved from the recent window to the archive and summary."""
    segments: int = 0
    """Archive segments written."""
    summary_tokens: int = 0
    """Tokens of the new summary."""
    dropped: int = 0
    """Summary entries left out to fit the cap (still archived)."""
    error: str | None = None
    breaker_open: bool = False


def exchanges(turns: Sequence[Turn]) -> list[list[Turn]]:
    """Split turns (oldest first) into exchanges: each starts at a user turn and holds
    the turns after it up to the next user turn. Turns before the first user turn
    form one leading group."""
    groups: list[list[Turn]] = []
    for turn in turns:
        if turn.role == "user" or not groups:
            groups.append([turn])
        else:
            groups[-1].append(turn)
    return groups


def plan_rollout(
    turns: Sequence[Turn], *, cap: int, target: float, keep_exchanges: int
) -> list[list[Turn]]:
    """The oldest whole exchanges to roll out, or ``[]`` if the window is within ``cap`` tokens.

    The newest ``max(keep_exchanges, 1)`` exchanges, which hold the latest user
    turn, never roll out. Rolling stops once the rest is within ``target × cap``.
    """
    total = sum(t.tokens for t in turns)
    if total <= cap:
        return []
    groups = exchanges(turns)
    rollable = groups[: max(len(groups) - max(keep_exchanges, 1), 0)]
    goal = cap * target
    out: list[list[Turn]] = []
    for group in rollable:
        if total <= goal:
            break
        out.append(group)
        total -= sum(t.tokens for t in group)
    return out


class Compactor:
    """Runs compaction for one session at a time, under the breaker rules."""

    def __init__(
        self,
        *,
        store: Store,
        embedder: Embedder,
        summarizer: Summarizer,
        counter: TokenCounter,
        keep_exchanges: int,
        target: float,
        breaker_threshold: int,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.summarizer = summarizer
        self.counter = counter
        self.keep_exchanges = keep_exchanges
        self.target = target
        self.breaker_threshold = breaker_threshold

    def maybe_compact(
        self, *, session_id: str, user_id: str, recent_cap: int, summary_cap: int, assistant_name: str
    ) -> CompactionOutcome | None:
        """Compact if the recent window exceeds ``recent_cap`` tokens; ``None`` if nothing to do.

        Summarizer failures are counted, logged and returned as ``ok=False``; they
        never raise. Storage errors raise :class:`~memory.errors.StorageError`.
        """
        state = self.store.compaction_state(session_id)
        if state.breaker_opened_at is not None:
            return None
        turns = self.store.turns(session_id, state=TurnState.context)
        groups = plan_rollout(turns, cap=recent_cap, target=self.target, keep_exchanges=self.keep_exchanges)
        if not groups:
            return None
        rolled = [t for g in groups for t in g]
        previous = self.store.summary(session_id)
        summarized_before = len(self.store.turns(session_id, state=TurnState.summarized))
        prev_items = list(previous.items) if previous else []
        try:
            draft = self.summarizer.summarize(
                previous=prev_items,
                turns=rolled,
                cap=summary_cap,
                counter=self.counter,
                omitted_before=max(summarized_before - len(prev_items), 0),
            )
            if draft.tokens > summary_cap or not draft.content.strip():
                raise ValueError(f"summary of {draft.tokens} tokens does not fit its cap of {summary_cap}")
        except Exception as exc:  # any summarizer failure is counted by the breaker, never swallowed
            return self._failed(session_id, f"{type(exc).__name__}: {exc}")
        drafts = build_segments(groups, assistant_name=assistant_name)
        vectors = self.embedder.embed([d.key for d in drafts])
        segments = [
            NewSegment(
                first_seq=d.first_seq,
                last_seq=d.last_seq,
                content=d.content,
                tokens=self.counter.count_text(d.content),
                session_date=d.session_date,
                embedding=vec,
            )
            for d, vec in zip(drafts, vectors)
        ]
        first_seq = min([rolled[0].seq, *[i["seq"] for i in prev_items]])
        self.store.commit_compaction(
            session_id=session_id,
            user_id=user_id,
            turn_ids=[t.id for t in rolled if t.id is not None],
            segments=segments,
            summary_content=draft.content,
            summary_items=draft.items,
            summary_first_seq=previous.first_seq if previous else first_seq,
            summary_last_seq=rolled[-1].seq,
            summary_tokens=draft.tokens,
        )
        log.info(
            "compaction.completed",
            session_id=session_id,
            rolled_turns=len(rolled),
            segments=len(segments),
            summary_tokens=draft.tokens,
            summary_dropped=draft.dropped,
            summarizer=self.summarizer.name,
        )
        return CompactionOutcome(
            session_id=session_id,
            ok=True,
            rolled_turns=len(rolled),
            segments=len(segments),
            summary_tokens=draft.tokens,
            dropped=draft.dropped,
        )

    def _failed(self, session_id: str, error: str) -> CompactionOutcome:
        state = self.store.record_compaction_failure(session_id, error=error, threshold=self.breaker_threshold)
        is_open = state.breaker_opened_at is not None
        log.warning(
            "compaction.failed",
            session_id=session_id,
            consecutive_failures=state.consecutive_failures,
            breaker_state="open" if is_open else "closed",
            reason=error[:300],
        )
        if is_open and state.consecutive_failures == self.breaker_threshold:
            log.warning("breaker.opened", session_id=session_id, consecutive_failures=state.consecutive_failures)
        return CompactionOutcome(session_id=session_id, ok=False, error=error, breaker_open=is_open)

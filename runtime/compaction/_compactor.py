"""Compaction: roll the oldest whole exchanges out of the recent window.

When the recent window (turns in state ``context``) exceeds the ``recent`` cap, the
oldest whole user/assistant exchanges roll out until it is back under
``target × cap``. The latest user turn and the newest ``keep_exchanges`` exchanges
never roll out. Rolled-out turns are archived verbatim as embedded segments and
merged into the session's one flat summary. A segment's key vector is composed from the
vectors of its turns (:class:`~memory.tables.TurnVector`): each turn's text is embedded once,
the user's when the turn was stored, the others here (one call, stored in the same transaction).

Guarantees:

- **Atomic, only after success.** The archive, the new summary and the turn states
  change in one transaction (:meth:`~memory.compaction.Compactions.commit`), and only
  once a summary was made and passed :func:`~runtime.compaction.validate_summary`.
  A failed compaction changes nothing but the failure count. Nothing is deleted.
- **One at a time per session**, across processes: the work runs under a PostgreSQL
  advisory lock (:meth:`~memory.store.Store.compaction_lock`) and re-reads the turns
  under it; a second compactor finds the lock held and skips.
- **Circuit breaker**, stored in ``compaction_state``: the summarizer's failures
  (:class:`~errors.SummarizationError`: model errors, timeouts, rejected
  summaries) count as consecutive failures; anything else (a storage error, a bug)
  propagates to the caller with its traceback and leaves the count alone; a success resets the count. At
  ``breaker_threshold`` failures the breaker opens: no summarizer is called for the
  session. While it is open, turns over the cap are still archived verbatim (state
  ``archived``), so every turn stays in the recent window, quoted in the summary or
  in an archived segment. With ``breaker_cooldown`` set, one half-open attempt is
  allowed once that many seconds have passed since it opened; success closes it,
  failure opens it again.

Events (structlog, ``companion.compaction``), each with ``session_id``:
``compaction.completed``, ``compaction.failed``, ``compaction.archived_only``,
``compaction.skipped``, ``summary.quotes_dropped``, ``breaker.opened``,
``breaker.half_open``, ``breaker.closed``, ``breaker.reopened``,
``breaker.failures_cleared``. Breaker events carry ``reasons``, the failure reasons
of the current run (error classes and numbers, never conversation text).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

import structlog

from errors import EmbedderUnavailableError, SummarizationError
from memory.archive import SegmentDraft, build_segments, key_vectors
from memory.embeddings import Embedder
from memory.store import NewSegment, NewSummary, Store
from memory.tables import CompactionState, Turn, TurnState, utcnow
from prompts import render
from runtime.accounting import TokenCounter, longest_fitting_prefix
from runtime.compaction._summarizers import RolledTurn, Summarizer, turns_to_check, validate_summary
from runtime.context import user_zone
from runtime.summary_items import items_from_json, items_to_json

log = structlog.get_logger("companion.compaction")

BreakerState = Literal["closed", "open", "half_open"]


@dataclass(frozen=True, kw_only=True)
class CompactionOutcome:
    """What one compaction attempt did."""

    session_id: str
    ok: bool
    """False if the summarizer failed or its summary was rejected (nothing changed but the count)."""
    summarized: bool = False
    """True if a new summary replaced the old one; False for an archive-only roll-out (breaker open)."""
    rolled_turns: int = 0
    """Turns moved out of the recent window."""
    segments: int = 0
    """Archive segments written."""
    summary_tokens: int = 0
    """Tokens of the new summary."""
    dropped: int = 0
    """Summary entries left out to fit the cap (still archived)."""
    dropped_quotes: int = 0
    """User quotes among them."""
    error: str | None = None
    breaker_open: bool = False


def reset_breaker(store: Store, session_id: str) -> CompactionState:
    """Close the session's breaker and clear its failure count (``companion breaker reset``,
    ``POST /v1/sessions/{id}/breaker/reset``); logs ``breaker.reset`` with the reasons it clears."""
    before = store.compaction.state(session_id)
    state = store.compaction.reset_breaker(session_id)
    log.info(
        "breaker.reset",
        session_id=session_id,
        breaker_state="closed",
        was_open=before.breaker_opened_at is not None,
        consecutive_failures=before.consecutive_failures,
        reasons=list(before.recent_errors or []),
    )
    return state


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


def plan_rollout(turns: Sequence[Turn], *, cap: int, target: float, keep_exchanges: int) -> list[list[Turn]]:
    """The oldest whole exchanges to roll out, or ``[]`` if the window is within ``cap`` tokens.

    Never rolled out: the newest ``keep_exchanges`` complete exchanges, and the latest
    user turn with whatever follows it (an exchange still waiting for its reply counts
    in addition to them). Rolling stops once the rest is within ``target × cap``.
    """
    total = sum(t.tokens for t in turns)
    if total <= cap:
        return []
    groups = exchanges(turns)
    keep = max(keep_exchanges, 0)
    if groups and (len(groups[-1]) == 1 or keep == 0):
        keep += 1  # the latest user turn (still unanswered, or kept whatever the setting)
    rollable = groups[: max(len(groups) - keep, 0)]
    goal = cap * target
    out: list[list[Turn]] = []
    for group in rollable:
        if total <= goal:
            break
        out.append(group)
        total -= sum(t.tokens for t in group)
    return out


def cut_for_summarizer(turn: Turn, *, limit: int, counter: TokenCounter, zone: tzinfo = UTC) -> RolledTurn:
    """What a summarizer may read of ``turn``: whole, or cut to ``limit`` tokens when it is larger.

    A turn larger than the ``recent`` cap is cut (``RolledTurn.cut``) rather than fed
    whole to the summarizer; the summarizer says so, and the archive keeps it whole.
    """
    text = turn.content
    if turn.tokens > limit and counter.count_text(text) > limit:
        whole = text

        def fits(n: int) -> bool:
            return counter.count_text(whole[:n] + render("notice_turn_cut", shown=n, total=len(whole))) <= limit

        text = text[: longest_fitting_prefix(len(text), fits)]
    # dated on the user's day: at the offset the turn's time was given with, else in the user's zone
    said = turn.local_created_at() if turn.utc_offset_minutes is not None else turn.created_at.astimezone(zone)
    return RolledTurn(seq=turn.seq, role=turn.role, date=said.date().isoformat(), text=text, chars=len(turn.content))


class Compactor:
    """Runs compaction for one session at a time, under the breaker rules.

    Args:
        keep_exchanges: newest complete exchanges never rolled out.
        target: after compaction, ``recent`` holds at most this share of its cap.
        breaker_threshold: consecutive failures that open the breaker.
        breaker_cooldown: seconds after which an open breaker allows one half-open
            attempt; ``None`` (the default) keeps it open until ``companion breaker reset``.
        clock: the current time (tests move it).
    """

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
        breaker_cooldown: float | None = None,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.store = store
        self.embedder = embedder
        self.on_unembedded: Callable[[], None] | None = None
        """Called when segments were archived without keys (the embedder was down): the engine's backfill."""
        self.summarizer = summarizer
        self.counter = counter
        self.keep_exchanges = keep_exchanges
        self.target = target
        self.breaker_threshold = breaker_threshold
        self.breaker_cooldown = breaker_cooldown
        self.clock = clock

    def breaker_state(self, state: CompactionState) -> BreakerState:
        """``closed``, ``open``, or ``half_open`` (open, but the cool-down has passed)."""
        if state.breaker_opened_at is None:
            return "closed"
        if self.breaker_cooldown is not None and self.clock() - state.breaker_opened_at >= timedelta(
            seconds=self.breaker_cooldown
        ):
            return "half_open"
        return "open"

    def due(self, *, session_id: str, recent_cap: int) -> bool:
        """True if the session's recent window is over ``recent_cap`` tokens with exchanges that
        may roll out: a compaction would do something now. A read, without the lock."""
        return self.due_in(self.store.turns.of_session(session_id, state=TurnState.context), recent_cap=recent_cap)

    def due_in(self, window: Sequence[Turn], *, recent_cap: int) -> bool:
        """:meth:`due` for a recent window already read (the turns in state ``context``, in seq order)."""
        return bool(plan_rollout(window, cap=recent_cap, target=self.target, keep_exchanges=self.keep_exchanges))

    def maybe_compact(
        self, *, session_id: str, user_id: str, recent_cap: int, summary_cap: int, assistant_name: str
    ) -> CompactionOutcome | None:
        """Compact if the recent window exceeds ``recent_cap`` tokens; ``None`` if there was nothing
        to do or another compaction of the session holds its lock.

        Summarizer failures (:class:`~errors.SummarizationError`: model errors,
        timeouts, rejected summaries) are counted, logged and returned as ``ok=False``;
        they never raise. Storage errors raise :class:`~errors.StorageError`; any
        other exception (a bug) propagates as it is, and neither is counted by the breaker.
        """
        plan_args: dict[str, Any] = dict(cap=recent_cap, target=self.target, keep_exchanges=self.keep_exchanges)
        window = self.store.turns.of_session(session_id, state=TurnState.context, user_id=user_id)
        if not plan_rollout(window, **plan_args):
            return None  # the common case, decided without taking the lock
        with self.store.compaction.lock(session_id) as held:
            if not held:
                log.info("compaction.skipped", session_id=session_id, reason="lock_held")
                return None
            # everything is read again under the lock: another process may have compacted
            state = self.store.compaction.state(session_id, user_id=user_id)
            groups = plan_rollout(
                self.store.turns.of_session(session_id, state=TurnState.context, user_id=user_id), **plan_args
            )
            if not groups:
                return None
            breaker = self.breaker_state(state)
            if breaker == "open":
                return self._archive_only(session_id, user_id, groups, assistant_name, state)
            if breaker == "half_open":
                log.warning(
                    "breaker.half_open",
                    session_id=session_id,
                    breaker_state="half_open",
                    consecutive_failures=state.consecutive_failures,
                    reasons=list(state.recent_errors or []),
                )
            return self._summarize(
                session_id,
                user_id,
                groups,
                state,
                breaker,
                recent_cap=recent_cap,
                summary_cap=summary_cap,
                assistant_name=assistant_name,
            )

    # -- closing a session ------------------------------------------------------
    def roll_out_all(
        self, *, session_id: str, user_id: str, recent_cap: int, summary_cap: int, assistant_name: str
    ) -> CompactionOutcome | None:
        """Roll every turn still in the recent window out, as when a session closes: the
        newest exchanges too, whatever ``keep_exchanges`` says. ``None`` if none is left.

        Under the same breaker rules as :meth:`maybe_compact`: with the breaker closed
        (or half-open) the turns are archived and merged into the summary; with it open
        they are archived only. A summarizer failure is counted by the breaker as usual,
        and the turns are then archived verbatim (``ok=True``, ``summarized=False``,
        ``error`` set) so that the session can still close with nothing left behind.
        When another compaction of the session holds its lock, nothing changes and the
        outcome has ``ok=False``, ``error="compaction_lock_held"``.

        Raises:
            StorageError: the database failed.
        """
        with self.store.compaction.lock(session_id) as held:
            if not held:
                log.info("compaction.skipped", session_id=session_id, reason="lock_held")
                return CompactionOutcome(session_id=session_id, ok=False, error="compaction_lock_held")
            groups = exchanges(self.store.turns.of_session(session_id, state=TurnState.context, user_id=user_id))
            if not groups:
                return None
            state = self.store.compaction.state(session_id, user_id=user_id)
            breaker = self.breaker_state(state)
            if breaker == "open":
                return self._archive_only(session_id, user_id, groups, assistant_name, state)
            outcome = self._summarize(
                session_id,
                user_id,
                groups,
                state,
                breaker,
                recent_cap=recent_cap,
                summary_cap=summary_cap,
                assistant_name=assistant_name,
            )
            if outcome.ok:
                return outcome
            archived = self._archive_only(
                session_id, user_id, groups, assistant_name, self.store.compaction.state(session_id, user_id=user_id)
            )
            return CompactionOutcome(
                session_id=session_id,
                ok=True,
                summarized=False,
                rolled_turns=archived.rolled_turns,
                segments=archived.segments,
                error=outcome.error,
                breaker_open=outcome.breaker_open,
            )

    # -- internals ------------------------------------------------------------
    def _segments(
        self, groups: list[list[Turn]], assistant_name: str, user_id: str | None = None
    ) -> tuple[list[NewSegment], dict[int, list[float]]]:
        """The archive segments of ``groups`` and the turn vectors embedded for them (turn id →
        vector, for the turns that had none stored).

        Each segment's key vector is composed from its window's turn vectors
        (:func:`memory.archive.key_vectors`): the stored ones, and for the turns without one
        (assistant turns, turns added without a reply) their text embedded, in one call.
        """
        drafts = build_segments(groups, assistant_name=assistant_name)
        turns = [t for g in groups for t in g]
        stored = self.store.turns.vectors((t.id for t in turns if t.id is not None), user_id=user_id)
        missing = [t for t in turns if t.id is None or t.id not in stored]
        texts = list(dict.fromkeys(t.content for t in missing))
        try:
            fresh = dict(zip(texts, self.embedder.embed(texts), strict=True)) if texts else {}
        except EmbedderUnavailableError as exc:
            # archived without keys: full text and dates find them, the backfill composes the keys
            log.warning("embedder.unavailable", at="compaction", model=exc.model, status=exc.status, turns=len(texts))
            return [self._segment(d, None) for d in drafts], {}
        vectors = [stored[t.id] if t.id is not None and t.id in stored else fresh[t.content] for t in turns]
        keys = key_vectors(groups, vectors, tokens=[self.counter.count_text(t.content) for t in turns])
        log.debug("compaction.key_vectors", turns=len(turns), stored=len(turns) - len(missing), embedded=len(texts))
        segments = [self._segment(d, vec) for d, vec in zip(drafts, keys, strict=True)]
        return segments, {t.id: fresh[t.content] for t in missing if t.id is not None}

    def _keyless(self, segments: Sequence[NewSegment]) -> None:
        """After a commit that archived segments without keys (the embedder was down): ask for the backfill."""
        if self.on_unembedded is not None and any(s.embedding is None for s in segments):
            self.on_unembedded()

    def _segment(self, draft: SegmentDraft, key: list[float] | None) -> NewSegment:
        return NewSegment(
            first_seq=draft.first_seq,
            last_seq=draft.last_seq,
            content=draft.content,
            tokens=self.counter.count_text(draft.content),
            session_date=draft.session_date,
            embedding=key,
        )

    def _summarize(
        self,
        session_id: str,
        user_id: str,
        groups: list[list[Turn]],
        state: CompactionState,
        breaker: BreakerState,
        *,
        recent_cap: int,
        summary_cap: int,
        assistant_name: str,
    ) -> CompactionOutcome:
        rolled = [t for g in groups for t in g]
        boundary = rolled[-1].seq
        profile = self.store.profiles.get(user_id)
        zone = user_zone(profile.time_zone if profile is not None else None, None)
        inputs = [cut_for_summarizer(t, limit=recent_cap, counter=self.counter, zone=zone) for t in rolled]
        inputs = [i for i in inputs if i.text.strip()]
        previous = self.store.compaction.summary(session_id, user_id=user_id)
        prev_items = items_from_json(previous.items, session_id=session_id) if previous else []
        in_summary = {i.seq for i in prev_items if i.seq is not None}
        omitted_before = self.store.turns.rolled_out_count(session_id, excluding=in_summary, user_id=user_id)
        try:
            if not inputs:  # never call a summarizer on nothing
                raise SummarizationError("the turns to roll out hold no text", session_id=session_id)
            draft = self.summarizer.summarize(
                previous=prev_items,
                turns=inputs,
                cap=summary_cap,
                counter=self.counter,
                omitted_before=omitted_before,
                session_id=session_id,
                assistant_name=assistant_name,
            )
            # the texts of the turns the draft quotes (all of the user's, if a note quotes words);
            # quotes carried over from the previous session count as the user's
            user_turns = {
                **self.store.compaction.carried_quotes(session_id, user_id=user_id),
                **self.store.turns.user_texts(
                    session_id, through_seq=boundary, seqs=turns_to_check(draft), user_id=user_id
                ),
            }
            validate_summary(
                draft,
                cap=summary_cap,
                counter=self.counter,
                boundary_seq=boundary,
                user_turns=user_turns,
                session_id=session_id,
            )
        except SummarizationError as exc:
            # only the summarizer's own failures count: a storage error or a bug propagates
            # (the caller answers 503 or logs the traceback) and leaves the breaker alone
            return self._failed(session_id, f"{type(exc).__name__}: {exc}", breaker, user_id=user_id)
        segments, turn_vectors = self._segments(groups, assistant_name, user_id)
        tokens = self.counter.count_text(draft.content)
        self.store.compaction.commit(
            session_id=session_id,
            user_id=user_id,
            turn_ids=[t.id for t in rolled if t.id is not None],
            segments=segments,
            summary=NewSummary(
                content=draft.content,
                items=items_to_json(draft.items),
                first_seq=previous.first_seq if previous else rolled[0].seq,
                last_seq=boundary,
                tokens=tokens,
                dropped_quotes=len(draft.dropped_quote_seqs),
            ),
            turn_vectors=turn_vectors,
        )
        self._keyless(segments)
        if draft.dropped_quote_seqs:
            log.info(
                "summary.quotes_dropped",
                session_id=session_id,
                count=len(draft.dropped_quote_seqs),
                seqs=draft.dropped_quote_seqs,
                summary_cap=summary_cap,
            )
        log.info(
            "compaction.completed",
            session_id=session_id,
            rolled_turns=len(rolled),
            first_seq=rolled[0].seq,
            last_seq=boundary,
            segments=len(segments),
            summary_tokens=tokens,
            summary_dropped=draft.dropped,
            summarizer=self.summarizer.name,
        )
        if breaker != "closed":
            log.warning(
                "breaker.closed", session_id=session_id, breaker_state="closed", reasons=list(state.recent_errors or [])
            )
        elif state.consecutive_failures:
            log.info(
                "breaker.failures_cleared",
                session_id=session_id,
                breaker_state="closed",
                consecutive_failures=0,
                reasons=list(state.recent_errors or []),
            )
        return CompactionOutcome(
            session_id=session_id,
            ok=True,
            summarized=True,
            rolled_turns=len(rolled),
            segments=len(segments),
            summary_tokens=tokens,
            dropped=draft.dropped,
            dropped_quotes=len(draft.dropped_quote_seqs),
        )

    def _archive_only(
        self, session_id: str, user_id: str, groups: list[list[Turn]], assistant_name: str, state: CompactionState
    ) -> CompactionOutcome:
        """Breaker open: archive the oldest exchanges verbatim without a summarizer."""
        rolled = [t for g in groups for t in g]
        segments, turn_vectors = self._segments(groups, assistant_name, user_id)
        self.store.compaction.commit_archive(
            session_id=session_id,
            user_id=user_id,
            turn_ids=[t.id for t in rolled if t.id is not None],
            segments=segments,
            turn_vectors=turn_vectors,
        )
        self._keyless(segments)
        log.info(
            "compaction.archived_only",
            session_id=session_id,
            breaker_state=self.breaker_state(state),
            rolled_turns=len(rolled),
            first_seq=rolled[0].seq,
            last_seq=rolled[-1].seq,
            segments=len(segments),
            reasons=list(state.recent_errors or []),
        )
        return CompactionOutcome(
            session_id=session_id,
            ok=True,
            summarized=False,
            rolled_turns=len(rolled),
            segments=len(segments),
            breaker_open=True,
        )

    def _failed(
        self, session_id: str, error: str, breaker: BreakerState, *, user_id: str | None = None
    ) -> CompactionOutcome:
        state = self.store.compaction.record_failure(
            session_id, error=error, threshold=self.breaker_threshold, user_id=user_id
        )
        is_open = state.breaker_opened_at is not None
        reasons = list(state.recent_errors or [])
        log.warning(
            "compaction.failed",
            session_id=session_id,
            consecutive_failures=state.consecutive_failures,
            breaker_state="open" if is_open else "closed",
            summarizer=self.summarizer.name,
            reason=error[:300],
        )
        if breaker == "half_open":
            log.warning(
                "breaker.reopened",
                session_id=session_id,
                breaker_state="open",
                consecutive_failures=state.consecutive_failures,
                reasons=reasons,
            )
        elif is_open:
            log.warning(
                "breaker.opened",
                session_id=session_id,
                breaker_state="open",
                consecutive_failures=state.consecutive_failures,
                threshold=self.breaker_threshold,
                reasons=reasons,
            )
        return CompactionOutcome(session_id=session_id, ok=False, error=error, breaker_open=is_open)

"""Recall split for the cache layout: a block kept in place across turns, and a small per-turn tail.

A provider's prompt cache reuses the longest prefix a request shares with one it has seen. If
the recalled segments of every turn sat in the system context, everything after them would be
new to the provider on every turn. The cache layout keeps one memory block under the text of the
user turn it was built for (its anchor, stored with the session: :class:`StableRecall`), so the
turns before it and after it stay as the provider saw them, and puts only what the turn's recall
adds beyond it in a small tail under the newest user message.

The rule, per turn (``cap``: the memory budget for recalled segments; ``tail_cap``: the tail's
share of it; tokens):

1. Recall selects what the classic layout would show within ``cap`` (:func:`memory_block`).
2. The kept block stays when it leaves ``tail_cap`` of ``cap`` free and, by the ``all`` rule (the
   default), every selected segment it lacks fits ``tail_cap``; by the ``coverage`` rule, when it
   holds at least :data:`KEEP_COVERAGE` of the turn's best-ranked segments (the best ``tail_cap``
   tokens of the selection, by their stored counts). The selected segments it lacks then form the
   tail, best first, within ``tail_cap``. It also stays when the message has not moved on from the
   user's message before it (``same_topic``: the recall built for the subject still serves it):
   the tail then holds the best of what it lacks within :data:`SAME_TOPIC_TAIL` of ``tail_cap``,
   while the block and the tail show at least :data:`SAME_TOPIC_FILL` of the selection.
3. Otherwise recall has moved on: the block is rebuilt from the best-ranked selected segments
   within ``cap - tail_cap`` and anchored under the current message; the rest of the selection
   forms the tail. The prompt then shows every segment the classic layout would.

A rebuild changes the prompt from the old anchor on (the turns since it and the block), never
the persona, the summary or the turns before it. A block whose anchor turn is no longer in the
recent window (rolled out, deleted) is rebuilt. The tail size, the
``same_topic`` threshold and :data:`KEEP_COVERAGE` trade the prefix a provider can reuse against
recall shown per turn: ``scripts/bench_cache.py`` measures both. A message that moves on (a new
subject, a question about something long past) gets a block rebuilt for it, so it sees all the
classic layout would show; one that stays on the subject keeps the block built for the subject.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import tzinfo
from typing import Literal

from runtime.accounting import TokenCounter
from runtime.context._blocks import memory_block
from runtime.context._values import RecalledItem

Keep = Literal["all", "coverage"]
"""When the kept block stays, besides while the message stays on its subject: ``all``, while
every selected segment it lacks fits the tail (the prompt shows all the classic layout would);
``coverage``, while it holds :data:`KEEP_COVERAGE` of the turn's best-ranked segments (selected
segments it lacks beyond the tail are not shown)."""

SAME_TOPIC_TAIL = 1 / 3
"""On the same subject, the tail's share of ``tail_cap``: the block already serves the subject, so
the tail adds only the best few segments it lacks (our choice, set on the tuning split:
``scripts/bench_cache.py``)."""

SAME_TOPIC_FILL = 0.75
"""On the same subject, the share of the turn's selection (tokens) the block and the tail must show
for the block to stay: a block built when the room or the archive was smaller is rebuilt to fill it
(our choice)."""

KEEP_COVERAGE = 0.25
"""Share of the turn's best-ranked segments (``tail_cap`` tokens of them) the kept block must hold
for it to stay (our choice, set on the tuning split: ``scripts/bench_cache.py``)."""


@dataclass(frozen=True, kw_only=True)
class StableRecall:
    """The memory block a session keeps in its stable system context, as stored with the session."""

    text: str
    """The rendered block (the memory block's reference framing included); empty: none."""
    segment_ids: tuple[int, ...] = ()
    """The archive segments the block quotes."""
    anchor: int | None = None
    """The ``seq`` of the user turn the block sits under (``None``: under a message not stored)."""


@dataclass(frozen=True, kw_only=True)
class RecallSplit:
    """What one turn shows of its recall in the cache layout."""

    stable: StableRecall
    """The block for the stable system context (kept, or rebuilt this turn)."""
    rebuilt: bool
    """True when ``stable`` was built this turn (the turn stores it with its reply)."""
    tail: str
    """The memory block of selected segments ``stable`` lacks (empty: none), under the newest user message."""
    tail_ids: tuple[int, ...] = ()
    """The segments ``tail`` quotes."""
    recalled: list[RecalledItem] = field(default_factory=list)
    """The selected segments, all in view (in ``stable`` or ``tail``), chronological."""
    cut: str | None = None
    """What the selection left out, as :func:`memory_block` says it."""


def split_recall(
    candidates: Sequence[RecalledItem],
    kept: StableRecall | None,
    *,
    cap: int,
    tail_cap: int,
    counter: TokenCounter,
    zone: tzinfo,
    keep: Keep = "all",
    same_topic: bool = False,
) -> RecallSplit:
    """Split the recall of one turn between the kept block and the tail (rule in the module doc).

    ``candidates``: recall's segments, best first; ``kept``: the session's stored block (``None``:
    none yet); ``cap`` and ``tail_cap`` in tokens; ``keep``: the rule that keeps the block
    (:data:`Keep`); ``same_topic``: the message has not moved on (the block stays on the terms of
    the module doc's step 2). Pure.
    """
    _, selected, report = memory_block(candidates, cap, counter, zone)
    chosen = {s.id for s in selected}
    ranked = [c for c in candidates if c.id in chosen]
    if kept is not None:
        kept_tokens = counter.count_text(kept.text) if kept.text else 0
        held = set(kept.segment_ids)
        missing = [c for c in ranked if c.id not in held]
        tail, shown, _ = memory_block(missing, tail_cap, counter, zone)
        if keep == "all":
            ok = len(shown) == len(missing)
        else:
            core = _best(ranked, tail_cap)
            ok = sum(c.tokens for c in core if c.id in held) >= KEEP_COVERAGE * sum(c.tokens for c in core)
        if same_topic and not ok:
            # the block serves the subject: the tail adds the best few it lacks, and the block
            # stays while the two show most of what the turn selects
            tail, shown, tail_report = memory_block(missing, int(tail_cap * SAME_TOPIC_TAIL), counter, zone)
            ok = kept_tokens + tail_report.tokens >= SAME_TOPIC_FILL * report.tokens
        if kept_tokens + tail_cap <= cap and ok:
            in_view_ids = held | {s.id for s in shown}
            in_view = [c for c in selected if c.id in in_view_ids]
            return RecallSplit(
                stable=kept,
                rebuilt=False,
                tail=tail,
                tail_ids=tuple(sorted(s.id for s in shown)),
                recalled=in_view,
                cut=report.cut,
            )
    text, stable_items, _ = memory_block(ranked, max(cap - tail_cap, 0), counter, zone)
    stable_tokens = counter.count_text(text) if text else 0
    in_stable = {s.id for s in stable_items}
    tail, tail_items, _ = memory_block([c for c in ranked if c.id not in in_stable], cap - stable_tokens, counter, zone)
    shown = [*stable_items, *tail_items]
    return RecallSplit(
        stable=StableRecall(text=text, segment_ids=tuple(sorted(in_stable))),
        rebuilt=True,
        tail=tail,
        tail_ids=tuple(sorted(s.id for s in tail_items)),
        recalled=sorted(shown, key=lambda s: (s.session_date, s.first_seq)),
        cut=report.cut,
    )


def _best(ranked: Sequence[RecalledItem], tokens: int) -> list[RecalledItem]:
    """The best-ranked segments of ``ranked`` whose stored token counts add up to at most ``tokens`` (at least one)."""
    out: list[RecalledItem] = []
    used = 0
    for c in ranked:
        if out and used + c.tokens > tokens:
            break
        out.append(c)
        used += c.tokens
    return out

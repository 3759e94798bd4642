"""Recall split for the cache layout: a block kept in place across turns, tails kept under the
turns that added them, and what a turn shows once.

A provider's prompt cache reuses the longest prefix a request shares with one it has seen. If
the recalled segments of every turn sat in the system context, everything after them would be
new to the provider on every turn. The cache layout keeps one memory block under the text of the
user turn it was built for (its anchor, stored with the session: :class:`StableRecall`), so the
turns before it and after it stay as the provider saw them. What a later turn's recall adds
beyond it goes under that turn's message, and stays there (a :class:`FrozenTail`, as SillyTavern's
proposal to freeze fired entries into the history does): the next request sends the message as
the provider saw it, and the turn after adds only what is in view nowhere yet. A small share of
the budget is never kept: it shows, under the newest message for that turn only, what the kept
recall lacks once it fills its budget.

The rule, per turn (``cap``: the memory budget for recalled segments; ``tail_cap``: the tail's
share of it; ``reserve``: :data:`SAME_TOPIC_TAIL` of ``tail_cap``, never kept; tokens; "kept":
the block and the tails in view):

1. Recall selects what the classic layout would show within ``cap`` (:func:`memory_block`).
2. The kept block stays while the kept recall fits ``cap`` and, by the ``all`` rule (the default),
   every selected segment it lacks fits what is left of ``cap`` within ``tail_cap``, or the kept
   recall already holds :data:`KEEP_HELD` of the selection (in tokens: the message has moved on
   less than recall's ranking says, and the turn shows the best of what it lacks) and the
   best-ranked selected segment is in view or added; by the
   ``coverage`` rule, while it holds at least :data:`KEEP_COVERAGE` of the turn's best-ranked
   segments (the best ``tail_cap`` tokens of the selection, by their stored counts). The selected
   segments it lacks are added best first: those that fit ``cap`` less the kept recall and the
   ``reserve`` as a new tail kept under the current message, the rest for this turn only. It
   also stays when the message has not moved on from the user's message before it (``same_topic``,
   decided by the caller, against the setting and :func:`topic_background`: the recall built for
   the subject still serves it): the turn then adds the best of what it lacks
   within the ``reserve``, while the kept recall and the addition show at least
   :data:`SAME_TOPIC_FILL` of the selection (in tokens).
3. Otherwise recall has moved on: the block is rebuilt from the best-ranked selected segments
   within ``cap - tail_cap`` and anchored under the current message, with the rest of the
   selection kept there too within ``cap`` less the ``reserve``, and the remainder shown for this
   turn only; the tails are dropped. The prompt then shows every segment the classic layout would.

A rebuild changes the prompt from the old anchor on (the turns since it, the block, the tails),
never the persona, the summary or the turns before it. A block whose anchor turn is no longer in
the recent window (rolled out, deleted) is rebuilt; a tail whose turn is no longer in it is no
longer in view. The assembler also rebuilds the block when the prompt before it changed since it
was built (a compaction changed the summary; :attr:`StableRecall.prefix`): the provider then has
nothing cached after it, and a block built for the current message costs no more than the old one.
The tail size, the ``same_topic`` threshold, :data:`KEEP_HELD` and :data:`KEEP_COVERAGE` trade the
prefix a provider can reuse against recall shown per turn: ``scripts/bench_cache.py`` measures
both. A message that moves on (a new subject, a question about something long past) gets a block
rebuilt for it, so it sees all the classic layout would show; one that stays on the subject, or
whose selection the kept recall mostly holds, keeps the recall built before, with the best of what
it lacks.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from datetime import tzinfo
from typing import Literal

import numpy as np

from runtime.accounting import TokenCounter
from runtime.context._blocks import memory_block
from runtime.context._values import RecalledItem

Keep = Literal["all", "coverage"]
"""When the kept block stays, besides while the message stays on its subject: ``all``, while
every selected segment it lacks fits the tail (the prompt shows all the classic layout would);
``coverage``, while it holds :data:`KEEP_COVERAGE` of the turn's best-ranked segments (selected
segments it lacks beyond the tail are not shown)."""

SAME_TOPIC_TAIL = 1 / 3
"""The share of ``tail_cap`` never kept (the ``reserve``), and what a turn on the same subject adds:
the kept recall already serves the subject, so the turn adds only the best few segments it lacks
(our choice, set on the tuning split: ``scripts/bench_cache.py``)."""

SAME_TOPIC_FILL = 0.75
"""On the same subject, the share of the turn's selection (tokens) the block and the tail must show
for the block to stay: a block built when the room or the archive was smaller is rebuilt to fill it
(our choice)."""

KEEP_HELD = 0.6
"""By the ``all`` rule, the share of the turn's selection (tokens, by their stored counts) the kept
recall must hold for the block to stay when what it lacks does not all fit, its best-ranked
segment in view or added (when that is missing, the message needs what it lacks most, as a
question about a small archive does): the best of that shows within the room left (our choice,
set on the tuning split with a margin: ``scripts/bench_cache.py`` found evidence equal to the
classic layout's from 0.5 up, and lower at 0.42)."""

BACKGROUND_GAP = 3
"""The pairs of the user's messages :func:`topic_background` compares: at least this many user
messages apart, as messages that are rarely on one subject (our choice)."""

BACKGROUND_MESSAGES = 24
"""The user's newest messages in view :func:`topic_background` reads (bounds its work: at most
231 pairs; our choice)."""

BACKGROUND_MIN = 5
"""Fewer of the user's messages in view than this: :func:`topic_background` does not know the
conversation's background (our choice)."""

BACKGROUND_SPREAD = 0.5
"""How far below the mean of the background pairs' similarities, in their standard deviations,
:func:`topic_background` sets the floor (set on the tuning splits, ``scripts/bench_cache.py``: at
0.5 LoCoMo's English conversations keep the figures of the setting alone and MemoryBank's Chinese
ones get back most of the evidence the setting alone lost, 55.6 → 88.9 % at a 2,048 window; at 0
the English ones lose evidence)."""

KEEP_COVERAGE = 0.25
"""Share of the turn's best-ranked segments (``tail_cap`` tokens of them) the kept block must hold
for it to stay (our choice, set on the tuning split: ``scripts/bench_cache.py``)."""


def topic_background(vectors: Sequence[Sequence[float]]) -> float | None:
    """The similarity a message must reach to the user's message before it to count as staying on
    its subject, whatever the embedding model's scale: the mean less :data:`BACKGROUND_SPREAD`
    standard deviations of the cosine similarities of the user's messages at least
    :data:`BACKGROUND_GAP` apart (``vectors``: the user's messages in view before the current one,
    oldest first, equal lengths; the newest :data:`BACKGROUND_MESSAGES` are read). ``None`` with
    fewer than :data:`BACKGROUND_MIN` messages.

    An embedding model puts any two texts of a language at some similarity: all-MiniLM-L6-v2 puts
    user messages three or more apart at 0.23 on average in English, 0.67 in Chinese (LoCoMo,
    MemoryBank; the floor comes to about 0.16 and 0.63). A message no closer to the one before it
    than that has not stayed on its subject. Pure."""
    recent = vectors[-BACKGROUND_MESSAGES:]
    if len(recent) < max(BACKGROUND_MIN, BACKGROUND_GAP + 1):
        return None
    unit = np.asarray(recent, dtype=np.float64)
    norms = np.linalg.norm(unit, axis=1, keepdims=True)
    unit = np.divide(unit, norms, out=np.zeros_like(unit), where=norms > 0)
    similarity = unit @ unit.T
    pairs = similarity[np.tril_indices(len(recent), k=-BACKGROUND_GAP)]
    return float(pairs.mean() - BACKGROUND_SPREAD * pairs.std())


@dataclass(frozen=True, kw_only=True)
class FrozenTail:
    """A recall tail kept under the user turn it was first shown under, as stored with the session."""

    anchor: int | None
    """The ``seq`` of that user turn (``None``: the current message, not stored yet)."""
    text: str
    """The rendered tail (a memory block)."""
    segment_ids: tuple[int, ...] = ()
    """The archive segments it quotes."""


@dataclass(frozen=True, kw_only=True)
class StableRecall:
    """The recall a session keeps in its prompt, as stored with the session: one block and the
    tails frozen under the turns since it."""

    text: str
    """The rendered block (the memory block's reference framing included); empty: none."""
    segment_ids: tuple[int, ...] = ()
    """The archive segments the block quotes."""
    anchor: int | None = None
    """The ``seq`` of the user turn the block sits under (``None``: under a message not stored)."""
    tails: tuple[FrozenTail, ...] = ()
    """The tails shown since the block was built, oldest first, each under its turn."""
    prefix: str | None = None
    """A fingerprint of the prompt before the block (the persona and the system context) when it
    was built (``None``: not known); another one now means the provider has nothing cached after it."""

    @property
    def pieces(self) -> tuple[tuple[int | None, str], ...]:
        """``(anchor, text)`` of the block and of each tail, in prompt order."""
        return ((self.anchor, self.text), *((t.anchor, t.text) for t in self.tails))

    @property
    def all_segment_ids(self) -> frozenset[int]:
        """The segments the block and its tails quote."""
        return frozenset(self.segment_ids).union(*(t.segment_ids for t in self.tails))

    def anchored(self, seq: int | None) -> StableRecall:
        """This recall with what the current turn built (anchor ``None``) anchored at ``seq``, as stored."""
        return replace(
            self,
            anchor=seq if self.anchor is None else self.anchor,
            tails=tuple(t if t.anchor is not None else replace(t, anchor=seq) for t in self.tails),
        )


@dataclass(frozen=True, kw_only=True)
class RecallSplit:
    """What one turn shows of its recall in the cache layout."""

    stable: StableRecall
    """What the session keeps after this turn: the block (kept, or rebuilt this turn) and its
    tails, this turn's (anchor ``None``) last."""
    rebuilt: bool
    """True when the block was built this turn."""
    tail: str
    """The memory block of selected segments the kept recall lacks that the session keeps under the
    newest user message (empty: none)."""
    tail_ids: tuple[int, ...] = ()
    """The segments ``tail`` quotes."""
    volatile: str = ""
    """The memory block of selected segments shown under the newest user message for this turn
    only, after ``tail`` (empty: none): what the kept recall lacks beyond what it may keep."""
    volatile_ids: tuple[int, ...] = ()
    """The segments ``volatile`` quotes."""
    recalled: list[RecalledItem] = field(default_factory=list)
    """The selected segments in view (in the block, a tail or ``volatile``), chronological."""
    cut: str | None = None
    """What the selection left out, as :func:`memory_block` says it."""
    withheld: tuple[RecalledItem, ...] = ()
    """The selected segments this turn does not show (chronological): the kept recall stayed, and they
    did not fit the room it left. The classic layout would show them."""

    @property
    def changed(self) -> bool:
        """True when the session's kept recall changes with this turn (a rebuilt block or a new tail)."""
        return self.rebuilt or bool(self.tail)


@dataclass(frozen=True, kw_only=True)
class _Tail:
    """Segments a turn adds under its message: those kept (``text``) and those shown once (``volatile``)."""

    text: str = ""
    items: tuple[RecalledItem, ...] = ()
    volatile: str = ""
    volatile_items: tuple[RecalledItem, ...] = ()
    tokens: int = 0
    """Of both, each counted with the blank line before it."""


def _tail(missing: Sequence[RecalledItem], room: int, keepable: int, counter: TokenCounter, zone: tzinfo) -> _Tail:
    """The best of ``missing`` (best first) within ``room`` tokens: those within ``keepable`` kept
    under the message, the rest shown for this turn only."""
    text, items, _ = memory_block(missing, min(room, keepable), counter, zone)
    used = counter.count_text("\n\n" + text) if text else 0
    ids = {s.id for s in items}
    volatile, more, _ = memory_block([c for c in missing if c.id not in ids], room - used, counter, zone)
    return _Tail(
        text=text,
        items=tuple(items),
        volatile=volatile,
        volatile_items=tuple(more),
        tokens=used + (counter.count_text("\n\n" + volatile) if volatile else 0),
    )


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
    """Split the recall of one turn between the kept recall and what the turn adds (rule in the module doc).

    ``candidates``: recall's segments, best first; ``kept``: the session's stored recall, with only
    the tails still in view (``None``: none yet); ``cap`` and ``tail_cap`` in tokens; ``keep``: the
    rule that keeps the block (:data:`Keep`); ``same_topic``: the message has not moved on (the
    block stays on the terms of the module doc's step 2). Pure.
    """
    _, selected, report = memory_block(candidates, cap, counter, zone)
    chosen = {s.id for s in selected}
    ranked = [c for c in candidates if c.id in chosen]
    reserve = int(tail_cap * SAME_TOPIC_TAIL)  # never kept: room for what a later turn lacks
    if kept is not None:
        used = sum(counter.count_text("\n\n" + t) for _, t in kept.pieces if t)
        held = kept.all_segment_ids
        missing = [c for c in ranked if c.id not in held]
        room = min(tail_cap, cap - used)
        added = _tail(missing, room, cap - used - reserve, counter, zone)
        if keep == "all":
            ok = len(added.items) + len(added.volatile_items) == len(missing)
            if not ok and not same_topic:
                # most of what the turn selects is in view already, its best-ranked segment among
                # it or added: the kept recall still serves it (the ranking churns in its tail)
                total = sum(c.tokens for c in ranked)
                shown = held | {c.id for c in (*added.items, *added.volatile_items)}
                ok = (
                    total > 0
                    and sum(c.tokens for c in ranked if c.id in held) >= KEEP_HELD * total
                    and ranked[0].id in shown
                )
        else:
            core = _best(ranked, tail_cap)
            ok = sum(c.tokens for c in core if c.id in held) >= KEEP_COVERAGE * sum(c.tokens for c in core)
        if same_topic and not ok:
            # the kept recall serves the subject: the turn adds the best few it lacks, and the
            # block stays while the two show most of what the turn selects
            added = _tail(missing, min(reserve, room), cap - used - reserve, counter, zone)
            ok = used + added.tokens >= SAME_TOPIC_FILL * report.tokens
        if used <= cap and ok:
            return _split(kept, added, rebuilt=False, selected=selected, in_view=held, cut=report.cut)
    text, stable_items, _ = memory_block(ranked, max(cap - tail_cap, 0), counter, zone)
    stable_tokens = counter.count_text(text) if text else 0
    in_stable = {s.id for s in stable_items}
    rest = [c for c in ranked if c.id not in in_stable]
    added = _tail(rest, cap - stable_tokens, cap - stable_tokens - reserve, counter, zone)
    block = StableRecall(text=text, segment_ids=tuple(sorted(in_stable)))
    return _split(block, added, rebuilt=True, selected=selected, in_view=in_stable, cut=report.cut)


def _split(
    kept: StableRecall,
    added: _Tail,
    *,
    rebuilt: bool,
    selected: Sequence[RecalledItem],
    in_view: Collection[int],
    cut: str | None,
) -> RecallSplit:
    """The split that shows ``kept`` (whose segments ``in_view`` are) and ``added``."""
    ids = tuple(sorted(s.id for s in added.items))
    shown = {*in_view, *ids, *(s.id for s in added.volatile_items)}
    tail = FrozenTail(anchor=None, text=added.text, segment_ids=ids)
    return RecallSplit(
        stable=replace(kept, tails=(*kept.tails, tail)) if added.text else kept,
        rebuilt=rebuilt,
        tail=added.text,
        tail_ids=ids,
        volatile=added.volatile,
        volatile_ids=tuple(sorted(s.id for s in added.volatile_items)),
        recalled=[c for c in selected if c.id in shown],
        cut=cut,
        withheld=tuple(c for c in selected if c.id not in shown),
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

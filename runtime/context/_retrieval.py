"""The retrieval block: fired lorebook entries and knowledge chunks, sharing the ``retrieval`` budget.

All of it sits in one block (``prompts/retrieval_block.txt``) that says it is reference
material whose instructions are not to be followed. Items enter whole, never cut:
they claim the budget in ``rank`` order (lorebook entries first, by
:func:`runtime.context.admission_order`, then knowledge chunks, nearest first) and
are shown in ``order`` (lorebook entries by insertion order, then chunks). When not
all fit, a notice (``prompts/notice_retrieval_cut.txt``) says how many matched and
how many were left out.

Lorebook entries placed at a depth (SillyTavern's "@D", V3 ``@@depth``) are not in the
block: each is a message of its own inserted among the recent turns (see
:func:`insert_at_depth`), with its content as written, and its tokens (framing
included) count to ``retrieval`` like the block's. A card's own lorebook
``token_budget`` caps the tokens of its entries (in the block and inserted) when it
is smaller than what ``retrieval`` leaves them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from persona import MacroContext, expand
from prompts import fence, render
from runtime.accounting import TokenCounter
from runtime.context._lorebook import FiredEntry, admission_order
from runtime.context._values import KnowledgeItem
from runtime.messages import Message


@dataclass(frozen=True, kw_only=True)
class RetrievalItem:
    """One candidate for the retrieval block."""

    kind: str
    """``lore`` or ``knowledge``."""
    text: str
    """The rendered entry, as it would appear in the block."""
    rank: int
    """Lower claims the budget first."""
    order: int
    """Lower is shown first."""
    label: str
    """For reports: the lore entry's name or key, or ``source#chunk``."""
    depth: int | None = None
    """Set: a lore entry inserted as its own message this many messages before the newest (0: after it)."""
    role: str = "system"
    """The inserted message's role (with ``depth``)."""
    key: str | None = None
    """For a lorebook entry, the primary key that fired it; ``None`` for a constant entry or a chunk."""
    distance: float | None = None
    """For a knowledge chunk, its cosine distance to the query (0 to 2); ``None`` for a lorebook entry."""

    def message(self) -> Message:
        """The message an entry placed at a depth becomes."""
        return Message(role=self.role, content=self.text)  # type: ignore[arg-type]


@dataclass(frozen=True, kw_only=True)
class RetrievalBlock:
    text: str
    """The block; empty when nothing matched or nothing fit."""
    tokens: int
    shown: list[RetrievalItem]
    matched: int
    """Items offered (lorebook entries plus chunks)."""
    cut: str | None = None
    inserted: list[RetrievalItem] = field(default_factory=list)
    """Entries placed at a depth that fit, in prompt order; their tokens are in ``tokens``."""


def retrieval_items(
    fired: Sequence[FiredEntry],
    hits: Sequence[KnowledgeItem],
    *,
    char: str,
    user: str,
    macros: MacroContext | None = None,
) -> list[RetrievalItem]:
    """Candidates from fired lorebook entries (macros replaced, under ``macros`` when given,
    else with only ``char`` and ``user``) and knowledge hits (verbatim)."""
    items = []
    ranks = {id(f): r for r, f in enumerate(admission_order(fired))}
    ctx = macros or MacroContext(char=char, user=user)
    for order, f in enumerate(fired):
        keys = ", ".join(f.entry.keys) if f.entry.keys else "always"
        content = expand(f.entry.content, ctx, field=f"lore:{f.index}")
        at_depth = f.entry.placement == "depth"
        items.append(
            RetrievalItem(
                kind="lore",
                text=content if at_depth else render("retrieval_lore_entry", keys=fence(keys), content=fence(content)),
                rank=ranks[id(f)],
                order=order,
                label=f.entry.name or (f.key or "constant"),
                depth=f.entry.depth if at_depth else None,
                role=f.entry.role,
                key=f.key,
            )
        )
    base = len(items)
    for i, hit in enumerate(hits):
        items.append(
            RetrievalItem(
                kind="knowledge",
                text=render(
                    "retrieval_knowledge_entry",
                    source=fence(hit.source),
                    part=hit.chunk_index + 1,
                    content=fence(hit.content),
                ),
                rank=base + i,
                order=base + i,
                label=f"{hit.source}#{hit.chunk_index}",
                distance=hit.distance,
            )
        )
    return items


def fit_retrieval(
    items: Sequence[RetrievalItem], *, cap: int, counter: TokenCounter, lore_cap: int | None = None
) -> RetrievalBlock:
    """The block holding as many whole items as fit ``cap`` tokens (notice and entries placed at
    a depth included), lore entries within ``lore_cap`` tokens when given (the card's
    ``token_budget``: the entries' own tokens, block framing and notice excluded)."""
    if not items:
        return RetrievalBlock(text="", tokens=0, shown=[], matched=0)
    costs = {
        id(i): counter.count_message(i.message()) if i.depth is not None else counter.count_text(i.text) for i in items
    }

    def build(chosen: list[RetrievalItem]) -> str:
        body = [i.text for i in sorted(chosen, key=lambda i: i.order) if i.depth is None]
        left = len(items) - len(chosen)
        if left:
            body.append(render("notice_retrieval_cut", matched=len(items), left=left))
        return render("retrieval_block", body="\n\n".join(body)) if body else ""

    def tokens(chosen: list[RetrievalItem]) -> int:
        text = build(chosen)
        return (counter.count_text(text) if text else 0) + sum(costs[id(i)] for i in chosen if i.depth is not None)

    def lore_ok(chosen: list[RetrievalItem]) -> bool:
        return lore_cap is None or sum(costs[id(i)] for i in chosen if i.kind == "lore") <= lore_cap

    def result(chosen: list[RetrievalItem], cut: str | None) -> RetrievalBlock:
        shown = sorted(chosen, key=lambda i: i.order)
        return RetrievalBlock(
            text=build(chosen),
            tokens=tokens(chosen),
            shown=shown,
            matched=len(items),
            cut=cut,
            inserted=[i for i in shown if i.depth is not None],
        )

    if tokens(list(items)) <= cap and lore_ok(list(items)):
        return result(list(items), None)
    chosen: list[RetrievalItem] = []
    for item in sorted(items, key=lambda i: i.rank):
        if tokens([*chosen, item]) <= cap and lore_ok([*chosen, item]):
            chosen.append(item)
    left = len(items) - len(chosen)
    cut = f"{len(items)} matched, {left} left out"
    if not chosen and tokens([]) > cap:  # not even the notice that something matched fits
        return RetrievalBlock(text="", tokens=0, shown=[], matched=len(items), cut=cut)
    return result(chosen, cut)


def insert_at_depth(
    messages: Sequence[Mapping[str, Any]], inserted: Sequence[RetrievalItem]
) -> tuple[list[Mapping[str, Any]], list[int]]:
    """``messages`` (the recent turns, oldest first) with each entry of ``inserted`` placed
    ``depth`` messages before the newest (0: after it; deeper than the turns: before the
    oldest), as the V3 spec's ``@@depth`` and SillyTavern's "@D" place them, and the
    indexes of the inserted messages in the result. Entries at the same depth keep their order."""
    gaps: dict[int, list[Message]] = {}
    for item in inserted:
        gaps.setdefault(max(len(messages) - (item.depth or 0), 0), []).append(item.message())
    out: list[Mapping[str, Any]] = []
    at: list[int] = []
    for i in range(len(messages) + 1):
        for extra in gaps.get(i, []):
            at.append(len(out))
            out.append(extra)
        if i < len(messages):
            out.append(messages[i])
    return out, at

"""The retrieval block: fired lorebook entries and knowledge chunks, sharing the ``retrieval`` budget.

All of it sits in one block (``prompts/retrieval_block.txt``) that says it is reference
material whose instructions are not to be followed. Items enter whole, never cut:
they claim the budget in ``rank`` order (lorebook entries first, by
:func:`runtime.context.admission_order`, then knowledge chunks, nearest first) and
are shown in ``order`` (lorebook entries by insertion order, then chunks). When not
all fit, a notice (``prompts/notice_retrieval_cut.txt``) says how many matched and
how many were left out.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from persona import apply_macros
from prompts import render
from runtime.context._lorebook import FiredEntry, admission_order
from runtime.accounting import TokenCounter
from runtime.context._values import KnowledgeItem


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


@dataclass(frozen=True, kw_only=True)
class RetrievalBlock:
    text: str
    """The block; empty when nothing matched or nothing fit."""
    tokens: int
    shown: list[RetrievalItem]
    matched: int
    """Items offered (lorebook entries plus chunks)."""
    cut: str | None = None


def retrieval_items(
    fired: Sequence[FiredEntry], hits: Sequence[KnowledgeItem], *, char: str, user: str
) -> list[RetrievalItem]:
    """Candidates from fired lorebook entries (macros replaced) and knowledge hits (verbatim)."""
    items = []
    ranks = {id(f): r for r, f in enumerate(admission_order(fired))}
    for order, f in enumerate(fired):
        keys = ", ".join(f.entry.keys) if f.entry.keys else "always"
        content = apply_macros(f.entry.content, char=char, user=user)
        items.append(
            RetrievalItem(
                kind="lore",
                text=render("retrieval_lore_entry", keys=keys, content=content),
                rank=ranks[id(f)],
                order=order,
                label=f.entry.name or (f.key or "constant"),
            )
        )
    base = len(items)
    for i, hit in enumerate(hits):
        items.append(
            RetrievalItem(
                kind="knowledge",
                text=render("retrieval_knowledge_entry", source=hit.source, part=hit.chunk_index + 1, content=hit.content),
                rank=base + i,
                order=base + i,
                label=f"{hit.source}#{hit.chunk_index}",
            )
        )
    return items


def fit_retrieval(items: Sequence[RetrievalItem], *, cap: int, counter: TokenCounter) -> RetrievalBlock:
    """The block holding as many whole items as fit ``cap`` tokens (notice included)."""
    if not items:
        return RetrievalBlock(text="", tokens=0, shown=[], matched=0)

    def build(chosen: list[RetrievalItem]) -> str:
        body = [i.text for i in sorted(chosen, key=lambda i: i.order)]
        left = len(items) - len(chosen)
        if left:
            body.append(render("notice_retrieval_cut", matched=len(items), left=left))
        return render("retrieval_block", body="\n\n".join(body))

    full = build(list(items))
    if counter.count_text(full) <= cap:
        return RetrievalBlock(text=full, tokens=counter.count_text(full), shown=sorted(items, key=lambda i: i.order), matched=len(items))
    chosen: list[RetrievalItem] = []
    for item in sorted(items, key=lambda i: i.rank):
        if counter.count_text(build([*chosen, item])) <= cap:
            chosen.append(item)
    left = len(items) - len(chosen)
    cut = f"{len(items)} matched, {left} left out"
    if not chosen:
        notice_only = build([])  # still say that something matched, if even that fits
        if counter.count_text(notice_only) > cap:
            return RetrievalBlock(text="", tokens=0, shown=[], matched=len(items), cut=cut)
        return RetrievalBlock(text=notice_only, tokens=counter.count_text(notice_only), shown=[], matched=len(items), cut=cut)
    text = build(chosen)
    return RetrievalBlock(
        text=text, tokens=counter.count_text(text), shown=sorted(chosen, key=lambda i: i.order), matched=len(items), cut=cut
    )

"""Summarizers: turn rolled-out turns plus the current summary into a new flat summary.

A summary is a flat list of items (``seq``, ``role``, ``date``, ``text``) rendered
under one header. Merging appends the new items to the old *items* and renders
again; a rendered summary is never fed back in, so summaries cannot nest.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from memory.tables import Turn
from prompts import render
from runtime.tokens import TokenCounter

ASSISTANT_LINE_CHARS = 80
"""Longest shortened assistant line, in characters (our choice: one short sentence)."""


@dataclass(frozen=True, kw_only=True)
class SummaryDraft:
    """A proposed summary, not yet validated or stored."""

    content: str
    """The rendered summary as it enters the prompt."""
    items: list[dict[str, Any]]
    """The flat entries kept, oldest first."""
    tokens: int
    """Tokens of ``content`` by the session's counter; at most the cap it was made for."""
    dropped: int
    """Entries (old and new) this merge left out to fit the cap; they remain in the archive."""


class Summarizer(Protocol):
    """Makes a new flat summary from the previous items and the turns rolled out."""

    name: str

    def summarize(
        self,
        *,
        previous: Sequence[dict[str, Any]],
        turns: Sequence[Turn],
        cap: int,
        counter: TokenCounter,
        omitted_before: int = 0,
    ) -> SummaryDraft:
        """Merge ``turns`` into ``previous`` within ``cap`` tokens.

        Args:
            previous: the current summary's items, oldest first.
            turns: the turns being rolled out, oldest first; never empty.
            cap: the summary's token cap.
            omitted_before: entries earlier compactions already dropped (shown as a count).
        """
        ...


def shorten(text: str, limit: int = ASSISTANT_LINE_CHARS) -> str:
    """The first sentence of ``text`` (whitespace folded), cut to ``limit`` characters with "…"."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?。！？])(\s|$)", flat)
    first = match.group(1) if match else flat
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def render_summary(items: Sequence[dict[str, Any]], omitted: int) -> str:
    """Render items (oldest first) under the summary header."""
    lines = [render(f"summary_line_{item['role']}", date=item["date"], text=item["text"]) for item in items]
    return render(
        "summary_block",
        omitted=render("summary_omitted", count=omitted) if omitted else "",
        body="\n".join(lines),
    )


class ExtractiveSummarizer:
    """The model-free summarizer.

    It keeps the user's lines verbatim and the assistant's first sentences, newest
    first, until the cap is full. Older entries fall out first; they are archived
    verbatim before the summary changes, so they can still be recalled.
    """

    name = "extractive"

    def summarize(
        self,
        *,
        previous: Sequence[dict[str, Any]],
        turns: Sequence[Turn],
        cap: int,
        counter: TokenCounter,
        omitted_before: int = 0,
    ) -> SummaryDraft:
        new_items = [
            {
                "seq": t.seq,
                "role": "user" if t.role == "user" else "assistant",
                "date": t.created_at.date().isoformat(),
                "text": t.content if t.role == "user" else shorten(t.content),
            }
            for t in turns
            if t.content.strip()
        ]
        candidates = sorted([*previous, *new_items], key=lambda i: i["seq"])
        kept: list[dict[str, Any]] = []
        base = counter.count_text(render_summary([], 1))
        used = base
        for item in reversed(candidates):
            line = counter.count_text(render(f"summary_line_{item['role']}", date=item["date"], text=item["text"])) + 1
            if used + line > cap:
                if item["role"] == "assistant":
                    continue  # a shortened assistant line may be skipped; user lines stop the scan
                if not kept:
                    cut = _prefix_that_fits(item, cap - used, counter)
                    if cut is not None:
                        kept.append(cut)
                break
            kept.append(item)
            used += line
        kept.reverse()
        dropped = len(candidates) - len(kept)
        content = render_summary(kept, omitted_before + dropped)
        while kept and counter.count_text(content) > cap:
            kept.pop(0)
            dropped += 1
            content = render_summary(kept, omitted_before + dropped)
        return SummaryDraft(content=content, items=kept, tokens=counter.count_text(content), dropped=dropped)


def _prefix_that_fits(item: dict[str, Any], room: int, counter: TokenCounter) -> dict[str, Any] | None:
    """The longest prefix of a user line (an exact substring) whose line fits ``room`` tokens."""
    text = item["text"]
    lo, hi = 0, len(text)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        cost = counter.count_text(render("summary_line_user", date=item["date"], text=text[:mid])) + 1
        lo, hi = (mid, hi) if cost <= room else (lo, mid - 1)
    return {**item, "text": text[:lo]} if lo >= 20 else None

"""The summary and memory blocks of the system context, each within its cap (tokens)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from datetime import UTC, tzinfo

from prompts import fence, render
from runtime.accounting import TokenCounter
from runtime.context._clock import local_date
from runtime.context._report import SourceReport
from runtime.context._values import RecalledItem, SummaryText


def summary_block(summary: SummaryText | None, cap: int, counter: TokenCounter) -> tuple[str, SourceReport]:
    """The summary block within ``cap`` tokens, with the pending-summary line when turns wait for
    their compaction (that line is never cut: without it the prompt would hide a gap)."""
    if summary is not None and summary.pending:
        note = render("notice_summary_pending", count=summary.pending)
        if not summary.content:
            tokens = counter.count_text(note)
            return note, SourceReport(source="summary", tokens=tokens, cap=cap, items=0)
        content, report = _summary_body(summary, cap - counter.count_text(note) - 1, counter)
        if not content:
            tokens = counter.count_text(note)
            return note, replace(report, tokens=tokens, cap=cap)
        lines = content.split("\n")
        content = "\n".join([*lines[:-1], note, *lines[-1:]])
        return content, replace(report, tokens=counter.count_text(content), cap=cap)
    return _summary_body(summary, cap, counter)


def _summary_body(summary: SummaryText | None, cap: int, counter: TokenCounter) -> tuple[str, SourceReport]:
    if summary is None or not summary.content:
        return "", SourceReport(source="summary", tokens=0, cap=cap, items=0)
    content = summary.content
    tokens = counter.count_text(content)
    lines = content.split("\n")
    cut_note = None
    if tokens > cap:
        # keep the header (first two lines) and the closing tag; drop the oldest entries first
        header, body, footer = lines[:2], lines[2:-1], lines[-1:]
        dropped = 0
        while body:
            body.pop(0)
            dropped += 1
            cut_note = render("notice_summary_cut", count=dropped)
            content = "\n".join([*header, cut_note, *body, *footer])
            tokens = counter.count_text(content)
            if tokens <= cap:
                break
        if tokens > cap:
            return "", SourceReport(
                source="summary", tokens=0, cap=cap, items=0, cut="summary omitted: larger than its cap"
            )
    items = summary.items
    return content, SourceReport(source="summary", tokens=tokens, cap=cap, items=items, cut=cut_note)


def memory_block(
    candidates: Sequence[RecalledItem], cap: int, counter: TokenCounter, zone: tzinfo = UTC
) -> tuple[str, list[RecalledItem], SourceReport]:
    if not candidates or cap <= 0:
        return "", [], SourceReport(source="memory", tokens=0, cap=cap, items=0)
    used = counter.count_text(render("memory_block", body=""))
    chosen: list[tuple[RecalledItem, str]] = []
    for seg in candidates:
        entry = render("memory_entry", date=local_date(seg.session_date, zone), content=fence(seg.content))
        cost = counter.count_text(entry) + 1
        if used + cost <= cap:
            chosen.append((seg, entry))
            used += cost
    if not chosen:
        cut: str | None = f"{len(candidates)} recalled segments did not fit the memory budget"
        return "", [], SourceReport(source="memory", tokens=0, cap=cap, items=0, cut=cut)
    chosen.sort(key=lambda pair: (pair[0].session_date, pair[0].first_seq))  # chronological reads best
    text = render("memory_block", body="\n".join(entry for _, entry in chosen))
    tokens = counter.count_text(text)
    while tokens > cap and chosen:  # the per-entry sum is an estimate of the joined text; make sure
        chosen.pop()
        text = render("memory_block", body="\n".join(entry for _, entry in chosen))
        tokens = counter.count_text(text)
    left = len(candidates) - len(chosen)
    cut = f"{left} more recalled segments not shown" if left else None
    return (
        text,
        [seg for seg, _ in chosen],
        SourceReport(source="memory", tokens=tokens, cap=cap, items=len(chosen), cut=cut),
    )

"""The assembled context as the API shows it: tokens by source, the recalled segments with
why each came back (and, in the cache layout, those selected but not shown), the retrieval
items with the lorebook key that fired them, and the cut notices the prompt carries.

A notice is found by matching each line of a source's rendered text against the notice
templates (``prompts/notice_*.txt``, ``$name`` placeholders as wildcards), so what the
API reports is exactly what the model reads.
"""

from __future__ import annotations

import functools
import re
from datetime import UTC, tzinfo
from typing import Literal

from prompts import template
from runtime.context import AssembledContext, RecalledItem, RetrievalItem
from runtime.service.api.schemas import (
    ContextOut,
    NoticeOut,
    RecalledOut,
    RetrievedOut,
    SourceOut,
)

NOTICE_SOURCES: dict[str, str] = {
    "notice_examples_cut": "persona",
    "notice_summary_cut": "summary",
    "notice_summary_pending": "summary",
    "summary_omitted": "summary",
    "notice_profile_cut": "memory",
    "notice_retrieval_cut": "retrieval",
    "notice_files_omitted": "retrieval",
    "notice_messages_dropped": "recent",
    "notice_turn_cut": "recent",
    "notice_tool_result_cut": "recent",
}
"""Each cut-notice template and the source whose cut it reports (``summary_omitted`` is the
summarizer's own count of lines left out of the summary)."""


REASONS: tuple[Literal["vector", "full_text", "neighbour"], ...] = ("vector", "full_text", "neighbour")
"""Why a segment can be recalled, in the order the API lists them."""


@functools.cache
def _notice_patterns() -> list[tuple[str, re.Pattern[str]]]:
    out = []
    for name, source in NOTICE_SOURCES.items():
        line = next(ln for ln in template(name).template.splitlines() if ln.strip())
        parts = re.split(r"\$\{?\w+\}?", line.strip())
        out.append((source, re.compile("^" + "(.+?)".join(re.escape(p) for p in parts) + "$")))
    return out


def find_notices(context: AssembledContext) -> list[NoticeOut]:
    """The cut notices in ``context``'s source texts, by source, in prompt order."""
    found = []
    for source, text in context.source_text.items():
        for line in text.splitlines():
            line = line.strip()
            if line.startswith("[") and any(s == source and p.match(line) for s, p in _notice_patterns()):
                found.append(NoticeOut(source=source, text=line))
    return found


def recalled_out(seg: RecalledItem, zone: tzinfo = UTC) -> RecalledOut:
    return RecalledOut(
        id=seg.id,
        session_id=seg.session_id,
        first_seq=seg.first_seq,
        last_seq=seg.last_seq,
        session_date=seg.session_date.astimezone(zone),  # on the user's clock
        tokens=seg.tokens,
        content=seg.content,
        reasons=[r for r in REASONS if r in seg.reason.split("+")],
        score=seg.score,
        vector_rank=seg.vector_rank,
        text_rank=seg.text_rank,
        distance=seg.distance,
        neighbour_of=seg.neighbour_of,
    )


def retrieved_out(item: RetrievalItem) -> RetrievedOut:
    kind: Literal["lore", "knowledge"] = "lore" if item.kind == "lore" else "knowledge"
    return RetrievedOut(kind=kind, label=item.label, key=item.key, distance=item.distance, text=item.text)


def context_out(context: AssembledContext) -> ContextOut:
    """The API body of an assembled context (a read of ``context``; nothing is stored)."""
    return ContextOut(
        session_id=context.session_id,
        total_tokens=context.total_tokens,
        window=context.window,
        reply_reserve=context.reply_reserve,
        overhead_tokens=context.overhead_tokens,
        sources={
            name: SourceOut(tokens=r.tokens, cap=r.cap, items=r.items, cut=r.cut, text=context.source_text.get(name))
            for name, r in context.sources.items()
        },
        recalled=[recalled_out(s, context.zone) for s in context.recalled],
        withheld=[recalled_out(s, context.zone) for s in context.recall_withheld],
        retrieved=[retrieved_out(i) for i in context.retrieved],
        notices=find_notices(context),
        attached_files=list(context.attached_files),
    )

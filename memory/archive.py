"""Archive segmentation: how rolled-out exchanges become archived segments.

A segment is stored verbatim (``content``) and found by the embedding of its
``key`` text. Compaction hands over whole exchanges (oldest first); this module
decides how they are cut into segments and what each segment's key is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Sequence

from memory.tables import Turn


@dataclass(frozen=True, kw_only=True)
class SegmentDraft:
    """A segment before it is embedded."""

    first_seq: int
    last_seq: int
    content: str
    """The turns verbatim, one ``Speaker: text`` line each."""
    key: str
    """The text whose embedding finds this segment."""
    session_date: datetime
    """When the segment's first turn was said."""


def turn_line(turn: Turn, assistant_name: str) -> str:
    """``User: text`` or ``<assistant_name>: text``, verbatim."""
    return f"{'User' if turn.role == 'user' else assistant_name}: {turn.content}"


def build_segments(exchanges: Sequence[Sequence[Turn]], *, assistant_name: str) -> list[SegmentDraft]:
    """One segment per exchange, keyed by its own verbatim text.

    Args:
        exchanges: whole exchanges, oldest first, each a non-empty list of turns.
        assistant_name: the label of the assistant's lines.
    """
    drafts = []
    for group in exchanges:
        content = "\n".join(turn_line(t, assistant_name) for t in group)
        drafts.append(
            SegmentDraft(
                first_seq=group[0].seq,
                last_seq=group[-1].seq,
                content=content,
                key=content,
                session_date=group[0].created_at,
            )
        )
    return drafts

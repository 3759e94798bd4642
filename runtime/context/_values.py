"""The values context assembly takes: its own, never storage rows.

The turn layer (:mod:`runtime.turn`) reads rows from :mod:`memory` and converts them into
these, so that assembly stays a pure function of its arguments and imports nothing from
storage. Each is a frozen keyword-only dataclass; token counts are the runtime's estimates.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime


@dataclass(frozen=True, kw_only=True)
class RecentTurn:
    """One stored turn of the recent window, as the prompt shows it."""

    seq: int
    """Per-session sequence number (from 1)."""
    role: str
    """``user`` or ``assistant``."""
    content: str
    """The turn's text, verbatim."""


@dataclass(frozen=True, kw_only=True)
class SummaryText:
    """The session's current rolling summary."""

    content: str
    """The rendered summary block, as it enters the prompt (first two lines a header, last line the closing tag)."""
    items: int = 0
    """How many flat entries (quotes, notes) the summary holds."""
    pending: int = 0
    """Turns out of view (over the ``recent`` cap) that no compaction has rolled out yet: their
    summary is still pending. The summary block says so in one line, counted in its budget."""


@dataclass(frozen=True, kw_only=True)
class RecalledItem:
    """One archive segment recall returned, best first in the list that holds it."""

    id: int
    """The segment's id in the archive."""
    session_id: str
    first_seq: int
    last_seq: int
    content: str
    """The rolled-out turns, verbatim."""
    tokens: int
    """Estimated tokens of ``content``."""
    session_date: datetime
    """When the segment's turns were said."""
    distance: float | None = 0.0
    """Cosine distance of the segment's key embedding to the query, 0 to 2; ``None`` when recall
    ran without a query vector (the embedder was down) or the segment has no key yet."""
    vector_rank: int | None = None
    """1-based rank by ``distance``; ``None`` beyond the ranker's pool."""
    text_rank: int | None = None
    """1-based rank by full-text score; ``None`` if no query term matched."""
    score: float = 0.0
    """Reciprocal-rank-fusion score over the rankers (times the speaker weight for a segment of the
    speaker the message names, :func:`memory.recall.recall`); 0 for a neighbour."""
    neighbour_of: int | None = None
    """For a segment added next to a hit, the hit's id."""

    @property
    def reason(self) -> str:
        """Why it was recalled: ``vector``, ``full_text``, ``vector+full_text`` or ``neighbour``."""
        if self.neighbour_of is not None:
            return "neighbour"
        found = [
            name for name, rank in (("vector", self.vector_rank), ("full_text", self.text_rank)) if rank is not None
        ]
        return "+".join(found) or "vector"


@dataclass(frozen=True, kw_only=True)
class KnowledgeItem:
    """One knowledge-base chunk found for the message."""

    source: str
    """The file the chunk came from."""
    chunk_index: int
    """0-based position of the chunk in its file."""
    content: str
    distance: float = 0.0
    """Cosine distance to the query (0 = same direction)."""


@dataclass(frozen=True, kw_only=True)
class PinnedProfile:
    """A user's pinned profile: shown first in ``memory``; ``name`` is what ``{{user}}`` becomes."""

    name: str | None = None
    pronouns: str | None = None
    facts: tuple[str, ...] = field(default_factory=tuple)
    """Facts the user or app set."""
    learned: tuple[str, ...] = field(default_factory=tuple)
    """Facts learned from summaries, oldest first."""

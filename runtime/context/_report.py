"""What one source put into the prompt."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class SourceReport:
    """What one source put into the prompt."""

    source: str
    tokens: int
    """Tokens this source used, its share of message framing included."""
    cap: int
    """The source's cap in tokens, for its content: ``tokens`` may pass it by the source's share of
    message framing. For ``memory``: its cap plus what the persona, the summary and retrieval left
    of theirs (when that flow is on); for ``recent``: its cap plus what all the others left."""
    items: int
    """Entries included: turns, segments, summary lines."""
    cut: str | None = None
    """What was cut, as said in the prompt; ``None`` if nothing was."""

"""When compaction runs: the turn asks a :class:`CompactionScheduler` after the reply.

The reply never waits for a compaction. After the reply is stored, the turn hands a
:class:`CompactionRequest` to the engine's scheduler:

- :class:`InlineCompaction` (the default of library use, ``companion chat`` and ``companion
  replay``) runs it at once, in the turn's thread, after the reply was produced and stored:
  deterministic, so a replay or a test sees the compacted session as soon as the turn returns.
- :class:`runtime.service.QueuedCompaction` (``companion serve``'s default) defers a durable job
  that a queue worker runs (:mod:`runtime.service._queue`).

Either way the compaction itself is :meth:`runtime.turn.TurnRunner.compact_now`: the advisory
lock, the breaker, the verbatim-quote check and the one commit transaction of
:class:`~runtime.compaction.Compactor`, then profile learning.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

from memory.tables import Turn
from runtime.compaction import CompactionOutcome


@dataclass(frozen=True, kw_only=True)
class CompactionRequest:
    """What one compaction of a session needs, as the engine that asks for it sees it."""

    session_id: str
    user_id: str
    recent_cap: int
    """Compact when the session's recent window holds more than this many tokens."""
    summary_cap: int
    """The summary's budget, tokens."""
    assistant_name: str
    """The character's name, as archive segments and the summary name the assistant."""
    character_id: str = ""
    """The session's character, whose learned facts the summary's profile section joins (``""``:
    read from the session)."""


def room_cap(window: Sequence[Turn], cap: int) -> int:
    """The ``recent`` cap (stored tokens) a compaction after a turn applies, so that the next
    request shows its recent window whole: ``cap`` less room for a next message as long as the
    newest user message of ``window`` (the session's recent window), but never less than half of
    ``cap`` (a longer message is cut to fit in any case). Otherwise the context drops the oldest
    turns for room before a compaction is due: they are out of view without being summarized, and
    a prompt the provider could cache loses its start one turn at a time."""
    message = next((t.tokens for t in reversed(window) if t.role == "user"), 0)
    return max(cap - message, cap // 2)


CompactNow = Callable[[CompactionRequest], CompactionOutcome | None]
"""Runs one compaction now (:meth:`runtime.turn.TurnRunner.compact_now`)."""
Due = Callable[[CompactionRequest], bool]
"""True if a compaction of the request's session would do something now
(:meth:`runtime.compaction.Compactor.due`); one read of the recent window."""


class CompactionScheduler(Protocol):
    """Decides when a session's compaction runs, once the reply is stored."""

    def schedule(self, request: CompactionRequest, run: CompactNow, due: Due) -> CompactionOutcome | None:
        """Run ``request`` now with ``run`` and return its outcome, or (when ``due`` says there is
        something to do) arrange for it to run later and return ``None``. Raises what ``run``
        raises when it runs now (:class:`~errors.StorageError`); a scheduler that defers raises
        ``StorageError`` when the job cannot be stored."""
        ...


class InlineCompaction:
    """Runs the compaction at once, in the turn's thread, after the reply."""

    name = "inline"

    def schedule(self, request: CompactionRequest, run: CompactNow, due: Due) -> CompactionOutcome | None:
        return run(request) if due(request) else None  # run() checks again, under the lock

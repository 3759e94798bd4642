"""Archived segments the recall tests write straight through the store, without a compaction."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from memory.store import NewSegment, NewSummary, Store

T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)


def archive_segments(
    store: Store,
    *,
    user_id: str,
    session_id: str,
    contents: Sequence[str],
    vectors: Sequence[Sequence[float]],
    tokens: Callable[[str], int],
    step: timedelta,
) -> None:
    """Store ``contents`` as one-turn segments (seqs 1, 2, …) of ``session_id``, the i-th dated
    ``T0 + i * step`` with embedding ``vectors[i]`` and ``tokens(content)`` tokens, in one
    compaction commit with a placeholder summary."""
    # the test persona's character (tests.conftest.PERSONA), as an engine's turns in the same tests have it
    store.sessions.ensure(session_id=session_id, user_id=user_id, character_id=store.characters.placeholder("Mira").id)
    store.compaction.commit(
        session_id=session_id,
        user_id=user_id,
        turn_ids=[],
        segments=[
            NewSegment(
                first_seq=i + 1,
                last_seq=i + 1,
                content=c,
                tokens=tokens(c),
                session_date=T0 + i * step,
                embedding=[float(x) for x in v],
            )
            for i, (c, v) in enumerate(zip(contents, vectors, strict=True))
        ],
        summary=NewSummary(content="s", items=[], first_seq=1, last_seq=len(contents), tokens=1),
    )

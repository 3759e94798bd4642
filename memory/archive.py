"""Archive segmentation: how rolled-out exchanges become archived segments.

A segment is stored verbatim (``content``) and found by the embedding of its
``key`` text and by full-text search over its content. Compaction hands over whole
exchanges (oldest first); this module decides how they are cut into segments and
what each segment's key is.

The choice, one segment per turn keyed by the turn with the turn before and after it
(:data:`UNIT`, :data:`KEY`), was made by ``scripts/eval_recall.py`` on LoCoMo evidence
recall at fixed token budgets (retrieval only, hybrid recall, 7 conversations,
categories 1–4, at 1,000 / 2,000 tokens): one segment per exchange 64.4 / 74.0 %; per
turn keyed by itself 65.2 / 73.0; keyed with the turn before 67.7 / 76.6; with the
turns before and after 69.6 / 76.8 (all without neighbour expansion). Small segments
waste less budget on turns that are not the evidence; the surrounding turns give a
short reply ("Yes, last May!") the topic it answers. The other layouts stay available
to that script through :func:`segment_exchanges`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

from memory.tables import Turn

Unit = Literal["turn", "exchange"]
"""``turn``: one segment per turn; ``exchange``: one per user/assistant exchange."""
Key = Literal["content", "user", "context", "window"]
"""What the embedding key holds: ``content`` the segment's own lines; ``user`` only the
user's lines (falling back to the content when it has none); ``context`` the turn
before the segment, then the segment's lines; ``window`` the turn before, the segment's
lines and the turn after. Neighbours are known only within one call (one compaction)."""

UNIT: Unit = "turn"
"""The segment unit :func:`build_segments` uses."""
KEY: Key = "window"
"""The key :func:`build_segments` uses."""


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


USER_LABEL = "User"
"""The label of the user's lines when the user's display name is not known."""


def turn_line(turn: Turn, assistant_name: str, user_name: str | None = None) -> str:
    """``<user_name>: text`` (``User: text`` without a name) or ``<assistant_name>: text``, verbatim."""
    return f"{(user_name or USER_LABEL) if turn.role == 'user' else assistant_name}: {turn.content}"


def build_segments(
    exchanges: Sequence[Sequence[Turn]], *, assistant_name: str, user_name: str | None = None
) -> list[SegmentDraft]:
    """Segments for rolled-out exchanges, in the layout chosen by evaluation (:data:`UNIT`, :data:`KEY`).

    Args:
        exchanges: whole exchanges, oldest first, each a non-empty list of turns.
        assistant_name: the label of the assistant's lines.
        user_name: the label of the user's lines (their display name), so a question
            that names the user ("What did Caroline paint?") matches their lines by
            embedding and full text; ``None`` labels them :data:`USER_LABEL`. The
            runtime passes ``None``: on the tuning split the name did not pay
            (``scripts/eval_recall.py --components dates,names``; LoCoMo 71.6 → 70.9 %
            at 1,000 tokens and 80.2 → 78.5 % at 2,000; MemoryBank Chinese, with jieba
            words, 96.3 % at 500 tokens either way).
    """
    return segment_exchanges(exchanges, assistant_name=assistant_name, user_name=user_name, unit=UNIT, key=KEY)


def segment_exchanges(
    exchanges: Sequence[Sequence[Turn]], *, assistant_name: str, unit: Unit, key: Key, user_name: str | None = None
) -> list[SegmentDraft]:
    """Cut exchanges into segments of ``unit`` with keys of kind ``key``; ``content`` is always verbatim."""
    if unit == "turn":
        groups = [[t] for group in exchanges for t in group]
    elif unit == "exchange":
        groups = [list(g) for g in exchanges]
    else:
        raise ValueError(f"unit must be 'turn' or 'exchange', got {unit!r}")
    drafts = []
    previous: Turn | None = None
    for index, group in enumerate(groups):
        following = groups[index + 1][0] if index + 1 < len(groups) else None
        lines = [turn_line(t, assistant_name, user_name) for t in group]
        content = "\n".join(lines)
        if key == "content":
            key_text = content
        elif key == "user":
            key_text = "\n".join(line for t, line in zip(group, lines, strict=False) if t.role == "user") or content
        elif key == "context":
            key_text = content if previous is None else turn_line(previous, assistant_name, user_name) + "\n" + content
        elif key == "window":
            around = [turn_line(previous, assistant_name, user_name)] if previous is not None else []
            around.append(content)
            if following is not None:
                around.append(turn_line(following, assistant_name, user_name))
            key_text = "\n".join(around)
        else:
            raise ValueError(f"key must be 'content', 'user', 'context' or 'window', got {key!r}")
        drafts.append(
            SegmentDraft(
                first_seq=group[0].seq,
                last_seq=group[-1].seq,
                content=content,
                key=key_text,
                session_date=group[0].created_at,
            )
        )
        previous = group[-1]
    return drafts

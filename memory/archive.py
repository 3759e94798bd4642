"""Archive segmentation: how rolled-out exchanges become archived segments.

A segment is stored verbatim (``content``) and found by the embedding of its
``key`` text and by full-text search over its content. Compaction hands over whole
exchanges (oldest first); this module decides how they are cut into segments and
what each segment's key is.

The choice, one segment per turn keyed by the turn with the turn before and after it
(:data:`UNIT`, :data:`KEY`), was made by ``scripts/eval_recall.py`` on LoCoMo evidence
recall at fixed token budgets (``docs/decisions/measurements.md#archive-segments-and-keys``). Small segments
waste less budget on turns that are not the evidence; the surrounding turns give a
short reply ("Yes, last May!") the topic it answers. The other layouts stay available
to that script through :func:`segment_exchanges`.
"""

from __future__ import annotations

import math
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

Weighting = Literal["equal", "centre2", "tokens", "tokens-centre2"]
"""How :func:`key_weights` weighs the turns of a composed vector: ``equal``; ``centre2`` the
segment's own turn (or the message of an enriched query) twice; ``tokens`` each by its tokens;
``tokens-centre2`` both."""

UNIT: Unit = "turn"
"""The segment unit :func:`build_segments` uses."""
KEY: Key = "window"
"""The key :func:`build_segments` uses."""
WEIGHTING: Weighting = "centre2"
"""How the runtime composes a key's vector from its turns' vectors (:func:`key_vectors`), chosen
by ``scripts/eval_recall.py --compose`` on the tuning splits
(``docs/decisions/measurements.md#composed-keys``)."""


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
            (``docs/decisions/measurements.md#the-users-name-in-keys``).
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


def cosine(a: Sequence[float], b: Sequence[float]) -> float:
    """Cosine similarity of two vectors of one dimension, -1 to 1 (0 when either is zero)."""
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0


def compose(vectors: Sequence[Sequence[float]], weights: Sequence[float]) -> list[float]:
    """The L2-normalised weighted sum of ``vectors`` (unit vectors of one dimension, one weight
    each): the vector of a text joined from several embedded texts, without embedding it.

    all-MiniLM-L6-v2 mean-pools its token vectors, so the sum of the parts' vectors weighted by
    their token counts approximates the joined text's vector (up to the context each part
    would see of the others).

    Raises:
        ValueError: no vectors, or not as many weights as vectors.
    """
    if not vectors or len(vectors) != len(weights):
        raise ValueError(f"compose needs one weight per vector, got {len(vectors)} vectors, {len(weights)} weights")
    total = [0.0] * len(vectors[0])
    for vector, weight in zip(vectors, weights, strict=True):
        for i, x in enumerate(vector):
            total[i] += weight * x
    norm = math.sqrt(sum(x * x for x in total))
    return [x / norm for x in total] if norm > 0 else total


def key_weights(tokens: Sequence[int], centre: int, weighting: Weighting = WEIGHTING) -> list[float]:
    """The weights :func:`compose` gives texts of ``tokens`` tokens each, ``centre`` being the
    position of the segment's own turn (or of an enriched query's message)."""
    weights = [float(max(n, 1)) if weighting.startswith("tokens") else 1.0 for n in tokens]
    if weighting.endswith("centre2"):
        weights[centre] *= 2
    return weights


def key_vectors(
    exchanges: Sequence[Sequence[Turn]],
    vectors: Sequence[Sequence[float]],
    *,
    tokens: Sequence[int],
    weighting: Weighting = WEIGHTING,
) -> list[list[float]]:
    """The key vectors of :func:`build_segments`' segments of ``exchanges``, composed from the
    embeddings of their turns' texts instead of embedding the key texts: for each turn, the
    :func:`compose` of the vectors of the turn before, the turn and the turn after (the
    ``window`` key's turns, within this call), weighted by :func:`key_weights`.

    Args:
        exchanges: as for :func:`build_segments`.
        vectors: the embedding of each turn's ``content``, in the order of the turns.
        tokens: each turn's token count, same order.

    Raises:
        ValueError: ``vectors`` or ``tokens`` do not match the turns one to one.
    """
    turns = [t for group in exchanges for t in group]
    if len(vectors) != len(turns) or len(tokens) != len(turns):
        raise ValueError(f"{len(turns)} turns need as many vectors and token counts, got {len(vectors)}, {len(tokens)}")
    keys = []
    for i in range(len(turns)):
        window = range(max(i - 1, 0), min(i + 2, len(turns)))
        keys.append(
            compose([vectors[j] for j in window], key_weights([tokens[j] for j in window], i - window.start, weighting))
        )
    return keys

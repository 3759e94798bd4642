"""The read model of context assembly: what a turn reads of a session besides its turns, in one statement.

It reads across rooms (summaries, sessions, characters, archive counts, turn files, knowledge chunks) and writes
nothing; each of those tables is written by its own room.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Engine, text

from memory.database import autocommit_engine, storage_errors
from memory.profiles import dedupe_facts
from memory.tables import Summary
from memory.turns import RecallTail


@dataclass(frozen=True, kw_only=True)
class SessionReads:
    """What assembling a context reads of a session besides its turns (:meth:`AssemblyReads.session`)."""

    summary: Summary | None
    """The session's summary, as :meth:`memory.compaction.Compactions.summary` gives it."""
    archived_segments: int
    """The archived segments recall reads: the user's with the session's character (their
    ``archive_counts`` row), or all of the user's (``scoped`` ``False``)."""
    archive_rows: float
    """The archive table's estimated rows (``pg_class.reltuples``: ``-1`` before it was ever
    analyzed), for :func:`memory.recall.index_pays`."""
    has_files: bool
    """Whether any turn of the session carries a file (``False``: :meth:`memory.turns.Turns.attachments`
    would return nothing)."""
    has_knowledge: bool
    """Whether the session's character has knowledge chunks (``False``: a knowledge search finds nothing)."""
    character_id: str | None
    """The session's character (``None``: no such session yet)."""
    revision: int
    """That character's newest revision (0: none)."""
    learned: tuple[str, ...] = ()
    """What the session's character learned of the user from summaries, oldest first (with
    ``scoped`` ``False``, what every character did, repeats left out)."""
    recall_block: str | None = None
    """The recall block the session keeps in its stable context (cache layout; ``None``: none kept)."""
    recall_segments: tuple[int, ...] = ()
    """The archive segments that block quotes (not those of ``recall_tails``)."""
    recall_anchor: int | None = None
    """The ``seq`` of the user turn the block sits under."""
    recall_tails: tuple[RecallTail, ...] = ()
    """The recall tails the session keeps under the turns since that one, oldest first."""
    recall_prefix: str | None = None
    """A fingerprint of the prompt before the block when it was built (``None``: not known)."""
    vector_model: str | None = None
    """The embedding model the database records for its vectors (``None``: none recorded yet);
    another than the reader's means the database was switched to it (``companion db reembed``)."""


class AssemblyReads:
    """The reads context assembly makes of a session in one round trip."""

    def __init__(self, engine: Engine) -> None:
        self._one = autocommit_engine(engine)

    def session(self, session_id: str, *, user_id: str, scoped: bool = True) -> SessionReads:
        """The session's summary, its character and that one's newest revision, the archive's size
        (the user's segments with the session's character; with ``scoped`` ``False``, all of the
        user's), and whether the session's turns carry files and the character has knowledge, in
        one statement (:class:`SessionReads`): what
        assembling a context would otherwise read in four, two of them only to find nothing. A
        read: nothing changes. Each part is read by a key or an index; whether the session has
        files is the question :meth:`memory.turns.Turns.attachments` answers, at no greater cost."""
        with storage_errors(session_id), self._one.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT s.session_id IS NOT NULL AS found, s.user_id AS summary_user, s.content, s.items, "
                    "s.first_seq, s.last_seq, "
                    "s.tokens, s.dropped_quotes, s.updated_at, "
                    "coalesce((SELECT sum(a.segments) FROM archive_counts AS a WHERE a.user_id = :u "
                    "AND (NOT :scoped OR a.character_id = ss.character_id)), 0) AS archived, "
                    "(SELECT reltuples FROM pg_class WHERE oid = CAST('archived_segments' AS regclass)) AS archive_rows, "
                    "EXISTS (SELECT 1 FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
                    "WHERE t.session_id = :s AND t.user_id = :u AND tf.user_id = :u) AS has_files, "
                    "EXISTS (SELECT 1 FROM knowledge_chunks AS k WHERE k.character_id = ss.character_id) AS has_knowledge, "
                    "ss.character_id, coalesce(h.revision, 0) AS revision, ss.recall_block, ss.recall_segments, ss.recall_anchor, ss.recall_tails, ss.recall_prefix, "
                    "(SELECT m.name FROM embedding_model AS m WHERE m.id = 1) AS vector_model, "
                    "(SELECT coalesce(jsonb_agg(e.f ORDER BY lf.updated_at, lf.character_id, e.n), '[]') "
                    "FROM learned_facts AS lf CROSS JOIN LATERAL jsonb_array_elements_text(lf.facts) "
                    "WITH ORDINALITY AS e(f, n) WHERE lf.user_id = :u "
                    "AND (NOT :scoped OR lf.character_id = ss.character_id)) AS learned "
                    "FROM (SELECT 1) AS one LEFT JOIN summaries AS s ON s.session_id = :s AND s.user_id = :u "
                    "LEFT JOIN sessions AS ss ON ss.id = :s AND ss.user_id = :u "
                    "LEFT JOIN characters AS h ON h.id = ss.character_id"
                ),
                {"s": session_id, "u": user_id, "scoped": scoped},
            ).one()
        summary = (
            Summary(
                session_id=session_id,
                user_id=row.summary_user,
                content=row.content,
                items=row.items,
                first_seq=row.first_seq,
                last_seq=row.last_seq,
                tokens=row.tokens,
                dropped_quotes=row.dropped_quotes,
                updated_at=row.updated_at,
            )
            if row.found
            else None
        )
        tails = tuple(
            RecallTail(anchor=int(t["anchor"]), text=str(t["text"]), segments=tuple(int(i) for i in t["segments"]))
            for t in row.recall_tails or ()
            if t.get("anchor") is not None
        )
        in_tails = {i for t in tails for i in t.segments}
        return SessionReads(
            summary=summary,
            archived_segments=int(row.archived),
            archive_rows=float(row.archive_rows if row.archive_rows is not None else -1),
            has_files=bool(row.has_files),
            has_knowledge=bool(row.has_knowledge),
            character_id=row.character_id,
            revision=int(row.revision),
            learned=tuple(dedupe_facts(row.learned or [])),
            recall_block=row.recall_block,
            recall_segments=tuple(s for s in row.recall_segments or () if s not in in_tails),
            recall_anchor=row.recall_anchor,
            recall_tails=tails,
            recall_prefix=row.recall_prefix,
            vector_model=row.vector_model,
        )

"""Vectors the embedder could not make when they were needed, made later (the embeddings backfill).

When the embedder is down (an embeddings API that fails), a turn still answers: its message is
stored without a vector, and a compaction stores its segments without keys
(``archived_segments.embedding`` ``NULL``). :func:`backfill` fills in what is missing once the
embedder answers again:

- **turn vectors**: every user turn with text and no ``turn_vectors`` row (embedded as the runtime
  embeds a message, ``user_text``), and every turn a keyless segment's key is composed from;
- **archive keys**: each segment without a key, composed by :func:`memory.archive.key_vectors`
  from the vectors of its turn and of the archived turns just before and after it in its session
  (the window one compaction of the whole run would use; the compaction that stored it may have
  had a shorter one at its edges); a segment of several turns (an older layout) is keyed by the
  embedding of its content.

Every write is conditional on the database still recording the embedder's model
(:mod:`memory.vector_model`), so vectors of a model the database has switched away from are never
written. :func:`missing` counts what is left, the figure the runtime's tests hold at zero.
:class:`Backfill` is the room the runtime calls them through (``Store.backfill``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import structlog
from sqlalchemy import Connection, Engine, bindparam, text

from errors import EmbeddingModelMismatch
from memory.archive import key_vectors
from memory.database import storage_errors
from memory.embeddings import Embedder
from memory.tables import Turn
from memory.vector_model import canonical_name, recorded_model
from memory.vectors import Vector

log = structlog.get_logger("companion.backfill")

BATCH = 64
"""Texts embedded (and rows written) per step."""

_VEC = bindparam("e", type_=Vector())
_SAME_MODEL = "coalesce((SELECT name = :model AND dimension = :dim FROM embedding_model WHERE id = 1), true)"
"""True while the database records the embedder's model, or none (a database no runtime has opened)."""

_MISSING_TURNS = (
    "SELECT t.id FROM turns t WHERE t.role = 'user' AND t.content <> '' "
    "AND NOT EXISTS (SELECT 1 FROM turn_vectors v WHERE v.turn_id = t.id)"
)
_KEYLESS = "SELECT id FROM archived_segments WHERE embedding IS NULL"


@dataclass(frozen=True)
class Missing:
    """What is still without a vector."""

    turn_vectors: int
    """User turns with text and no vector."""
    archive_keys: int
    """Archive segments without a key."""

    @property
    def total(self) -> int:
        return self.turn_vectors + self.archive_keys


@dataclass
class Backfilled:
    """What one :func:`backfill` wrote."""

    turn_vectors: int = 0
    archive_keys: int = 0


def missing(engine: Engine) -> Missing:
    """The user turns without a vector and the segments without a key, counted.

    Raises:
        StorageError: the database failed.
    """
    with storage_errors(), engine.connect() as conn:
        turns = conn.execute(text(f"SELECT count(*) FROM ({_MISSING_TURNS}) AS m")).scalar_one()
        keys = conn.execute(text(f"SELECT count(*) FROM ({_KEYLESS}) AS k")).scalar_one()
    return Missing(turn_vectors=int(turns), archive_keys=int(keys))


def backfill(
    engine: Engine,
    embedder: Embedder,
    *,
    count_tokens: Callable[[str], int],
    user_text: Callable[[str, Sequence[str]], str],
    batch: int = BATCH,
) -> Backfilled:
    """Embed the user turns without a vector and compose the archive keys that are missing
    (module docstring), ``batch`` texts per call of ``embedder``, each batch committed on its own.

    Args:
        count_tokens: tokens of a text, as the compactor counts them (the key weights use them).
        user_text: the text a user's message is embedded from, given the message and the
            speakers' names (:func:`runtime.context.without_names`).

    Returns:
        What was written (rows another process filled meanwhile are not counted).

    Raises:
        EmbeddingModelMismatch: the database records another model than ``embedder``'s; nothing
            is written.
        StorageError: the database failed; the batches committed before stay.
        Whatever ``embedder`` raises (:class:`~errors.EmbedderUnavailableError` while it is
            down); the batches committed before stay.
    """
    recorded = recorded_model(engine)
    if recorded is not None and (recorded.name, recorded.dimension) != (
        canonical_name(embedder.name),
        embedder.dimension,
    ):
        raise EmbeddingModelMismatch(
            recorded_name=recorded.name,
            recorded_dim=recorded.dimension,
            model_name=embedder.name,
            model_dim=embedder.dimension,
        )
    model = {"model": canonical_name(embedder.name), "dim": int(embedder.dimension)}
    done = Backfilled()
    with storage_errors():
        after = 0
        while True:
            with engine.connect() as conn:
                ids = list(
                    conn.execute(
                        text(f"{_MISSING_TURNS} AND t.id > :after ORDER BY t.id LIMIT :n"), {"after": after, "n": batch}
                    ).scalars()
                )
            if not ids:
                break
            after = ids[-1]
            done.turn_vectors += _embed_turns(engine, embedder, ids, user_text, model)
        after = 0
        while True:
            with engine.connect() as conn:
                ids = list(
                    conn.execute(
                        text(f"{_KEYLESS} AND id > :after ORDER BY id LIMIT :n"), {"after": after, "n": batch}
                    ).scalars()
                )
            if not ids:
                break
            after = ids[-1]
            done.archive_keys += _compose_keys(engine, embedder, ids, count_tokens, user_text, model)
    if done.turn_vectors or done.archive_keys:
        log.info("embeddings.backfilled", turn_vectors=done.turn_vectors, archive_keys=done.archive_keys)
    return done


def _embed_turns(
    engine: Engine,
    embedder: Embedder,
    ids: Sequence[int],
    user_text: Callable[[str, Sequence[str]], str],
    model: dict[str, object],
) -> int:
    """Embed turns ``ids`` (each as the runtime embeds it) and store the vectors they lack."""
    with engine.connect() as conn:
        rows = turn_rows(conn, ids)
    if not rows:
        return 0
    vectors = embedder.embed([embedded_text(r, user_text) for r in rows])
    with engine.begin() as conn:
        written = conn.execute(
            text(
                "INSERT INTO turn_vectors (turn_id, user_id, embedding) "
                f"SELECT :t, :u, CAST(:e AS vector) WHERE {_SAME_MODEL} ON CONFLICT (turn_id) DO NOTHING"
            ).bindparams(_VEC),
            [{"t": r.id, "u": r.user_id, "e": v, **model} for r, v in zip(rows, vectors, strict=True)],
        )
    return max(int(written.rowcount or 0), 0)


def turn_rows(conn: Connection, ids: Sequence[int]) -> list:
    """Turns ``ids`` (id order) with what embedding one needs: ``role``, ``content``, the session's
    character's name (``persona``) and the user's profile ``name`` (:func:`embedded_text`)."""
    return list(
        conn.execute(
            text(
                "SELECT t.id, t.session_id, t.seq, t.role, t.content, t.user_id, c.name AS persona, p.name "
                "FROM turns t JOIN sessions s ON s.id = t.session_id JOIN characters c ON c.id = s.character_id "
                "LEFT JOIN user_profiles p ON p.user_id = s.user_id WHERE t.id IN :ids ORDER BY t.id"
            ).bindparams(bindparam("ids", expanding=True)),
            {"ids": list(ids)},
        ).fetchall()
    )


def embedded_text(row, user_text: Callable[[str, Sequence[str]], str]) -> str:
    """A turn's text as the runtime embeds it: a user's without the speakers' names."""
    return user_text(row.content, [row.persona, row.name or ""]) if row.role == "user" else row.content


def _compose_keys(
    engine: Engine,
    embedder: Embedder,
    segment_ids: Sequence[int],
    count_tokens: Callable[[str], int],
    user_text: Callable[[str, Sequence[str]], str],
    model: dict[str, object],
) -> int:
    """Compose (or embed) the keys of the keyless segments ``segment_ids``."""
    with engine.connect() as conn:
        segments = conn.execute(
            text(
                "SELECT a.id, a.session_id, a.first_seq, a.last_seq, a.content, t.id AS turn_id "
                "FROM archived_segments a LEFT JOIN turns t ON t.session_id = a.session_id AND t.seq = a.first_seq "
                "WHERE a.id IN :ids AND a.embedding IS NULL ORDER BY a.id"
            ).bindparams(bindparam("ids", expanding=True)),
            {"ids": list(segment_ids)},
        ).fetchall()
        # each single-turn segment's window: its turn and the archived turns just before and after it
        windows: dict[int, list[int]] = {}
        for s in segments:
            if s.first_seq != s.last_seq or s.turn_id is None:
                continue
            around = conn.execute(
                text(
                    "SELECT t.id FROM archived_segments a JOIN turns t ON t.session_id = a.session_id "
                    "AND t.seq = a.first_seq WHERE a.session_id = :s AND a.first_seq = a.last_seq "
                    "AND a.first_seq BETWEEN :seq - 1 AND :seq + 1 ORDER BY a.first_seq"
                ),
                {"s": s.session_id, "seq": s.first_seq},
            ).scalars()
            windows[s.id] = list(around)
        wanted = sorted({t for w in windows.values() for t in w})
        stored = {
            r.turn_id: [float(x) for x in r.embedding]
            for r in conn.execute(
                text("SELECT turn_id, embedding FROM turn_vectors WHERE turn_id IN :ids")
                .bindparams(bindparam("ids", expanding=True))
                .columns(embedding=Vector()),
                {"ids": wanted or [-1]},
            )
        }
        rows = {r.id: r for r in turn_rows(conn, wanted)} if wanted else {}
    lacking = [rows[t] for t in wanted if t not in stored and t in rows]
    by_content = [s for s in segments if s.id not in windows]
    fresh = embedder.embed([embedded_text(r, user_text) for r in lacking] + [s.content for s in by_content])
    stored.update((r.id, v) for r, v in zip(lacking, fresh, strict=False))
    keys = {s.id: v for s, v in zip(by_content, fresh[len(lacking) :], strict=True)}
    seq_of = {s.id: s.first_seq for s in segments}
    for segment_id, window in windows.items():
        turns = [rows[t] for t in window]
        keys[segment_id] = key_vectors(
            [
                [
                    Turn(id=r.id, session_id=r.session_id, seq=r.seq, role=r.role, content=r.content, tokens=0)
                    for r in turns
                ]
            ],
            [stored[t] for t in window],
            tokens=[count_tokens(r.content) for r in turns],
        )[next(i for i, t in enumerate(window) if rows[t].seq == seq_of[segment_id])]
    with engine.begin() as conn:
        if lacking:
            conn.execute(
                text(
                    "INSERT INTO turn_vectors (turn_id, user_id, embedding) "
                    f"SELECT :t, :u, CAST(:e AS vector) WHERE {_SAME_MODEL} ON CONFLICT (turn_id) DO NOTHING"
                ).bindparams(_VEC),
                [{"t": r.id, "u": r.user_id, "e": stored[r.id], **model} for r in lacking],
            )
        written = conn.execute(
            text(
                f"UPDATE archived_segments SET embedding = CAST(:e AS vector) "
                f"WHERE id = :i AND embedding IS NULL AND {_SAME_MODEL}"
            ).bindparams(_VEC),
            [{"i": segment_id, "e": key, **model} for segment_id, key in keys.items()],
        )
    return max(int(written.rowcount or 0), 0)


class Backfill:
    """The backfill room: :func:`missing` and :func:`backfill` on one database."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def missing(self) -> Missing:
        """See :func:`missing`."""
        return missing(self._engine)

    def run(
        self,
        embedder: Embedder,
        *,
        count_tokens: Callable[[str], int],
        user_text: Callable[[str, Sequence[str]], str],
        batch: int = BATCH,
    ) -> Backfilled:
        """See :func:`backfill`."""
        return backfill(self._engine, embedder, count_tokens=count_tokens, user_text=user_text, batch=batch)

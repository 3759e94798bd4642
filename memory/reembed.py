"""Re-embedding every stored vector with another model (``companion db reembed``).

Three tables hold vectors of the one recorded model (:mod:`memory.vector_model`):

- ``turn_vectors``: each is the embedding of its turn's ``content``, embedded again;
- ``archived_segments.embedding``: a segment's key, composed again from the new vectors of
  its turns by :func:`memory.archive.key_vectors`, the function compaction composes it with;
- ``knowledge_chunks.embedding``: each chunk's ``content``, embedded again.

**Which turns a key was composed from.** Compaction composes a segment's key from its turn
and the turns before and after it *within that compaction* (:func:`~memory.archive.key_vectors`):
the first and last segment of each compaction miss a neighbour, although the archive holds
one. The database keeps no compaction boundaries, so they are read back from the old vectors:
for each segment, of the windows its adjacent archived segments allow (with or without the
one before, with or without the one after), the one whose composition from the old turn
vectors gives the stored key (cosine at least :data:`SAME_KEY`). When none does (a key from
an older version that embedded the key text, a turn with no stored vector, a database mixing
models), the full window is taken, as one compaction of the whole run would compose it. A
segment of several turns (an older layout) is keyed by the embedding of its content.
:class:`Reembedded` counts each kind.

**One transaction.** Everything (vectors, column types, the HNSW index, the model record)
changes in one transaction, so an interrupted run (Ctrl-C, a lost connection, a crash)
leaves the database exactly as it was, with the old model recorded; it is rerun from the
start. A half-done run that committed as it went would leave two vector spaces in the same
columns, the state the guard exists to prevent, and would need a per-row model mark to resume.
The three tables are locked against writes (``SHARE ROW EXCLUSIVE``) for the duration;
reads go on.

**The service stopped.** A process still running on the old model would wait for those locks
and then write old-model vectors, so the run refuses to start while other runtime processes
hold connections to the database (:class:`~errors.DatabaseInUseError`; they are found in
``pg_stat_activity`` by :data:`memory.database.APPLICATION_NAME`). The model record is locked
too, so a process that starts meanwhile waits at its model check and then finds the new model.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product

import structlog
from sqlalchemy import Connection, Engine, bindparam, text

from errors import DatabaseInUseError
from memory.archive import key_vectors
from memory.database import ARCHIVE_TABLE, runtime_processes, storage_errors, vector_dimension
from memory.embeddings import Embedder
from memory.recall import ARCHIVE_HNSW_INDEX, archive_hnsw_index_ddl
from memory.tables import Turn
from memory.vector_model import TABLE as MODEL_TABLE
from memory.vector_model import RecordedModel, canonical_name, record_model, recorded_model
from memory.vectors import Vector

log = structlog.get_logger("companion.reembed")

BATCH = 256
"""Texts embedded (and rows written) per step."""
SAME_KEY = 0.99999
"""Cosine between a stored key and a window's composition of the old turn vectors at or above
which that window is taken to be the one compaction used (float4 storage costs about 1e-12)."""
VECTOR_COLUMNS = (("turn_vectors", "embedding"), (ARCHIVE_TABLE, "embedding"), ("knowledge_chunks", "embedding"))

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``stage`` is ``turn vectors``, ``archive keys`` or ``knowledge chunks``."""

_VEC = bindparam("e", type_=Vector())


@dataclass
class Reembedded:
    """What :func:`reembed` rewrote."""

    previous: RecordedModel | None
    """The model recorded before (``None`` if none was)."""
    model: RecordedModel
    """The model recorded now."""
    turn_vectors: int = 0
    """Turn vectors re-embedded (plus those added for archived turns that had none)."""
    archive_keys: int = 0
    """Archive keys rewritten, all kinds together."""
    keys_matched: int = 0
    """Keys whose compaction window was read back from the old vectors."""
    keys_full_window: int = 0
    """Keys composed over the full window because no window reproduced the old key."""
    keys_from_content: int = 0
    """Keys of segments of several turns, embedded from their content."""
    knowledge_chunks: int = 0
    dimension_changed: bool = False
    added_turn_vectors: list[int] = field(default_factory=list)
    """Turns of archived segments that had no stored vector and got one."""


@dataclass(frozen=True)
class _Plan:
    segment_id: int
    window: tuple[int, ...] = ()
    """Turn ids of the key's window, oldest first; empty for a key embedded from ``content``."""
    centre: int = 0
    """Position of the segment's own turn in ``window``."""
    content: str = ""
    """The segment's content, embedded as its key when ``window`` is empty."""
    matched: bool = False
    """``window`` reproduced the old key from the old vectors."""


def reembed(
    engine: Engine,
    embedder: Embedder,
    *,
    count_tokens: Callable[[str], int],
    user_text: Callable[[str, Sequence[str]], str],
    batch: int = BATCH,
    progress: Progress | None = None,
) -> Reembedded:
    """Re-embed every stored vector with ``embedder`` and record it as the vectors' model, in one transaction.

    Args:
        embedder: the new model; its ``name`` and ``dimension`` are recorded.
        count_tokens: tokens of a text, as the compactor counts them (the key weights may use them).
        user_text: the text a user's message is embedded from, given the message and the
            speakers' names (the session's character's name and the user's profile name): the
            runtime's own rule (:func:`runtime.context.without_names`).
        batch: texts per embedding call and rows per write.
        progress: called after each batch.

    When ``embedder.dimension`` differs from the columns' N, the three ``vector`` columns
    become ``vector(embedder.dimension)`` and the HNSW index is rebuilt on the new N.

    Returns:
        The counts of what was rewritten and the models before and after.

    Raises:
        DatabaseInUseError: other runtime processes (a service, a worker) are connected to the
            database; nothing changed.
        StorageError: the database failed; nothing changed.
        Whatever ``embedder`` raises; nothing changed.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    report_progress = progress or (lambda stage, done, total: None)
    previous = recorded_model(engine)
    old_dim = vector_dimension(engine)
    new_dim = int(embedder.dimension)
    with storage_errors(), engine.begin() as conn:
        conn.execute(text("LOCK TABLE turn_vectors, archived_segments, knowledge_chunks IN SHARE ROW EXCLUSIVE MODE"))
        conn.execute(text(f"LOCK TABLE {MODEL_TABLE} IN EXCLUSIVE MODE"))
        _require_alone(conn)
        plans, missing = _plan_keys(conn, count_tokens)
        if new_dim != old_dim:
            _change_dimension(conn, new_dim)
        done = Reembedded(previous=previous, model=RecordedModel(canonical_name(embedder.name), new_dim))
        done.dimension_changed = new_dim != old_dim
        done.added_turn_vectors = sorted(missing)
        done.turn_vectors = _turn_vectors(conn, embedder, missing, batch, report_progress, user_text)
        _archive_keys(conn, embedder, plans, count_tokens, batch, report_progress, done)
        done.knowledge_chunks = _knowledge(conn, embedder, batch, report_progress)
        if done.dimension_changed:
            conn.execute(text(archive_hnsw_index_ddl(new_dim)))
        record_model(conn, name=embedder.name, dimension=new_dim)
    log.info(
        "reembed.completed",
        previous=previous.name if previous else None,
        model=done.model.name,
        dimension=new_dim,
        dimension_changed=done.dimension_changed,
        turn_vectors=done.turn_vectors,
        archive_keys=done.archive_keys,
        keys_matched=done.keys_matched,
        keys_full_window=done.keys_full_window,
        keys_from_content=done.keys_from_content,
        knowledge_chunks=done.knowledge_chunks,
    )
    return done


def _vector(value) -> list[float]:
    return [float(x) for x in value]


def _cosine(a: Sequence[float], b: Sequence[float]) -> float:
    dot = sum(x * y for x, y in zip(a, b, strict=True))
    norm = math.sqrt(sum(x * x for x in a) * sum(y * y for y in b))
    return dot / norm if norm > 0 else 0.0


def _turn(row) -> Turn:
    return Turn(id=row.id, session_id=row.session_id, seq=row.seq, role=row.role, content=row.content, tokens=0)


def _require_alone(conn: Connection) -> None:
    """Raise :class:`DatabaseInUseError` if other runtime processes are connected to the database.

    A running service or worker would go on embedding with its own (old) model and write its
    vectors next to the new ones once this transaction commits. One that starts while it runs
    blocks on the model record (locked by the caller) and then finds the new model, which it
    refuses unless it was started with it."""
    others = runtime_processes(conn)
    if others:
        shown = ", ".join(str(pid) for pid in others[:5]) + (", …" if len(others) > 5 else "")
        raise DatabaseInUseError(
            f"{len(others)} other process(es) of the runtime are connected to this database "
            f"(pid {shown}): stop companion serve and companion jobs run, then run companion db reembed again. "
            "Nothing was changed.",
            processes=len(others),
        )


def _plan_keys(conn: Connection, count_tokens: Callable[[str], int]) -> tuple[list[_Plan], set[int]]:
    """Each segment's key window, read back from the old vectors (module docstring), and the
    ids of the window turns that have no stored vector."""
    plans: list[_Plan] = []
    missing: set[int] = set()
    sessions = conn.execute(text(f"SELECT DISTINCT session_id FROM {ARCHIVE_TABLE} ORDER BY session_id")).scalars()
    for session_id in list(sessions):
        rows = conn.execute(
            text(
                "SELECT a.id AS segment_id, a.first_seq, a.last_seq, a.content AS segment_content, "
                "a.embedding AS key, t.id, t.session_id, t.seq, t.role, t.content, v.embedding AS vector "
                f"FROM {ARCHIVE_TABLE} a LEFT JOIN turns t ON t.session_id = a.session_id AND t.seq = a.first_seq "
                "LEFT JOIN turn_vectors v ON v.turn_id = t.id "
                "WHERE a.session_id = :s ORDER BY a.first_seq, a.id"
            ).columns(key=Vector(), vector=Vector()),
            {"s": session_id},
        ).fetchall()
        singles = [r for r in rows if r.first_seq == r.last_seq and r.id is not None]
        for r in rows:
            if r.first_seq != r.last_seq or r.id is None:
                plans.append(_Plan(r.segment_id, content=r.segment_content))
        vectors = [_vector(x.vector) if x.vector is not None else None for x in singles]
        tokens = [count_tokens(x.content) for x in singles]
        turns = [_turn(x) for x in singles]
        for i, r in enumerate(singles):
            first = i - 1 if i > 0 and singles[i - 1].seq == r.seq - 1 else i
            last = i + 1 if i + 1 < len(singles) and singles[i + 1].seq == r.seq + 1 else i
            missing.update(singles[j].id for j in range(first, last + 1) if vectors[j] is None)
            plan = _Plan(r.segment_id, window=tuple(x.id for x in singles[first : last + 1]), centre=i - first)
            if all(vectors[j] is not None for j in range(first, last + 1)):
                old_key = _vector(r.key)
                # the full window first (a segment inside its compaction); the first that gives the old key wins
                for lo, hi in dict.fromkeys(product((first, i), (last, i))):
                    key = key_vectors(
                        [turns[lo : hi + 1]],
                        [v for v in vectors[lo : hi + 1] if v is not None],
                        tokens=tokens[lo : hi + 1],
                    )[i - lo]
                    if _cosine(key, old_key) >= SAME_KEY:
                        window = tuple(x.id for x in singles[lo : hi + 1])
                        plan = _Plan(r.segment_id, window=window, centre=i - lo, matched=True)
                        break
            plans.append(plan)
    return plans, missing


def _change_dimension(conn: Connection, dimension: int) -> None:
    """Drop the HNSW index and make the vector columns ``vector(dimension)``, holding zero
    vectors until every row is rewritten (in this transaction)."""
    conn.execute(text(f"DROP INDEX IF EXISTS {ARCHIVE_HNSW_INDEX}"))
    for table, column in VECTOR_COLUMNS:
        conn.execute(
            text(
                f"ALTER TABLE {table} ALTER COLUMN {column} TYPE vector({dimension}) "
                f"USING CAST(array_fill(0, ARRAY[{dimension}]) AS vector({dimension}))"
            )
        )


def _turn_vectors(
    conn: Connection,
    embedder: Embedder,
    missing: set[int],
    batch: int,
    progress: Progress,
    user_text: Callable[[str, Sequence[str]], str],
) -> int:
    """Re-embed every stored turn vector from ``turns.content`` and add one for the ``missing`` turns.

    A user's turn is embedded without the speakers' names, as the runtime embeds a message
    (``user_text``): the session's character's name and the user's profile
    name. A persona's nickname is not stored, so a nickname in an old message stays in."""
    ids = list(conn.execute(text("SELECT turn_id FROM turn_vectors ORDER BY turn_id")).scalars())
    ids = sorted(set(ids) | missing)
    for start in range(0, len(ids), batch):
        chunk = ids[start : start + batch]
        rows = conn.execute(
            text(
                "SELECT t.id, t.role, t.content, c.name AS persona, p.name FROM turns t "
                "JOIN sessions s ON s.id = t.session_id JOIN characters c ON c.id = s.character_id "
                "LEFT JOIN user_profiles p ON p.user_id = s.user_id "
                "WHERE t.id IN :ids ORDER BY t.id"
            ).bindparams(bindparam("ids", expanding=True)),
            {"ids": chunk},
        ).fetchall()
        vectors = embedder.embed(
            [user_text(r.content, [r.persona, r.name or ""]) if r.role == "user" else r.content for r in rows]
        )
        conn.execute(
            text(
                "INSERT INTO turn_vectors (turn_id, embedding) VALUES (:t, CAST(:e AS vector)) "
                "ON CONFLICT (turn_id) DO UPDATE SET embedding = EXCLUDED.embedding"
            ).bindparams(_VEC),
            [{"t": r.id, "e": v} for r, v in zip(rows, vectors, strict=True)],
        )
        progress("turn vectors", start + len(chunk), len(ids))
    return len(ids)


def _archive_keys(
    conn: Connection,
    embedder: Embedder,
    plans: list[_Plan],
    count_tokens: Callable[[str], int],
    batch: int,
    progress: Progress,
    done: Reembedded,
) -> None:
    """Compose (or embed) every segment's key again from the new turn vectors."""
    for start in range(0, len(plans), batch):
        chunk = plans[start : start + batch]
        turn_ids = sorted({t for p in chunk for t in p.window})
        turns = {
            r.id: r
            for r in conn.execute(
                text(
                    "SELECT t.id, t.session_id, t.seq, t.role, t.content, v.embedding AS vector "
                    "FROM turns t JOIN turn_vectors v ON v.turn_id = t.id WHERE t.id IN :ids"
                )
                .bindparams(bindparam("ids", expanding=True))
                .columns(vector=Vector()),
                {"ids": turn_ids or [-1]},
            ).fetchall()
        }
        by_content = [p for p in chunk if not p.window]
        embedded = embedder.embed([p.content for p in by_content]) if by_content else []
        keys = dict(zip((p.segment_id for p in by_content), embedded, strict=True))
        for p in chunk:
            if p.window:
                window = [turns[t] for t in p.window]
                keys[p.segment_id] = key_vectors(
                    [[_turn(x) for x in window]],
                    [_vector(x.vector) for x in window],
                    tokens=[count_tokens(x.content) for x in window],
                )[p.centre]
        conn.execute(
            text(f"UPDATE {ARCHIVE_TABLE} SET embedding = CAST(:e AS vector) WHERE id = :i").bindparams(_VEC),
            [{"i": segment_id, "e": key} for segment_id, key in keys.items()],
        )
        done.archive_keys += len(chunk)
        done.keys_from_content += len(by_content)
        done.keys_matched += sum(p.matched for p in chunk)
        done.keys_full_window += sum(bool(p.window) and not p.matched for p in chunk)
        progress("archive keys", start + len(chunk), len(plans))


def _knowledge(conn: Connection, embedder: Embedder, batch: int, progress: Progress) -> int:
    """Re-embed every knowledge chunk from its ``content``."""
    ids = list(conn.execute(text("SELECT id FROM knowledge_chunks ORDER BY id")).scalars())
    for start in range(0, len(ids), batch):
        rows = conn.execute(
            text("SELECT id, content FROM knowledge_chunks WHERE id IN :ids ORDER BY id").bindparams(
                bindparam("ids", expanding=True)
            ),
            {"ids": ids[start : start + batch]},
        ).fetchall()
        vectors = embedder.embed([r.content for r in rows])
        conn.execute(
            text("UPDATE knowledge_chunks SET embedding = CAST(:e AS vector) WHERE id = :i").bindparams(_VEC),
            [{"i": r.id, "e": v} for r, v in zip(rows, vectors, strict=True)],
        )
        progress("knowledge chunks", start + len(rows), len(ids))
    return len(ids)

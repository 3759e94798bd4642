"""Switching every stored vector to another embedding model (``companion db reembed``), while
the runtime goes on answering from the old ones.

Three tables hold vectors of the one recorded model (:mod:`memory.vector_model`):

- ``turn_vectors``: each is the embedding of its turn's ``content``, embedded again;
- ``archived_segments.embedding``: a segment's key, composed again from the new vectors of
  its turns by :func:`memory.archive.key_vectors`, the function compaction composes it with;
- ``knowledge_chunks.embedding``: each chunk's ``content``, embedded again.

**Staged, then switched.** The new vectors are written beside the old ones, into the
``reembed_*`` tables (migration 0025), ``batch`` rows per transaction; the target model is the
``reembed_target`` row. Recall, turns and compactions go on meanwhile with the old model and the
old vectors. Rows added meanwhile (new turns, segments, chunks) are staged by the next pass;
when a pass finds nothing left, one short transaction locks the three tables against writes
(``SHARE ROW EXCLUSIVE``; reads go on, a turn's write waits), stages the last few rows, copies the
staged vectors over the old ones (changing the columns' ``vector(N)`` when the dimension
changes), rebuilds the HNSW index, records the new model and empties the staging tables.

**Resumable.** Each staged batch is committed; a run stopped anywhere (Ctrl-C, a lost
connection, ``SIGKILL``) leaves the old vectors and model in place, and the next run for the same
model (name and dimension) stages only what is not staged yet. A run for another model starts over.

**Which turns a key was composed from.** Compaction composes a segment's key from its turn
and the turns before and after it *within that compaction* (:func:`~memory.archive.key_vectors`):
the first and last segment of each compaction miss a neighbour, although the archive holds
one. The database keeps no compaction boundaries, so they are read back from the old vectors:
for each segment, of the windows its adjacent archived segments allow (with or without the
one before, with or without the one after), the one whose composition from the old turn
vectors gives the stored key (cosine at least :data:`SAME_KEY`). When none does (a key from
an older version that embedded the key text, a turn with no stored vector, a segment stored
without a key while the embedder was down), the full window is taken, as one compaction of the
whole run would compose it. A segment of several turns (an older layout) is keyed by the
embedding of its content. :class:`Reembedded` counts each kind.

**After the switch** the processes still running the old model must be restarted with the new
one (``COMPANION_EMBEDDING_MODEL``): their next start checks the record (:func:`memory.vector_model.check_model`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import product

import structlog
from sqlalchemy import Connection, Engine, bindparam, text

from memory.archive import cosine, key_vectors
from memory.backfill import embedded_text, turn_rows
from memory.database import ARCHIVE_TABLE, storage_errors, vector_dimension
from memory.embeddings import Embedder
from memory.recall import ARCHIVE_HNSW_INDEX, archive_hnsw_index_ddl
from memory.tables import Turn
from memory.vector_model import TABLE as MODEL_TABLE
from memory.vector_model import RecordedModel, canonical_name, record_model, recorded_model
from memory.vectors import Vector

log = structlog.get_logger("companion.reembed")

BATCH = 256
"""Texts embedded (and rows staged) per transaction."""
SAME_KEY = 0.99999
"""Cosine between a stored key and a window's composition of the old turn vectors at or above
which that window is taken to be the one compaction used (float4 storage costs about 1e-12)."""
VECTOR_COLUMNS = (("turn_vectors", "embedding"), (ARCHIVE_TABLE, "embedding"), ("knowledge_chunks", "embedding"))

Progress = Callable[[str, int, int], None]
"""``progress(stage, done, total)``: ``stage`` is ``turn vectors``, ``knowledge chunks`` or
``archive keys``; ``done`` counts the rows staged so far, an earlier run's included."""

_VEC = bindparam("e", type_=Vector())

_TURNS = (
    "SELECT t.id FROM turns t WHERE (EXISTS (SELECT 1 FROM turn_vectors v WHERE v.turn_id = t.id) "
    "OR (t.role = 'user' AND t.content <> '') "
    f"OR EXISTS (SELECT 1 FROM {ARCHIVE_TABLE} a WHERE a.session_id = t.session_id AND a.first_seq = t.seq "
    "AND a.last_seq = t.seq))"
)
"""The turns that get a new vector: those with one, every user turn with text, every turn of a
one-turn segment (its key is composed from it)."""


@dataclass
class Reembedded:
    """What :func:`reembed` rewrote."""

    previous: RecordedModel | None
    """The model recorded before (``None`` if none was)."""
    model: RecordedModel
    """The model recorded now."""
    turn_vectors: int = 0
    """Turn vectors written (re-embedded, or added for turns that had none)."""
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
    resumed: int = 0
    """Rows an earlier, interrupted run had staged for the same model (not embedded again)."""
    switch_seconds: float = 0.0
    """How long the switch held the vector tables locked against writes, seconds."""
    added_turn_vectors: list[int] = field(default_factory=list)
    """Turns that had no stored vector and got one."""


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


@dataclass
class _Work:
    """What every stage needs."""

    embedder: Embedder
    count_tokens: Callable[[str], int]
    user_text: Callable[[str, Sequence[str]], str]
    batch: int
    progress: Progress
    staged: dict[str, int] = field(default_factory=dict)
    """Rows staged so far by stage (an earlier run's included): what :meth:`advance` reports."""

    def advance(self, stage: str, rows: int, total: int) -> None:
        """``rows`` more of ``stage`` were staged (of about ``total``): report the progress."""
        self.staged[stage] = self.staged.get(stage, 0) + rows
        self.progress(stage, self.staged[stage], max(total, self.staged[stage]))


def reembed(
    engine: Engine,
    embedder: Embedder,
    *,
    count_tokens: Callable[[str], int],
    user_text: Callable[[str, Sequence[str]], str],
    batch: int = BATCH,
    progress: Progress | None = None,
) -> Reembedded:
    """Re-embed every stored vector with ``embedder`` beside the old ones, then switch to them
    and record ``embedder`` as the vectors' model (module docstring).

    Args:
        embedder: the new model; its ``name`` and ``dimension`` are recorded.
        count_tokens: tokens of a text, as the compactor counts them (the key weights use them).
        user_text: the text a user's message is embedded from, given the message and the
            speakers' names (the session's character's name and the user's profile name): the
            runtime's own rule (:func:`runtime.context.without_names`).
        batch: texts per embedding call and rows per staging transaction.
        progress: called after each batch.

    When ``embedder.dimension`` differs from the columns' N, the three ``vector`` columns
    become ``vector(embedder.dimension)`` and the HNSW index is rebuilt on the new N.

    Returns:
        The counts of what was rewritten and the models before and after.

    Raises:
        StorageError: the database failed; what was staged stays for the next run, and the old
            vectors and model are unchanged.
        Whatever ``embedder`` raises (:class:`~errors.EmbedderUnavailableError`, ``KeyboardInterrupt``
            while it works); as for ``StorageError``.
    """
    if batch < 1:
        raise ValueError(f"batch must be at least 1, got {batch}")
    work = _Work(embedder, count_tokens, user_text, batch, progress or (lambda stage, done, total: None))
    previous = recorded_model(engine)
    new_dim = int(embedder.dimension)
    done = Reembedded(previous=previous, model=RecordedModel(canonical_name(embedder.name), new_dim))
    with storage_errors():
        done.resumed = _start(engine, done.model, work)
        while _pass(engine, work, done):  # until a pass finds nothing new (rows added meanwhile)
            pass
        old_dim = vector_dimension(engine)
        started = time.monotonic()
        with engine.begin() as conn:
            _switch(conn, work, done, old_dim)
        done.switch_seconds = time.monotonic() - started
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
        resumed=done.resumed,
        switch_seconds=round(done.switch_seconds, 3),
    )
    return done


def _pass(engine: Engine, work: _Work, done: Reembedded) -> int:
    """Stage every row not staged yet, a transaction per batch; how many were staged."""
    staged = 0
    with engine.connect() as conn:
        turns, chunks = _count(conn, "turn vectors"), _count(conn, "knowledge chunks")
    for stage, total in ((_stage_turns, turns), (_stage_chunks, chunks)):
        while True:
            with engine.begin() as conn:
                n = stage(conn, work, total)
            if not n:
                break
            staged += n
    with engine.connect() as conn:
        sessions = _unstaged_sessions(conn)
        keys = int(conn.execute(text(f"SELECT count(*) FROM {ARCHIVE_TABLE}")).scalar_one())
    for session_id in sessions:
        with engine.begin() as conn:
            staged += _stage_keys(conn, work, session_id, done, keys)
    return staged


def _start(engine: Engine, model: RecordedModel, work: _Work) -> int:
    """Record ``model`` as the switch's target; a run for another target starts over (its staged
    rows are deleted). Returns the rows already staged for this one."""
    with engine.begin() as conn:
        row = conn.execute(text("SELECT name, dimension FROM reembed_target WHERE id = 1 FOR UPDATE")).fetchone()
        if row is not None and (row.name, int(row.dimension)) == (model.name, model.dimension):
            counts = conn.execute(
                text(
                    "SELECT (SELECT count(*) FROM reembed_turn_vectors) AS turns, (SELECT count(*) FROM "
                    "reembed_chunk_vectors) AS chunks, (SELECT count(*) FROM reembed_segment_keys) AS keys"
                )
            ).one()
            work.staged.update(
                {"turn vectors": counts.turns, "knowledge chunks": counts.chunks, "archive keys": counts.keys}
            )
            return int(counts.turns + counts.chunks + counts.keys)
        conn.execute(text("TRUNCATE reembed_turn_vectors, reembed_chunk_vectors, reembed_segment_keys"))
        conn.execute(
            text(
                "INSERT INTO reembed_target (id, name, dimension) VALUES (1, :n, :d) ON CONFLICT (id) DO UPDATE "
                "SET name = EXCLUDED.name, dimension = EXCLUDED.dimension, started_at = now()"
            ),
            {"n": model.name, "d": model.dimension},
        )
    return 0


def _count(conn: Connection, stage: str) -> int:
    sql = (
        f"SELECT count(*) FROM ({_TURNS}) AS t" if stage == "turn vectors" else "SELECT count(*) FROM knowledge_chunks"
    )
    return int(conn.execute(text(sql)).scalar_one())


def _stage_turns(conn: Connection, work: _Work, total: int) -> int:
    """Stage the new vectors of up to ``batch`` turns that have none staged; how many."""
    ids = list(
        conn.execute(
            text(
                f"{_TURNS} AND NOT EXISTS (SELECT 1 FROM reembed_turn_vectors r WHERE r.turn_id = t.id) "
                "ORDER BY t.id LIMIT :n"
            ),
            {"n": work.batch},
        ).scalars()
    )
    if not ids:
        return 0
    rows = turn_rows(conn, ids)
    vectors = work.embedder.embed([embedded_text(r, work.user_text) for r in rows])
    conn.execute(
        text("INSERT INTO reembed_turn_vectors (turn_id, embedding) VALUES (:t, CAST(:e AS vector))").bindparams(_VEC),
        [{"t": r.id, "e": v} for r, v in zip(rows, vectors, strict=True)],
    )
    work.advance("turn vectors", len(rows), total)
    return len(rows)


def _stage_chunks(conn: Connection, work: _Work, total: int) -> int:
    """Stage the new vectors of up to ``batch`` knowledge chunks that have none staged; how many."""
    rows = conn.execute(
        text(
            "SELECT k.id, k.content FROM knowledge_chunks k WHERE NOT EXISTS "
            "(SELECT 1 FROM reembed_chunk_vectors r WHERE r.chunk_id = k.id) ORDER BY k.id LIMIT :n"
        ),
        {"n": work.batch},
    ).fetchall()
    if not rows:
        return 0
    vectors = work.embedder.embed([r.content for r in rows])
    conn.execute(
        text("INSERT INTO reembed_chunk_vectors (chunk_id, embedding) VALUES (:c, CAST(:e AS vector))").bindparams(
            _VEC
        ),
        [{"c": r.id, "e": v} for r, v in zip(rows, vectors, strict=True)],
    )
    work.advance("knowledge chunks", len(rows), total)
    return len(rows)


def _unstaged_sessions(conn: Connection) -> list[str]:
    return list(
        conn.execute(
            text(
                f"SELECT DISTINCT a.session_id FROM {ARCHIVE_TABLE} a WHERE NOT EXISTS "
                "(SELECT 1 FROM reembed_segment_keys r WHERE r.segment_id = a.id) ORDER BY a.session_id"
            )
        ).scalars()
    )


def _vector(value) -> list[float]:
    return [float(x) for x in value]


def _turn(row) -> Turn:
    return Turn(id=row.id, session_id=row.session_id, seq=row.seq, role=row.role, content=row.content, tokens=0)


def _stage_keys(conn: Connection, work: _Work, session_id: str, done: Reembedded, total: int = 0) -> int:
    """Stage the new keys of the session's segments that have none staged, composed from the
    staged turn vectors in the window read back from the old ones (module docstring). A segment
    whose window has a turn without a staged vector waits for the next pass."""
    rows = conn.execute(
        text(
            "SELECT a.id AS segment_id, a.first_seq, a.last_seq, a.content AS segment_content, "
            "a.embedding AS key, t.id, t.session_id, t.seq, t.role, t.content, v.embedding AS vector, "
            "n.embedding AS new, EXISTS (SELECT 1 FROM reembed_segment_keys r WHERE r.segment_id = a.id) AS staged "
            f"FROM {ARCHIVE_TABLE} a LEFT JOIN turns t ON t.session_id = a.session_id AND t.seq = a.first_seq "
            "LEFT JOIN turn_vectors v ON v.turn_id = t.id LEFT JOIN reembed_turn_vectors n ON n.turn_id = t.id "
            "WHERE a.session_id = :s ORDER BY a.first_seq, a.id"
        ).columns(key=Vector(), vector=Vector(), new=Vector()),
        {"s": session_id},
    ).fetchall()
    plans = [_Plan(r.segment_id, content=r.segment_content) for r in rows if r.first_seq != r.last_seq or r.id is None]
    singles = [r for r in rows if r.first_seq == r.last_seq and r.id is not None]
    old = [_vector(x.vector) if x.vector is not None else None for x in singles]
    new = {x.id: _vector(x.new) for x in singles if x.new is not None}
    tokens = [work.count_tokens(x.content) for x in singles]
    turns = [_turn(x) for x in singles]
    for i, r in enumerate(singles):
        if r.staged:
            continue
        first = i - 1 if i > 0 and singles[i - 1].seq == r.seq - 1 else i
        last = i + 1 if i + 1 < len(singles) and singles[i + 1].seq == r.seq + 1 else i
        plan = _Plan(r.segment_id, window=tuple(x.id for x in singles[first : last + 1]), centre=i - first)
        if r.key is not None and all(old[j] is not None for j in range(first, last + 1)):
            old_key = _vector(r.key)
            # the full window first (a segment inside its compaction); the first that gives the old key wins
            for lo, hi in dict.fromkeys(product((first, i), (last, i))):
                key = key_vectors(
                    [turns[lo : hi + 1]], [v for v in old[lo : hi + 1] if v is not None], tokens=tokens[lo : hi + 1]
                )[i - lo]
                if cosine(key, old_key) >= SAME_KEY:
                    window = tuple(x.id for x in singles[lo : hi + 1])
                    plan = _Plan(r.segment_id, window=window, centre=i - lo, matched=True)
                    break
        plans.append(plan)
    staged_ids = {r.segment_id for r in rows if r.staged}
    plans = [p for p in plans if p.segment_id not in staged_ids and all(t in new for t in p.window)]
    by_content = [p for p in plans if not p.window]
    embedded = work.embedder.embed([p.content for p in by_content]) if by_content else []
    keys = dict(zip((p.segment_id for p in by_content), embedded, strict=True))
    position = {x.id: j for j, x in enumerate(singles)}
    for p in plans:
        if p.window:
            keys[p.segment_id] = key_vectors(
                [[turns[position[t]] for t in p.window]],
                [new[t] for t in p.window],
                tokens=[tokens[position[t]] for t in p.window],
            )[p.centre]
    if keys:
        conn.execute(
            text("INSERT INTO reembed_segment_keys (segment_id, embedding) VALUES (:i, CAST(:e AS vector))").bindparams(
                _VEC
            ),
            [{"i": segment_id, "e": key} for segment_id, key in keys.items()],
        )
    done.keys_from_content += len(by_content)
    done.keys_matched += sum(p.matched for p in plans)
    done.keys_full_window += sum(bool(p.window) and not p.matched for p in plans)
    work.advance("archive keys", len(keys), total)
    return len(keys)


def _switch(conn: Connection, work: _Work, done: Reembedded, old_dim: int) -> None:
    """In one transaction: lock the vector tables against writes, stage what the passes left,
    copy the staged vectors over the old ones, rebuild the index, record the model, clear the stage."""
    conn.execute(text("LOCK TABLE turn_vectors, archived_segments, knowledge_chunks IN SHARE ROW EXCLUSIVE MODE"))
    conn.execute(text(f"LOCK TABLE {MODEL_TABLE} IN EXCLUSIVE MODE"))
    while _stage_turns(conn, work, 0) or _stage_chunks(conn, work, 0):
        pass
    for session_id in _unstaged_sessions(conn):
        _stage_keys(conn, work, session_id, done)
    new_dim = done.model.dimension
    done.dimension_changed = new_dim != old_dim
    conn.execute(text(f"DROP INDEX IF EXISTS {ARCHIVE_HNSW_INDEX}"))
    if done.dimension_changed:
        for table, column in VECTOR_COLUMNS:
            conn.execute(
                text(
                    f"ALTER TABLE {table} ALTER COLUMN {column} TYPE vector({new_dim}) "
                    f"USING CAST(array_fill(0, ARRAY[{new_dim}]) AS vector({new_dim}))"
                )
            )
    done.added_turn_vectors = list(
        conn.execute(
            text(
                "SELECT r.turn_id FROM reembed_turn_vectors r WHERE NOT EXISTS "
                "(SELECT 1 FROM turn_vectors v WHERE v.turn_id = r.turn_id) ORDER BY r.turn_id"
            )
        ).scalars()
    )
    # recorded first: the vector tables' trigger lets in only the recorded model's writes
    record_model(conn, name=work.embedder.name, dimension=new_dim)
    # what could not be staged must not keep an old-model vector: the backfill makes it
    conn.execute(
        text(
            "DELETE FROM turn_vectors v WHERE NOT EXISTS (SELECT 1 FROM reembed_turn_vectors r WHERE r.turn_id = v.turn_id)"
        )
    )
    conn.execute(
        text(
            f"UPDATE {ARCHIVE_TABLE} a SET embedding = NULL WHERE NOT EXISTS "
            "(SELECT 1 FROM reembed_segment_keys r WHERE r.segment_id = a.id)"
        )
    )
    done.turn_vectors = conn.execute(
        text(
            "INSERT INTO turn_vectors (turn_id, user_id, embedding) SELECT r.turn_id, t.user_id, r.embedding "
            "FROM reembed_turn_vectors r JOIN turns t ON t.id = r.turn_id "
            "ON CONFLICT (turn_id) DO UPDATE SET embedding = EXCLUDED.embedding"
        )
    ).rowcount
    done.archive_keys = conn.execute(
        text(
            f"UPDATE {ARCHIVE_TABLE} a SET embedding = r.embedding FROM reembed_segment_keys r WHERE r.segment_id = a.id"
        )
    ).rowcount
    done.knowledge_chunks = conn.execute(
        text(
            "UPDATE knowledge_chunks k SET embedding = r.embedding FROM reembed_chunk_vectors r WHERE r.chunk_id = k.id"
        )
    ).rowcount
    conn.execute(text(archive_hnsw_index_ddl(new_dim)))
    conn.execute(text("TRUNCATE reembed_turn_vectors, reembed_chunk_vectors, reembed_segment_keys"))
    conn.execute(text("DELETE FROM reembed_target"))

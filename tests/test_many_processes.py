"""Many processes, one PostgreSQL: two ``companion serve`` processes and two ``companion jobs run``
workers on one database, clients alternating between the servers. Every turn is stored once,
every file is readable from both servers, and every compaction runs once."""

from __future__ import annotations

import re
import threading
import time

import httpx
from sqlalchemy import text

from memory.apps import Directory
from memory.database import make_engine
from tests.processes import Process, Server, runtime_env

SESSIONS = 4
TURNS = 10
"""Turns per session: enough, at a 1,024-token window, for every session to compact."""


def _message(session: int, turn: int) -> str:
    filler = " ".join(f"word{(session * 31 + turn * 7 + k) % 97}" for k in range(45))
    return f"Session {session} turn {turn}: today I walked to the harbour and counted boats. {filler}"


def _queue_left(engine) -> list[tuple[str, str]]:
    with engine.connect() as conn:
        return [
            tuple(r)
            for r in conn.execute(
                text("SELECT task_name, status::text FROM procrastinate_jobs WHERE task_name NOT LIKE 'maintenance:%'")
            )
        ]


def test_two_servers_and_two_workers_store_each_turn_once_and_compact_once(db_url, fake_llm):
    env = runtime_env(db_url, fake_llm.api_base, COMPANION_CONTEXT_WINDOW="1024", COMPANION_LOG_LEVEL="info")
    servers = [Server(env, "--no-worker") for _ in range(2)]  # the jobs run on the two workers only
    workers = [Process(["jobs", "run", "--worker", f"w{i}", "--concurrency", "2"], env) for i in range(2)]
    db = make_engine(db_url)
    try:
        _, key = Directory(db).create_app("many")
        deadline = time.monotonic() + 400
        bases = [server.wait_ready(deadline) for server in servers]
        clients = [httpx.Client(base_url=b, headers={"Authorization": f"Bearer {key}"}, timeout=120) for b in bases]

        # files: each user uploads through one server; the parse is a job a worker runs
        files = {}
        for i, user in enumerate(("ana", "ben")):
            body = f"# Notes of {user}\n\nThe lighthouse key is under the blue stone number {i + 7}.\n".encode()
            up = clients[i].post(f"/v1/users/{user}/files", files={"file": (f"{user}.md", body, "text/markdown")})
            assert up.status_code == 201, up.text
            files[user] = up.json()["id"]

        sessions = [clients[0].post("/v1/sessions", json={"user_id": f"user{s}"}).json()["id"] for s in range(SESSIONS)]
        failures: list[str] = []

        def chat(s: int) -> None:
            for t in range(TURNS):
                client = clients[t % 2]  # alternate between the servers
                done = client.post(
                    f"/v1/sessions/{sessions[s]}/messages", json={"content": _message(s, t), "stream": False}
                )
                if done.status_code != 200:
                    failures.append(f"session {s} turn {t}: {done.status_code} {done.text}")

        started = time.monotonic()
        threads = [threading.Thread(target=chat, args=(s,)) for s in range(SESSIONS)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(600)
        turns_seconds = time.monotonic() - started
        assert not failures, failures

        # the workers drain the queue: compactions and parses
        while time.monotonic() < deadline + 300 and _queue_left(db):
            time.sleep(0.5)
        assert _queue_left(db) == []  # nothing waiting, nothing failed (successful jobs are deleted)

        with db.connect() as conn:
            stored = conn.execute(
                text(
                    "SELECT session_id, role, count(*), count(DISTINCT seq), count(DISTINCT content) FROM turns GROUP BY 1, 2"
                )
            ).all()
            overlaps = conn.execute(
                text(
                    "SELECT count(*) FROM archived_segments a JOIN archived_segments b ON a.session_id = b.session_id "
                    "AND a.id < b.id AND a.first_seq <= b.last_seq AND b.first_seq <= a.last_seq"
                )
            ).scalar_one()
            compactions = dict(conn.execute(text("SELECT session_id, compactions FROM compaction_state")).all())
            blobs = conn.execute(text("SELECT count(*) FROM file_blobs")).scalar_one()
        users = {(sid, role): rest for sid, role, *rest in stored}
        for sid in sessions:  # every turn stored once: TURNS user turns and TURNS replies, seqs distinct
            assert users[(sid, "user")] == [TURNS, TURNS, TURNS]
            assert users[(sid, "assistant")][:2] == [TURNS, TURNS]
        assert overlaps == 0  # no turn archived twice
        assert set(compactions) == set(sessions) and all(n >= 1 for n in compactions.values())
        worker_output = "".join(w.text() for w in workers)
        ran = [int(n) for n in re.findall(r"queue\.compaction_ran\S*\s.*?rolled_turns=(\d+)", worker_output)]
        assert sum(1 for n in ran if n > 0) == sum(compactions.values())  # each compaction ran once, as one job
        assert blobs == 2

        for file_id in files.values():  # parsed by a worker, readable through either server
            for client in clients:
                meta = client.get(f"/v1/files/{file_id}")
                assert meta.status_code == 200 and meta.json()["parse_state"] == "ready", meta.text
                read = client.get(f"/v1/files/{file_id}/read")
                assert read.status_code == 200 and "lighthouse key" in read.json()["text"], read.text
        print(f"\n{SESSIONS * TURNS} turns through 2 servers in {turns_seconds:.1f} s; compactions {compactions}")
        for client in clients:
            client.close()
    finally:
        for process in (*servers, *workers):
            process.stop()
        db.dispose()

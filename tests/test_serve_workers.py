"""``companion serve --workers N``: N worker processes, each with its own engine, behind one port."""

from __future__ import annotations

import re
import time

import httpx

from memory.apps import Directory
from memory.database import make_engine
from tests.processes import Server, children, cmdline, runtime_env


def test_serve_with_two_workers_opens_an_engine_in_each_and_serves_turns(db_url, fake_llm):
    server = Server(runtime_env(db_url, fake_llm.api_base, COMPANION_LOG_LEVEL="info"), "--workers", "2")
    try:
        base = server.wait_ready(time.monotonic() + 300)
        workers = {p for p in children(server.popen.pid) if "multiprocessing.spawn" in cmdline(p)}
        assert len(workers) == 2, server.text()
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:  # /healthz answered once one worker was up
            ready = {int(pid) for pid in re.findall(r"service\.worker_ready\S*\s.*?pid=(\d+)", server.text())}
            if ready == workers:
                break
            time.sleep(0.2)
        assert ready == workers, server.text()  # each worker opened its own engine
        engine = make_engine(db_url)
        _, key = Directory(engine).create_app("workers")
        engine.dispose()
        for i in range(6):  # a new connection each time: the kernel spreads them over the workers
            with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
                session = http.post("/v1/sessions", json={"user_id": f"u{i}"}).json()
                done = http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "hello", "stream": False})
                assert done.status_code == 200, done.text
    finally:
        server.stop()
    assert server.popen.returncode is not None

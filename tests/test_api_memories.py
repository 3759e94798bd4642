"""Memories over HTTP: seen, searched and forgotten; a message deleted; a user exported and erased
(also while a reply streams and a compaction job waits); other apps' ids are 404s."""

from __future__ import annotations

import threading
import time
import uuid

import httpx
import pytest

from memory.apps import Directory
from tests.conftest import serve
from tests.traces import traces


def _client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _talk(c: httpx.Client, session_id: str, message: str) -> dict:
    r = c.post(f"/v1/sessions/{session_id}/messages", json={"content": message, "stream": False})
    assert r.status_code == 200, r.text
    return r.json()


@pytest.fixture
def served(make_engine_for, store):
    from runtime.accounting import Budgets

    engine = make_engine_for(budgets=Budgets.create(recent=200, summary=800))
    with serve(engine) as base:
        yield base, engine, Directory(store.engine)


def test_memories_are_listed_searched_and_forgotten_and_other_apps_get_404(served):
    base, engine, directory = served
    _, key = directory.create_app("mem-" + uuid.uuid4().hex[:6])
    _, other_key = directory.create_app("mem-other-" + uuid.uuid4().hex[:6])
    marker = "zq" + uuid.uuid4().hex[:10]
    with _client(base, key) as c, _client(base, other_key) as other:
        sid = c.post("/v1/sessions", json={"user_id": "ana"}).json()["id"]
        _talk(c, sid, f"My locker code is {marker}.")
        for i in range(8):
            _talk(c, sid, f"Filler {i}: the garden was quiet today.")
        page = c.get("/v1/users/ana/memories").json()
        [mine] = [m for m in page["data"] if marker in m["content"]]
        assert any(marker in q["text"] for q in page["quotes"])
        found = c.get("/v1/users/ana/memories", params={"q": "what is my locker code"}).json()["data"]
        assert mine["id"] in [m["id"] for m in found[:3]]
        for bad in (mine["id"], "seg_999999999", "not-a-memory"):
            r = other.delete(f"/v1/memories/{bad}")
            assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        assert other.get("/v1/users/ana/memories").status_code == 404
        r = c.delete(f"/v1/memories/{mine['id']}")
        assert r.status_code == 200 and r.json()["deleted"]["archived_segments"] == 1
        page = c.get("/v1/users/ana/memories").json()
        assert not [m for m in page["data"] if marker in m["content"]]
        assert not any(marker in q["text"] for q in page["quotes"])
        assert c.delete(f"/v1/memories/{mine['id']}").status_code == 404

        turns = c.get(f"/v1/sessions/{sid}/turns").json()
        assert other.delete(f"/v1/sessions/{sid}/turns/1").status_code == 404
        r = c.delete(f"/v1/sessions/{sid}/turns/1")
        assert r.status_code == 200 and r.json()["deleted"]["turns"] == 1
        assert len(c.get(f"/v1/sessions/{sid}/turns").json()) == len(turns) - 1
        assert c.delete(f"/v1/sessions/{sid}/turns/1").status_code == 404
        assert traces(engine.store.engine, marker) == {}

        exported = c.get("/v1/users/ana/export").json()
        said = [t["content"] for s in exported["sessions"] for t in s["turns"] if t["role"] == "user"]
        assert said == [f"Filler {i}: the garden was quiet today." for i in range(8)]
        assert other.get("/v1/users/ana/export").status_code == 404


def test_a_user_erased_while_a_reply_streams_and_a_compaction_waits_leaves_no_row(make_engine_for, store, fake_llm):
    from runtime.accounting import Budgets
    from runtime.service import QueuedCompaction

    scheduler = QueuedCompaction(store.engine)
    engine = make_engine_for(budgets=Budgets.create(recent=200, summary=800))
    engine.runner.scheduler = scheduler
    directory = Directory(store.engine)
    app, key = directory.create_app("erase-" + uuid.uuid4().hex[:6])
    try:
        with serve(engine) as base, _client(base, key) as c:
            sid = c.post("/v1/sessions", json={"user_id": "ana"}).json()["id"]
            for i in range(8):
                _talk(c, sid, f"Message {i}: the garden was quiet today, and the tea was warm.")
            user = directory.user(app.id, "ana").id
            assert traces(store.engine, user).get("procrastinate_jobs.args")  # a compaction job waits
            fake_llm.stream_delay = 0.2
            fake_llm.script.append("one two three four five six seven eight nine ten eleven twelve")
            events: list[str] = []

            def stream() -> None:
                with c.stream(
                    "POST", f"/v1/sessions/{sid}/messages", json={"content": "Are you there?", "stream": True}
                ) as r:
                    for line in r.iter_lines():
                        events.append(line)

            streaming = threading.Thread(target=stream)
            streaming.start()
            deadline = time.monotonic() + 20
            while not any(e.startswith("event: delta") for e in events) and time.monotonic() < deadline:
                time.sleep(0.02)
            assert any(e.startswith("event: delta") for e in events), events  # the reply is streaming
            with _client(base, key) as eraser:
                r = eraser.delete("/v1/users/ana")
            assert r.status_code == 200 and r.json()["finished"], r.text
            streaming.join(30)
            said = "\n".join(events)
            assert "event: error" in said, said  # the turn ended with a clear error
            assert '"not_found"' in said or '"user_erasing"' in said, said
            assert traces(store.engine, user) == {}  # no row, vector, job or breaker state of the user
            assert c.get("/v1/users/ana").status_code == 404
            assert c.delete("/v1/users/ana").status_code == 404
    finally:
        fake_llm.stream_delay = 0.0
        scheduler.close()

"""The HTTP API through a real uvicorn server on loopback, with an httpx client, against
the loopback fake model: users, sessions, streamed replies (SSE read as they come),
turns, summary, context, close, delete, breaker reset, auth and app isolation."""

from __future__ import annotations

import inspect
import json
import time

import httpx
import pytest
from sqlalchemy import text

import errors as E
from runtime.service.api import ERRORS
from tests.conftest import estimate_as_we_do

pytestmark = pytest.mark.usefixtures("steady_fake_llm")


def client(base: str, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=base, headers=headers, timeout=30)


def read_sse(response: httpx.Response) -> list[dict]:
    """Events of a server-sent-event stream, read line by line as they arrive."""
    events, current = [], {}
    for line in response.iter_lines():
        if not line:
            if current:
                events.append(current)
                current = {}
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value[1:] if value.startswith(" ") else value
        current[name] = current[name] + "\n" + value if name == "data" and name in current else value
    if current:
        events.append(current)
    return events


@pytest.fixture
def alice(api_server, new_app):
    """An app, its client, and a session of its user ``alice``."""
    _, key = new_app()
    http = client(api_server, key)
    session = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    yield http, session
    http.close()


def counts(engine, session_id: str) -> dict[str, int]:
    tables = ("turns", "summaries", "archived_segments", "compaction_state")
    with engine.connect() as conn:
        out = {
            t: conn.execute(text(f"SELECT count(*) FROM {t} WHERE session_id = :s"), {"s": session_id}).scalar()
            for t in tables
        }
        out["sessions"] = conn.execute(text("SELECT count(*) FROM sessions WHERE id = :s"), {"s": session_id}).scalar()
    return out


# -- schema, auth, errors -----------------------------------------------------------
def test_openapi_schema_is_served_and_lists_the_routes(api_server):
    schema = httpx.get(f"{api_server}/openapi.json").json()
    for path in (
        "/v1/users",
        "/v1/sessions",
        "/v1/sessions/{session_id}/messages",
        "/v1/sessions/{session_id}/turns",
        "/v1/sessions/{session_id}/summary",
        "/v1/sessions/{session_id}/context",
        "/v1/sessions/{session_id}/close",
        "/v1/sessions/{session_id}/breaker/reset",
        "/v1/chat/completions",
    ):
        assert path in schema["paths"], path
    assert "delete" in schema["paths"]["/v1/sessions/{session_id}"]


@pytest.mark.parametrize(
    "headers",
    [
        pytest.param({}, id="no-key"),
        pytest.param({"Authorization": "Bearer ck_not-a-key"}, id="wrong-key"),
        pytest.param({"Authorization": "Basic dXNlcjpwdw=="}, id="not-bearer"),
    ],
)
def test_requests_without_a_valid_key_get_401_with_a_json_error(api_server, headers):
    response = httpx.get(f"{api_server}/v1/users", headers=headers)
    assert response.status_code == 401
    error = response.json()["error"]
    assert error["code"] == "unauthorized" and error["message"] and error["type"] == "AuthenticationError"
    assert response.headers["www-authenticate"] == "Bearer"


def test_every_error_class_has_its_own_status_and_code():
    classes = [c for _, c in inspect.getmembers(E, inspect.isclass) if issubclass(c, E.CompanionError)]
    assert len(classes) >= 21
    missing = [c.__name__ for c in classes if c not in ERRORS]
    assert missing == []
    codes = [code for _, code in ERRORS.values()]
    assert len(codes) == len(set(codes)), "codes must be distinct"
    assert all(100 <= status < 600 for status, _ in ERRORS.values())


def test_a_bad_body_answers_422_in_the_same_error_shape(alice):
    http, _ = alice
    response = http.post("/v1/sessions", json={"wrong": 1})
    assert response.status_code == 422
    assert response.json()["error"]["code"] == "invalid_request"
    assert response.json()["error"]["param"] == "user_id"


def test_an_invalid_message_is_refused_before_anything_is_stored(alice, api_engine):
    http, session = alice
    response = http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "bad\x00byte", "stream": False})
    assert response.status_code == 422
    assert response.json()["error"] | {"message": ""} == {
        "code": "invalid_message",
        "message": "",
        "type": "InvalidMessageError",
        "reason": "nul_byte",
    }
    assert api_engine.store.turns.of_session(session["id"]) == []


# -- users and sessions ---------------------------------------------------------------
def test_users_are_created_once_and_listed_per_app(api_server, new_app):
    _, key = new_app()
    with client(api_server, key) as http:
        first = http.post("/v1/users", json={"id": "ana"})
        again = http.post("/v1/users", json={"id": "ana"})
        assert (first.status_code, first.json()["created"]) == (201, True)
        assert (again.status_code, again.json()["created"]) == (200, False)
        assert [u["id"] for u in http.get("/v1/users").json()] == ["ana"]
        assert http.get("/v1/users/nobody").json()["error"]["code"] == "not_found"


def test_a_reply_streams_as_server_sent_events_and_both_turns_are_stored(alice, fake_llm):
    http, session = alice
    fake_llm.script.append("Lisbon is lovely in the spring, Alice.")
    with http.stream(
        "POST", f"/v1/sessions/{session['id']}/messages", json={"content": "I moved to Lisbon."}
    ) as response:
        assert response.status_code == 200
        assert response.headers["content-type"].startswith("text/event-stream")
        events = read_sse(response)
    deltas = [e for e in events if e.get("event") == "delta"]
    assert len(deltas) >= 5  # one per word from the fake model
    assert "".join(json.loads(e["data"])["text"] for e in deltas) == "Lisbon is lovely in the spring, Alice."
    assert [int(e["id"]) for e in events] == list(range(1, len(events) + 1))
    assert events[-1]["event"] == "done"
    done = json.loads(events[-1]["data"])
    assert (done["user_seq"], done["assistant_seq"], done["interrupted"]) == (1, 2, False)
    assert done["usage"]["prompt_tokens"] == estimate_as_we_do(fake_llm.requests[-1])  # the provider's report
    assert 0 < done["usage"]["prompt_estimate_tokens"] <= done["usage"]["window"]
    turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
    assert [(t["seq"], t["role"], t["content"]) for t in turns] == [
        (1, "user", "I moved to Lisbon."),
        (2, "assistant", "Lisbon is lovely in the spring, Alice."),
    ]


def test_a_whole_reply_comes_back_as_json(alice, fake_llm):
    http, session = alice
    fake_llm.script.append("Hello there.")
    body = http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "Hi", "stream": False}).json()
    assert body["content"] == "Hello there." and body["assistant_seq"] == 2


def test_a_model_failure_mid_request_arrives_as_an_error_event_and_keeps_the_user_turn(alice, fake_llm):
    http, session = alice
    fake_llm.script.append((400, "Invalid value for 'temperature'."))
    with http.stream("POST", f"/v1/sessions/{session['id']}/messages", json={"content": "Are you there?"}) as response:
        events = read_sse(response)
    assert events[-1]["event"] == "error"
    assert json.loads(events[-1]["data"])["error"]["code"] == "model_request_rejected"
    turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
    assert [(t["role"], t["content"]) for t in turns] == [("user", "Are you there?")]


def test_a_client_that_disconnects_mid_stream_loses_nothing(alice, fake_llm, api_engine):
    http, session = alice
    reply = " ".join(f"word{i}" for i in range(40))
    fake_llm.stream_delay = 0.02
    fake_llm.script.append(reply)
    try:
        with http.stream(
            "POST", f"/v1/sessions/{session['id']}/messages", json={"content": "Tell me a story."}
        ) as response:
            for line in response.iter_lines():
                if line.startswith("event: delta"):
                    break  # hang up after the first piece
        deadline = time.monotonic() + 30
        while len(api_engine.store.turns.of_session(session["id"])) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        fake_llm.stream_delay = 0.0
    turns = api_engine.store.turns.of_session(session["id"])
    assert [(t.role, t.content, t.interrupted) for t in turns] == [
        ("user", "Tell me a story.", False),
        ("assistant", reply, False),
    ]


def test_context_and_summary_can_be_read_by_source(alice, fake_llm):
    http, session = alice
    http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "My cat is called Miso.", "stream": False})
    context = http.get(f"/v1/sessions/{session['id']}/context").json()
    assert set(context["sources"]) >= {"persona", "memory", "summary", "recent"}
    assert context["sources"]["recent"]["items"] == 2
    assert "My cat is called Miso." in context["sources"]["recent"]["text"]
    assert context["total_tokens"] <= context["window"]
    assert http.get(f"/v1/sessions/{session['id']}/summary").json()["content"] is None


def test_closing_rolls_the_session_into_its_summary_and_refuses_new_turns(alice, fake_llm, api_engine):
    http, session = alice
    http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "I love hiking in Sintra.", "stream": False})
    closed = http.post(f"/v1/sessions/{session['id']}/close").json()
    assert closed["rolled_turns"] == 2 and closed["summarized"] and closed["session"]["closed_by"] == "api"
    summary = http.get(f"/v1/sessions/{session['id']}/summary").json()
    assert "I love hiking in Sintra." in summary["content"]
    assert summary["items"] == api_engine.store.compaction.summary(session["id"]).items  # the entries as stored
    assert [(i["seq"], i["role"], i["text"]) for i in summary["items"]][0] == (1, "user", "I love hiking in Sintra.")
    assert set(summary["items"][0]) == {"seq", "role", "date", "text"}
    refused = http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "Hello again"})
    assert refused.status_code == 409 and refused.json()["error"]["code"] == "session_closed"
    assert http.post(f"/v1/sessions/{session['id']}/close").json()["error"]["code"] == "session_closed"
    # the user comes back: the new session starts from the closed one's summary
    again = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    assert again["carried_from"] == session["id"]
    context = http.get(f"/v1/sessions/{again['id']}/context").json()
    assert "I love hiking in Sintra." in context["sources"]["summary"]["text"]
    carried = http.get(f"/v1/sessions/{again['id']}/summary").json()["items"]
    assert [(i["seq"], i["from_seq"], i["carried_from"]) for i in carried] == [
        (-1, 1, session["id"]),
        (0, 2, session["id"]),
    ]


def test_deleting_a_session_removes_all_its_rows_and_nothing_else(alice, fake_llm, api_engine):
    http, session = alice
    for line in ("I grow tomatoes.", "My sister is Rita."):
        http.post(f"/v1/sessions/{session['id']}/messages", json={"content": line, "stream": False})
    other = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    http.post(f"/v1/sessions/{other['id']}/messages", json={"content": "Other session.", "stream": False})
    http.post(f"/v1/sessions/{session['id']}/close")
    follower = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    assert follower["carried_from"] == session["id"]
    db = api_engine.store.engine
    before = counts(db, session["id"])
    assert before == {"turns": 4, "summaries": 1, "archived_segments": 4, "compaction_state": 1, "sessions": 1}
    other_before, follower_before = counts(db, other["id"]), counts(db, follower["id"])

    response = http.delete(f"/v1/sessions/{session['id']}")
    assert response.status_code == 200
    assert response.json()["deleted"] == {**before, "turn_files": 0, "files": 0}  # no files attached here
    assert counts(db, session["id"]) == {t: 0 for t in before}
    assert counts(db, other["id"]) == other_before
    assert counts(db, follower["id"]) == follower_before  # its carried summary is its own copy
    assert http.get(f"/v1/sessions/{follower['id']}").json()["carried_from"] is None
    assert http.get("/v1/users/alice").status_code == 200  # the user stays
    assert http.get(f"/v1/sessions/{session['id']}").status_code == 404


def test_the_breaker_can_be_reset(alice, api_engine):
    http, session = alice
    for _ in range(3):
        api_engine.store.compaction.record_failure(session["id"], error="SummarizationError: test", threshold=3)
    assert api_engine.store.compaction.state(session["id"]).breaker_opened_at is not None
    body = http.post(f"/v1/sessions/{session['id']}/breaker/reset").json()
    assert body == {"session_id": session["id"], "state": "closed", "consecutive_failures": 0, "compactions": 0}
    assert api_engine.store.compaction.state(session["id"]).breaker_opened_at is None


# -- isolation between apps -----------------------------------------------------------
def test_one_apps_key_cannot_reach_another_apps_users_or_sessions(api_server, new_app, fake_llm, api_engine):
    _, key_a = new_app()
    _, key_b = new_app()
    with client(api_server, key_a) as a, client(api_server, key_b) as b:
        session = a.post("/v1/sessions", json={"user_id": "alice"}).json()
        a.post(f"/v1/sessions/{session['id']}/messages", json={"content": "A secret of app A.", "stream": False})
        sid = session["id"]
        attempts = [
            ("GET", f"/v1/sessions/{sid}", None),
            ("GET", f"/v1/sessions/{sid}/turns", None),
            ("GET", f"/v1/sessions/{sid}/summary", None),
            ("GET", f"/v1/sessions/{sid}/context", None),
            ("POST", f"/v1/sessions/{sid}/messages", {"content": "hijack", "stream": False}),
            ("POST", f"/v1/sessions/{sid}/messages", {"content": "hijack"}),
            ("POST", f"/v1/sessions/{sid}/close", None),
            ("POST", f"/v1/sessions/{sid}/breaker/reset", None),
            ("DELETE", f"/v1/sessions/{sid}", None),
            ("GET", "/v1/users/alice", None),
            ("GET", "/v1/users/alice/sessions", None),
        ]
        for method, path, body in attempts:
            response = b.request(method, path, json=body)
            assert response.status_code == 404, (method, path, response.text)
            assert response.json()["error"]["code"] == "not_found"
        missing = b.get("/v1/sessions/s_doesnotexist").json()
        assert b.get(f"/v1/sessions/{sid}").json()["error"]["type"] == missing["error"]["type"]
        assert b.get("/v1/users").json() == []
        # app B's own "alice" is a different user with her own sessions
        b_session = b.post("/v1/sessions", json={"user_id": "alice"}).json()
        assert [s["id"] for s in b.get("/v1/users/alice/sessions").json()] == [b_session["id"]]
        assert [s["id"] for s in a.get("/v1/users/alice/sessions").json()] == [sid]
    turns = api_engine.store.turns.of_session(sid)
    assert [t.content for t in turns if t.role == "user"] == ["A secret of app A."]
    assert api_engine.store.sessions.get(sid).closed_at is None

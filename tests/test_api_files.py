"""The HTTP API's files, attachments, edit-and-resend, pinned profiles and greetings,
through a real uvicorn server on loopback with an httpx client, the real parsers, and
the loopback fake model."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import replace

import httpx
import pytest

from tests import file_fixtures as ff
from tests.conftest import PERSONA, serve
from tests.test_api import client, read_sse

pytestmark = pytest.mark.usefixtures("steady_fake_llm")

FINAL = ("ready", "empty", "needs_ocr", "failed")


@pytest.fixture
def app_a(api_server, new_app):
    """An app's client and a session of its user ``alice``."""
    _, key = new_app()
    http = client(api_server, key)
    session = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    yield http, session
    http.close()


def upload(http: httpx.Client, user: str, name: str, data: bytes, **form: str) -> httpx.Response:
    return http.post(f"/v1/users/{user}/files", files={"file": (name, data)}, data=form)


def parsed(http: httpx.Client, file_id: str) -> dict:
    """The file's metadata once its background parse has ended (polled, bounded)."""
    deadline = time.monotonic() + 120
    while True:
        body = http.get(f"/v1/files/{file_id}").json()
        if body["parse_state"] in FINAL or time.monotonic() > deadline:
            return body
        time.sleep(0.05)


def context_text(http: httpx.Client, session_id: str) -> str:
    sources = http.get(f"/v1/sessions/{session_id}/context").json()["sources"]
    return "\n".join(s["text"] or "" for s in sources.values())


# -- files ------------------------------------------------------------------------------
def test_an_upload_is_stored_parsed_and_read_by_window(app_a, api_engine):
    http, _ = app_a
    data = ff.book_pdf()
    response = upload(http, "alice", "book.pdf", data)
    assert response.status_code == 201
    stored = response.json()
    assert stored["id"].startswith("file_") and stored["user_id"] == "alice"
    assert (stored["name"], stored["mime"], stored["size_bytes"]) == ("book.pdf", "application/pdf", len(data))
    assert stored["sha256"] == hashlib.sha256(data).hexdigest()
    assert stored["durability"] == "durable" and stored["parse_state"] in ("pending", "parsing", *FINAL)

    meta = parsed(http, stored["id"])
    assert meta["parse_state"] == "ready" and meta["page_count"] == 8 and meta["body_start_page"] == 3
    assert [f["id"] for f in http.get("/v1/users/alice/files").json()] == [stored["id"]]

    window = http.get(f"/v1/files/{stored['id']}/read", params={"start_page": 4, "max_pages": 2}).json()
    owner = api_engine.files.lookup(stored["id"]).user_id  # the internal user id
    assert window == {
        "file_id": stored["id"],
        "text": api_engine.file_services.reader.file_read(stored["id"], owner, start_page=4, max_pages=2),
    }
    assert "--- page 4 ---" in window["text"] and "--- page 6 ---" not in window["text"]
    bad = http.get(f"/v1/files/{stored['id']}/read", params={"start_page": 0})
    assert bad.status_code == 422 and bad.json()["error"]["code"] == "file_invalid"

    again = upload(http, "alice", "book.pdf", data)  # the same bytes: the same file
    assert again.status_code == 201 and again.json()["id"] == stored["id"]


@pytest.mark.parametrize(
    "form, code",
    [
        pytest.param({"durability": "ephemeral"}, "invalid_request", id="ephemeral-without-session"),
        pytest.param({"durability": "forever"}, "invalid_request", id="bad-durability"),
        pytest.param({"durability": "ephemeral", "session_id": "s_doesnotexist"}, "not_found", id="unknown-session"),
    ],
)
def test_a_bad_upload_is_refused_and_stores_nothing(app_a, form, code):
    http, _ = app_a
    response = upload(http, "alice", "notes.md", ff.markdown_bytes(), **form)
    assert response.json()["error"]["code"] == code
    assert http.get("/v1/users/alice/files").json() == []


def _upload_with_disposition(http: httpx.Client, user: str, disposition: str, data: bytes) -> httpx.Response:
    """A multipart upload whose one part has exactly ``disposition`` as its Content-Disposition value."""
    boundary = "companion-test-boundary"
    body = (
        f"--{boundary}\r\nContent-Disposition: {disposition}\r\nContent-Type: text/plain\r\n\r\n".encode()
        + data
        + f"\r\n--{boundary}--\r\n".encode("ascii")
    )
    return http.post(
        f"/v1/users/{user}/files", content=body, headers={"Content-Type": f"multipart/form-data; boundary={boundary}"}
    )


@pytest.mark.parametrize(
    "disposition, name",
    [
        pytest.param(
            "form-data; name=\"file\"; filename*=UTF-8''%E6%97%A5%E8%A8%98.txt", "日記.txt", id="extended-alone"
        ),
        pytest.param(
            'form-data; name="file"; filename="nikki.txt"; filename*=UTF-8\'\'%E6%97%A5%E8%A8%98.txt',
            "日記.txt",
            id="extended-after-ascii-fallback",
        ),
        pytest.param(
            'form-data; name="file"; filename*=utf-8\'\'%E6%97%A5%E8%A8%98.txt; filename="nikki.txt"',
            "日記.txt",
            id="extended-before-ascii-fallback",
        ),
        pytest.param("form-data; name=\"file\"; filename*=iso-8859-1'fr'%E9t%E9.txt", "été.txt", id="extended-latin-1"),
        pytest.param('form-data; name="file"; filename="日記.txt"', "日記.txt", id="raw-utf8-plain"),
        pytest.param('form-data; name="file"; filename="notes.txt"', "notes.txt", id="plain"),
    ],
)
def test_an_upload_is_stored_under_its_rfc5987_name(app_a, disposition, name):
    http, _ = app_a
    response = _upload_with_disposition(http, "alice", disposition, b"Dear diary.\n")
    assert response.status_code == 201, response.text
    assert response.json()["name"] == name
    assert [f["name"] for f in http.get("/v1/users/alice/files").json()] == [name]


def test_an_upload_whose_extended_name_does_not_decode_is_a_clear_error(app_a):
    http, _ = app_a
    response = _upload_with_disposition(
        http, "alice", "form-data; name=\"file\"; filename*=no-such-charset''%E6.txt", b"x\n"
    )
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert (error["code"], error["param"]) == ("invalid_request", "file")
    assert "filename*" in error["message"]
    assert http.get("/v1/users/alice/files").json() == []


def test_an_empty_upload_is_refused(app_a):
    http, _ = app_a
    response = upload(http, "alice", "empty.txt", b"")
    assert response.status_code == 422 and response.json()["error"]["code"] == "file_invalid"


def test_an_ephemeral_upload_is_valid_only_in_its_session(app_a):
    http, session = app_a
    stored = upload(
        http, "alice", "notes.md", ff.markdown_bytes(), durability="ephemeral", session_id=session["id"]
    ).json()
    assert (stored["durability"], stored["session_id"]) == ("ephemeral", session["id"])
    other = http.post("/v1/sessions", json={"user_id": "alice"}).json()
    refused = http.post(
        f"/v1/sessions/{other['id']}/messages",
        json={"content": "see this", "attachments": [stored["id"]], "stream": False},
    )
    assert refused.status_code == 404 and refused.json()["error"]["code"] == "file_not_found"
    # another user's session of the same app is as unknown as a missing one
    bob = http.post("/v1/sessions", json={"user_id": "bob"}).json()
    response = upload(http, "alice", "x.md", b"# x\n", durability="ephemeral", session_id=bob["id"])
    assert response.status_code == 404 and response.json()["error"]["code"] == "not_found"


# -- attachments ------------------------------------------------------------------------
def test_a_streamed_message_carries_a_file_shown_first_turn_style_then_folded(app_a, fake_llm):
    http, session = app_a
    file_id = upload(http, "alice", "list.md", ff.markdown_bytes()).json()["id"]
    assert parsed(http, file_id)["parse_state"] == "ready"
    fake_llm.script.append("Corner bakery it is.")
    with http.stream(
        "POST", f"/v1/sessions/{session['id']}/messages", json={"content": "Here is my list", "attachments": [file_id]}
    ) as response:
        events = read_sse(response)
    assert events[-1]["event"] == "done", events[-1]
    sent = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"][-1]
    assert sent.startswith("Here is my list\n\nAttached files:") and "Buy the bread at the corner bakery." in sent

    # answered: the next reply's context shows it folded, charged to retrieval
    later = http.get(f"/v1/sessions/{session['id']}/context").json()["sources"]
    assert "Attached files:" not in later["recent"]["text"]
    assert "Referenced files" in later["recent"]["text"] and f"file_id={file_id}" in later["recent"]["text"]
    assert later["retrieval"]["tokens"] > 0


def test_an_unanswered_message_with_a_file_shows_the_first_turn_block_in_the_context(app_a, fake_llm):
    http, session = app_a
    sid = session["id"]
    file_id = upload(http, "alice", "list.md", ff.markdown_bytes()).json()["id"]
    parsed(http, file_id)
    fake_llm.script.append((400, "Invalid value for 'temperature'."))
    with http.stream(
        "POST", f"/v1/sessions/{sid}/messages", json={"content": "Here is my list", "attachments": [file_id]}
    ) as response:
        events = read_sse(response)
    assert events[-1]["event"] == "error"
    pending = http.get(f"/v1/sessions/{sid}/context").json()["sources"]
    assert "Here is my list\n\nAttached files:" in pending["recent"]["text"]
    assert "Buy the bread at the corner bakery." in pending["recent"]["text"]  # small text, inline
    assert pending["retrieval"]["tokens"] == 0

    fake_llm.script.append("Got it.")
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "Anything else?", "stream": False})
    history = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"]
    assert history[0].startswith("Here is my list\n\nReferenced files") and history[-1] == "Anything else?"
    assert "Attached files:" not in http.get(f"/v1/sessions/{sid}/context").json()["sources"]["recent"]["text"]


def test_deleting_a_file_removes_it_from_the_next_context(app_a, api_engine):
    http, session = app_a
    file_id = upload(http, "alice", "list.md", ff.markdown_bytes()).json()["id"]
    parsed(http, file_id)
    http.post(
        f"/v1/sessions/{session['id']}/messages", json={"content": "My list", "attachments": [file_id], "stream": False}
    )
    assert file_id in context_text(http, session["id"])

    response = http.delete(f"/v1/files/{file_id}")
    assert response.status_code == 200 and response.json() == {"file_id": file_id, "deleted": True}
    assert file_id not in context_text(http, session["id"])
    assert "corner bakery" not in context_text(http, session["id"])
    assert http.get(f"/v1/files/{file_id}").json()["error"]["code"] == "file_not_found"
    assert http.get("/v1/users/alice/files").json() == []
    assert [t["content"] for t in http.get(f"/v1/sessions/{session['id']}/turns").json()][0] == "My list"


def test_another_apps_file_is_unknown_to_every_route_and_cannot_be_attached(api_server, new_app, api_engine):
    _, key_a = new_app()
    _, key_b = new_app()
    with client(api_server, key_a) as a, client(api_server, key_b) as b:
        file_id = upload(a, "alice", "secret.md", b"# A's secret\n\nThe code is 4711.\n").json()["id"]
        parsed(a, file_id)
        missing = b.get("/v1/files/file_00000000000000000000").json()["error"]
        for method, path in [
            ("GET", f"/v1/files/{file_id}"),
            ("GET", f"/v1/files/{file_id}/read"),
            ("DELETE", f"/v1/files/{file_id}"),
        ]:
            response = b.request(method, path)
            assert response.status_code == 404, (method, path)
            error = response.json()["error"]
            assert (
                (error["code"], error["type"])
                == (missing["code"], missing["type"])
                == ("file_not_found", "FileNotFound")
            )
            assert error["message"] == missing["message"].replace("file_00000000000000000000", file_id)
        assert b.get("/v1/users/alice/files").json()["error"]["code"] == "not_found"  # B has no alice yet

        # B's own alice cannot attach A's file: 404 before anything is stored
        b_session = b.post("/v1/sessions", json={"user_id": "alice"}).json()
        for stream in (False, True):
            refused = b.post(
                f"/v1/sessions/{b_session['id']}/messages",
                json={"content": "read it", "attachments": [file_id], "stream": stream},
            )
            assert refused.status_code == 404 and refused.json()["error"]["code"] == "file_not_found"
        assert b.get(f"/v1/sessions/{b_session['id']}/turns").json() == []
        assert b.get("/v1/users/alice/files").json() == []
        # A's file is untouched
        assert a.get(f"/v1/files/{file_id}").json()["parse_state"] == "ready"
        assert "4711" in a.get(f"/v1/files/{file_id}/read").json()["text"]


# -- edit and resend ----------------------------------------------------------------------
def test_resending_an_edited_turn_replaces_it_and_its_reply(app_a, fake_llm):
    http, session = app_a
    sid = session["id"]
    fake_llm.script.extend(["First answer.", "Second answer.", "Answer to the edit."])
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I live in Porto.", "stream": False})
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I like trains.", "stream": False})
    file_id = upload(http, "alice", "list.md", ff.markdown_bytes()).json()["id"]
    parsed(http, file_id)

    with http.stream(
        "POST", f"/v1/sessions/{sid}/turns/3/resend", json={"content": "I like ferries.", "attachments": [file_id]}
    ) as response:
        events = read_sse(response)
    done = json.loads(events[-1]["data"])
    assert events[-1]["event"] == "done" and (done["user_seq"], done["content"]) == (3, "Answer to the edit.")
    turns = http.get(f"/v1/sessions/{sid}/turns").json()
    assert [(t["seq"], t["content"]) for t in turns] == [
        (1, "I live in Porto."),
        (2, "First answer."),
        (3, "I like ferries."),
        (4, "Answer to the edit."),
    ]
    sent = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"]
    assert sent[-1].startswith("I like ferries.\n\nAttached files:") and "I like trains." not in "\n".join(sent)

    bad = http.post(f"/v1/sessions/{sid}/turns/2/resend", json={"content": "x", "stream": True})
    assert bad.status_code == 422 and bad.json()["error"]["reason"] == "bad_edit"
    assert len(http.get(f"/v1/sessions/{sid}/turns").json()) == 4


# -- pinned profile -------------------------------------------------------------------------
def test_the_profile_round_trips_and_enters_the_memory_source(app_a):
    http, session = app_a
    assert http.get("/v1/users/alice/profile").json() == {
        "user_id": "alice",
        "name": None,
        "pronouns": None,
        "facts": [],
        "learned": [],
        "time_zone": None,
        "updated_at": None,
    }
    put = http.put(
        "/v1/users/alice/profile",
        json={"name": "Ana", "pronouns": "she/her", "facts": ["Lives in Lisbon.", "Has a cat named Tom."]},
    )
    assert put.status_code == 200
    got = http.get("/v1/users/alice/profile").json()
    assert got == put.json()
    assert (got["name"], got["pronouns"], got["facts"]) == (
        "Ana",
        "she/her",
        ["Lives in Lisbon.", "Has a cat named Tom."],
    )
    # null leaves a field, facts replaces the set
    http.put("/v1/users/alice/profile", json={"facts": ["Has a dog named Rex."]})
    got = http.get("/v1/users/alice/profile").json()
    assert (got["name"], got["facts"]) == ("Ana", ["Has a dog named Rex."])

    http.post(f"/v1/sessions/{session['id']}/messages", json={"content": "Hi!", "stream": False})
    memory = http.get(f"/v1/sessions/{session['id']}/context").json()["sources"]["memory"]["text"]
    assert memory.startswith('<profile about="the user"')
    assert "Name: Ana" in memory and "- Has a dog named Rex." in memory and "Has a cat" not in memory


def test_profile_of_an_unknown_or_foreign_user_is_404_and_bad_bodies_422(app_a, api_server, new_app):
    http, _ = app_a
    _, key_b = new_app()
    with client(api_server, key_b) as b:
        assert b.get("/v1/users/alice/profile").json()["error"]["code"] == "not_found"
        assert b.put("/v1/users/alice/profile", json={"name": "Eve"}).status_code == 404
    assert http.get("/v1/users/alice/profile").json()["name"] is None
    too_long = http.put("/v1/users/alice/profile", json={"facts": ["x" * 501]})
    assert too_long.status_code == 422 and too_long.json()["error"]["code"] == "invalid_request"


# -- greeting -------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def greeting_server(api_engine):
    """A second server on the API database whose persona has a first message."""
    persona = replace(
        PERSONA,
        first_message="Hi {{user}}, I'm {{char}}. How was your day?",
        alternate_greetings=("Storm tonight, {{user}}.{{// author note}}", "Quiet morning."),
    )
    with serve(api_engine.derive(persona=persona)) as base:
        yield base


def test_a_new_session_stores_and_returns_the_persona_greeting(greeting_server, new_app):
    _, key = new_app()
    with client(greeting_server, key) as http:
        http.post("/v1/users", json={"id": "ana"})
        http.put("/v1/users/ana/profile", json={"name": "Ana"})
        session = http.post("/v1/sessions", json={"user_id": "ana"}).json()
        assert session["greeting"]["content"] == "Hi Ana, I'm Mira. How was your day?"
        assert (session["greeting"]["seq"], session["greeting"]["role"]) == (1, "assistant")
        turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
        assert [(t["seq"], t["role"], t["content"]) for t in turns] == [
            (1, "assistant", "Hi Ana, I'm Mira. How was your day?")
        ]
        assert (
            "How was your day?" in http.get(f"/v1/sessions/{session['id']}/context").json()["sources"]["recent"]["text"]
        )


def test_an_alternate_greeting_is_chosen_at_session_creation(greeting_server, new_app):
    _, key = new_app()
    with client(greeting_server, key) as http:
        persona = http.get("/v1/persona").json()
        assert persona["greetings"] == [
            "Hi {{user}}, I'm Mira. How was your day?",
            "Storm tonight, {{user}}.",
            "Quiet morning.",
        ]
        http.post("/v1/users", json={"id": "ana"})
        http.put("/v1/users/ana/profile", json={"name": "Ana"})
        session = http.post("/v1/sessions", json={"user_id": "ana", "greeting": 1}).json()
        assert session["greeting"]["content"] == "Storm tonight, Ana."
        turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
        assert [(t["role"], t["content"]) for t in turns] == [("assistant", "Storm tonight, Ana.")]


@pytest.mark.parametrize(
    "greeting, status",
    [
        pytest.param(3, 400, id="past-the-last"),
        pytest.param(-1, 422, id="negative"),
        pytest.param("one", 422, id="not-a-number"),
    ],
)
def test_a_greeting_the_persona_lacks_is_refused_before_anything_is_stored(greeting_server, new_app, greeting, status):
    _, key = new_app()
    with client(greeting_server, key) as http:
        answer = http.post("/v1/sessions", json={"user_id": "bo", "greeting": greeting})
        assert answer.status_code == status
        error = answer.json()["error"]
        assert error["code"] == "invalid_request" and "greeting" in json.dumps(error)
        assert http.get("/v1/users/bo/sessions").status_code == 404  # not even the user was created


def test_a_persona_without_a_first_message_greets_with_null(app_a):
    http, session = app_a
    assert session["greeting"] is None
    assert http.get(f"/v1/sessions/{session['id']}/turns").json() == []


def test_openapi_lists_the_file_profile_and_resend_routes(api_server):
    paths = httpx.get(f"{api_server}/openapi.json").json()["paths"]
    assert {"post", "get"} <= set(paths["/v1/users/{user_id}/files"])
    assert {"get", "delete"} <= set(paths["/v1/files/{file_id}"])
    assert "get" in paths["/v1/files/{file_id}/read"]
    assert {"get", "put"} <= set(paths["/v1/users/{user_id}/profile"])
    assert "post" in paths["/v1/sessions/{session_id}/turns/{seq}/resend"]
    upload_body = paths["/v1/users/{user_id}/files"]["post"]["requestBody"]["content"]
    assert list(upload_body) == ["multipart/form-data"]

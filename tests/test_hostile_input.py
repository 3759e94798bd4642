"""Odd bytes and error bodies: NUL, lone surrogates and over-long values in any text field
answer 422 naming the field (HTTP, CLI, Python API); a 503 never shows the driver's text."""

from __future__ import annotations

import json

import httpx
import pytest

from errors import InvalidFieldError

NUL = "a\u0000b"
SURROGATE_JSON = '"a\\ud800b"'  # a lone surrogate, as a JSON escape (it cannot be encoded as UTF-8)


def client(base: str, key: str | None) -> httpx.Client:
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return httpx.Client(base_url=base, headers=headers, timeout=30)


@pytest.fixture
def api(api_server, new_app):
    _, key = new_app()
    with client(api_server, key) as c:
        assert c.post("/v1/users", json={"id": "ana"}).status_code in (200, 201)
        yield c


def raw_json(template: str, value_json: str) -> bytes:
    return template.replace("$V", value_json).encode("utf-8")


BODY_CASES = [
    pytest.param("POST", "/v1/users", '{"id": $V}', "id", id="user-id"),
    pytest.param("POST", "/v1/sessions", '{"user_id": $V}', "user_id", id="session-user-id"),
    pytest.param("PUT", "/v1/users/ana/profile", '{"name": $V}', "name", id="profile-name"),
    pytest.param("PUT", "/v1/users/ana/profile", '{"pronouns": $V}', "pronouns", id="profile-pronouns"),
    pytest.param("PUT", "/v1/users/ana/profile", '{"facts": ["fine", $V]}', "facts", id="profile-fact"),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        '{"user": $V, "messages": [{"role": "user", "content": "hi"}]}',
        "user",
        id="openai-user",
    ),
    pytest.param(
        "POST",
        "/v1/chat/completions",
        '{"model": $V, "messages": [{"role": "user", "content": "hi"}]}',
        "model",
        id="openai-model",
    ),
]


@pytest.mark.parametrize(
    "value", [pytest.param(json.dumps(NUL), id="nul"), pytest.param(SURROGATE_JSON, id="surrogate")]
)
@pytest.mark.parametrize("method,path,template,field", BODY_CASES)
def test_odd_bytes_in_a_body_field_answer_422_naming_it(api, method, path, template, field, value):
    r = api.request(method, path, content=raw_json(template, value), headers={"content-type": "application/json"})
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["param"].startswith(field)


PATH_CASES = [
    pytest.param("GET", "/v1/users/{}", "user_id", id="get-user"),
    pytest.param("GET", "/v1/users/{}/sessions", "user_id", id="list-sessions"),
    pytest.param("GET", "/v1/users/{}/profile", "user_id", id="get-profile"),
    pytest.param("GET", "/v1/users/{}/files", "user_id", id="list-files"),
    pytest.param("GET", "/v1/sessions/{}", "session_id", id="get-session"),
    pytest.param("GET", "/v1/sessions/{}/turns", "session_id", id="turns"),
    pytest.param("POST", "/v1/sessions/{}/close", "session_id", id="close"),
    pytest.param("DELETE", "/v1/sessions/{}", "session_id", id="delete-session"),
    pytest.param("GET", "/v1/files/{}", "file_id", id="get-file"),
]


@pytest.mark.parametrize("value", [pytest.param("a%00b", id="nul"), pytest.param("x" * 500, id="too-long")])
@pytest.mark.parametrize("method,path,field", PATH_CASES)
def test_odd_or_over_long_path_ids_answer_422_naming_them(api, method, path, field, value):
    r = api.request(method, path.format(value))
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == field


def test_odd_bytes_in_a_query_parameter_answer_422(api):
    r = api.get("/v1/files/file_00000000000000000000/read", params={"focus": NUL})
    assert r.status_code == 422 and r.json()["error"]["param"] == "focus"


def test_an_over_long_user_id_in_a_body_answers_422_not_a_storage_error(api):
    r = api.post("/v1/users", json={"id": "u" * 500})
    assert r.status_code == 422 and r.json()["error"]["param"] == "id"
    r = api.post("/v1/chat/completions", json={"user": "u" * 500, "messages": [{"role": "user", "content": "hi"}]})
    assert r.status_code == 422 and r.json()["error"]["param"] == "user"


@pytest.mark.parametrize(
    "bad",
    [pytest.param(NUL, id="nul"), pytest.param("a\ud800b", id="surrogate"), pytest.param("s" * 300, id="too-long")],
)
def test_the_python_api_refuses_odd_ids_and_profile_fields_naming_the_field(make_engine_for, store, bad):
    from memory.profiles import Profiles

    engine = make_engine_for(window=4096)
    with pytest.raises(InvalidFieldError) as caught:
        engine.turn(user_id="u1", session_id=bad, message="hello", reply="hi")
    assert caught.value.field == "session_id"
    with pytest.raises(InvalidFieldError) as caught:
        engine.turn(user_id=bad, session_id="s1", message="hello", reply="hi")
    assert caught.value.field == "user_id"
    with pytest.raises(InvalidFieldError) as caught:
        Profiles(store.engine).set("u1", facts=["fine", bad * 2])
    assert caught.value.field == "facts[1]"
    assert store.turns.of_session("s1") == []


def test_the_cli_refuses_a_lone_surrogate_in_an_id(db_url, monkeypatch, capsys):
    from runtime.cli import main

    monkeypatch.setenv("DATABASE_URL", db_url)
    with pytest.raises(SystemExit) as exit_:
        main(["profile", "set", "a\udcffb", "--name", "X"])  # an undecodable argv byte, as Python passes it
    assert exit_.value.code != 0
    assert "surrogate" in capsys.readouterr().err


def test_a_storage_error_answers_503_without_driver_text_or_socket_paths(embedder, fake_llm, tmp_path):
    from memory.database import make_engine
    from memory.store import Store
    from runtime.config import Settings
    from runtime.llm import LiteLLMReplier
    from runtime.turn import Engine
    from tests.conftest import PERSONA, serve

    socket_dir = tmp_path / "no-server-here"
    socket_dir.mkdir()
    url = f"postgresql+psycopg://nobody@/nowhere?host={socket_dir}"
    settings = Settings(context_window=4096, database_url=url)
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(
        settings=settings, store=Store(make_engine(url)), embedder=embedder, persona=PERSONA, replier=replier
    )
    with serve(engine) as base, client(base, "ck_whatever") as c:
        r = c.get("/v1/users")
    assert r.status_code == 503
    body = r.text
    assert r.json()["error"]["code"] == "storage_unavailable"
    for leak in (str(socket_dir), ".s.PGSQL", "psycopg", "OperationalError", "connection"):
        assert leak not in body

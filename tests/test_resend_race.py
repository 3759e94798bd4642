"""A resend deletes only what the client could see: turns stored while it waited for the
session (a message answered meanwhile) are never deleted; the resend answers 409
``turns_changed`` with the session's last seq instead."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from tests.test_api import client, read_sse

pytestmark = pytest.mark.usefixtures("steady_fake_llm")


@pytest.fixture
def chat(api_server, new_app):
    _, key = new_app()
    http = client(api_server, key)
    session = http.post("/v1/sessions", json={"user_id": "rhea"}).json()
    yield http, session["id"], api_server, key
    http.close()


def _turns(http: httpx.Client, sid: str) -> list[tuple[int, str, str]]:
    return [(t["seq"], t["role"], t["content"]) for t in http.get(f"/v1/sessions/{sid}/turns").json()]


def test_a_resend_that_waited_for_a_new_message_deletes_nothing_and_says_what_arrived(chat, fake_llm):
    http, sid, base, key = chat
    fake_llm.script.extend(["One.", "Two."])
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I live in Porto.", "stream": False})
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I like trains.", "stream": False})
    # the next reply streams slowly: 40 words, 0.05 s each
    fake_llm.script.append(" ".join(f"w{i}" for i in range(40)))
    fake_llm.stream_delay = 0.05
    answered: list[list[dict]] = []

    def new_message() -> None:
        with (
            client(base, key) as other,
            other.stream("POST", f"/v1/sessions/{sid}/messages", json={"content": "Ferries too."}) as response,
        ):
            answered.append(read_sse(response))

    sender = threading.Thread(target=new_message)
    sender.start()
    deadline = time.monotonic() + 10
    while len(_turns(http, sid)) < 5 and time.monotonic() < deadline:  # the new message is stored, its reply streams
        time.sleep(0.02)
    assert len(_turns(http, sid)) == 5
    # the client saw turns 1-4 (it asked before the new message's reply was stored)
    resend = http.post(
        f"/v1/sessions/{sid}/turns/3/resend",
        json={"content": "I like planes.", "stream": False, "expected_last_seq": 4},
    )
    sender.join(30)
    assert answered and answered[0][-1]["event"] == "done"  # the new message was answered and acknowledged
    assert resend.status_code == 409, resend.text
    error = resend.json()["error"]
    assert (error["code"], error["last_seq"]) == ("turns_changed", 6)
    turns = _turns(http, sid)
    assert [t[0] for t in turns] == [1, 2, 3, 4, 5, 6]  # the acknowledged message and its reply are kept
    assert turns[4][2] == "Ferries too." and turns[2][2] == "I like trains."


def test_a_resend_without_expected_last_seq_takes_the_last_turn_when_it_arrives(chat, fake_llm):
    http, sid, _, _ = chat
    fake_llm.script.extend(["One.", "Two.", "Edited."])
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I live in Porto.", "stream": False})
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I like trains.", "stream": False})
    done = http.post(f"/v1/sessions/{sid}/turns/3/resend", json={"content": "I like planes.", "stream": False})
    assert done.status_code == 200, done.text
    assert [t[2] for t in _turns(http, sid)] == ["I live in Porto.", "One.", "I like planes.", "Edited."]


def test_a_stale_expected_last_seq_is_refused_before_the_stream_starts(chat, fake_llm):
    http, sid, _, _ = chat
    fake_llm.script.extend(["One.", "Two."])
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I live in Porto.", "stream": False})
    http.post(f"/v1/sessions/{sid}/messages", json={"content": "I like trains.", "stream": False})
    stale = http.post(
        f"/v1/sessions/{sid}/turns/1/resend", json={"content": "Lisbon.", "stream": True, "expected_last_seq": 2}
    )
    assert stale.status_code == 409 and stale.json()["error"]["last_seq"] == 4
    assert len(_turns(http, sid)) == 4


def test_the_engine_refuses_an_edit_when_turns_came_after_the_ones_seen(make_engine_for):
    from errors import TurnsChangedError

    engine = make_engine_for()
    for text in ("a", "b", "c"):
        engine.turn(user_id="u", session_id="s", message=text, reply="ok")
    with pytest.raises(TurnsChangedError) as caught:
        engine.edit_turn(user_id="u", session_id="s", seq=3, message="B", reply="ok", expected_last_seq=4)
    assert caught.value.last_seq == 6
    assert [t.content for t in engine.store.turns.of_session("s")] == ["a", "ok", "b", "ok", "c", "ok"]

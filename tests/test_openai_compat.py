"""The OpenAI-compatible front door, driven by the official ``openai`` SDK pointed at the
real uvicorn server: only the newest user message is taken, the runtime builds the
rest; streamed and whole; the session from the ``user`` field or ``X-Session-Id``."""

from __future__ import annotations

import json

import httpx
import openai
import pytest

from tests.conftest import PERSONA, estimate_as_we_do

pytestmark = pytest.mark.usefixtures("steady_fake_llm")


@pytest.fixture
def sdk(api_server, new_app):
    _, key = new_app()
    return openai.OpenAI(base_url=f"{api_server}/v1", api_key=key, max_retries=0, timeout=30)


def test_only_the_newest_user_message_is_taken_and_the_runtime_builds_the_rest(sdk, fake_llm):
    fake_llm.script.append("Nice to meet you, Ana.")
    first = sdk.chat.completions.create(
        model="companion",
        user="ana",
        messages=[{"role": "user", "content": "Hello, I'm Ana and I live in Porto."}],
    )
    assert first.object == "chat.completion"
    assert first.choices[0].message.content == "Nice to meet you, Ana."
    reported = estimate_as_we_do(fake_llm.requests[-1])
    assert first.usage.prompt_tokens == reported and first.usage.completion_tokens == 7  # the provider's usage

    fake_llm.script.append("Of course I do.")
    second = sdk.chat.completions.create(
        model="companion",
        user="ana",
        messages=[
            {"role": "system", "content": "CLIENT SYSTEM PROMPT"},
            {"role": "user", "content": "CLIENT-SIDE HISTORY THAT MUST NOT BE SENT"},
            {"role": "assistant", "content": "CLIENT-SIDE REPLY"},
            {"role": "user", "content": [{"type": "text", "text": "Do you remember where I live?"}]},
        ],
    )
    assert second.choices[0].message.content == "Of course I do."
    sent = fake_llm.requests[-1]["messages"]
    flat = "\n".join(str(m["content"]) for m in sent)
    assert "CLIENT" not in flat
    assert PERSONA.system_prompt in flat
    assert [m["content"] for m in sent if m["role"] == "user"] == [
        "Hello, I'm Ana and I live in Porto.",
        "Do you remember where I live?",
    ]  # the runtime's own history of the same session


def test_a_streamed_completion_yields_chunks_and_our_usage(sdk, fake_llm, api_engine):
    fake_llm.script.append("The sea is calm tonight, Bo.")
    stream = sdk.chat.completions.create(
        model="companion",
        user="bo",
        messages=[{"role": "user", "content": "How is the sea?"}],
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == "The sea is calm tonight, Bo."
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["stop"]
    reported = estimate_as_we_do(fake_llm.requests[-1])
    assert chunks[-1].usage.prompt_tokens == reported and chunks[-1].usage.total_tokens == reported + 7
    assert len([c for c in chunks if c.choices and c.choices[0].delta.content]) >= 5


def test_with_include_usage_every_chunk_before_the_last_carries_null_usage(sdk, api_server, fake_llm):
    fake_llm.script.append("Calm seas and a clear sky tonight.")
    chunks = list(
        sdk.chat.completions.create(
            model="companion",
            user="dee",
            messages=[{"role": "user", "content": "How is the sea?"}],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    *before, last = chunks
    assert before and all("usage" in c.model_fields_set and c.usage is None for c in before)
    assert last.choices == [] and last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens

    fake_llm.script.append("Still calm.")
    with httpx.Client(base_url=api_server, headers={"Authorization": f"Bearer {sdk.api_key}"}, timeout=30) as http:
        body = {
            "model": "companion",
            "user": "dee",
            "messages": [{"role": "user", "content": "And now?"}],
            "stream": True,
        }
        with_usage = _sse_objects(http, {**body, "stream_options": {"include_usage": True}})
        fake_llm.script.append("Still calm.")
        without = _sse_objects(http, body)
    assert [("usage" in c, c.get("usage") is None) for c in with_usage] == [(True, True)] * (len(with_usage) - 1) + [
        (True, False)
    ]
    assert not any("usage" in c for c in without)  # not asked for: no usage key at all, as OpenAI does


def _sse_objects(http: httpx.Client, body: dict) -> list[dict]:
    """The JSON objects of a streamed chat completion's ``data:`` lines, without ``[DONE]``."""
    with http.stream("POST", "/v1/chat/completions", json=body) as response:
        assert response.status_code == 200
        lines = [line[len("data:") :].strip() for line in response.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "[DONE]"
    return [json.loads(line) for line in lines[:-1]]


def test_the_session_header_picks_the_session_and_a_closed_one_continues_in_a_new_one(sdk, api_server, fake_llm):
    key = sdk.api_key
    with httpx.Client(base_url=api_server, headers={"Authorization": f"Bearer {key}"}) as http:
        session = http.post("/v1/sessions", json={"user_id": "cy"}).json()
        raw = sdk.chat.completions.with_raw_response.create(
            model="companion",
            messages=[{"role": "user", "content": "My favourite colour is teal."}],
            extra_headers={"X-Session-Id": session["id"]},
        )
        assert raw.headers["x-session-id"] == session["id"]
        assert [t["content"] for t in http.get(f"/v1/sessions/{session['id']}/turns").json()][
            0
        ] == "My favourite colour is teal."
        http.post(f"/v1/sessions/{session['id']}/close")
        with pytest.raises(openai.ConflictError) as closed:
            sdk.chat.completions.create(
                model="companion",
                messages=[{"role": "user", "content": "hi"}],
                extra_headers={"X-Session-Id": session["id"]},
            )
        assert closed.value.body["code"] == "session_closed"
        raw = sdk.chat.completions.with_raw_response.create(
            model="companion", user="cy", messages=[{"role": "user", "content": "I'm back."}]
        )
        new_id = raw.headers["x-session-id"]
        assert new_id != session["id"]
        assert http.get(f"/v1/sessions/{new_id}").json()["carried_from"] == session["id"]
    system = "\n".join(m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "system")
    assert "My favourite colour is teal." in system  # the previous session's summary, not its raw turns


def test_another_apps_session_and_a_bad_key_are_refused(sdk, api_server, new_app, fake_llm):
    _, other_key = new_app()
    with httpx.Client(base_url=api_server, headers={"Authorization": f"Bearer {other_key}"}) as other:
        foreign = other.post("/v1/sessions", json={"user_id": "dee"}).json()
    with pytest.raises(openai.NotFoundError):
        sdk.chat.completions.create(
            model="companion",
            messages=[{"role": "user", "content": "hi"}],
            extra_headers={"X-Session-Id": foreign["id"]},
        )
    bad = openai.OpenAI(base_url=f"{api_server}/v1", api_key="ck_wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.chat.completions.create(model="companion", user="x", messages=[{"role": "user", "content": "hi"}])
    with pytest.raises(openai.BadRequestError) as missing:
        sdk.chat.completions.create(model="companion", messages=[{"role": "user", "content": "hi"}])
    assert missing.value.body["code"] == "invalid_request"
    assert fake_llm.requests == []


def test_two_requests_at_once_for_a_new_user_share_one_session(sdk, api_server, fake_llm):
    import threading

    start = threading.Barrier(4)
    sessions: list[str] = []

    def ask(i: int) -> None:
        start.wait()
        raw = sdk.chat.completions.with_raw_response.create(
            model="companion", user="eve", messages=[{"role": "user", "content": f"Message {i}"}]
        )
        sessions.append(raw.headers["x-session-id"])

    threads = [threading.Thread(target=ask, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(sessions) == 4 and len(set(sessions)) == 1  # the later three waited for the running turn
    with httpx.Client(base_url=api_server, headers={"Authorization": f"Bearer {sdk.api_key}"}) as http:
        assert len(http.get("/v1/users/eve/sessions").json()) == 1
        assert len(http.get(f"/v1/sessions/{sessions[0]}/turns").json()) == 8

"""`companion chat` as a user runs it: subprocesses fed stdin lines, on a real database,
talking to the loopback model server.

The sessions run concurrently (each subprocess spends most of its time importing
torch and litellm), once per module; the tests read their results.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass

import pytest

from memory.database import make_engine, upgrade
from memory.store import Store
from tests.conftest import create_database, estimate_as_we_do
from tests.fake_llm import estimate_prompt_tokens

REPLIES = {
    "Hello, I'm Ana.": "Nice to meet you, Ana. Welcome!",
    "I just moved to Lisbon.": "Lisbon is lovely in spring.",
    "first": (400, "Invalid value for 'temperature'."),
    "second": "Still here.",
}
"""The loopback model's reply to each last user message (the sessions run at the same time)."""


@dataclass
class Run:
    result: subprocess.CompletedProcess
    requests: list[dict]
    """The model requests whose last user message came from this run."""


def _last_user(body: dict) -> str:
    return [m["content"] for m in body["messages"] if m["role"] == "user"][-1]


@pytest.fixture(scope="module")
def chats(admin_url, fake_llm, tmp_path_factory):
    db_url = create_database(admin_url)
    engine = make_engine(db_url)
    upgrade(engine, embedding_dim=384)
    persona = tmp_path_factory.mktemp("persona") / "juno.toml"
    persona.write_text('name = "Juno"\nsystem_prompt = "You are Juno, a patient companion."\n', encoding="utf-8")
    env = {
        **os.environ,
        "COMPANION_MODEL": "openai/fake",
        "COMPANION_API_BASE": fake_llm.api_base,
        "OPENAI_API_KEY": "sk-test",
        "DATABASE_URL": db_url,
        "COMPANION_CONTEXT_WINDOW": "1024",
    }
    env.pop("COMPANION_PERSONA", None)
    no_window = {k: v for k, v in env.items() if k != "COMPANION_CONTEXT_WINDOW"}
    sessions = {
        "quit": (
            ["--user", "ana", "--session", "chat-1", "--persona", str(persona)],
            env,
            "Hello, I'm Ana.\n/context\nI just moved to Lisbon.\n/quit\nnever read\n",
        ),
        "eof": (["--user", "bo", "--session", "chat-2"], env, "first\nsecond\n"),
        "unknown": (["--user", "cy", "--session", "chat-3"], no_window, "hello\n"),
    }
    fake_llm.script.clear()
    fake_llm.requests.clear()
    fake_llm.responder = lambda body: REPLIES[_last_user(body)]
    fake_llm.prompt_tokens = estimate_prompt_tokens  # usage in proportion to the prompt, as a provider reports it
    try:
        procs = {
            name: subprocess.Popen(
                [sys.executable, "-m", "runtime.cli", "chat", *args],
                env=run_env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for name, (args, run_env, _) in sessions.items()
        }
        results = {}
        for name, proc in procs.items():
            out, err = proc.communicate(sessions[name][2], timeout=240)
            results[name] = subprocess.CompletedProcess(proc.args, proc.returncode, out, err)
        requests = list(fake_llm.requests)
    finally:
        fake_llm.responder = None
        fake_llm.prompt_tokens = estimate_as_we_do
    runs = {
        name: Run(results[name], [r for r in requests if _last_user(r) in sessions[name][2].splitlines()])
        for name in sessions
    }
    yield runs, Store(engine)
    engine.dispose()


def test_chat_streams_replies_shows_the_context_and_quits(chats):
    runs, store = chats
    run = runs["quit"]
    assert run.result.returncode == 0, run.result.stderr
    out = run.result.stdout
    assert "Juno> Nice to meet you, Ana. Welcome!" in out
    assert "Juno> Lisbon is lovely in spring." in out
    # /context prints the inspect table: every source with its tokens and cap
    table = out[out.index("context of chat-1") : out.index("I just moved to Lisbon.")]
    for source in ("persona", "memory", "retrieval", "summary", "recent"):
        assert source in table
    assert "reserved of 1024 tokens" in table
    # both replies were streamed, with usage asked for; /quit ended it before "never read"
    assert [_last_user(r) for r in run.requests] == ["Hello, I'm Ana.", "I just moved to Lisbon."]
    assert all(r["stream"] is True and r["stream_options"] == {"include_usage": True} for r in run.requests)
    turns = store.turns.of_session("chat-1")
    assert [(t.role, t.content) for t in turns] == [
        ("user", "Hello, I'm Ana."),
        ("assistant", "Nice to meet you, Ana. Welcome!"),
        ("user", "I just moved to Lisbon."),
        ("assistant", "Lisbon is lovely in spring."),
    ]
    assert turns[-1].usage_prompt_tokens is not None and turns[-1].usage_completion_tokens == 7


def test_chat_ends_cleanly_at_end_of_input_and_carries_on_after_a_model_error(chats):
    runs, store = chats
    run = runs["eof"]
    assert run.result.returncode == 0, run.result.stderr
    assert "refused the request (HTTP 400)" in run.result.stderr
    assert "Mira> Still here." in run.result.stdout
    assert len(run.requests) == 2  # a bad request is not retried
    assert [t.role for t in store.turns.of_session("chat-2")] == ["user", "user", "assistant"]


def test_chat_with_an_unknown_model_and_no_window_is_a_clear_error_at_start(chats):
    runs, store = chats
    run = runs["unknown"]
    assert run.result.returncode == 2
    assert "openai/fake" in run.result.stderr and "COMPANION_CONTEXT_WINDOW" in run.result.stderr
    assert run.requests == [] and store.sessions.get("chat-3") is None

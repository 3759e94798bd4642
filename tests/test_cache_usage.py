"""Cached prompt tokens, counted: read from the usage litellm normalizes for each provider, stored
per reply, answered by the API, priced by litellm's cost map. The loopback model reports a prompt
cache as OpenAI does (its longest common prefix with the previous request, in 128-token blocks,
none under 1,024 tokens)."""

from __future__ import annotations

import httpx
import pytest
from litellm.types.utils import Usage

from memory.apps import Directory
from persona import Persona
from runtime.config import Settings
from runtime.llm import LiteLLMReplier
from runtime.llm._replier import Reply
from runtime.llm._usage import cache_usage, request_cost
from runtime.turn import Engine
from tests.conftest import serve
from tests.fake_llm import cached_tokens, estimate_prompt_tokens

LONG = Persona(name="Mira", system_prompt="You are Mira, a kind companion. " + "Remember the harbour. " * 400)
"""A persona whose system prompt alone is over 1,024 tokens: the prefix a provider caches."""


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"prompt_tokens_details": {"cached_tokens": 1536}}, (1536, None)),  # OpenAI, xAI, Gemini
        ({"cache_read_input_tokens": 1500, "cache_creation_input_tokens": 300}, (1500, 300)),  # Anthropic
        ({"prompt_cache_hit_tokens": 1200, "prompt_cache_miss_tokens": 800}, (1200, None)),  # DeepSeek
        ({}, (None, None)),
    ],
)
def test_each_providers_cache_fields_are_read(fields, expected):
    usage = Usage(prompt_tokens=2000, completion_tokens=10, total_tokens=2010, **fields)
    read, written = cache_usage(usage)
    assert (read or None, written) == expected


def test_a_cached_prefix_costs_less_by_the_cost_map():
    full = request_cost("gpt-4o-mini", Reply(content="x", prompt_tokens=4000, completion_tokens=100))
    cached = request_cost(
        "gpt-4o-mini", Reply(content="x", prompt_tokens=4000, completion_tokens=100, cached_tokens=3072)
    )
    assert full is not None and cached is not None and cached < full
    assert request_cost("openai/no-such-model", Reply(content="x", prompt_tokens=10, completion_tokens=1)) is None


def test_the_fake_caches_as_a_provider_does():
    system = {"role": "system", "content": "a" * 8000}  # 2,004 tokens by its rule
    first = {"messages": [system, {"role": "user", "content": "hello"}]}
    second = {"messages": [system, {"role": "user", "content": "hello"}, {"role": "user", "content": "again"}]}
    assert cached_tokens(None, first) == 0
    assert cached_tokens(first, second) == 1920  # 2,004 + 5 tokens: 15 whole blocks of 128
    assert cached_tokens(first, {"messages": [{"role": "system", "content": "b" * 8000}]}) == 0


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_replys_cached_tokens_are_stored_and_answered(store, embedder, fake_llm):
    fake_llm.prompt_tokens = estimate_prompt_tokens
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(
        settings=Settings(context_window=32768, database_url="unused"),
        store=store,
        embedder=embedder,
        persona=LONG,
        replier=replier,
    )
    _, key = Directory(store.engine).create_app("cache-usage")
    with serve(engine) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
        sid = c.post("/v1/sessions", json={"user_id": "ana"}).json()["id"]
        for stream in (False, False, True):
            r = c.post(f"/v1/sessions/{sid}/messages", json={"content": "Tell me about the harbour.", "stream": stream})
            assert r.status_code == 200
        turns = c.get(f"/v1/sessions/{sid}/turns").json()
    replies = [t for t in turns if t["role"] == "assistant"]
    assert replies[0]["usage_cached_tokens"] == 0  # nothing was cached before the first request
    for later in replies[1:]:  # the persona and the earlier turns are the prefix the provider saw
        assert later["usage_cached_tokens"] >= 1024 and later["usage_cached_tokens"] % 128 == 0
        assert later["usage_cached_tokens"] <= later["usage_prompt_tokens"]
    stored = [t for t in store.turns.of_session(sid) if t.role == "assistant"]
    assert [t.usage_cached_tokens for t in stored] == [t["usage_cached_tokens"] for t in replies]


@pytest.mark.usefixtures("steady_fake_llm")
def test_the_context_view_and_inspect_show_the_last_replys_cache(store, embedder, fake_llm, db_url):
    import os
    import subprocess
    import sys

    fake_llm.prompt_tokens = estimate_prompt_tokens
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(
        settings=Settings(context_window=32768, database_url="unused"),
        store=store,
        embedder=embedder,
        persona=LONG,
        replier=replier,
    )
    _, key = Directory(store.engine).create_app("cache-view")
    with serve(engine) as base, httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}) as c:
        sid = c.post("/v1/sessions", json={"user_id": "ana"}).json()["id"]
        assert c.get(f"/v1/sessions/{sid}/context").json()["last_reply"] is None
        for _ in range(2):
            c.post(f"/v1/sessions/{sid}/messages", json={"content": "Tell me about the harbour.", "stream": False})
        last = c.get(f"/v1/sessions/{sid}/context").json()["last_reply"]
    assert last["cached_tokens"] >= 1024 and last["prompt_tokens"] >= last["cached_tokens"]
    shown = subprocess.run(
        [sys.executable, "-m", "runtime.cli", "inspect", sid],
        env={**os.environ, "DATABASE_URL": db_url, "COMPANION_CONTEXT_WINDOW": "32768"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert shown.returncode == 0, shown.stderr
    assert f"cached {last['cached_tokens']}" in shown.stdout

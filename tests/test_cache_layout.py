"""A prompt the provider can cache: the cache layout keeps each request's start as the one before
it had it, the kept recall block is dropped when its segment is forgotten,
and requests to a provider that needs cache markers carry them (through litellm)."""

from __future__ import annotations

import json
import math
import threading
import time
from dataclasses import replace
from datetime import UTC, datetime
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest
from sqlalchemy import text

from memory.tables import Turn, TurnState
from persona import Lorebook, LoreEntry, Persona
from runtime.accounting import counter_for
from runtime.config import Settings
from runtime.context import RecalledItem, split_recall, topic_background
from runtime.llm import LiteLLMReplier, cache_marks, cache_points, marks_cache
from runtime.messages import StablePrefix, to_openai
from runtime.turn import Engine
from runtime.turn._compaction import room_cap
from runtime.turn._gather import stored_cap
from tests.fake_llm import estimate_prompt_tokens

PERSONA = Persona(name="Mira", system_prompt="You are Mira, a kind companion. " + "Remember the harbour. " * 300)
TOPICS = [
    "my sister Lena moved to Porto to study marine biology",
    "I adopted a grey cat called Pixel from the shelter",
    "our band rehearses jazz standards every Thursday night",
    "I broke my wrist skiing in the Alps last winter",
    "my grandmother taught me to bake rye bread with caraway",
    "the startup I work at builds irrigation sensors for vineyards",
    "I am learning Japanese with flashcards on the train",
    "we planted tomatoes and basil on the balcony in April",
]

FILLER = "It rained all day, so I stayed in and tidied the shelves and the drawers. " * 10
"""About 160 tokens a message: compactions run every dozen turns at an 8,192-token window."""


class _Recording(LiteLLMReplier):
    """The fake model's replier, recording the ``stable`` count the engine passes with each request."""

    stables: list[StablePrefix | None]

    def reply(self, messages, *, session_id, on_delta=None, tools=None, stable=None):  # type: ignore[override]
        self.stables.append(stable)
        return super().reply(messages, session_id=session_id, on_delta=on_delta, tools=tools, stable=stable)


def _engine(store, embedder, fake_llm, *, layout: str, window: int = 8192) -> Engine:
    fake_llm.prompt_tokens = estimate_prompt_tokens
    settings = Settings(context_window=window, database_url="unused", layout=layout, compaction="inline")
    replier = _Recording(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    replier.stables = []
    return Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier)


def _talk_one(engine: Engine, user: str, i: int, *, run: int = 1) -> Any:
    """Turn ``i`` of a session that changes subject every ``run`` turns."""
    topic = TOPICS[(i // run) % len(TOPICS)]
    return engine.turn(user_id=user, session_id=f"{user}:s", message=f"Do you remember? {topic}. Round {i}. " + FILLER)


def _talk(engine: Engine, user: str, rounds: int) -> list[Any]:
    contexts = []
    for i in range(rounds):
        topic = TOPICS[i % len(TOPICS)]
        message = f"Do you remember? {topic}. Round {i}. " + FILLER
        result = engine.turn(user_id=user, session_id=f"{user}:s", message=message)
        contexts.append(result)
    return contexts


def _kept(store, session_id: str) -> tuple[str | None, list[int] | None, int | None]:
    with store.engine.connect() as conn:
        row = conn.execute(
            text("SELECT recall_block, recall_segments, recall_anchor FROM sessions WHERE id = :s"), {"s": session_id}
        ).one()
    return row.recall_block, row.recall_segments, row.recall_anchor


def _tails(store, session_id: str) -> tuple[list[dict] | None, str | None]:
    """The session's stored recall tails and prefix fingerprint."""
    with store.engine.connect() as conn:
        row = conn.execute(
            text("SELECT recall_tails, recall_prefix FROM sessions WHERE id = :s"), {"s": session_id}
        ).first()
    return (row.recall_tails, row.recall_prefix) if row is not None else (None, None)


@pytest.mark.usefixtures("steady_fake_llm")
def test_each_request_starts_as_the_one_before_it_until_a_compaction(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    results = _talk(engine, "ana", 40)
    requests = [r["messages"] for r in fake_llm.requests[-len(results) :]]
    assert any(r.context.recalled for r in results), "recall must have found segments for this to test anything"
    # the engine tells the replier how many leading messages the next request sends again
    assert engine.runner.replier.stables[-len(results) :] == [r.context.stable_prefix for r in results]
    steady = whole = part = rebuilt = 0
    kept = None
    for before, after, previous, result in zip(requests, requests[1:], results, results[1:], strict=False):
        kept = previous.context.kept_recall or kept  # the recall the session keeps: set when a turn changes it
        if previous.compactions or result.context.sources["recent"].cut:
            continue  # a compaction changed the summary, or one is due and the window is over its cap
        if result.context.rebuilt_recall is not None and kept is not None:
            # the message moved on: the block is rebuilt under it, and the prompt changes from
            # the old block's turn on, never before it
            anchor = next(i for i, m in enumerate(before) if m["role"] == "user" and kept.text in m["content"])
            assert after[:anchor] == before[:anchor]
            rebuilt += 1
            continue
        # everything before the previous request's newest message is sent again as it was,
        # and that message again without what was under it only for that turn
        last = len(before) - 1
        assert after[:last] == before[:last]
        assert after[last]["content"] == before[last]["content"][: len(after[last]["content"])]
        # what the assembly said the next request sends again (where the cache markers go) is sent again
        stable = previous.context.stable_prefix
        if stable.messages == last + 1:  # nothing under it showed for that turn only: all of it
            assert after[last] == before[last]
            whole += 1
        elif stable.chars:  # the user's text and the recall kept under it
            assert stable.messages == last and after[last]["content"] == before[last]["content"][: stable.chars]
            part += 1
        steady += 1
    assert steady >= 20 and whole >= 5 and part >= 1
    # what the provider reported reading from its cache: most of each steady request
    replies = [t for t in engine.store.turns.of_session("ana:s") if t.role == "assistant"]
    shares = [t.usage_cached_tokens / t.usage_prompt_tokens for t in replies[1:] if t.usage_prompt_tokens]
    assert sorted(shares)[len(shares) // 2] >= 0.8


@pytest.mark.usefixtures("steady_fake_llm")
def test_the_classic_layout_keeps_the_old_order(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="classic")
    results = _talk(engine, "bo", 30)
    recalled = [r for r in results if r.context.recalled]
    assert recalled
    for r in recalled:
        system = r.context.messages[1]
        assert system["role"] == "system" and '<reference source="earlier conversations"' in system["content"]
        assert '<reference source="earlier conversations"' not in to_openai(r.context.messages)[-1]["content"]
        assert not r.context.recall_withheld  # the classic layout shows all recall selects


@pytest.mark.usefixtures("steady_fake_llm")
def test_the_kept_recall_block_goes_with_a_forgotten_segment(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    results = _talk(engine, "cy", 24)
    for _ in range(8):  # until a turn that ran no compaction has kept a block
        block, segments, anchor = _kept(store, "cy:s")
        if block:
            break
        results += _talk(engine, "cy", 1)
    assert block and segments and anchor is not None
    # the block sits under its anchor turn's text in the request that built it
    sent = fake_llm.requests[-1]["messages"]
    assert any(m["role"] == "user" and block in m["content"] for m in sent)
    engine.memories.forget("cy", f"seg_{segments[0]}")
    assert _kept(store, "cy:s") == (None, None, None) and _tails(store, "cy:s") == (None, None)
    assert block not in json.dumps(to_openai(engine.assemble(user_id="cy", session_id="cy:s").messages))
    # the next turn builds a new one under its own message
    _talk(engine, "cy", 1)
    assert _kept(store, "cy:s")[0]
    assert results


def test_markers_go_where_the_next_request_starts_the_same():
    messages = [
        {"role": "system", "content": "persona"},
        {"role": "system", "content": "summary"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and now?\n\n<reference>...</reference>"},
        {"role": "system", "content": "post-history"},
    ]
    points = cache_points(messages, ttl="1h")
    assert [p["index"] for p in points] == [0, 1, 3]
    assert all(p["control"] == {"type": "ephemeral", "ttl": "1h"} for p in points)
    assert [p["index"] for p in cache_points(messages[:3])] == [0, 1]
    assert [p["index"] for p in cache_points(messages[1:])] == [0, 2]
    # the newest user message too, when the next request sends it again as it is
    assert [p["index"] for p in cache_points(messages, stable=StablePrefix(5))] == [0, 1, 3, 4]
    assert [p["index"] for p in cache_points(messages, stable=StablePrefix(4, 8))] == [0, 1, 3]
    # only its start: it goes as two parts, the start marked, the same text
    sent, points = cache_marks(messages, stable=StablePrefix(4, 8))
    assert [p["index"] for p in points] == [0, 1, 3] and messages[4]["content"].startswith("and now?\n")
    first, rest = sent[4]["content"]
    assert first == {"type": "text", "text": "and now?", "cache_control": {"type": "ephemeral"}}
    assert first["text"] + rest["text"] == messages[4]["content"] and "cache_control" not in rest
    assert marks_cache("anthropic/claude-sonnet-4-5") and marks_cache("claude-sonnet-4-5")
    assert not marks_cache("deepseek/deepseek-chat") and not marks_cache("gpt-4.1")
    assert marks_cache("gpt-4.1", "on") and not marks_cache("claude-sonnet-4-5", "off")


class _Anthropic:
    """A loopback server speaking Anthropic's Messages API (whole replies): it records each body
    and reports a prompt cache read and write in its usage."""

    def __init__(self) -> None:
        self.bodies: list[dict[str, Any]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                body = json.loads(self.rfile.read(int(self.headers.get("content-length", 0))))
                fake.bodies.append(body)
                data = json.dumps(
                    {
                        "id": "msg_fake",
                        "type": "message",
                        "role": "assistant",
                        "model": body.get("model"),
                        "content": [{"type": "text", "text": "Hello again."}],
                        "stop_reason": "end_turn",
                        "stop_sequence": None,
                        "usage": {
                            "input_tokens": 40,
                            "output_tokens": 4,
                            "cache_read_input_tokens": 1500,
                            "cache_creation_input_tokens": 300,
                        },
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"


def test_an_anthropic_request_carries_the_markers_and_its_cache_usage_is_read():
    server = _Anthropic()
    try:
        replier = LiteLLMReplier(
            model="anthropic/claude-sonnet-4-5",
            api_base=server.url,
            api_key="sk-ant-test",
            timeout=10,
            cache_markers=True,
            cache_ttl="1h",
        )
        messages = [
            {"role": "system", "content": "You are Mira."},
            {"role": "system", "content": "<summary>...</summary>"},
            {"role": "user", "content": "hi"},
            {"role": "assistant", "content": "hello"},
            {"role": "user", "content": "and now?"},
        ]
        reply = replier.reply(messages, session_id="s")
        replier.reply(messages, session_id="s", stable=StablePrefix(len(messages)))
        replier.reply(messages, session_id="s", stable=StablePrefix(len(messages) - 1, 3))
    finally:
        server.server.shutdown()
    body = server.bodies[0]
    system = body["system"]
    # the persona and the system context after it, each a system block with a breakpoint
    assert isinstance(system, list) and [b.get("cache_control", {}).get("type") for b in system] == ["ephemeral"] * 2
    assert system[-1]["cache_control"].get("ttl") == "1h"
    marked = [m for m in body["messages"] if any(isinstance(b, dict) and b.get("cache_control") for b in m["content"])]
    assert [m["role"] for m in marked] == ["assistant"]
    assert reply.cached_tokens == 1500 and reply.cache_write_tokens == 300
    # the newest user message is marked when the next request sends it again as it is
    again = server.bodies[1]["messages"]
    marked = [m for m in again if any(isinstance(b, dict) and b.get("cache_control") for b in m["content"])]
    assert [m["role"] for m in marked] == ["assistant", "user"] and marked[-1] is again[-1]
    # only its start: the marker goes on the first of two text blocks
    last = server.bodies[2]["messages"][-1]["content"]
    assert [b["text"] for b in last] == ["and", " now?"]
    assert last[0]["cache_control"]["type"] == "ephemeral" and "cache_control" not in last[1]


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_dashscope_request_carries_the_markers_in_its_openai_compatible_body(fake_llm):
    # DashScope's OpenAI-compatible API takes the same cache_control on a content part
    replier = LiteLLMReplier(
        model="dashscope/qwen-plus", api_base=fake_llm.api_base, api_key="sk-test", timeout=10, cache_markers=True
    )
    messages = [
        {"role": "system", "content": "You are Mira."},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "and now?\n\n<reference>once</reference>"},
    ]
    replier.reply(messages, session_id="s", stable=StablePrefix(3, len("and now?")))
    sent = fake_llm.requests[-1]["messages"]
    first, rest = sent[-1]["content"]
    assert first["text"] == "and now?" and first["cache_control"]["type"] == "ephemeral"
    assert rest["text"] == "\n\n<reference>once</reference>" and "cache_control" not in rest
    marked = [m["role"] for m in sent if "cache_control" in str(m)]
    assert marked == ["system", "assistant", "user"]


def _segment(i: int, words: int = 20) -> RecalledItem:
    return RecalledItem(
        id=i,
        session_id="s0",
        first_seq=2 * i,
        last_seq=2 * i + 1,
        content=f"User: fact {i} " + "about the harbour " * words,
        tokens=4 * words,
        session_date=datetime(2026, 1, 1, tzinfo=UTC),
    )


def test_the_kept_block_stays_while_the_rule_holds_and_is_rebuilt_when_recall_moves_on():
    counter = counter_for("gpt-4o-mini")
    segments = [_segment(i) for i in range(12)]
    first = split_recall(segments[:6], None, cap=600, tail_cap=150, counter=counter, zone=UTC)
    assert first.rebuilt and first.stable.text  # none kept yet: built from the best-ranked
    every = {s.id for s in first.recalled}
    assert every == set(first.stable.segment_ids) | set(first.tail_ids)  # all the selection is in view
    kept = first.stable
    # one new segment ranked second: it fits the tail, the kept block stays (both rules)
    moved_a_little = [segments[0], segments[9], *segments[1:5]]
    for keep in ("all", "coverage"):
        split = split_recall(moved_a_little, kept, cap=600, tail_cap=150, counter=counter, zone=UTC, keep=keep)
        assert not split.rebuilt and split.stable.text == kept.text and 9 in split.tail_ids + split.volatile_ids
        # what it keeps of the addition joins the session's tails, to be anchored under the current message
        assert split.stable.tails[: len(kept.tails)] == kept.tails
        assert split.changed == bool(split.tail_ids)
        if split.tail_ids:
            assert split.stable.tails[-1].segment_ids == split.tail_ids and split.stable.tails[-1].anchor is None
    # recall moved on to other segments: more than the tail holds
    moved_on = [*segments[6:12]]
    assert split_recall(moved_on, kept, cap=600, tail_cap=150, counter=counter, zone=UTC, keep="all").rebuilt
    # coverage keeps the block while it holds a quarter of the best-ranked segments
    half = [segments[0], segments[7], segments[8], segments[9], segments[10]]
    all_rule = split_recall(half, kept, cap=600, tail_cap=150, counter=counter, zone=UTC, keep="all")
    coverage = split_recall(half, kept, cap=600, tail_cap=150, counter=counter, zone=UTC, keep="coverage")
    assert all_rule.rebuilt and {s.id for s in all_rule.recalled} == {0, 7, 8, 9, 10}
    assert not coverage.rebuilt and 7 in coverage.tail_ids + coverage.volatile_ids  # the best it lacks


def test_a_selection_the_kept_recall_mostly_holds_keeps_the_block_and_shows_the_best_it_lacks():
    counter = counter_for("gpt-4o-mini")
    segments = [_segment(i, words=10) for i in range(14)]
    kept = split_recall(segments[:6], None, cap=900, tail_cap=90, counter=counter, zone=UTC).stable
    assert set(kept.segment_ids) == set(range(6))
    # three new segments, more than the room left holds, beside the six the kept recall holds
    mostly = [segments[11], segments[12], segments[13], *segments[:6]]
    split = split_recall(mostly, kept, cap=900, tail_cap=90, counter=counter, zone=UTC)
    assert not split.rebuilt and split.stable.text == kept.text
    assert {s.id for s in split.recalled} == {*range(6), 11}  # the best of what it lacks, within the room
    assert {s.id for s in split.withheld} == {12, 13}  # the rest of the selection: not shown this turn
    # the same three beside two of the six: most of the selection is new, the block is rebuilt
    less = [segments[11], segments[12], segments[13], *segments[:2]]
    rebuilt = split_recall(less, kept, cap=900, tail_cap=90, counter=counter, zone=UTC)
    assert rebuilt.rebuilt and {s.id for s in rebuilt.recalled} == {0, 1, 11, 12, 13} and not rebuilt.withheld
    # most of the selection held, but its best-ranked segment missing and longer than the room:
    # the message needs what the block lacks most (a question about a small archive), so the
    # block is rebuilt; ranked below what the block holds, the same segment leaves it in place
    big = _segment(20, words=35)
    assert sum(s.tokens for s in segments[:6]) >= 0.6 * sum(s.tokens for s in [big, *segments[:6]])
    top_missing = split_recall([big, *segments[:6]], kept, cap=900, tail_cap=30, counter=counter, zone=UTC)
    assert top_missing.rebuilt and 20 in {s.id for s in top_missing.recalled}
    assert not split_recall([*segments[:6], big], kept, cap=900, tail_cap=30, counter=counter, zone=UTC).rebuilt


def test_a_tail_stays_under_its_turn_and_a_turn_adds_only_what_is_not_in_view():
    counter = counter_for("gpt-4o-mini")
    segments = [_segment(i, words=10) for i in range(12)]
    kept = split_recall(segments[:4], None, cap=900, tail_cap=300, counter=counter, zone=UTC).stable.anchored(1)
    assert not kept.tails  # the whole selection fit the block
    # a new segment: a tail under this turn
    second = split_recall([segments[5], *segments[:4]], kept, cap=900, tail_cap=300, counter=counter, zone=UTC)
    assert not second.rebuilt and second.tail_ids == (5,) and second.changed
    kept = second.stable.anchored(3)
    assert [(t.anchor, t.segment_ids) for t in kept.tails] == [(3, (5,))]
    # the same selection again: everything is in view (the block, the kept tail), nothing is added
    third = split_recall([segments[5], *segments[:4]], kept, cap=900, tail_cap=300, counter=counter, zone=UTC)
    assert not third.rebuilt and not third.tail and not third.changed and third.stable == kept
    assert {s.id for s in third.recalled} == {0, 1, 2, 3, 5}
    # one more new segment is added beside the kept tail, never instead of it
    fourth = split_recall(
        [segments[6], segments[5], *segments[:4]], kept, cap=900, tail_cap=300, counter=counter, zone=UTC
    )
    assert fourth.tail_ids == (6,) and fourth.stable.tails[0] == kept.tails[0]
    # when the kept tails leave no room for what the turn lacks, and it holds less than half of
    # what the turn selects, the block is rebuilt
    used = sum(counter.count_text("\n\n" + t) for _, t in kept.pieces if t)
    selection = [segments[6], segments[7], segments[8], segments[9], segments[5], segments[0]]
    full = split_recall(selection, kept, cap=used + 5, tail_cap=300, counter=counter, zone=UTC)
    fresh = split_recall(selection, None, cap=used + 5, tail_cap=300, counter=counter, zone=UTC)
    assert full.rebuilt and {s.id for s in full.recalled} == {s.id for s in fresh.recalled}


def test_a_message_on_the_same_subject_keeps_the_block_whatever_recall_finds():
    counter = counter_for("gpt-4o-mini")
    segments = [_segment(i) for i in range(12)]
    kept = split_recall(segments[:6], None, cap=600, tail_cap=150, counter=counter, zone=UTC).stable
    mostly_new = [segments[6], segments[7], segments[8], *segments[0:2]]  # more than the tail holds, mostly new
    assert split_recall(mostly_new, kept, cap=600, tail_cap=150, counter=counter, zone=UTC).rebuilt
    for keep in ("all", "coverage"):
        split = split_recall(
            mostly_new, kept, cap=600, tail_cap=150, counter=counter, zone=UTC, keep=keep, same_topic=True
        )
        assert not split.rebuilt and split.stable.text == kept.text
        # the tail shows the best-ranked segments the block lacks, within a third of its cap
        assert counter.count_text(split.tail) <= 50 if split.tail else not split.tail_ids
        assert set(split.tail_ids) <= {s.id for s in split.recalled} <= kept.all_segment_ids | set(split.tail_ids)
    # a kept recall over the cap is rebuilt even on the same subject
    used = sum(counter.count_text("\n\n" + t) for _, t in kept.pieces if t)
    assert split_recall(
        mostly_new, kept, cap=used - 1, tail_cap=150, counter=counter, zone=UTC, same_topic=True
    ).rebuilt
    # so is one built when the archive was small, once the turn selects much more than it shows
    small = split_recall(segments[:2], None, cap=600, tail_cap=150, counter=counter, zone=UTC).stable
    grown = split_recall(segments[:8], small, cap=600, tail_cap=150, counter=counter, zone=UTC, same_topic=True)
    assert grown.rebuilt and len(grown.stable.segment_ids) > len(small.segment_ids)


def _rebuilds(
    store, embedder, fake_llm, user: str, same_topic: float, *, run: int = 1, rounds: int = 30
) -> tuple[list[int], int]:
    """(the turns, 0-based, that rebuilt the kept block while the one before was still in view,
    turns) of a session that changes subject every ``run`` turns, at
    ``COMPANION_RECALL_SAME_TOPIC=same_topic``."""
    fake_llm.prompt_tokens = estimate_prompt_tokens
    settings = Settings(
        context_window=8192, database_url="unused", layout="cache", compaction="inline", recall_same_topic=same_topic
    )
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier)
    rebuilt = []
    results = []
    for i in range(rounds):
        results.append(_talk_one(engine, user, i, run=run))
    kept_anchor: int | None = None
    for i, (before, result) in enumerate(zip([None, *results], results, strict=False)):
        seqs = set(result.context.recent_seqs)
        # after a compaction the prompt before the block changed: rebuilding it then costs nothing
        compacted = before is not None and before.compactions
        if result.context.rebuilt_recall is not None and kept_anchor in seqs and not compacted:
            rebuilt.append(i)
        if result.context.rebuilt_recall is not None:
            kept_anchor = max(seqs)  # built under this turn's own message, the newest in view
    return rebuilt, len(results)


class _AllAlike:
    """An embedder that finds any two texts alike, as a model does a language it was not trained
    on: the test model's vectors pulled toward one direction (two texts on different subjects come
    out at about 0.7, far above the setting's 0.25)."""

    def __init__(self, inner) -> None:
        self.name = inner.name
        self.dimension = inner.dimension
        self._inner = inner

    def embed(self, texts):
        out = []
        for vector in self._inner.embed(texts):
            pulled = [x + 1.5 / self.dimension**0.5 for x in vector]
            norm = sum(x * x for x in pulled) ** 0.5
            out.append([x / norm for x in pulled])
        return out


@pytest.mark.usefixtures("steady_fake_llm")
def test_the_gatherer_keeps_the_block_while_the_message_stays_on_its_subject(store, embedder, fake_llm, monkeypatch):
    # the subject alone decides here: a block that holds most of a turn's selection would stay anyway
    monkeypatch.setattr("runtime.context._stable_recall.KEEP_HELD", 1.01)
    # three messages a subject; at -1 the setting never binds, and a message on the subject of
    # the one before is closer to it than the conversation's messages a few apart are to each
    # other: no such turn replaces the block (once five messages tell the conversation's background)
    rebuilt, turns = _rebuilds(store, embedder, fake_llm, "dee", -1.0, run=3)
    assert turns == 30 and not [i for i in rebuilt if i % 3 and i >= 5]
    # at 1, only a repeated message stays on it: recall moving on rebuilds the block
    moved_on, _ = _rebuilds(store, embedder, fake_llm, "eve", 1.0)
    assert len(moved_on) >= 3


def test_the_background_is_how_alike_messages_a_few_apart_are():
    # unit vectors at known angles: messages 0..5 alternate between two subjects at 0 and 60 degrees
    angle = [0.0, math.pi / 3] * 3
    vectors = [[math.cos(a), math.sin(a)] for a in angle]
    assert topic_background(vectors[:4]) is None  # fewer than five messages: not known
    # the pairs at least three apart: (3,0) (4,0) (5,0) (4,1) (5,1) (5,2), cosines 0.5 1 0.5 0.5 1 0.5
    pairs = [0.5, 1.0, 0.5, 0.5, 1.0, 0.5]
    mean = sum(pairs) / len(pairs)
    spread = (sum((p - mean) ** 2 for p in pairs) / len(pairs)) ** 0.5
    assert topic_background(vectors) == pytest.approx(mean - 0.5 * spread)
    # only the newest messages are read: older ones of another subject change nothing
    assert topic_background([[0.0, -1.0]] * 40 + vectors * 4) == topic_background(vectors * 4)
    # a zero vector (no embedding) counts as unlike everything, not as an error
    assert topic_background([[0.0, 0.0], *vectors]) is not None


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_model_that_finds_all_texts_alike_still_tells_a_new_subject(store, embedder, fake_llm, monkeypatch):
    monkeypatch.setattr("runtime.context._stable_recall.KEEP_HELD", 1.01)
    alike = _AllAlike(embedder)
    similarity = sum(a * b for a, b in zip(*alike.embed([TOPICS[0], TOPICS[3]]), strict=True))
    assert similarity > 0.6
    # every message is above the setting's 0.25, yet each changes the subject: measured against
    # how alike the conversation's messages are anyway, the message has moved on
    rebuilt, turns = _rebuilds(store, alike, fake_llm, "gil", 0.25)
    assert turns == 30 and len(rebuilt) >= 3


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_kept_tail_is_sent_again_under_its_turn_and_goes_with_a_forgotten_segment(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache", window=16384)
    seen: list[tuple[int, str]] = []
    for round_ in range(60):
        before = _tails(store, "fay:s")[0] or []
        _talk_one(engine, "fay", round_)
        after = _tails(store, "fay:s")[0] or []
        if len(after) > len(before) and after[:-1] == before:  # this turn kept a tail of its own
            seen.append((after[-1]["anchor"], after[-1]["text"]))
        if len(seen) >= 2:
            break
    assert seen, "no turn kept a tail: the test needs recall to add segments the block lacks"
    anchor, tail = seen[0]
    # every later request sends the tail again under the text of its turn, as the provider saw it
    contents = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "user"]
    turn = next(t for t in engine.store.turns.of_session("fay:s") if t.seq == anchor)
    assert any(c.startswith(turn.content) and tail in c for c in contents)
    # the tail's segments go with a forgotten one, and so does the tail
    segment = next(t["segments"][0] for t in _tails(store, "fay:s")[0] if t["segments"])
    engine.memories.forget("fay", f"seg_{segment}")
    assert _tails(store, "fay:s") == (None, None)
    assert tail not in json.dumps(to_openai(engine.assemble(user_id="fay", session_id="fay:s").messages))


def _forget_mid_turn(engine: Engine, store, user: str, monkeypatch, forget) -> tuple[int, str]:
    """Turns of ``user`` until one keeps recall; while the model is asked for it, ``forget(segment)``
    runs on a segment that recall quotes. Returns the segment and its text; asserts that turn
    stored its recall."""
    splits: list[Any] = []

    def recording(*args, **kwargs):
        splits.append(split_recall(*args, **kwargs))
        return splits[-1]

    monkeypatch.setattr("runtime.context._assemble.split_recall", recording)
    forgotten: dict[int, str] = {}
    ask = engine.runner.replier.reply

    def forgetting(messages, **kwargs):
        split = splits[-1] if splits else None
        if not forgotten and split is not None and split.changed and split.stable.all_segment_ids:
            segment = min(split.stable.all_segment_ids)
            with store.engine.connect() as conn:
                forgotten[segment] = conn.execute(
                    text("SELECT content FROM archived_segments WHERE id = :i"), {"i": segment}
                ).scalar_one()
            forget(segment)
        return ask(messages, **kwargs)

    monkeypatch.setattr(engine.runner.replier, "reply", forgetting)
    for i in range(40):
        result = _talk_one(engine, user, i)
        if forgotten:
            assert result.context.kept_recall is not None  # the turn stored the recall it kept
            ((segment, content),) = forgotten.items()
            return segment, content
    raise AssertionError("no turn kept recall: the test needs recall to find segments")


def _quotes(engine: Engine, store, user: str, segment: int, content: str) -> bool:
    """Whether the session's stored recall, or its next prompt, still has ``segment`` or its text."""
    block, segments, _ = _kept(store, f"{user}:s")
    tails = _tails(store, f"{user}:s")[0] or []
    prompt = json.dumps(to_openai(engine.assemble(user_id=user, session_id=f"{user}:s").messages))
    return (
        segment in (segments or [])
        or any(segment in t["segments"] for t in tails)
        or content in (block or "") + json.dumps(tails) + prompt
    )


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_segment_forgotten_while_a_turn_runs_is_not_kept_in_its_recall(store, embedder, fake_llm, monkeypatch):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    segment, content = _forget_mid_turn(
        engine, store, "dee", monkeypatch, lambda s: engine.memories.forget("dee", f"seg_{s}")
    )
    assert not _quotes(engine, store, "dee", segment, content)
    _talk_one(engine, "dee", 41)  # the next turn keeps recall of its own again
    assert _kept(store, "dee:s")[0]


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_turn_that_waited_for_a_forgetting_finds_its_segment_gone(store, embedder, fake_llm, monkeypatch):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    committed: list[bool] = []

    def forget_slowly(segment: int) -> None:
        # a forgetting, as the runtime's takes its locks, that commits a second later: the turn
        # storing its reply waits for the session row, then must find the segment gone
        conn = store.engine.connect()
        conn.execute(text("SELECT id FROM sessions WHERE user_id = 'eve' ORDER BY id FOR UPDATE"))
        conn.execute(text("DELETE FROM archived_segments WHERE id = :i"), {"i": segment})
        conn.execute(
            text(
                "UPDATE sessions SET recall_block = NULL, recall_segments = NULL "
                "WHERE recall_segments @> ARRAY[CAST(:i AS bigint)]"
            ),
            {"i": segment},
        )

        def commit() -> None:
            time.sleep(1.0)
            committed.append(True)
            conn.commit()
            conn.close()

        threading.Thread(target=commit).start()

    segment, content = _forget_mid_turn(engine, store, "eve", monkeypatch, forget_slowly)
    assert committed  # the turn stored its reply after the forgetting committed
    assert not _quotes(engine, store, "eve", segment, content)


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_forgetting_waits_for_a_turn_storing_its_reply(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    _talk(engine, "fin", 24)
    kept = set(_kept(store, "fin:s")[1] or [])
    with store.engine.connect() as conn:
        ids = conn.execute(text("SELECT id FROM archived_segments WHERE user_id = 'fin' ORDER BY id")).scalars().all()
    segment = next(i for i in ids if i not in kept)  # one the session's kept recall does not quote
    writing = store.engine.connect()  # a turn storing its reply holds its session's row until it commits
    writing.execute(text("UPDATE sessions SET last_activity_at = now() WHERE id = 'fin:s'"))
    done: list[dict] = []
    forgetting = threading.Thread(target=lambda: done.append(engine.memories.forget("fin", f"seg_{segment}")))
    forgetting.start()
    time.sleep(0.5)
    assert not done  # it waits: deleting now could miss the recall the turn is storing
    writing.commit()
    writing.close()
    forgetting.join(10)
    assert done and done[0]["archived_segments"] == 1


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_deleted_session_leaves_no_quote_in_another_sessions_kept_recall(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    _talk(engine, "gus", 24)
    with store.engine.connect() as conn:
        rows = conn.execute(text("SELECT id, content FROM archived_segments WHERE session_id = 'gus:s'")).all()
    archived = {r.id: r.content for r in rows}
    quoted: set[int] = set()
    for i in range(8):  # the user's next session recalls the first one's segments, and keeps them
        message = f"Do you remember? {TOPICS[i % len(TOPICS)]}. Round {i}. " + FILLER
        engine.turn(user_id="gus", session_id="gus:t", message=message)
        quoted = set(_kept(store, "gus:t")[1] or []) & archived.keys()
        if quoted:
            break
    assert quoted, "the second session's kept recall must quote the first one's segments"
    engine.delete_session(user_id="gus", session_id="gus:s")
    block, segments, _ = _kept(store, "gus:t")
    assert not set(segments or []) & archived.keys()
    prompt = json.dumps(to_openai(engine.assemble(user_id="gus", session_id="gus:t").messages))
    assert not any(c in (block or "") + json.dumps(_tails(store, "gus:t")[0]) + prompt for c in archived.values())


@pytest.mark.usefixtures("steady_fake_llm")
def test_a_block_is_rebuilt_when_the_prompt_before_it_changes(store, embedder, fake_llm):
    fake_llm.prompt_tokens = estimate_prompt_tokens
    settings = Settings(
        context_window=8192, database_url="unused", layout="cache", compaction="inline", recall_same_topic=-1.0
    )
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier)
    results = _talk(engine, "gus", 20)
    prefix = _tails(store, "gus:s")[1]
    assert prefix and _kept(store, "gus:s")[0], "a block must be kept for this to test anything"
    # on the subject (threshold -1) and nothing else changed: the block stays
    steady = _talk_one(engine, "gus", 20)
    assert steady.context.rebuilt_recall is None or steady.compactions or results[-1].compactions
    # the pinned profile changes the system context: the provider has nothing cached after it,
    # so the block is rebuilt for the current message (it would have stayed otherwise)
    engine.profiles.set("gus", name="Gustavo")
    moved = _talk_one(engine, "gus", 21)
    assert moved.context.rebuilt_recall is not None and _tails(store, "gus:s")[1] != prefix


@pytest.mark.usefixtures("steady_fake_llm")
def test_after_each_turn_the_recent_window_has_room_for_a_message_like_the_last(store, embedder, fake_llm):
    engine = _engine(store, embedder, fake_llm, layout="cache")
    compactions = checked = 0
    for i in range(40):
        result = _talk_one(engine, "hal", i)
        compactions += len(result.compactions)
        # what the next request's recent window holds (stored tokens), with a message as long as this one
        window = engine.store.turns.of_session("hal:s", state=TurnState.context)
        cap = stored_cap(engine.runner.budgets.recent, result.context.calibration)
        if len(window) > 6:  # more than a compaction keeps in any case
            assert sum(t.tokens for t in window) + result.user_turn.tokens <= cap, i
            checked += 1
    assert compactions >= 2 and checked >= 20


def test_the_compaction_after_a_turn_leaves_room_for_the_next_message():
    turns = [
        Turn(session_id="s", seq=i, role="user" if i % 2 == 0 else "assistant", content="x", tokens=100 + i)
        for i in range(6)
    ]
    # the cap, less a message as long as the newest user message
    assert room_cap(turns, 1000) == 1000 - turns[4].tokens
    # never less than half the cap: a longer message is cut to fit anyway
    assert room_cap(turns, 150) == 75


def _blocks(body: dict[str, Any]) -> list[tuple[str, str, bool]]:
    """An Anthropic request as its blocks in order: (role, text, carries a breakpoint)."""
    out = [("system", b["text"], bool(b.get("cache_control"))) for b in body.get("system", [])]
    for m in body["messages"]:
        parts = m["content"] if isinstance(m["content"], list) else [{"text": m["content"]}]
        out += [(m["role"], p.get("text", ""), bool(p.get("cache_control"))) for p in parts]
    return out


@pytest.mark.usefixtures("steady_fake_llm")
def test_an_anthropic_session_marks_only_what_the_next_request_starts_with(store, embedder):
    # a lorebook entry fires under the message that names the cat: that turn only
    book = Lorebook(entries=(LoreEntry(keys=("Pixel",), content="Pixel is a grey tabby who hates the vacuum."),))
    persona = replace(PERSONA, character_book=replace(book, scan_depth=0))
    settings = Settings(context_window=32768, database_url="unused", layout="cache", compaction="inline")
    server = _Anthropic()
    replier = LiteLLMReplier(
        model="anthropic/claude-sonnet-4-5", api_base=server.url, api_key="sk-ant-test", timeout=10, cache_markers=True
    )
    engine = Engine(settings=settings, store=store, embedder=embedder, persona=persona, replier=replier)
    try:
        results = [_talk_one(engine, "ivy", i) for i in range(10)]
    finally:
        server.server.shutdown()
    assert not any(r.compactions for r in results)
    whole = part = 0
    for before, after in zip(server.bodies, server.bodies[1:], strict=False):
        sent, next_sent = _blocks(before), _blocks(after)
        assert sum(m for _, _, m in sent) <= 4  # Anthropic takes four breakpoints at most
        last = max(i for i, (_, _, marked) in enumerate(sent) if marked)
        # everything up to the last breakpoint is the start of the next request, block for block
        assert [(r, t) for r, t, _ in next_sent[: last + 1]] == [(r, t) for r, t, _ in sent[: last + 1]]
        if last == len(sent) - 1:
            whole += 1  # the newest message, all of it
        elif sent[last][0] == "user" and sent[last + 1][0] == "user":
            part += 1  # its text, without the lorebook entry under it
            assert "Pixel is a grey tabby" in sent[last + 1][1] and "Pixel is a grey tabby" not in next_sent[last][1]
    assert whole >= 5 and part >= 1

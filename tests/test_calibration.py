"""Calibration that tightens as well as loosens: against a loopback model whose tokenizer counts 2×
or 0.5× our estimate, or one script at 0.4× and another at 1× (a language switch mid-session),
the provider never rejects a request we built as fitting, and a session our estimate over-counts
ends up counting within 10 % of what the provider reports."""

from __future__ import annotations

import math
import re

import pytest

from runtime.accounting import counter_for
from runtime.config import Settings
from tests.fake_llm import OVERFLOW, HTTPError

WINDOW = 4096
CYRILLIC = re.compile(r"[\u0400-\u04ff]")
RUSSIAN = "Вчера мы гуляли по набережной, смотрели на корабли и долго говорили о детстве. "
ENGLISH = "Yesterday we walked along the harbour, watched the ships and talked about our childhood. "


def _provider(ratio):
    """A provider's prompt count: each message at ``ratio(text)`` of our raw estimate of it."""
    counter = counter_for(Settings.model_fields["model"].default)

    def count(body: dict) -> int:
        return 3 + sum(
            math.ceil(counter.count_message(m) * ratio(str(m.get("content") or ""))) for m in body["messages"]
        )

    return count


def _strict(fake_llm, count, reserve: int) -> list[int]:
    """Make the loopback model refuse, as a provider does, a request whose prompt plus the reply
    reserve is over the window; returns the list it records the counts of the requests in."""
    seen: list[int] = []
    overflow = OVERFLOW["openai"]

    def respond(body: dict):
        n = count(body)
        seen.append(n)
        if n + reserve > WINDOW:
            return HTTPError(overflow.status, overflow.message, type=overflow.type, code=overflow.code)
        return "Tell me more."

    fake_llm.prompt_tokens = count
    fake_llm.responder = respond
    return seen


def _script(text: str) -> float:
    """A tokenizer that counts Cyrillic at 0.4 of our estimate and everything else at 1: a message
    mixing both counts each at its own rate."""
    share = len(CYRILLIC.findall(text)) / max(len(text), 1)
    return 0.4 * share + 1.0 * (1 - share)


@pytest.mark.parametrize(
    ("name", "ratio", "lines"),
    [
        ("counts-double", lambda _text: 2.0, [ENGLISH * 20] * 14),
        ("counts-half", lambda _text: 0.5, [ENGLISH * 20] * 18),
        ("russian-then-english", _script, [RUSSIAN * 20] * 12 + [ENGLISH * 60] * 4),
    ],
)
def test_no_request_we_built_as_fitting_is_refused(make_engine_for, fake_llm, name, ratio, lines):
    engine = make_engine_for(window=WINDOW)
    seen = _strict(fake_llm, _provider(ratio), engine.budgets.reply_reserve)
    results = [engine.turn(user_id="u1", session_id=name, message=line) for line in lines]
    # every request the model got fits by its own count: none was refused and none retried
    assert len(seen) == len(lines)
    assert all(n + engine.budgets.reply_reserve <= WINDOW for n in seen)
    assert all(r.context.total_tokens + r.context.reply_reserve <= WINDOW for r in results)
    assert sum(len(r.compactions) for r in results) >= 1  # the window was full enough to compact


@pytest.mark.parametrize(
    ("ratio", "line", "share"),
    # Russian at 0.4 pays for its safety margin: what no reported request held (the newest message,
    # the reply before it, the recall tail, a rebuilt recall block) is counted at the raw estimate,
    # 2.5× what it costs
    [(lambda _text: 0.5, ENGLISH * 20, 0.9), (_script, RUSSIAN * 20, 0.8)],
    ids=["counts-half", "russian"],
)
def test_an_over_counted_session_gets_the_window_it_pays_for(make_engine_for, fake_llm, ratio, line, share):
    """Measured as the provider counts them: the prompts of a session our estimate over-counts hold
    at least ``share`` of the tokens of the same session with a provider that counts as we do (with
    the factor held at 1 or more, as before, they held about the provider's ratio: 0.5, 0.4)."""
    engine = make_engine_for(window=WINDOW)
    sizes = {}
    for name, provider_ratio in (("exact", lambda _text: 1.0), ("over", ratio)):
        _strict(fake_llm, _provider(provider_ratio), engine.budgets.reply_reserve)
        results = [engine.turn(user_id="u1", session_id=name, message=line) for _ in range(24)]
        replies = [t for t in engine.store.turns.of_session(name) if t.role == "assistant"]
        sizes[name] = [t.usage_prompt_tokens / provider_ratio(line) for t in replies]  # in our raw tokens
        sizes[name + "-reported"] = [t.usage_prompt_tokens for t in replies]
        if name == "over":
            assert results[5].context.calibration < 0.6  # fallen toward the provider by the sixth turn
            # recall fetched what the memory budget holds at the session's count, not at the raw one
            memory = results[-1].context.sources["memory"]
            assert memory.tokens >= 0.8 * memory.cap
    exact, over = sizes["exact-reported"][-8:], sizes["over-reported"][-8:]
    # what the over-counted session sends, as the provider counts it, against the exact one's
    assert sum(over) >= share * sum(exact)

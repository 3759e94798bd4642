"""Budgets that always hold, replaying failing inputs reported against other context managers."""

from __future__ import annotations

import pytest

from errors import ConfigurationError
from runtime.accounting import CalibratedCounter, correction, counter_for
from runtime.context import fit_messages

COUNTER = counter_for("gpt-4o-mini")


def _call(i):
    return {"id": f"call_{i}", "type": "function", "function": {"name": "lookup", "arguments": f'{{"q": "item {i}"}}'}}


def _valid(messages):
    """OpenAI-compatible validity: every tool result follows its call, and the first
    message after the system messages is a user message."""
    body = [m for m in messages if m["role"] != "system"]
    assert not body or body[0]["role"] == "user"
    open_calls: set[str] = set()
    for m in messages:
        if m["role"] == "assistant" and m.get("tool_calls"):
            open_calls = {c["id"] for c in m["tool_calls"]}
        elif m["role"] == "tool":
            assert m["tool_call_id"] in open_calls, f"orphaned tool result {m['tool_call_id']}"
    for i, m in enumerate(messages):
        if m["role"] == "assistant" and m.get("tool_calls"):
            answered = {x["tool_call_id"] for x in messages[i + 1 :] if x["role"] == "tool"}
            assert {c["id"] for c in m["tool_calls"]} <= answered, "a tool call lost its result"


def test_trim_never_orphans_a_tool_result():
    # LangChain trim_messages / LlamaIndex ChatMemoryBuffer reports: the cut fell between a call and its results
    messages = [
        {"role": "system", "content": "You are Mira."},
        {"role": "user", "content": "Look up two things for me " + "please " * 30},
        {"role": "assistant", "content": None, "tool_calls": [_call(1), _call(2)]},
        {"role": "tool", "tool_call_id": "call_1", "content": "result one " * 20},
        {"role": "tool", "tool_call_id": "call_2", "content": "result two " * 20},
        {"role": "assistant", "content": "Here is what I found."},
        {"role": "user", "content": "Thanks! And now?"},
    ]
    full = COUNTER.count_messages(messages)
    for limit in range(COUNTER.count_messages([messages[0], messages[-1]]), full, 7):
        fit = fit_messages(messages, limit=limit, counter=COUNTER)
        assert fit.tokens <= limit
        assert COUNTER.count_messages(fit.messages) <= limit
        _valid(fit.messages)
        assert fit.messages[0] == messages[0]  # the system message is never evicted
        assert fit.messages[-1]["content"].endswith("Thanks! And now?")


def test_trim_never_leaves_an_assistant_turn_first():
    # SillyTavern / OpenAI-compat reports: after trimming, history began with the assistant's greeting
    messages = [
        {"role": "system", "content": "You are Mira."},
        {"role": "assistant", "content": "Hi! I'm Mira. " * 10},
        {"role": "user", "content": "Hello Mira, " * 10},
        {"role": "assistant", "content": "Lovely to meet you. " * 10},
        {"role": "user", "content": "What's new?"},
    ]
    full = COUNTER.count_messages(messages)
    for limit in range(COUNTER.count_messages([messages[0], messages[-1]]), full):
        fit = fit_messages(messages, limit=limit, counter=COUNTER)
        body = [m for m in fit.messages if m["role"] != "system"]
        assert body[0]["role"] == "user"
        assert fit.tokens <= limit


def test_a_list_far_under_budget_comes_back_identical():
    messages = [
        {"role": "system", "content": "sys"},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "bye"},
    ]
    snapshot = [dict(m) for m in messages]
    fit = fit_messages(messages, limit=100_000, counter=COUNTER, tool_result_cap=1000, tool_results_cap=5000)
    assert fit.messages is messages
    assert messages == snapshot
    assert fit.dropped == 0 and fit.cut == []


def test_parallel_tool_results_each_under_single_cap_still_fail_the_aggregate_cap():
    calls = [_call(i) for i in range(10)]
    results = [
        {"role": "tool", "tool_call_id": f"call_{i}", "content": f"row {i}: " + "data " * 150} for i in range(10)
    ]
    messages = [
        {"role": "system", "content": "You are Mira."},
        {"role": "user", "content": "Fetch everything."},
        {"role": "assistant", "content": None, "tool_calls": calls},
        *results,
    ]
    single, aggregate = 400, 1500
    sizes = [COUNTER.count_message(r) for r in results]
    assert all(s < single for s in sizes) and sum(sizes) > aggregate  # the burst the issue describes
    fit = fit_messages(messages, limit=100_000, counter=COUNTER, tool_result_cap=single, tool_results_cap=aggregate)
    tool_msgs = [m for m in fit.messages if m["role"] == "tool"]
    assert len(tool_msgs) == 10  # results are cut, never orphaned or lost
    assert sum(COUNTER.count_message(m) for m in tool_msgs) <= aggregate
    assert all("Tool result cut to fit its budget" in m["content"] for m in tool_msgs)
    assert len(fit.cut) == 10
    _valid(fit.messages)


def test_one_tool_result_over_the_single_cap_is_cut_with_a_notice():
    messages = [
        {"role": "user", "content": "Read it."},
        {"role": "assistant", "content": None, "tool_calls": [_call(0)]},
        {"role": "tool", "tool_call_id": "call_0", "content": "x " * 3000},
    ]
    fit = fit_messages(messages, limit=100_000, counter=COUNTER, tool_result_cap=300)
    assert COUNTER.count_message(fit.messages[2]) <= 300
    assert "of 6000 characters shown" in fit.messages[2]["content"]


def test_a_big_system_prompt_plus_history_is_trimmed_on_the_whole_request():
    system = {"role": "system", "content": "Rules. " * 1000}
    history = []
    for i in range(10):
        history += [
            {"role": "user", "content": f"question {i} " * 20},
            {"role": "assistant", "content": f"answer {i} " * 20},
        ]
    history.append({"role": "user", "content": "last question"})
    limit = 3000
    assert COUNTER.count_messages(history) < limit  # the history alone is under the trigger
    assert COUNTER.count_messages([system, *history]) > limit  # the whole request is not
    fit = fit_messages([system, *history], limit=limit, counter=COUNTER)
    assert fit.tokens <= limit and COUNTER.count_messages(fit.messages) <= limit
    assert fit.messages[0] is system
    assert fit.dropped > 0 and "earlier messages of this conversation are not shown" in fit.messages[1]["content"]
    _valid(fit.messages)


def test_system_messages_that_alone_exceed_the_limit_are_a_clear_error():
    with pytest.raises(ConfigurationError, match="system messages alone take"):
        fit_messages(
            [{"role": "system", "content": "Rules. " * 2000}, {"role": "user", "content": "hi"}],
            limit=1000,
            counter=COUNTER,
        )


def test_a_message_too_big_for_any_room_is_cut_not_dropped():
    messages = [{"role": "system", "content": "sys"}, {"role": "user", "content": "word " * 5000}]
    fit = fit_messages(messages, limit=500, counter=COUNTER)
    assert fit.tokens <= 500
    assert fit.messages[-1]["content"].startswith("word word")
    assert "This message was cut" in fit.messages[-1]["content"]


@pytest.mark.parametrize(
    "samples, expected",
    [
        pytest.param([], 1.0, id="no-usage-yet"),
        pytest.param([(90, 100)], 1.0, id="provider-counts-less-never-below-one"),
        pytest.param([(1500, 1000), (1100, 1000)], 1.5, id="largest-ratio-wins"),
        pytest.param([(300, 100)], 1.0, id="tiny-request-sets-overhead-not-factor"),
    ],
)
def test_correction_factor_only_makes_estimates_safer(samples, expected):
    assert correction(samples).factor == pytest.approx(expected)


def test_correction_keeps_a_fixed_provider_cost_as_overhead():
    calibration = correction([(300, 100), (1300, 1000)])
    assert calibration.factor == pytest.approx(1.3)
    assert calibration.overhead == 300 - 130  # the tiny request's excess beyond its scaled estimate


def test_calibrated_counter_scales_every_count():
    counter = CalibratedCounter(COUNTER, 1.5)
    msg = {"role": "user", "content": "hello there, how are you today?"}
    assert counter.count_message(msg) >= 1.5 * COUNTER.count_message(msg)
    assert counter.conservative is counter
    lower = CalibratedCounter(COUNTER, 0.5)  # a provider that counts less than we estimate
    assert lower.count_message(msg) == -(-COUNTER.count_message(msg) // 2)
    assert lower.conservative is COUNTER  # what the provider has not counted: the raw estimate
    with pytest.raises(ValueError):
        CalibratedCounter(COUNTER, 0.0)


def test_the_factor_falls_toward_the_provider_never_under_what_it_reported():
    calibration = correction([(480, 1000), (500, 1000), (490, 1000)])
    assert calibration.factor == pytest.approx(0.5)  # the largest ratio: none of them under-counted
    assert correction([(400, 1000), (700, 1000)]).factor == 1.0  # ratios that move: not below 1 yet
    assert correction([(100, 1000), (1000, 1000)]).factor == 1.0  # a report under a quarter is not believed

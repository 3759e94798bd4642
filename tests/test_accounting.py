"""Provider usage as the baseline, and self-calibration, through the real litellm path."""

from __future__ import annotations

from runtime.accounting import MIN_CALIBRATION_TOKENS


def test_usage_is_stored_and_used_as_the_next_turns_baseline(make_engine_for, store, fake_llm):
    engine = make_engine_for()
    fake_llm.prompt_tokens = 500
    fake_llm.script.extend(["Nice to meet you, Ana.", "Lisbon is lovely."])
    engine.turn(user_id="u1", session_id="s1", message="Hi, I'm Ana.")
    first_reply = store.turns.of_session("s1")[-1]
    assert first_reply.usage_prompt_tokens == 500 and first_reply.usage_completion_tokens == 7
    raw_first = first_reply.request_estimate_tokens
    assert raw_first == engine.counter.count_messages(fake_llm.requests[0]["messages"])

    result = engine.turn(user_id="u1", session_id="s1", message="I live in Lisbon now.")
    context = result.context
    # a tiny request does not set the factor: its excess is a fixed per-request overhead
    assert raw_first < MIN_CALIBRATION_TOKENS
    assert context.calibration == 1.0
    assert context.overhead_tokens == 500 - raw_first
    # the baseline is the prefix the next request sends again: the messages before the newest user message
    assert first_reply.request_messages == 1  # the persona
    added = context.messages[first_reply.request_messages : len(context.messages) - context.post_history_messages]
    assert context.baseline_tokens == 500 + sum(engine.counter.count_message(m) for m in added)


def test_a_provider_that_counts_less_bounds_the_request_by_its_baseline(make_engine_for, store, fake_llm):
    engine = make_engine_for()
    fake_llm.prompt_tokens = lambda body: engine.counter.count_messages(body["messages"]) // 2
    talk = "I spent the morning at the market choosing apples and bread. " * 30
    engine.turn(user_id="u1", session_id="s2", message=talk)
    first_reply = store.turns.of_session("s2")[-1]
    result = engine.turn(user_id="u1", session_id="s2", message="And then?")
    context = result.context
    assert 0.45 < context.calibration < 0.55  # the factor fell toward what the provider reports
    added = context.messages[first_reply.request_messages : len(context.messages) - context.post_history_messages]
    assert [m["role"] for m in added] == ["user", "assistant", "user"]
    # the provider's count of the last request, plus what was added counted at the raw estimate
    expected = first_reply.usage_prompt_tokens + sum(engine.counter.count_message(m) for m in added)
    assert context.baseline_tokens == expected
    # and our count of the request is never under what the provider then reported for it
    assert context.total_tokens >= store.turns.of_session("s2")[-1].usage_prompt_tokens


def test_a_provider_that_counts_more_shrinks_what_we_send(make_engine_for, store, fake_llm):
    engine = make_engine_for(window=1024)
    for i in range(8):
        engine.turn(
            user_id="u1", session_id="cal", message=f"message {i}: " + "talk " * 30, reply=f"reply {i}: " + "ok " * 30
        )
    honest = engine.assemble(user_id="u1", session_id="cal")
    fake_llm.prompt_tokens = 3 * honest.total_tokens  # the provider says we undercount 3x
    engine.turn(user_id="u1", session_id="cal", message="and now?")
    after = engine.assemble(user_id="u1", session_id="cal")
    assert after.calibration > 2.5
    assert after.total_tokens + after.reply_reserve <= after.window
    assert len(after.recent_seqs) < len(honest.recent_seqs) + 2  # fewer turns fit once calibrated
    # and the prompt says what it left out: turns over the recent cap (in the session's counts) wait
    # for their compaction out of view, and the summary block says so
    assert after.sources["recent"].cut or (after.pending_turns and "not shown here" in after.source_text["summary"])

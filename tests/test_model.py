"""Real model calls through litellm against the loopback server: streamed and whole
replies, usage, overflow recovery, retries, fail-fast errors, cut streams, the model's window."""

from __future__ import annotations

import inspect
import time

import litellm
import litellm.exceptions
import pytest

from errors import (
    ContextOverflowError,
    ModelAuthError,
    ModelCallError,
    ModelRequestError,
    ModelUnavailableError,
    UnknownModelError,
)
from memory.database import make_engine
from memory.tables import TurnState
from runtime.config import Settings
from runtime.llm import LiteLLMReplier, RetryPolicy, error_class_for, map_model_error, retry_after
from runtime.service import Database, open_engine, settings_for_model
from runtime.turn import Engine
from tests.conftest import PERSONA, estimate_as_we_do
from tests.fake_llm import OVERFLOW, OVERFLOW_LIMIT, Cut, Hang, HTTPError, rate_limited


@pytest.fixture
def engine_with(store, embedder, fake_llm):
    """An engine whose replier talks to the loopback server with the given retry policy."""

    def build(
        *, window: int | None = None, retries: int = 0, total_seconds: float = 30.0, timeout: float = 10.0
    ) -> Engine:
        replier = LiteLLMReplier(
            model="openai/fake-model",
            api_base=fake_llm.api_base,
            api_key="sk-test",
            timeout=timeout,
            retry=RetryPolicy(retries=retries, total_seconds=total_seconds, base_delay=0.05, max_delay=0.2),
        )
        settings = Settings(context_window=window, database_url="unused")
        return Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier)

    return build


def _fill(engine: Engine, session_id: str, exchanges: int) -> None:
    """Stored history, written straight to the store (no model, no embedding, no compaction)."""
    engine.store.sessions.ensure(session_id=session_id, user_id="u1")
    for i in range(exchanges):
        for role, text in (
            ("user", f"message {i}: I keep telling you about my garden and the tomatoes " + "and more " * 12),
            ("assistant", f"reply {i}: that sounds lovely, tell me about the tomatoes " + "yes " * 12),
        ):
            tokens = engine.counter.count_message({"role": role, "content": text})
            engine.store.turns.add(session_id=session_id, role=role, content=text, tokens=tokens)


# -- classification ---------------------------------------------------------------
def _litellm_exception_classes() -> list[type[BaseException]]:
    return sorted(
        (c for _, c in inspect.getmembers(litellm.exceptions, inspect.isclass) if issubclass(c, Exception)),
        key=lambda c: c.__name__,
    )


def _bare(cls: type[BaseException], message: str = "something failed", status: int | None = None) -> BaseException:
    """An instance of ``cls`` without running its (provider-specific) constructor."""
    exc = cls.__new__(cls)
    exc.args = (message,)
    for name, value in (
        ("message", message),
        ("status_code", status),
        ("num_retries", None),
        ("max_retries", None),
        ("body", None),
        ("response", None),
        ("litellm_response_headers", None),
    ):
        try:
            setattr(exc, name, value)
        except AttributeError:  # a read-only property on some classes
            pass
    return exc


def test_every_litellm_exception_class_maps_to_a_specific_error_of_ours():
    classes = _litellm_exception_classes()
    assert len(classes) > 20  # the iteration really sees litellm's classes
    unmapped = {c.__name__ for c in classes if error_class_for(_bare(c)) is ModelCallError}
    assert not unmapped
    for cls in classes:
        error = map_model_error(_bare(cls), model="m", session_id="s1")
        assert type(error) in (ContextOverflowError, ModelAuthError, ModelRequestError, ModelUnavailableError)
        assert error.session_id == "s1" and "'m'" in str(error)


@pytest.mark.parametrize(
    "cls, status, message, expected",
    [
        pytest.param(
            litellm.ContextWindowExceededError, 400, "too long", ContextOverflowError, id="context-window-exceeded"
        ),
        pytest.param(
            litellm.BadRequestError,
            400,
            OVERFLOW["vllm-prompt"].message,
            ContextOverflowError,
            id="vllm-wording-in-plain-400",
        ),
        pytest.param(
            litellm.BadRequestError,
            400,
            OVERFLOW["llama.cpp"].message,
            ContextOverflowError,
            id="llama-cpp-wording-in-plain-400",
        ),
        pytest.param(
            litellm.APIError,
            400,
            OVERFLOW["openai"].message,
            ContextOverflowError,
            id="openai-wording-in-generic-error",
        ),
        pytest.param(
            litellm.BadRequestError, 400, "messages[0].role is invalid", ModelRequestError, id="plain-bad-request"
        ),
        pytest.param(litellm.ContentPolicyViolationError, 400, "flagged", ModelRequestError, id="content-policy"),
        pytest.param(litellm.NotFoundError, 404, "no such model", ModelRequestError, id="not-found"),
        pytest.param(litellm.AuthenticationError, 401, "bad key", ModelAuthError, id="auth"),
        pytest.param(litellm.PermissionDeniedError, 403, "no access", ModelAuthError, id="permission"),
        pytest.param(litellm.RateLimitError, 429, "slow down", ModelUnavailableError, id="rate-limit"),
        pytest.param(litellm.InternalServerError, 500, "boom", ModelUnavailableError, id="internal"),
        pytest.param(
            litellm.InternalServerError,
            500,
            "OpenAIException - Missing credentials. Please pass an `api_key`, or set the `OPENAI_API_KEY` environment variable.",
            ModelAuthError,
            id="no-api-key-reported-as-500",
        ),
        pytest.param(litellm.ServiceUnavailableError, 503, "overloaded", ModelUnavailableError, id="unavailable"),
        pytest.param(litellm.Timeout, 408, "timed out", ModelUnavailableError, id="timeout"),
        pytest.param(litellm.APIConnectionError, 500, "connection refused", ModelUnavailableError, id="connection"),
        pytest.param(litellm.APIError, 502, "bad gateway", ModelUnavailableError, id="generic-5xx"),
        pytest.param(litellm.APIError, 418, "teapot", ModelRequestError, id="generic-4xx"),
        pytest.param(litellm.BudgetExceededError, None, "budget", ModelRequestError, id="spend-budget"),
        pytest.param(RuntimeError, None, "a bug", ModelCallError, id="not-a-provider-error"),
    ],
)
def test_each_kind_of_provider_error_maps_to_its_error(cls, status, message, expected):
    assert type(map_model_error(_bare(cls, message, status), model="m", session_id="s")) is expected


def test_retry_after_is_read_in_seconds_milliseconds_and_http_dates():
    class Response:
        def __init__(self, headers):
            self.headers = headers

    def exc(headers):
        e = _bare(litellm.RateLimitError, status=429)
        e.response = Response(headers)
        return e

    assert retry_after(exc({"retry-after": "2"})) == 2.0
    assert retry_after(exc({"retry-after-ms": "1500"})) == 1.5
    in_a_minute = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    assert 55 <= retry_after(exc({"retry-after": in_a_minute})) <= 61
    assert retry_after(exc({})) is None


def test_backoff_has_jitter_within_bounds_and_never_undercuts_retry_after():
    policy = RetryPolicy(retries=5, base_delay=0.5, max_delay=4.0)
    delays = [policy.delay(3) for _ in range(200)]
    assert all(1.0 <= d <= 2.0 for d in delays) and len(set(delays)) > 1
    assert all(2.0 <= policy.delay(1, retry_after=2.0) <= 2.25 for _ in range(50))
    assert policy.delay(10) <= 4.0


# -- replies --------------------------------------------------------------------
def test_streamed_and_whole_replies_are_stored_identically(engine_with, store, fake_llm):
    engine = engine_with()
    text = "Lisbon in spring is lovely, and the trams are worth a ride."
    fake_llm.script.extend([text, text])
    whole = engine.turn(user_id="u1", session_id="whole", message="Tell me about Lisbon.")
    pieces: list[str] = []
    streamed = engine.turn(user_id="u2", session_id="streamed", message="Tell me about Lisbon.", on_delta=pieces.append)

    assert len(pieces) > 5 and "".join(pieces) == text
    assert "stream" not in fake_llm.requests[0]
    assert fake_llm.requests[1]["stream"] is True and fake_llm.requests[1]["stream_options"] == {"include_usage": True}
    fields = (
        "role",
        "content",
        "tokens",
        "usage_prompt_tokens",
        "usage_completion_tokens",
        "request_estimate_tokens",
        "request_messages",
        "request_fingerprint",
        "interrupted",
        "state",
    )
    a, b = store.turns.of_session("whole")[-1], store.turns.of_session("streamed")[-1]
    assert {f: getattr(a, f) for f in fields} == {f: getattr(b, f) for f in fields}
    assert b.content == text and b.usage_prompt_tokens == estimate_as_we_do(fake_llm.requests[-1])
    assert b.usage_completion_tokens == 7
    assert b.interrupted is False
    assert streamed.assistant_turn.content == whole.assistant_turn.content
    assert [t.role for t in store.turns.of_session("streamed")] == ["user", "assistant"]  # stored once


def test_streamed_usage_is_stored_and_used_as_the_next_turns_baseline(engine_with, store, fake_llm):
    engine = engine_with()
    fake_llm.prompt_tokens = 500
    try:
        fake_llm.script.extend(["Nice to meet you, Ana.", "Lisbon is lovely."])
        engine.turn(user_id="u1", session_id="s1", message="Hi, I'm Ana.", on_delta=lambda _: None)
        first = store.turns.of_session("s1")[-1]
        assert first.usage_prompt_tokens == 500 and first.usage_completion_tokens == 7
        assert first.request_estimate_tokens == engine.counter.count_messages(fake_llm.requests[0]["messages"])

        result = engine.turn(user_id="u1", session_id="s1", message="I live in Lisbon now.", on_delta=lambda _: None)
        # a request this small sets no factor; the provider's excess is kept as a per-request overhead
        assert result.context.calibration == 1.0
        assert result.context.overhead_tokens == 500 - first.request_estimate_tokens
        # the fingerprinted prefix is what the next request starts with: all before the newest user message
        assert first.request_messages == 1
        assert result.context.messages[: first.request_messages] == fake_llm.requests[0]["messages"][:1]
    finally:
        fake_llm.prompt_tokens = estimate_as_we_do


# -- overflow ---------------------------------------------------------------------
@pytest.mark.parametrize("wording", [pytest.param(k, id=k) for k in OVERFLOW])
def test_each_providers_overflow_wording_is_an_overflow_with_its_stated_limit(wording):
    sent = OVERFLOW[wording]
    exc = _bare(litellm.BadRequestError, f"litellm.BadRequestError: OpenAIException - {sent.message}", sent.status)
    error = map_model_error(exc, model="m", session_id="s1")
    assert type(error) is ContextOverflowError
    assert error.provider_limit == OVERFLOW_LIMIT[wording]


@pytest.mark.parametrize(
    "status, message",
    [
        pytest.param(429, "Throttling error: Too many tokens, please wait before trying again.", id="bedrock-throttle"),
        pytest.param(400, "Rate limit reached: token limit exceeded for this minute", id="rate-limited-proxy"),
        pytest.param(
            400,
            "max_tokens: 10000 > 4096, which is the maximum allowed number of output tokens for claude-3-5-sonnet",
            id="anthropic-max-tokens",
        ),
        pytest.param(
            413,
            "Request too large for model `llama-3.3-70b-versatile` on tokens per minute (TPM): Limit 6000, Requested 14810",
            id="groq-tokens-per-minute",
        ),
        pytest.param(400, "Invalid 'messages[1].content': string too long.", id="string-too-long"),
        pytest.param(400, "请求过于频繁，请稍后再试", id="zh-too-frequent"),
        pytest.param(400, "您的请求超过速率限制，请降低请求频率", id="zh-rate-limit"),
        pytest.param(400, "账户余额不足，请充值后再试", id="zh-balance"),
        pytest.param(400, "输出长度超过了 max_tokens 的上限", id="zh-output-length"),
        pytest.param(400, "The input exceeds the rate limit of 100 requests per minute.", id="input-rate"),
        pytest.param(400, "max_tokens exceeds the model's maximum output tokens (8192).", id="output-max-tokens"),
        pytest.param(400, "The input image exceeds the maximum size of 20MB.", id="image-size"),
    ],
)
def test_wordings_about_other_limits_are_not_overflows(status, message):
    exc = _bare(litellm.BadRequestError if status == 400 else litellm.RateLimitError, message, status)
    assert type(map_model_error(exc, model="m", session_id="s1")) is not ContextOverflowError


def test_an_overflow_leads_to_one_harder_compaction_then_success(engine_with, store, fake_llm):
    engine = engine_with(window=1024)
    _fill(engine, "s1", 10)
    before = store.turns.of_session("s1")
    fake_llm.script.extend([OVERFLOW["openai"], "Shorter now, and it fits."])
    result = engine.turn(user_id="u1", session_id="s1", message="Do you remember my garden?")

    assert len(fake_llm.requests) == 2
    first, second = (engine.counter.count_messages(r["messages"]) for r in fake_llm.requests)
    assert second < first
    retry = result.context  # the context that was answered: within a smaller window, with a margin
    assert retry.window <= 0.9 * engine.window and retry.total_tokens + retry.reply_reserve <= retry.window
    assert retry.sources["recent"].tokens <= engine.budgets.recent // 2
    harder = [c for c in result.compactions if c.ok and c.rolled_turns]
    assert harder, "the overflow compacted the session harder"
    assert result.assistant_turn.content == "Shorter now, and it fits."
    # the baseline covers what the next request sends again: all before the newest user message
    assert result.assistant_turn.request_messages == result.context.baseline_messages
    assert fake_llm.requests[1]["messages"][result.context.baseline_messages]["role"] == "user"
    assert result.context.messages == fake_llm.requests[1]["messages"]
    after = store.turns.of_session("s1")
    assert len(after) == len(before) + 2  # nothing deleted
    assert any(t.state != TurnState.context for t in after)  # rolled out, still stored


@pytest.mark.parametrize("wording", [pytest.param(k, id=k) for k in OVERFLOW])
def test_every_providers_overflow_wording_is_recovered_from(engine_with, store, fake_llm, wording):
    engine = engine_with(window=1024, retries=3)
    fake_llm.script.extend([OVERFLOW[wording], "ok"])
    result = engine.turn(user_id="u1", session_id="s1", message="hello")
    assert result.assistant_turn.content == "ok" and len(fake_llm.requests) == 2


def test_two_overflows_are_a_clear_error_and_the_history_is_intact(engine_with, store, fake_llm):
    engine = engine_with(window=1024, retries=3)
    _fill(engine, "s1", 4)
    before = [(t.seq, t.role, t.content) for t in store.turns.of_session("s1")]
    fake_llm.script.extend([OVERFLOW["azure"], OVERFLOW["vllm-prompt"], "never asked for"])
    with pytest.raises(ContextOverflowError) as info:
        engine.turn(user_id="u1", session_id="s1", message="Still there?")
    error = info.value
    assert len(fake_llm.requests) == 2  # one retry, no loop
    assert error.session_id == "s1" and error.window == 1024 and error.provider_limit == 1024
    assert len(error.sent_tokens) == 2 and error.sent_tokens[1] < error.sent_tokens[0]
    assert "twice" in str(error) and "COMPANION_CONTEXT_WINDOW" in str(error) and "1024" in str(error)
    after = [(t.seq, t.role, t.content) for t in store.turns.of_session("s1")]
    assert after[: len(before)] == before and after[-1][1:] == ("user", "Still there?")


# -- retries ----------------------------------------------------------------------
def test_a_rate_limit_is_retried_after_the_retry_after_seconds(engine_with, store, fake_llm):
    engine = engine_with(retries=3)
    fake_llm.script.extend([rate_limited(retry_after=1), "Here I am."])
    started = time.monotonic()
    result = engine.turn(user_id="u1", session_id="s1", message="hello?")
    assert time.monotonic() - started >= 1.0
    assert len(fake_llm.requests) == 2 and result.assistant_turn.content == "Here I am."


def test_a_retry_after_longer_than_the_retry_time_gives_up_at_once(engine_with, store, fake_llm):
    engine = engine_with(retries=3, total_seconds=2)
    fake_llm.script.extend([rate_limited(retry_after=60), "never asked for"])
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as info:
        engine.turn(user_id="u1", session_id="s1", message="hello?")
    assert time.monotonic() - started < 5
    assert info.value.status == 429 and info.value.retry_after == 60 and info.value.attempts == 1
    assert "retry limit" in str(info.value)


@pytest.mark.parametrize("status", [pytest.param(500, id="500"), pytest.param(503, id="503")])
def test_a_server_error_then_success(engine_with, store, fake_llm, status):
    engine = engine_with(retries=3)
    fake_llm.script.extend([(status, "upstream exploded"), "Back again."])
    result = engine.turn(user_id="u1", session_id="s1", message="hello?", on_delta=lambda _: None)
    assert len(fake_llm.requests) == 2 and result.assistant_turn.content == "Back again."


def test_timeouts_are_retried_within_bounds_then_a_clear_error(engine_with, store, fake_llm):
    engine = engine_with(retries=2, timeout=0.3)
    engine.turn(user_id="u1", session_id="s1", message="warm up")  # imports and model loads out of the timing
    fake_llm.script.extend([Hang(1.5), Hang(1.5), Hang(1.5), "too late"])
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as info:
        engine.turn(user_id="u1", session_id="s1", message="anyone?")
    elapsed = time.monotonic() - started
    assert len(fake_llm.requests) == 4 and info.value.attempts == 3
    assert elapsed < 2.5  # three 0.3 s timeouts and two short waits, not three 1.5 s hangs
    assert "Timeout" in str(info.value) and "3 attempts" in str(info.value)
    assert [t.role for t in store.turns.of_session("s1")][-1] == "user"  # the user turn is kept


def test_retries_stop_at_the_retry_time_limit(engine_with, store, fake_llm):
    engine = engine_with(retries=50, total_seconds=1.0)
    fake_llm.responder = lambda body: (503, "overloaded")
    started = time.monotonic()
    with pytest.raises(ModelUnavailableError) as info:
        engine.turn(user_id="u1", session_id="s1", message="anyone?")
    assert time.monotonic() - started < 2.5
    assert 2 <= info.value.attempts < 50 and len(fake_llm.requests) == info.value.attempts


@pytest.mark.parametrize(
    "error, expected",
    [
        pytest.param(
            HTTPError(
                401, "Incorrect API key provided: sk-test.", type="invalid_request_error", code="invalid_api_key"
            ),
            ModelAuthError,
            id="401",
        ),
        pytest.param(
            HTTPError(403, "You are not allowed to use this model.", type="invalid_request_error"),
            ModelAuthError,
            id="403",
        ),
        pytest.param(
            HTTPError(400, "Invalid value for 'temperature'.", type="invalid_request_error"),
            ModelRequestError,
            id="400",
        ),
        pytest.param(
            HTTPError(404, "The model 'fake-model' does not exist.", type="invalid_request_error"),
            ModelRequestError,
            id="404",
        ),
    ],
)
def test_auth_errors_and_bad_requests_fail_fast_with_one_request(engine_with, store, fake_llm, error, expected):
    engine = engine_with(retries=3)
    fake_llm.script.extend([error, "never asked for"])
    with pytest.raises(expected) as info:
        engine.turn(user_id="u1", session_id="s1", message="hello?")
    assert len(fake_llm.requests) == 1
    assert info.value.status == error.status and "'openai/fake-model'" in str(info.value)
    if expected is ModelAuthError:
        assert "OPENAI_API_KEY" in str(info.value)
    assert [t.role for t in store.turns.of_session("s1")] == ["user"]


# -- cut streams ------------------------------------------------------------------
def test_a_stream_cut_halfway_stores_what_arrived_marked_interrupted(engine_with, store, fake_llm):
    engine = engine_with(retries=3)
    fake_llm.script.append(Cut("Once upon a time there was a garden by the sea.", after=4))
    pieces: list[str] = []
    result = engine.turn(user_id="u1", session_id="s1", message="Tell me a story.", on_delta=pieces.append)

    assert "".join(pieces) == "Once upon a time "
    assert len(fake_llm.requests) == 1  # what was shown is not asked for again
    turns = store.turns.of_session("s1")
    assert [(t.role, t.content, t.interrupted) for t in turns] == [
        ("user", "Tell me a story.", False),
        ("assistant", "Once upon a time ", True),
    ]
    assert result.assistant_turn.interrupted and result.assistant_turn.usage_prompt_tokens is None
    fake_llm.script.append("Where was I?")  # the session carries on, the partial reply in its history
    engine.turn(user_id="u1", session_id="s1", message="Go on.", on_delta=lambda _: None)
    assert "Once upon a time " in [m["content"] for m in fake_llm.requests[-1]["messages"]]


def test_a_reply_cut_before_anything_arrived_is_retried(engine_with, store, fake_llm):
    engine = engine_with(retries=3)
    fake_llm.script.extend([Cut("lost on the way", after=0), "Here it is."])
    streamed = engine.turn(user_id="u1", session_id="s1", message="hi", on_delta=lambda _: None)
    assert streamed.assistant_turn.content == "Here it is." and not streamed.assistant_turn.interrupted
    fake_llm.script.extend([Cut("lost on the way too"), "Whole this time."])  # a whole reply cut mid-body
    whole = engine.turn(user_id="u1", session_id="s1", message="and again")
    assert whole.assistant_turn.content == "Whole this time." and not whole.assistant_turn.interrupted
    assert len(fake_llm.requests) == 4


# -- the model's window -----------------------------------------------------------
def test_an_unknown_model_without_a_window_is_a_clear_error_at_start():
    settings = Settings(model="openai/no-such-model", database_url="postgresql://nowhere.invalid/none")
    with pytest.raises(UnknownModelError) as info:
        open_engine(settings)  # before any database work: the URL is never tried
    assert info.value.model == "openai/no-such-model" and "COMPANION_CONTEXT_WINDOW" in str(info.value)


def test_an_unknown_model_with_a_window_override_works(db_url, embedder, fake_llm):
    settings = Settings(
        model="openai/no-such-model", api_base=fake_llm.api_base, context_window=2048, database_url=db_url
    )
    database = Database(db_url, make_engine(db_url), embedded=False)
    try:
        engine = open_engine(settings, embedder=embedder, database=database)
        assert engine.window == 2048 and engine.budgets.total == 2048
        assert engine.replier.retry.retries == settings.model_retries
    finally:
        database.engine.dispose()


@pytest.mark.parametrize(
    "model, window",
    [
        pytest.param("gpt-3.5-turbo", 16385, id="smaller-model-scales-budgets-down"),
        pytest.param("gpt-4o-mini", 24000, id="bigger-model-keeps-budgets"),
    ],
)
def test_the_models_window_comes_from_litellm_and_only_scales_budgets_down(model, window):
    settings = settings_for_model(Settings(model=model))
    assert settings.window == window and settings.scaled_budgets.total == window
    if window == 24000:
        assert settings.scaled_budgets == Settings().budgets


def test_model_settings_are_read_from_the_environment():
    settings = Settings.from_env(
        {"COMPANION_MODEL_RETRIES": "5", "COMPANION_MODEL_RETRY_SECONDS": "12.5", "COMPANION_MODEL_TIMEOUT": "20"}
    )
    assert (settings.model_retries, settings.model_retry_seconds, settings.model_timeout) == (5, 12.5, 20.0)
    from errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="COMPANION_MODEL_RETRIES"):
        Settings.from_env({"COMPANION_MODEL_RETRIES": "-1"})


def test_a_missing_api_key_fails_at_once_as_an_auth_error_not_an_outage(monkeypatch):
    """The real litellm path with no key configured: one attempt, ModelAuthError, no retries."""
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    slept: list[float] = []
    replier = LiteLLMReplier(
        model="gpt-4o-mini", timeout=5, retry=RetryPolicy(retries=3, total_seconds=30), sleep=slept.append
    )
    with pytest.raises(ModelAuthError, match="OPENAI_API_KEY"):
        replier.reply([{"role": "user", "content": "hi"}], session_id="s")
    assert slept == []


def test_litellm_logs_streamed_chunks_only_while_a_callback_observes_them(fake_llm, monkeypatch):
    """litellm's per-chunk stream logging is switched off while no litellm callback or cache is
    set (it feeds nothing else), and back on for a host application that registers a callback,
    which then gets the stream's success event; the reply is the same either way."""
    import threading

    monkeypatch.setattr(litellm, "disable_streaming_logging", False)
    monkeypatch.setattr(litellm, "success_callback", [])
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    messages = [{"role": "user", "content": "Hello there"}]
    fake_llm.script.extend(["one two three", "one two three"])

    quiet = replier.reply(messages, session_id="s1", on_delta=lambda _: None)
    assert litellm.disable_streaming_logging is True

    logged = threading.Event()
    monkeypatch.setattr(litellm, "success_callback", [lambda *args, **kwargs: logged.set()])
    observed = replier.reply(messages, session_id="s1", on_delta=lambda _: None)
    assert litellm.disable_streaming_logging is False
    assert logged.wait(10), "the registered callback gets the streamed reply's success event"
    assert (observed.content, observed.completion_tokens) == (quiet.content, quiet.completion_tokens)

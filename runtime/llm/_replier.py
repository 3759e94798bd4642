"""Model calls: the reply step of a turn.

:class:`LiteLLMReplier` calls any model litellm supports, whole or streamed. Errors
are classified by :func:`runtime.llm._errors.map_model_error`, the one litellm-to-ours mapping:

- context too long (``ContextWindowExceededError``, or a plain 400 worded as one of
  ``OVERFLOW_WORDINGS``) -> :class:`~errors.ContextOverflowError`; the engine
  compacts harder and asks once more;
- 401, 403 -> :class:`~errors.ModelAuthError`, not retried;
- 429, 5xx, timeout, lost connection -> :class:`~errors.ModelUnavailableError`,
  retried within bounds;
- any other 4xx, content policy, guardrail, spend budget ->
  :class:`~errors.ModelRequestError`, not retried.

Retries happen here and only here (litellm and the OpenAI client are told
``num_retries=0, max_retries=0``): exponential backoff with jitter, at least the
provider's ``Retry-After``, at most :attr:`RetryPolicy.retries` times, and none
that would start after :attr:`RetryPolicy.total_seconds`.

A stream that breaks after some text arrived is not retried (the caller already
showed that text): the reply comes back with ``interrupted=True`` and what arrived.

Tools: given :class:`Tools`, the replier offers them as real function tools
(litellm ``tools=``, ``tool_choice="auto"``). When the model answers with structured
``tool_calls``, each call is run, the assistant message with its ``tool_calls`` and
one ``{"role": "tool", "tool_call_id", "content"}`` message per call are appended,
the list is refitted (:attr:`Tools.fit`, e.g. the trim rules' tool-result caps), and
the model is asked again, at most :attr:`Tools.max_rounds` times; the last request says
``tool_choice="none"`` so that it ends in text. Only structured calls run: text that
merely looks like a call (``[file_read(file_id="...")]`` inside ``content``) is
ordinary reply text. Each request is retried on its own like a reply without tools.
"""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

import structlog

from errors import (
    ModelUnavailableError,
    UnknownModelError,
)
from runtime._offline import bundled_model_entry, load_litellm, model_info
from runtime.llm._errors import map_model_error
from runtime.llm._usage import cache_marks, cache_usage, request_cost
from runtime.messages import StablePrefix, to_openai

log = structlog.get_logger("companion.model")


@dataclass(frozen=True, kw_only=True)
class Reply:
    """The assistant's reply to one request."""

    content: str
    prompt_tokens: int | None = None
    """Prompt tokens the provider reported for the request, if it did."""
    completion_tokens: int | None = None
    """Completion tokens the provider reported, if it did."""
    cached_tokens: int | None = None
    """Prompt tokens the provider read from its prompt cache (billed at its cache price), if it said."""
    cache_write_tokens: int | None = None
    """Prompt tokens the provider wrote to its prompt cache (Anthropic bills them at 1.25×), if it said."""
    cost_usd: float | None = None
    """The request's price by litellm's cost map, cache reads and writes at their own prices; ``None``
    for a model the map does not price."""
    interrupted: bool = False
    """True if the stream broke off: ``content`` is what arrived before it did."""
    attempts: int = 1
    """Requests made for this reply, the first one included (retries and tool rounds too)."""
    tool_calls: tuple[ToolCall, ...] = ()
    """Tool calls the model asked for, all rounds, in order (empty without tools)."""


@dataclass(frozen=True, kw_only=True)
class ToolCall:
    """One structured tool call from the model."""

    id: str
    name: str
    arguments: str
    """The arguments as the model sent them: a JSON object, as text."""


@dataclass(frozen=True, kw_only=True)
class Tools:
    """Function tools offered for one reply, and how to run them."""

    specs: list[dict[str, Any]]
    """OpenAI-format tool schemas (``{"type": "function", "function": {...}}``), passed as ``tools=``."""
    run: Callable[[str, dict[str, Any]], str]
    """Runs one call: ``(tool name, parsed arguments) -> result text``. A
    :class:`~errors.CompanionError` it raises other than a :class:`~errors.DependencyError` (a bad id, a bad argument) becomes the result
    text, so the model can correct itself; any other exception fails the reply."""
    max_rounds: int = 4
    """Most follow-up requests after tool results; the last one forbids further calls."""
    fit: Callable[[list[Mapping[str, Any]]], list[Mapping[str, Any]]] | None = None
    """Refits the message list after results were appended (caps, window); ``None``: as is."""


def run_tool_call(tools: Tools, call: ToolCall) -> str:
    """The result text of one call: the tool's answer, or a plain explanation for an unknown
    tool, arguments that are not a JSON object, or a usage error the tool raised."""
    from errors import CompanionError, DependencyError

    known = [spec.get("function", {}).get("name") for spec in tools.specs]
    if call.name not in known:
        return f"Unknown tool {call.name!r}. Available tools: {', '.join(str(k) for k in known)}."
    try:
        arguments = json.loads(call.arguments or "{}")
    except json.JSONDecodeError as exc:
        return (
            f"The arguments of {call.name} are not valid JSON ({exc.msg} at character {exc.pos}). Send a JSON object."
        )
    if not isinstance(arguments, dict):
        return f"The arguments of {call.name} must be a JSON object, got {type(arguments).__name__}."
    try:
        return tools.run(call.name, arguments)
    except CompanionError as exc:
        if isinstance(exc, DependencyError):  # a failing database or provider fails the reply
            raise
        return f"{call.name} failed: {exc}"


class Replier(Protocol):
    """Produces the assistant's reply to an assembled message list.

    The engine reads ``model`` (whether images go to the model itself, and how its
    image tokens are priced) and passes ``tools`` whenever a turn has files to read
    or images to describe, so a replier must accept it (it may ignore the tools and
    answer in text).
    """

    model: str
    """The litellm model string the replies come from, e.g. ``openai/gpt-4o-mini``."""

    def reply(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        session_id: str,
        on_delta: Callable[[str], None] | None = None,
        tools: Tools | None = None,
        stable: StablePrefix | None = None,
    ) -> Reply:
        """Reply whole, or streamed to ``on_delta`` piece by piece when it is given;
        offer ``tools`` to the model when given and run the calls it makes. ``stable``: the start
        of ``messages`` the next request sends again as it is (for a provider's prompt cache
        markers; ``None``: not known).

        Raises:
            ModelCallError: one of its subclasses, when no reply can be had.
        """
        ...


@dataclass(frozen=True, kw_only=True)
class RetryPolicy:
    """Bounded retries for rate limits, server errors, timeouts and lost connections."""

    retries: int = 0
    """Attempts after the first one; 0 means none."""
    total_seconds: float = 30.0
    """No retry starts later than this many seconds after the first request."""
    base_delay: float = 0.5
    """Seconds before the first retry (before jitter); doubles with each retry."""
    max_delay: float = 8.0
    """Largest backoff between two attempts, seconds (a longer ``Retry-After`` still wins)."""

    def delay(self, retry: int, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (from 1): the exponential backoff with
        jitter in [½, 1] of it, or, when the provider sent ``Retry-After``, that plus up to half
        the backoff (so that clients told the same time do not all come back at once)."""
        backoff = min(self.max_delay, self.base_delay * 2 ** (retry - 1))
        if retry_after is not None:
            return retry_after + random.uniform(0, backoff / 2)
        return backoff * random.uniform(0.5, 1.0)


def model_window(model: str) -> int:
    """The model's input context window in tokens, from litellm's model map
    (``max_input_tokens``, else ``max_tokens``): the bundled map's entry when the name is
    one of its keys (:func:`runtime._offline.bundled_model_entry`, no litellm import),
    else ``litellm.get_model_info``.

    Raises:
        UnknownModelError: litellm does not know the model, or not its window.
    """
    entry = bundled_model_entry(model)
    bundled = (entry.get("max_input_tokens") or entry.get("max_tokens")) if entry is not None else None
    if isinstance(bundled, int) and bundled > 0:
        return bundled
    info = model_info(model)
    if info is None:
        raise UnknownModelError(
            f"litellm does not know the context window of {model!r}. Set COMPANION_CONTEXT_WINDOW to the "
            "model's window in tokens (e.g. vLLM's --max-model-len, Ollama's num_ctx, llama.cpp's --ctx-size).",
            model=model,
        )
    window = info.get("max_input_tokens") or info.get("max_tokens")
    if not window:
        raise UnknownModelError(
            f"litellm knows {model!r} but not its context window. Set COMPANION_CONTEXT_WINDOW.", model=model
        )
    return int(window)


_streams_unlogged_here = False
"""Whether :func:`_log_streams_only_when_observed` turned litellm's stream logging off, so that it
turns it back on only then: a host application that turned it off itself, before the replier's
first streamed reply, keeps it off (one that sets it again after that cannot be told apart)."""


def _log_streams_only_when_observed(litellm: Any) -> None:
    """Turn litellm's logging of streamed chunks off while nothing observes it, and back on
    when something does.

    For every streamed chunk, litellm submits a thread-pool task that runs its success handlers
    in a new event loop (``run_success_logging_and_cache_storage``). Those handlers feed only
    litellm's own callbacks (``litellm.callbacks``, ``success_callback``) and its response
    cache; the runtime uses neither: it reads usage from the stream's last chunk and logs with
    structlog. Without a callback or a cache, ``litellm.disable_streaming_logging`` (litellm's
    switch for it, process-wide: a host application's own streamed calls then skip the logging
    too, which with no callback and no cache feeds nothing) is set; a host application that
    registers callbacks or a cache gets its stream logging back on the next call. What it saves:
    ``docs/decisions/measurements.md#litellms-stream-logging``."""
    global _streams_unlogged_here
    observed = any(
        getattr(litellm, name, None) for name in ("callbacks", "success_callback", "_async_success_callback", "cache")
    )
    if not observed and not litellm.disable_streaming_logging:
        litellm.disable_streaming_logging = True
        _streams_unlogged_here = True
    elif observed and _streams_unlogged_here:
        litellm.disable_streaming_logging = False
        _streams_unlogged_here = False


# -- the replier ----------------------------------------------------------------
class _ProviderFailure(Exception):
    """Carries an exception raised by litellm (not by the caller's ``on_delta``) to the retry loop."""

    def __init__(self, exc: BaseException) -> None:
        super().__init__(str(exc))
        self.exc = exc


class LiteLLMReplier:
    """Replies through ``litellm.completion``, whole or streamed.

    Args:
        model: a litellm model string, e.g. ``gpt-4o-mini`` or ``openai/my-model``.
        api_base: base URL of an OpenAI-compatible server, or ``None`` for the provider's.
        timeout: seconds to wait for one request (for a stream: for each chunk).
        retry: retries for transient failures; the default is none
            (:func:`runtime.service.open_engine` passes ``COMPANION_MODEL_RETRIES``).
        sleep: how to wait between attempts (tests may replace it).
        cache_markers: mark each request's cache breakpoints (:func:`~runtime.llm._usage.cache_marks`,
            sent as litellm's ``cache_control_injection_points``), for providers whose prompt cache
            needs them (:func:`~runtime.llm._usage.marks_cache`).
        cache_ttl: the markers' lifetime, ``5m`` or ``1h`` (``None``: the provider's default).
        extra: more keyword arguments for ``litellm.completion`` (e.g. ``api_key``).
    """

    def __init__(
        self,
        *,
        model: str,
        api_base: str | None = None,
        timeout: float = 60.0,
        retry: RetryPolicy | None = None,
        sleep: Callable[[float], None] = time.sleep,
        cache_markers: bool = False,
        cache_ttl: str | None = None,
        **extra: Any,
    ) -> None:
        self.model = model
        self.cache_markers = cache_markers
        self.cache_ttl = cache_ttl
        self.api_base = api_base
        self.timeout = timeout
        self.retry = retry or RetryPolicy()
        self.sleep = sleep
        self.extra = extra

    def _priced(self, reply: Reply) -> Reply:
        """``reply`` with its request's cost (:func:`request_cost`)."""
        cost = request_cost(self.model, reply)
        return replace(reply, cost_usd=cost) if cost is not None else reply

    def reply(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        session_id: str,
        on_delta: Callable[[str], None] | None = None,
        tools: Tools | None = None,
        stable: StablePrefix | None = None,
    ) -> Reply:
        """Ask the model; stream to ``on_delta`` when it is given; offer ``tools`` when given
        and run the calls the model makes (see the module docstring). ``stable``: the start of
        ``messages`` the next request sends again as it is (where :func:`cache_marks` puts markers).

        The returned ``content`` joins the text of every round with a blank line (what
        ``on_delta`` was given, in the same order).

        Raises:
            ContextOverflowError, ModelAuthError, ModelRequestError: at once, without a retry.
            ModelUnavailableError: once the retries or their time are used up.
        """
        if tools is None:
            return self._priced(
                self._retrying(messages, session_id=session_id, on_delta=on_delta, extra={}, stable=stable)
            )
        convo = list(messages)
        texts: list[str] = []
        calls: list[ToolCall] = []
        attempts = 0
        first_prompt: int | None = None
        first: Reply | None = None
        completion = 0
        deltas = _Joiner(on_delta) if on_delta is not None else None
        rounds = 0
        while True:
            last = rounds >= tools.max_rounds
            extra = {"tools": tools.specs, "tool_choice": "none" if last else "auto"}
            if deltas is not None:
                deltas.new_round()
            answer = self._retrying(convo, session_id=session_id, on_delta=deltas, extra=extra, stable=stable)
            attempts += answer.attempts
            first = answer if rounds == 0 else first
            first_prompt = answer.prompt_tokens if rounds == 0 else first_prompt
            completion += answer.completion_tokens or 0
            if answer.content:
                texts.append(answer.content)
            if not answer.tool_calls or last or answer.interrupted:
                if answer.tool_calls:
                    log.warning(
                        "model.tool_calls_ignored",
                        session_id=session_id,
                        model=self.model,
                        calls=len(answer.tool_calls),
                        rounds=rounds,
                    )
                return self._priced(
                    Reply(
                        content="\n\n".join(texts),
                        prompt_tokens=first_prompt,
                        completion_tokens=completion or None,
                        cached_tokens=first.cached_tokens if first is not None else None,
                        cache_write_tokens=first.cache_write_tokens if first is not None else None,
                        interrupted=answer.interrupted,
                        attempts=attempts,
                        tool_calls=tuple(calls),
                    )
                )
            calls.extend(answer.tool_calls)
            convo.append(
                {
                    "role": "assistant",
                    "content": answer.content or None,
                    "tool_calls": [
                        {"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}}
                        for c in answer.tool_calls
                    ],
                }
            )
            for call in answer.tool_calls:
                result = run_tool_call(tools, call)
                convo.append({"role": "tool", "tool_call_id": call.id, "content": result})
                log.info(
                    "model.tool_call",
                    session_id=session_id,
                    tool=call.name,
                    call_id=call.id,
                    result_chars=len(result),
                    round=rounds + 1,
                )
            if tools.fit is not None:
                convo = tools.fit(convo)
            rounds += 1

    def _retrying(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        session_id: str,
        on_delta: Callable[[str], None] | None,
        extra: dict[str, Any],
        stable: StablePrefix | None = None,
    ) -> Reply:
        """One request with the bounded retries."""
        started = time.monotonic()
        waited = 0.0
        attempt = 0
        while True:
            attempt += 1
            try:
                return replace(
                    self._once(messages, session_id=session_id, on_delta=on_delta, extra=extra, stable=stable),
                    attempts=attempt,
                )
            except _ProviderFailure as failure:
                exc = failure.exc
            error = map_model_error(exc, model=self.model, session_id=session_id)
            if not isinstance(error, ModelUnavailableError):
                raise error from exc
            elapsed = time.monotonic() - started
            if attempt > self.retry.retries:
                raise self._gave_up(error, attempt, waited, elapsed, "no retries left") from exc
            delay = self.retry.delay(attempt, error.retry_after)
            if elapsed + delay > self.retry.total_seconds:
                reason = f"waiting {delay:.1f} s more would pass the {self.retry.total_seconds:g} s retry limit"
                raise self._gave_up(error, attempt, waited, elapsed, reason) from exc
            log.warning(
                "model.retry",
                session_id=session_id,
                model=self.model,
                attempt=attempt,
                status=error.status,
                error=type(exc).__name__,
                delay_seconds=round(delay, 3),
                retry_after=error.retry_after,
            )
            self.sleep(delay)
            waited += delay

    def _gave_up(
        self, error: ModelUnavailableError, attempts: int, waited: float, elapsed: float, reason: str
    ) -> ModelUnavailableError:
        return ModelUnavailableError(
            f"{error} Gave up after {attempts} attempt{'s' if attempts != 1 else ''} in {elapsed:.1f} s ({reason}; "
            f"COMPANION_MODEL_RETRIES={self.retry.retries}, COMPANION_MODEL_RETRY_SECONDS={self.retry.total_seconds:g}).",
            session_id=error.session_id,
            model=error.model,
            status=error.status,
            attempts=attempts,
            waited=waited,
            retry_after=error.retry_after,
        )

    def _once(
        self,
        messages: Sequence[Mapping[str, Any]],
        *,
        session_id: str,
        on_delta: Callable[[str], None] | None,
        extra: dict[str, Any] | None = None,
        stable: StablePrefix | None = None,
    ) -> Reply:
        """One request. litellm's exceptions come out wrapped in :class:`_ProviderFailure`;
        ``on_delta``'s own exceptions come out as they are."""
        litellm = load_litellm()

        sent = to_openai(messages)  # typed messages become litellm's dicts here only
        if self.cache_markers:
            sent, points = cache_marks(sent, ttl=self.cache_ttl, stable=stable)
            extra = {**(extra or {}), "cache_control_injection_points": points}
        kwargs: dict[str, Any] = dict(
            model=self.model,
            messages=sent,
            api_base=self.api_base,
            timeout=self.timeout,
            num_retries=0,
            max_retries=0,
            **self.extra,
            **(extra or {}),
        )
        if on_delta is None:
            try:
                response = litellm.completion(**kwargs)
                message = response.choices[0].message
                content = message.content or ""
                calls = _tool_calls(getattr(message, "tool_calls", None))
            except Exception as exc:
                raise _ProviderFailure(exc) from exc
            usage = getattr(response, "usage", None)
            read, written = cache_usage(usage)
            return Reply(
                content=content,
                prompt_tokens=getattr(usage, "prompt_tokens", None),
                completion_tokens=getattr(usage, "completion_tokens", None),
                cached_tokens=read,
                cache_write_tokens=written,
                tool_calls=calls,
            )

        parts: list[str] = []
        fragments: dict[int, dict[str, str]] = {}
        usage = None
        _log_streams_only_when_observed(litellm)
        try:
            chunks = iter(litellm.completion(**kwargs, stream=True, stream_options={"include_usage": True}))
        except Exception as exc:
            raise _ProviderFailure(exc) from exc
        while True:
            try:
                chunk = next(chunks)
            except StopIteration:
                break
            except Exception as exc:
                if not parts:  # nothing shown yet: as good as a failed request, and retried like one
                    raise _ProviderFailure(exc) from exc
                log.warning(
                    "model.stream_interrupted",
                    session_id=session_id,
                    model=self.model,
                    error=type(exc).__name__,
                    received_chars=sum(len(p) for p in parts),
                )
                return Reply(content="".join(parts), interrupted=True)
            usage = getattr(chunk, "usage", None) or usage
            for choice in getattr(chunk, "choices", None) or []:
                delta_obj = getattr(choice, "delta", None)
                delta = getattr(delta_obj, "content", None)
                if delta:
                    parts.append(delta)
                    on_delta(delta)
                for piece in getattr(delta_obj, "tool_calls", None) or []:
                    _add_fragment(fragments, piece)
        read, written = cache_usage(usage)
        return Reply(
            content="".join(parts),
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
            cached_tokens=read,
            cache_write_tokens=written,
            tool_calls=tuple(
                ToolCall(id=f["id"] or f"call_{i}", name=f["name"], arguments=f["arguments"])
                for i, f in sorted(fragments.items())
            ),
        )


def _tool_calls(raw: Any) -> tuple[ToolCall, ...]:
    """Structured tool calls of a whole reply's message (litellm objects or dicts)."""
    out = []
    for i, call in enumerate(raw or []):
        get = call.get if isinstance(call, dict) else lambda k, c=call: getattr(c, k, None)
        function = get("function")
        fget = function.get if isinstance(function, dict) else lambda k, f=function: getattr(f, k, None)
        out.append(ToolCall(id=get("id") or f"call_{i}", name=fget("name") or "", arguments=fget("arguments") or ""))
    return tuple(out)


def _add_fragment(fragments: dict[int, dict[str, str]], piece: Any) -> None:
    """Merge one streamed tool-call delta: the first fragment of a call (by ``index``) brings
    its id and name, later ones append to its arguments (the OpenAI streaming form)."""
    get: Callable[[str], Any] = piece.get if isinstance(piece, dict) else lambda k: getattr(piece, k, None)
    index = get("index") or 0
    entry = fragments.setdefault(index, {"id": "", "name": "", "arguments": ""})
    if get("id"):
        entry["id"] = get("id")
    function = get("function")
    if function is not None:
        fget: Callable[[str], Any] = (
            function.get if isinstance(function, dict) else lambda k: getattr(function, k, None)
        )
        if fget("name"):
            entry["name"] = fget("name")
        entry["arguments"] += fget("arguments") or ""


class _Joiner:
    """Passes streamed text on, with a blank line between the text of two tool rounds."""

    def __init__(self, on_delta: Callable[[str], None]) -> None:
        self.on_delta = on_delta
        self.shown = False
        self.fresh = True

    def new_round(self) -> None:
        self.fresh = True

    def __call__(self, piece: str) -> None:
        if self.fresh and self.shown:
            self.on_delta("\n\n")
        self.fresh = False
        self.shown = True
        self.on_delta(piece)

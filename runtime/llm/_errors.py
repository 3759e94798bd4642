"""The one mapping from litellm's exceptions (and the OpenAI client's and httpx's under it) to ours.

:func:`map_model_error` turns any exception a model call raises into the most specific
:class:`~errors.ModelCallError`, ``raise ... from exc`` at the call site:

- context too long (``ContextWindowExceededError``, or a plain 400 worded as one of
  :data:`OVERFLOW_WORDINGS`) -> :class:`~errors.ContextOverflowError`;
- 401, 403, or no API key configured -> :class:`~errors.ModelAuthError`;
- 429, 5xx, timeout, lost connection -> :class:`~errors.ModelUnavailableError` (retryable);
- any other 4xx, content policy, guardrail, spend budget -> :class:`~errors.ModelRequestError`.

The replier raises the result; the model summarizer wraps it in a
:class:`~errors.SummarizationError` (see ``runtime.compaction``). A test iterates every
class in ``litellm.exceptions`` and checks that each maps to one of the four.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from email.utils import parsedate_to_datetime
from typing import Any

from errors import (
    ContextOverflowError,
    ModelAuthError,
    ModelCallError,
    ModelRequestError,
    ModelUnavailableError,
)
from runtime._offline import load_litellm


@dataclass(frozen=True)
class OverflowWording:
    """One way a provider words "the prompt is longer than the context window" in an error.

    ``pattern`` is matched case-insensitively against the provider's message (and its error
    body's code/type); its named group ``limit``, when present, captures the context limit
    the provider stated, in tokens (digits, possibly with thousands separators)."""

    provider: str
    """Who sends this wording (for readers and tests; not used to match)."""
    pattern: str


_N = r"[\d,]+"
OVERFLOW_WORDINGS: tuple[OverflowWording, ...] = (
    # OpenAI, Azure OpenAI, DeepSeek, vLLM, OpenRouter ("This endpoint's ..."):
    # "This model's maximum context length is 128000 tokens. However, your messages resulted in ..."
    OverflowWording("openai", rf"maximum context length is (?P<limit>{_N}) tokens"),
    OverflowWording("openai", r"context_length_exceeded"),  # OpenAI/Azure error code
    OverflowWording("openai", r"reduce the length of the (?:input )?messages"),
    # vLLM: "The prompt (total length 1391) is longer than the model's maximum context length of 1024 tokens."
    #       "The decoder prompt (length 10127) is longer than the maximum model length of 8192."
    OverflowWording("vllm", rf"longer than the (?:model's )?maximum (?:context|model) length(?: of (?P<limit>{_N}))?"),
    # SGLang: "The input (61709 tokens) is longer than the model's context length (40960 tokens)."
    OverflowWording("sglang", rf"longer than the model's context length(?: \((?P<limit>{_N}) tokens\))?"),
    OverflowWording(
        "sglang", rf"input length \({_N} tokens\) exceeds the maximum allowed length \((?P<limit>{_N}) tokens\)"
    ),
    # Anthropic (and Bedrock): "prompt is too long: 209353 tokens > 200000 maximum"
    OverflowWording("anthropic", rf"prompt is too long(?:: {_N} tokens > (?P<limit>{_N}) maximum)?"),
    OverflowWording("anthropic", r"input is too long"),
    # Gemini: "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
    OverflowWording(
        "gemini",
        rf"input token count (?:\({_N}\) )?exceeds the maximum number of tokens allowed(?: \((?P<limit>{_N})\))?",
    ),
    # Mistral: "Prompt contains 300000 tokens, too large for model with 131072 maximum context length"
    OverflowWording("mistral", rf"too large for model with (?P<limit>{_N}) maximum context length"),
    # xAI: "This model's maximum prompt length is 131072 but the request contains 136973 tokens."
    OverflowWording("xai", rf"maximum prompt length is (?P<limit>{_N}) but the request contains {_N} tokens"),
    # TGI: "`inputs` must have less than 1024 tokens. Given: 1168"
    #      "`inputs` tokens + `max_new_tokens` must be <= 32768. Given: ..."
    OverflowWording("tgi", rf"`inputs` must have less than (?P<limit>{_N}) tokens"),
    OverflowWording("tgi", rf"`inputs` tokens \+ `max_new_tokens` must be <= (?P<limit>{_N})"),
    # llama.cpp server: "request (4476 tokens) exceeds the available context size (4096 tokens)",
    # older: "the request exceeds the available context size, try increasing it"; llama-cpp-python:
    # "Requested tokens (2138) exceed context window of 2048"
    OverflowWording("llama.cpp", rf"exceeds? the available context size(?: \((?P<limit>{_N}) tokens\))?"),
    OverflowWording("llama.cpp", r"exceed_context_size_error"),
    OverflowWording("llama.cpp", rf"requested tokens \({_N}\) exceed context window of (?P<limit>{_N})"),
    # LM Studio: "Input length 6491 exceeds context length 1500"; "The number of tokens to keep from the
    # initial prompt is greater than the context length (n_keep: 13055>= n_ctx: 4096)"; "Trying to keep
    # the first 10136 tokens when context the overflows. However, the model is loaded with context length
    # of only 7866 tokens"
    OverflowWording("lm-studio", rf"input length {_N} exceeds context length (?P<limit>{_N})"),
    OverflowWording(
        "lm-studio", rf"greater than the context length(?: \(n_keep: {_N}\s*>=\s*n_ctx: (?P<limit>{_N})\))?"
    ),
    OverflowWording("lm-studio", rf"context the overflows.*?context length of only (?P<limit>{_N}) tokens"),
    # Ollama: "prompt too long; exceeded max context length by 4096 tokens";
    #         "the input length exceeds the context length"
    OverflowWording("ollama", r"prompt too long; exceeded (?:max )?context length"),
    OverflowWording("ollama", r"input length exceeds the context length"),
    # Moonshot / Kimi: "Invalid request: Your request exceeded model token limit: 8192"
    OverflowWording("moonshot", rf"exceeded model token limit(?:: (?P<limit>{_N}))?"),
    # DashScope / Qwen (compatible mode and native): "Range of input length should be [1, 30720]"
    OverflowWording("dashscope", rf"range of input length should be \[1, (?P<limit>{_N})\]"),
    # Zhipu GLM / Z.ai, error code 1261: "Prompt exceeds max length", "Prompt 超长"
    OverflowWording("zhipu", r"prompt\s*(?:exceeds max length|超长|超过最大长度)"),
    # Baidu Qianfan / ERNIE (limits in characters, not tokens): error_code 336103 "the max input
    # characters is 20000", 336007 "the max length of current question is 2000"
    OverflowWording("qianfan", r"the max input characters is \d+"),
    OverflowWording("qianfan", r"the max length of current question is \d+"),
    # MiniMax, base_resp status_code 2013: "invalid params, context window exceeds limit"
    OverflowWording("minimax", r"context window exceeds limit"),
    # Volcengine Doubao (Ark), code InvalidParameter: "Total tokens of image and text exceed max message tokens"
    OverflowWording("doubao", r"exceed max message tokens"),
    # Tencent Hunyuan and other Chinese APIs: "输入长度超过限制", "输入超长", "消息长度超过最大限制"
    OverflowWording(
        "chinese",
        r"(?:输入|上下文|消息|提示词?)(?:的)?(?:长度|内容|token\s*数)?(?:已)?(?:超长|超过(?:了)?(?:模型)?(?:的)?(?:最大)?(?:长度)?限制|超出(?:了)?(?:模型)?(?:的)?(?:最大)?(?:长度)?限制)",
    ),
    # SiliconFlow, code 20015: "length of prompt_tokens (37419) must be less than max_seq_len (32768)."
    OverflowWording(
        "siliconflow", rf"length of prompt_tokens \({_N}\) must be less than max_seq_len \((?P<limit>{_N})\)"
    ),
    # xAI's newer error code "input_too_large": "... {N} tokens, the maximum is {limit}."
    OverflowWording("xai", rf"input_too_large(?:.*?maximum is (?P<limit>{_N}))?"),
    OverflowWording("xai", rf"(?:prompt|input) is too large for (?:this|the) model(?:.*?maximum is (?P<limit>{_N}))?"),
    # Cohere: "too many tokens: total number of tokens in the prompt cannot exceed 4081 - received ...";
    #         v2: "too many tokens: size limit exceeded by 1200 tokens"
    OverflowWording("cohere", rf"total number of tokens in the prompt cannot exceed (?P<limit>{_N})"),
    OverflowWording("cohere", r"too many tokens: size limit exceeded by"),
    # Bedrock (Titan): "Too many input tokens. Max input tokens: 8192, request input token count: 9000"
    OverflowWording("bedrock", rf"too many input tokens\. max input tokens: (?P<limit>{_N})"),
    # others that name the context window outright
    OverflowWording("generic", r"exceeds? the (?:model's )?context (?:size|window)"),
    # a wording no row above knows, for the input: "input/prompt/messages ... too long / exceed(s) ...
    # context / token limit / maximum length" in one sentence, never about rates, quotas or the output
    OverflowWording(
        "generic",
        r"\b(?:prompt|input|messages?|context)\b(?![^.]*(?:per minute|per day|rate|quota|tpm|rpm|max_tokens|"
        r"output|completion|image|file|upload))[^.]{0,80}?\b(?:is too long|too many tokens|exceeds?|exceeded)\b"
        r"[^.]{0,80}?\b(?:context(?: length| window| size)?|token limit|maximum (?:length|tokens|context))\b",
    ),
)
"""How providers word a context overflow inside a plain error (400, 413, TGI's 422, or the
500 some llama.cpp versions send). One row per wording; :func:`is_overflow` tries them all and
:func:`provider_limit` takes the first stated limit. Sources: each provider's error text as
users reported it (OpenAI, DeepSeek, OpenRouter, xAI, Gemini, Anthropic, SGLang, vLLM, TGI,
llama.cpp, LM Studio and Ollama issue trackers; Mistral as client libraries match it); the
Chinese providers (Moonshot, DashScope, Zhipu, Qianfan, MiniMax, Doubao, Hunyuan, SiliconFlow),
Cohere and Bedrock as their error references and users' reports word them. A limit is captured
only where it is stated in tokens (Qianfan's is in characters). To add a provider: one row here,
and one entry in ``tests/fake_llm.OVERFLOW`` with its status and JSON body as the provider
sends them. Kept specific: rate-limit wordings such as "too many tokens, please wait" must not
match."""

_OVERFLOW_PATTERNS = tuple(re.compile(w.pattern, re.IGNORECASE | re.DOTALL) for w in OVERFLOW_WORDINGS)
OVERFLOW_STATUS = frozenset({None, 400, 413, 422, 500})
"""HTTP statuses whose message is checked against :data:`OVERFLOW_WORDINGS` (``None``: no status)."""

RETRYABLE_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504, 529})
"""HTTP statuses worth another attempt: timeouts, rate limits, overload and server errors."""


# -- classification -------------------------------------------------------------
def _text(exc: BaseException) -> str:
    """The provider's message: ``message``, else ``str(exc)``, first line."""
    try:
        raw = getattr(exc, "message", None) or str(exc)
    except Exception:  # an exception whose __str__ fails still gets classified
        raw = ""
    body = getattr(exc, "body", None)
    if isinstance(body, (dict, list, str)):  # the JSON error body (or its "error" string), in any provider's shape
        raw = f"{raw} {' '.join(_values(body))}"
    return str(raw)


def _values(body: object, depth: int = 0) -> list[str]:
    """The strings and numbers of a JSON error body, nested objects included (``{"error": {...}}``,
    ``{"base_resp": {"status_msg"}}``, ``{"error_code", "error_msg"}``), in order."""
    if isinstance(body, dict) and depth < 4:
        return [v for value in body.values() for v in _values(value, depth + 1)]
    if isinstance(body, list) and depth < 4:
        return [v for value in body[:10] for v in _values(value, depth + 1)]
    if isinstance(body, (str, int, float)) and not isinstance(body, bool):
        return [str(body)]
    return []


def is_overflow(exc: BaseException) -> bool:
    """True if ``exc`` says the prompt exceeds the model's context window."""
    litellm = load_litellm()

    if isinstance(exc, litellm.exceptions.ContextWindowExceededError):
        return True
    status = getattr(exc, "status_code", None)
    if status not in OVERFLOW_STATUS:
        return False
    text = _text(exc)
    return any(pattern.search(text) for pattern in _OVERFLOW_PATTERNS)


def provider_limit(exc: BaseException) -> int | None:
    """The context limit the provider stated in its message, tokens, if it stated one.

    The first :data:`OVERFLOW_WORDINGS` row that matches with a ``limit`` gives it."""
    text = _text(exc)
    for pattern in _OVERFLOW_PATTERNS:
        for match in pattern.finditer(text):
            limit = match.groupdict().get("limit")
            if limit:
                return int(limit.replace(",", ""))
    return None


def retry_after(exc: BaseException) -> float | None:
    """The provider's ``Retry-After`` (or ``retry-after-ms``) from the error's response, seconds."""
    headers: Any = getattr(exc, "litellm_response_headers", None)
    if not headers:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
    if not headers:
        return None
    try:
        if headers.get("retry-after-ms") is not None:
            return max(0.0, float(headers["retry-after-ms"]) / 1000)
        raw = headers.get("retry-after")
        if raw is None:
            return None
        try:
            return max(0.0, float(raw))
        except ValueError:  # an HTTP date
            return max(0.0, parsedate_to_datetime(raw).timestamp() - time.time())
    except (TypeError, ValueError, AttributeError):  # an unreadable header is no header
        return None


def _litellm(*names: str) -> tuple[type[BaseException], ...]:
    """litellm's exception classes of these names that this litellm version has (the test
    that iterates ``litellm.exceptions`` catches a new class that none of the rules covers)."""
    lx = load_litellm().exceptions

    return tuple(getattr(lx, n) for n in names if isinstance(getattr(lx, n, None), type))


_MISSING_CREDENTIALS = re.compile(
    r"missing credentials|api_key client option must be set|set the `?[A-Z_]*API_KEY`? environment variable",
    re.IGNORECASE,
)
"""How the OpenAI client (inside litellm) says no API key was given at all. litellm reports it
as an InternalServerError (HTTP 500) before any request is sent; retrying cannot help."""


def is_missing_credentials(exc: BaseException) -> bool:
    """True if ``exc`` says no API key was configured (see :data:`_MISSING_CREDENTIALS`)."""
    return bool(_MISSING_CREDENTIALS.search(_text(exc)))


def error_class_for(exc: BaseException) -> type[ModelCallError]:
    """Which of our errors ``exc`` (from litellm, the OpenAI client or httpx) becomes."""
    import httpx
    import openai

    if is_overflow(exc):
        return ContextOverflowError
    if isinstance(exc, (openai.AuthenticationError, openai.PermissionDeniedError)) or is_missing_credentials(exc):
        return ModelAuthError
    if isinstance(
        exc,
        (
            openai.RateLimitError,
            openai.InternalServerError,
            *_litellm("ServiceUnavailableError", "BadGatewayError", "MidStreamFallbackError"),
            openai.APIConnectionError,  # openai.APITimeoutError and litellm.Timeout are subclasses
            httpx.TransportError,
        ),
    ):
        return ModelUnavailableError
    if isinstance(
        exc,
        (
            openai.BadRequestError,  # litellm's policy, unsupported-param, unknown-provider errors are subclasses
            openai.NotFoundError,
            openai.UnprocessableEntityError,
            openai.APIResponseValidationError,
            *_litellm(
                "BudgetExceededError",
                "GuardrailRaisedException",
                "BlockedPiiEntityError",
                "ModifyResponseException",
                "SensitiveDataRouteException",
                "ModelNotMappedError",
            ),
        ),
    ):
        return ModelRequestError
    if isinstance(exc, (openai.OpenAIError, httpx.HTTPError)):  # generic ones: decide by status
        status = getattr(exc, "status_code", None) or getattr(getattr(exc, "response", None), "status_code", None)
        if status in (401, 403):
            return ModelAuthError
        if status is None or status in RETRYABLE_STATUS or status >= 500:
            return ModelUnavailableError
        return ModelRequestError
    return ModelCallError


def map_model_error(exc: BaseException, *, model: str, session_id: str | None) -> ModelCallError:
    """Turn an exception from litellm (or the network under it) into the most specific
    :class:`ModelCallError`. The message names the model, the HTTP status and the original
    class, never conversation text."""
    cls = error_class_for(exc)
    status = getattr(exc, "status_code", None)
    status = status if isinstance(status, int) else None
    detail = _text(exc).strip().splitlines()[0] if _text(exc).strip() else ""
    where = f" (HTTP {status})" if status else ""
    kwargs: dict[str, Any] = dict(session_id=session_id, model=model, status=status)
    if cls is ContextOverflowError:
        limit = provider_limit(exc)
        return ContextOverflowError(
            f"The model {model!r} rejected the prompt as longer than its context window{where}"
            + (f" of {limit} tokens" if limit else "")
            + f": {detail[:300]}",
            provider_limit=limit,
            **kwargs,
        )
    if cls is ModelAuthError and is_missing_credentials(exc):  # no request was sent: no HTTP status to report
        return ModelAuthError(
            f"No API key is configured for the model {model!r}: {detail[:300]} "
            "Set the provider's API key variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...) or COMPANION_API_BASE.",
            **kwargs,
        )
    if cls is ModelAuthError:
        return ModelAuthError(
            f"The model {model!r} refused the credentials{where}: {type(exc).__name__}: {detail[:300]} "
            "Check the provider's API key variable (OPENAI_API_KEY, ANTHROPIC_API_KEY, ...) and COMPANION_MODEL.",
            **kwargs,
        )
    if cls is ModelUnavailableError:
        return ModelUnavailableError(
            f"The model {model!r} is unavailable{where}: {type(exc).__name__}: {detail[:300]}",
            retry_after=retry_after(exc),
            **kwargs,
        )
    if cls is ModelRequestError:
        return ModelRequestError(
            f"The model {model!r} refused the request{where}: {type(exc).__name__}: {detail[:300]}", **kwargs
        )
    return ModelCallError(
        f"The model call to {model!r} failed unexpectedly: {type(exc).__name__}: {detail[:300]}", **kwargs
    )


# -- the model's window ---------------------------------------------------------

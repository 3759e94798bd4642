"""A loopback OpenAI-compatible chat completions server for tests.

It answers ``POST /v1/chat/completions`` from a script: each queued entry is a
reply text, an HTTP error ``(status, body)``, or a callable that takes the request
body and returns either (it may also block, to play a hanging server). When the
queue is empty, ``responder`` (a callable like that) answers if set, else a fixed
reply. Every request body is kept in ``requests``.

Requests with ``"stream": true`` get server-sent events (``data: {chunk}`` lines,
then ``data: [DONE]``), one chunk per word, and a final chunk with ``usage`` when
``stream_options.include_usage`` is set. Besides reply texts and ``(status, body)``
tuples, a script entry can be a scripted fault: :class:`HTTPError` (any status,
OpenAI-style body, extra headers such as ``Retry-After``; see :func:`rate_limited`
and :data:`OVERFLOW`), :class:`Hang` (sleep past the client's timeout),
:class:`Cut` (close the connection halfway through the reply) or :class:`ToolCalls`
(a structured ``tool_calls`` reply, whole or streamed as argument fragments, with
``finish_reason: "tool_calls"``). A callable step sees each request, so a test can
answer by what the tool results in it say.

Run it alone for a manual session (``python -m tests.fake_llm --port 0``); it
prints its ``api_base``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass(frozen=True)
class HTTPError:
    """An HTTP error reply with an OpenAI-style body ``{"error": {message, type, code}}``."""

    status: int
    message: str
    type: str = "server_error"
    code: str | int | None = None
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers, e.g. ``{"Retry-After": "1"}``."""
    body: dict[str, Any] | None = None
    """The JSON body as the provider sends it, when it is not OpenAI's ``{"error": {...}}``
    (SiliconFlow's ``{"code", "message"}``, MiniMax's ``base_resp``, ...)."""


def rate_limited(retry_after: float | None = None) -> HTTPError:
    """A 429 as OpenAI sends it, with ``Retry-After`` (seconds) when given."""
    headers = {"Retry-After": f"{retry_after:g}"} if retry_after is not None else {}
    return HTTPError(
        429,
        "Rate limit reached for requests. Please try again later.",
        type="requests",
        code="rate_limit_exceeded",
        headers=headers,
    )


OVERFLOW: dict[str, HTTPError] = {
    "openai": HTTPError(
        400,
        "This model's maximum context length is 1024 tokens. However, your messages resulted in 1391 tokens. "
        "Please reduce the length of the messages.",
        type="invalid_request_error",
        code="context_length_exceeded",
    ),
    "azure": HTTPError(
        400,
        "This model's maximum context length is 1024 tokens. However, you requested 1391 tokens "
        "(1135 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
        type="invalid_request_error",
        code="context_length_exceeded",
    ),
    "vllm": HTTPError(
        400,
        "This model's maximum context length is 1024 tokens. However, you requested 1391 tokens "
        "(1135 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
        type="BadRequestError",
        code=400,
    ),
    "vllm-prompt": HTTPError(
        400,
        "The prompt (total length 1391) is longer than the model's maximum context length of 1024 tokens.",
        type="BadRequestError",
        code=400,
    ),
    "llama.cpp": HTTPError(
        400,
        "the request exceeds the available context size, try increasing it",
        type="exceed_context_size_error",
        code=400,
    ),
    "llama.cpp-sized": HTTPError(
        400,
        "request (1391 tokens) exceeds the available context size (1024 tokens)",
        type="exceed_context_size_error",
        code=400,
    ),
    "llama.cpp-500": HTTPError(
        500,
        "the request exceeds the available context size. try increasing the context size or enable context shift",
        type="exceed_context_size_error",
        code=500,
    ),
    "anthropic": HTTPError(400, "prompt is too long: 1391 tokens > 1024 maximum", type="invalid_request_error"),
    "gemini": HTTPError(
        400,
        "The input token count (1391) exceeds the maximum number of tokens allowed (1024).",
        type="INVALID_ARGUMENT",
        code=400,
    ),
    "mistral": HTTPError(
        400,
        "Prompt contains 1391 tokens, too large for model with 1024 maximum context length",
        type="invalid_request_error",
    ),
    "xai": HTTPError(
        400,
        "This model's maximum prompt length is 1024 but the request contains 1391 tokens.",
        type="invalid_request_error",
    ),
    "deepseek": HTTPError(
        400,
        "This model's maximum context length is 1024 tokens. However, you requested 1391 tokens "
        "(1135 in the messages, 256 in the completion). Please reduce the length of the messages or completion.",
        type="invalid_request_error",
        code="invalid_request_error",
    ),
    "vllm-decoder": HTTPError(
        400,
        "The decoder prompt (length 1391) is longer than the maximum model length of 1024. Make sure that "
        "`max_model_len` is no smaller than the number of text tokens plus multimodal tokens.",
        type="BadRequestError",
        code=400,
    ),
    "sglang": HTTPError(
        400,
        "The input (1391 tokens) is longer than the model's context length (1024 tokens).",
        type="BadRequestError",
        code=400,
    ),
    "tgi": HTTPError(
        422, "Input validation error: `inputs` must have less than 1024 tokens. Given: 1391", type="validation"
    ),
    "tgi-total": HTTPError(
        422,
        "Input validation error: `inputs` tokens + `max_new_tokens` must be <= 1024. Given: 1135 `inputs` tokens and "
        "256 `max_new_tokens`",
        type="validation",
    ),
    "lm-studio": HTTPError(400, "Input length 1391 exceeds context length 1024", type="invalid_request_error"),
    "lm-studio-n-keep": HTTPError(
        400,
        "The number of tokens to keep from the initial prompt is greater than the context length (n_keep: 1391>= n_ctx: 1024). "
        "Try to load the model with a larger context length, or provide a shorter input.",
    ),
    "ollama": HTTPError(400, "prompt too long; exceeded max context length by 367 tokens", type="api_error"),
    "ollama-input": HTTPError(400, "the input length exceeds the context length", type="api_error"),
    # -- providers whose wordings the first table missed: each as its API sends it ----------
    "moonshot": HTTPError(
        400,
        "Invalid request: Your request exceeded model token limit: 1024",
        type="invalid_request_error",
    ),
    "dashscope": HTTPError(
        400,
        "Range of input length should be [1, 1024]",
        type="invalid_request_error",
        code="invalid_parameter_error",
    ),
    "dashscope-native": HTTPError(
        400,
        "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 1024]",
        body={
            "code": "InvalidParameter",
            "message": "<400> InternalError.Algo.InvalidParameter: Range of input length should be [1, 1024]",
            "request_id": "5c9f0a1e-0000-0000-0000-000000000000",
        },
    ),
    "zhipu": HTTPError(400, "Prompt exceeds max length", type="invalid_request_error", code="1261"),
    "zhipu-zh": HTTPError(400, "Prompt 超长", body={"error": {"code": "1261", "message": "Prompt 超长"}}),
    "qianfan": HTTPError(
        400,
        "the max input characters is 20000",
        body={"error_code": 336103, "error_msg": "the max input characters is 20000", "id": "as-0000000000"},
    ),
    "qianfan-question": HTTPError(
        400,
        "the max length of current question is 2000",
        body={"error_code": 336007, "error_msg": "the max length of current question is 2000"},
    ),
    "minimax": HTTPError(
        400,
        "invalid params, context window exceeds limit",
        body={"base_resp": {"status_code": 2013, "status_msg": "invalid params, context window exceeds limit"}},
    ),
    "doubao": HTTPError(
        400,
        "Total tokens of image and text exceed max message tokens. Request id: 0217000000000000000",
        type="BadRequest",
        code="InvalidParameter",
    ),
    "hunyuan": HTTPError(
        400,
        "输入长度超过限制，请缩短输入内容",
        body={
            "error": {
                "message": "输入长度超过限制，请缩短输入内容",
                "type": "invalid_request_error",
                "code": "InvalidParameter",
            }
        },
    ),
    "siliconflow": HTTPError(
        400,
        "length of prompt_tokens (1391) must be less than max_seq_len (1024).",
        body={
            "code": 20015,
            "message": "length of prompt_tokens (1391) must be less than max_seq_len (1024).",
            "data": None,
        },
    ),
    "xai-input-too-large": HTTPError(
        400,
        "The prompt is too large for this model: 1391 tokens, the maximum is 1024.",
        body={
            "code": "input_too_large",
            "error": "The prompt is too large for this model: 1391 tokens, the maximum is 1024.",
        },
    ),
    "mistral-draft": HTTPError(
        400,
        "Prompt contains 1391 tokens and 0 draft tokens, too large for model with 1024 maximum context length",
        body={
            "object": "error",
            "message": "Prompt contains 1391 tokens and 0 draft tokens, too large for model with 1024 maximum context length",
            "type": "invalid_request_error",
            "param": None,
            "code": None,
        },
    ),
    "cohere": HTTPError(
        400,
        "too many tokens: total number of tokens in the prompt cannot exceed 1024 - received 1391. Try using a "
        "shorter prompt, or enabling prompt truncating.",
        body={
            "message": "too many tokens: total number of tokens in the prompt cannot exceed 1024 - received 1391. "
            "Try using a shorter prompt, or enabling prompt truncating."
        },
    ),
    "cohere-v2": HTTPError(
        400,
        "too many tokens: size limit exceeded by 367 tokens. Try using shorter or fewer inputs, or setting "
        "prompt_truncation='AUTO'.",
        body={
            "message": "too many tokens: size limit exceeded by 367 tokens. Try using shorter or fewer inputs, or setting prompt_truncation='AUTO'."
        },
    ),
    "gemini-native": HTTPError(
        400,
        "The input token count (1391) exceeds the maximum number of tokens allowed (1024).",
        body={
            "error": {
                "code": 400,
                "message": "The input token count (1391) exceeds the maximum number of tokens allowed (1024).",
                "status": "INVALID_ARGUMENT",
            }
        },
    ),
    "bedrock": HTTPError(
        400, "Input is too long for requested model.", body={"message": "Input is too long for requested model."}
    ),
    "bedrock-titan": HTTPError(
        400,
        "Too many input tokens. Max input tokens: 1024, request input token count: 1391",
        body={"message": "Too many input tokens. Max input tokens: 1024, request input token count: 1391"},
    ),
    "unseen-provider": HTTPError(
        400,
        "Your input exceeds the context length of this model (1024 tokens); shorten it and try again.",
        body={
            "error": {
                "message": "Your input exceeds the context length of this model (1024 tokens); shorten it and try again.",
                "code": "bad_request",
            }
        },
    ),
    "openrouter": HTTPError(
        400,
        "This endpoint's maximum context length is 1024 tokens. However, you requested about 1391 tokens (1135 of text "
        'input, 256 in the output). Please reduce the length of either one, or use the "middle-out" transform to '
        "compress your prompt automatically.",
        code=400,
    ),
}
"""Context-overflow errors worded the way each provider or server words them (their own
status: 400, TGI's 422, an older llama.cpp's 500). Every limit they state is 1024 tokens."""

OVERFLOW_LIMIT: dict[str, int | None] = {
    name: (
        None
        if name
        in (
            "llama.cpp",
            "llama.cpp-500",
            "ollama",
            "ollama-input",
            "zhipu",
            "zhipu-zh",
            "qianfan",
            "qianfan-question",
            "minimax",
            "doubao",
            "hunyuan",
            "cohere-v2",
            "bedrock",
            "unseen-provider",
        )
        else 1024
    )
    for name in OVERFLOW
}
"""The context limit each :data:`OVERFLOW` wording states, tokens (``None``: it states none)."""


@dataclass(frozen=True)
class Hang:
    """Sleep ``seconds`` before answering with ``then`` (default: the usual reply), so that a
    client with a shorter timeout gives up first."""

    seconds: float
    then: Any = None


@dataclass(frozen=True)
class Cut:
    """Send the first ``after`` chunks of ``text`` (streamed), or half its body (whole),
    then close the connection without finishing the reply."""

    text: str
    after: int = 2


@dataclass(frozen=True)
class ToolCalls:
    """A reply that asks for tool calls: ``calls`` is a list of ``(name, arguments)`` with
    ``arguments`` a dict (sent JSON-encoded, as providers do). ``content`` is text sent
    beside the calls (usually empty). Call ids are ``call_<n>`` numbered per server."""

    calls: list[tuple[str, dict[str, Any]]]
    content: str = ""


def _pieces(text: str) -> list[str]:
    """``text`` split into word chunks that join back to it exactly."""
    return [p for p in re.findall(r"\S*\s*", text) if p]


class _Server(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:  # a client that hung up is expected
        import sys

        if not isinstance(sys.exc_info()[1], (ConnectionError, TimeoutError)):
            super().handle_error(request, client_address)


class FakeLLM:
    def __init__(self, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.script: deque[Any] = deque()
        self.requests: list[dict[str, Any]] = []
        self.default_reply = "I hear you."
        self.responder: Any = None
        self.prompt_tokens: Any = 123
        """Reported prompt tokens: a number, or a callable of the request body."""
        self.stream_delay = 0.0
        """Seconds to wait before each streamed word."""
        self.previous: dict[str, Any] | None = None
        """The request before the one being answered: the prompt cache's reference."""
        fake = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"  # chunked streams, so that a cut stream is an error, not an end

            def log_message(self, *args: Any) -> None:  # keep test output clean
                pass

            def do_POST(self) -> None:  # noqa: N802 (http.server naming)
                length = int(self.headers.get("content-length", 0))
                body = json.loads(self.rfile.read(length) or b"{}")
                fake.requests.append(body)
                self.cached = cached_tokens(fake.previous, body)
                fake.previous = body
                step = fake.script.popleft() if fake.script else (fake.responder or fake.default_reply)
                while True:
                    if callable(step):
                        step = step(body)
                    if isinstance(step, Hang):
                        time.sleep(step.seconds)
                        step = fake.default_reply if step.then is None else step.then
                        continue
                    break
                if isinstance(step, tuple):
                    status, payload = step
                    step = HTTPError(status, payload, code=status)
                if isinstance(step, HTTPError):
                    self._error(step)
                elif body.get("stream"):
                    self._stream(body, step)
                else:
                    self._whole(body, step)

            def _error(self, error: HTTPError) -> None:
                data = json.dumps(
                    error.body
                    if error.body is not None
                    else {"error": {"message": error.message, "type": error.type, "code": error.code}},
                    ensure_ascii=False,
                ).encode()
                self.send_response(error.status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                for name, value in error.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def _usage(self, body: dict[str, Any]) -> dict[str, Any]:
                prompt = fake.prompt_tokens(body) if callable(fake.prompt_tokens) else fake.prompt_tokens
                cached = self.cached if prompt >= CACHE_MIN_TOKENS else 0
                return {
                    "prompt_tokens": prompt,
                    "completion_tokens": 7,
                    "total_tokens": prompt + 7,
                    "prompt_tokens_details": {"cached_tokens": min(cached, prompt)},
                }

            def _whole(self, body: dict[str, Any], step: Any) -> None:
                text = step.text if isinstance(step, Cut) else step
                message: dict[str, Any] = {"role": "assistant", "content": text}
                finish = "stop"
                if isinstance(step, ToolCalls):
                    message = {"role": "assistant", "content": step.content or None, "tool_calls": fake._calls(step)}
                    finish = "tool_calls"
                data = json.dumps(
                    {
                        "id": "chatcmpl-fake",
                        "object": "chat.completion",
                        "created": int(time.time()),
                        "model": body.get("model", "fake"),
                        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
                        "usage": self._usage(body),
                    }
                ).encode()
                self.send_response(200)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                if isinstance(step, Cut):
                    self.wfile.write(data[: len(data) // 2])
                    self._hang_up()
                    return
                self.wfile.write(data)

            def _stream(self, body: dict[str, Any], step: Any) -> None:
                text = step.text if isinstance(step, Cut) else step
                base = {
                    "id": "chatcmpl-fake",
                    "object": "chat.completion.chunk",
                    "created": int(time.time()),
                    "model": body.get("model", "fake"),
                }
                self.send_response(200)
                self.send_header("content-type", "text/event-stream")
                self.send_header("transfer-encoding", "chunked")
                self.end_headers()
                self._event(
                    {
                        **base,
                        "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}],
                    }
                )
                if isinstance(step, ToolCalls):
                    self._stream_calls(body, base, step)
                    return
                for i, piece in enumerate(_pieces(text)):
                    if isinstance(step, Cut) and i >= step.after:
                        self.wfile.write(b'40\r\ndata: {"id": "chatcmpl-fa')  # a chunk that never ends
                        self._hang_up()
                        return
                    if fake.stream_delay:
                        time.sleep(fake.stream_delay)
                    self._event({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "choices": [], "usage": self._usage(body)})
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

            def _stream_calls(self, body: dict[str, Any], base: dict[str, Any], step: ToolCalls) -> None:
                """Text first (if any), then each call: id and name, then its arguments in two fragments."""
                for piece in _pieces(step.content):
                    self._event({**base, "choices": [{"index": 0, "delta": {"content": piece}, "finish_reason": None}]})
                for index, call in enumerate(fake._calls(step)):
                    args = call["function"]["arguments"]
                    half = len(args) // 2
                    head = {
                        "index": index,
                        "id": call["id"],
                        "type": "function",
                        "function": {"name": call["function"]["name"], "arguments": args[:half]},
                    }
                    tail = {"index": index, "function": {"arguments": args[half:]}}
                    for delta in (head, tail):
                        self._event(
                            {**base, "choices": [{"index": 0, "delta": {"tool_calls": [delta]}, "finish_reason": None}]}
                        )
                self._event({**base, "choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]})
                if (body.get("stream_options") or {}).get("include_usage"):
                    self._event({**base, "choices": [], "usage": self._usage(body)})
                self._event("[DONE]")
                self.wfile.write(b"0\r\n\r\n")

            def _event(self, payload: Any) -> None:
                data = payload if isinstance(payload, str) else json.dumps(payload)
                line = f"data: {data}\n\n".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(line), line))
                self.wfile.flush()

            def _hang_up(self) -> None:
                import socket

                self.wfile.flush()
                self.close_connection = True
                try:
                    self.connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

        self._call_ids = 0
        self._lock = threading.Lock()
        self.server = _Server((host, port), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def _calls(self, step: ToolCalls) -> list[dict[str, Any]]:
        """``step``'s calls in the OpenAI wire form, each with a fresh ``call_<n>`` id."""
        out = []
        for name, arguments in step.calls:
            with self._lock:
                self._call_ids += 1
                call_id = f"call_{self._call_ids}"
            out.append(
                {"id": call_id, "type": "function", "function": {"name": name, "arguments": json.dumps(arguments)}}
            )
        return out

    @property
    def api_base(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}/v1"

    def __enter__(self) -> FakeLLM:
        self.thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()


def echo_reply(body: dict[str, Any]) -> str:
    """A reply that quotes the last user message, so a manual session reads like one."""
    users = [m.get("content") or "" for m in body.get("messages", []) if m.get("role") == "user"]
    last = " ".join(str(users[-1]).split()) if users else ""
    quoted = last if len(last) <= 60 else last[:57] + "..."
    return f"I hear you: \u201c{quoted}\u201d Tell me more."


CACHE_MIN_TOKENS = 1024
"""A prompt shorter than this is never cached (OpenAI's rule)."""
CACHE_BLOCK_TOKENS = 128
"""Cached tokens come in blocks of this many (OpenAI's rule)."""


def cached_tokens(previous: dict[str, Any] | None, body: dict[str, Any]) -> int:
    """What a provider's prompt cache would report for ``body`` after ``previous``: the tokens
    (:func:`estimate_prompt_tokens`' rule) of their longest common prefix, whole messages first and
    then the common start of the first message that differs, in whole blocks of
    :data:`CACHE_BLOCK_TOKENS`, none under :data:`CACHE_MIN_TOKENS`."""
    if previous is None:
        return 0
    tokens = 0
    for old, new in zip(previous.get("messages", []), body.get("messages", []), strict=False):
        if old == new:
            tokens += len(str(old.get("content") or "")) // 4 + 4
            continue
        if old.get("role") == new.get("role"):
            tokens += len(os.path.commonprefix([str(old.get("content") or ""), str(new.get("content") or "")])) // 4
        break
    return tokens // CACHE_BLOCK_TOKENS * CACHE_BLOCK_TOKENS if tokens >= CACHE_MIN_TOKENS else 0


def estimate_prompt_tokens(body: dict[str, Any]) -> int:
    """A rough provider count for a manual session: 4 characters a token plus 4 per message."""
    messages = body.get("messages", [])
    return sum(len(str(m.get("content") or "")) for m in messages) // 4 + 4 * len(messages)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="A loopback OpenAI-compatible chat server for manual runs.")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument("--reply", choices=("echo", "fixed"), default="echo", help="echo quotes the user's message")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each streamed word")
    args = parser.parse_args(argv)
    fake = FakeLLM(host=args.host, port=args.port)
    if args.reply == "echo":
        fake.responder = echo_reply
    fake.prompt_tokens = estimate_prompt_tokens
    fake.stream_delay = args.delay
    print(fake.api_base, flush=True)
    try:
        fake.server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        fake.server.server_close()


if __name__ == "__main__":
    main()

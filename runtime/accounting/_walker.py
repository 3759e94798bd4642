"""Walking chat messages: every counter counts a message's framing, role, text and non-text parts,
names, tool calls and tool results the same way; only ``count_text`` differs. Text counts are
cached (:class:`CachedCounter`)."""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any

from errors import UncountableContentError
from runtime.accounting._framing import (
    MESSAGE_FRAMING,
    NAME_TOKENS,
    REPLY_PRIMING,
    TOOL_CALL_FRAMING,
    TOOL_SCHEMA_FRAMING,
    TOOLS_PREAMBLE,
)
from runtime.accounting._media import (
    IMAGE_LOW_DETAIL,
    IMAGE_UNKNOWN_SIZE,
    anthropic_image_tokens,
    document_tokens,
    image_detail,
    openai_image_tokens,
    part_dimensions,
)

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_DOCUMENT_PARTS = frozenset({"file", "input_file", "document"})
_STRUCTURAL_KEYS = frozenset({"role", "content", "name", "tool_calls", "function_call", "type"})


class MessageCounter:
    """Shared message/request accounting. Subclasses provide ``count_text`` and ``_image``."""

    name = "message-counter"

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _image(self, part: Mapping[str, Any]) -> int:
        """Tokens of an image part: the larger of the OpenAI and Anthropic rules when the size is known."""
        size = part_dimensions(part)
        if size is None:
            return IMAGE_LOW_DETAIL if image_detail(part) == "low" else IMAGE_UNKNOWN_SIZE
        return max(openai_image_tokens(*size, detail=image_detail(part)), anthropic_image_tokens(*size))

    def _value(self, value: Any, where: str) -> int:
        """Tokens of an arbitrary field value: strings as text, anything else as compact JSON text."""
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count_text(value)
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as error:
            raise UncountableContentError(
                f"Cannot count tokens of {where}: {type(value).__name__} is not JSON."
            ) from error
        return self.count_text(text)

    def _part(self, part: Any) -> int:
        if isinstance(part, str):
            return self.count_text(part)
        if not isinstance(part, Mapping):
            raise UncountableContentError(f"Cannot count tokens of a content part of type {type(part).__name__!r}.")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[kind])
            if not isinstance(text, str):
                raise UncountableContentError(f"The content part of type {kind!r} has no string {_TEXT_PARTS[kind]!r}.")
            return self.count_text(text)
        if kind in _IMAGE_PARTS:
            return self._image(part)
        if kind in _DOCUMENT_PARTS:
            return document_tokens(part, self.count_text)
        raise UncountableContentError(
            f"Cannot count tokens of a content part of type {kind!r}; known types: "
            f"{sorted({*_TEXT_PARTS, *_IMAGE_PARTS, *_DOCUMENT_PARTS})}."
        )

    def _content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, (list, tuple)):
            return sum(self._part(part) for part in content)
        raise UncountableContentError(f"Cannot count tokens of message content of type {type(content).__name__}.")

    def _call(self, call: Any) -> int:
        """Tokens of one tool call (or legacy ``function_call``): name, arguments, id, framing."""
        if not isinstance(call, Mapping):
            raise UncountableContentError(f"Cannot count tokens of a tool call of type {type(call).__name__}.")
        function = call.get("function", call)
        if not isinstance(function, Mapping):
            raise UncountableContentError("A tool call's 'function' must be a mapping with 'name' and 'arguments'.")
        total = TOOL_CALL_FRAMING + self._value(function.get("name"), "a tool call's name")
        total += self._value(function.get("arguments"), "a tool call's arguments")
        total += self._value(call.get("id"), "a tool call's id")
        return total

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message: framing, role, content, name, tool calls and every other field."""
        if not isinstance(message, Mapping):
            raise UncountableContentError(f"A chat message must be a mapping, not {type(message).__name__}.")
        total = MESSAGE_FRAMING + self._value(message.get("role"), "a message's role")
        total += self._content(message.get("content"))
        if message.get("name"):
            total += NAME_TOKENS + self._value(message["name"], "a message's name")
        tool_calls = message.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, (list, tuple)):
                raise UncountableContentError("A message's 'tool_calls' must be a list.")
            total += sum(self._call(call) for call in tool_calls)
        if message.get("function_call"):
            total += self._call(message["function_call"])
        for key, value in message.items():
            if key not in _STRUCTURAL_KEYS:
                total += self._value(value, f"the message field {key!r}")
        return total

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the tool schemas: a preamble plus each schema's compact JSON text and framing."""
        if not tools:
            return 0
        return TOOLS_PREAMBLE + sum(TOOL_SCHEMA_FRAMING + self._value(tool, "a tool schema") for tool in tools)

    def count_messages(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Tokens of a whole request: every message, :data:`REPLY_PRIMING` and the tool schemas."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING + self.count_tools(tools or ())


COUNT_CACHE = 8192
"""Distinct texts whose counts a counter keeps (the exact counters and the conservative
estimator, :class:`CachedCounter`), least recently used out first.
Assembling a context counts the same recent turns, summary and recalled segments again on every
turn (a LoCoMo replay: about 94,000 counts, most of them repeats)."""
COUNT_CACHE_CHARS = 2048
"""Longest text (characters) whose count is kept. The limit bounds the cache's memory: it holds at
most :data:`COUNT_CACHE` × this many characters (about 16.8 million; 32 MB as Python strings of
Chinese text, two bytes a character). Longer texts go to a smaller cache
(:data:`LONG_COUNT_CACHE`)."""
LONG_COUNT_CACHE = 32
"""Distinct texts longer than :data:`COUNT_CACHE_CHARS` and at most :data:`LONG_COUNT_CACHE_CHARS`
whose counts a counter also keeps, least recently used out first. Assembling one context counts
its long texts several times: the memory block as it is built, as its source's share and
inside the system message that joins the blocks, and that message again in the whole request.
On a LoCoMo conv-26 replay (window 4,096) these repeats were most of the tokenizer's time.
Texts are counted again on the next turn, when they have changed."""
LONG_COUNT_CACHE_CHARS = 65_536
"""Longest text (characters) :data:`LONG_COUNT_CACHE` keeps: with it the long-text cache holds at
most about 2.1 million characters. A longer text (a whole pasted document) is counted each time."""


class CachedCounter(MessageCounter):
    """A counter whose text counts are kept: :data:`COUNT_CACHE` distinct texts of at most
    :data:`COUNT_CACHE_CHARS` characters, and :data:`LONG_COUNT_CACHE` longer ones of at most
    :data:`LONG_COUNT_CACHE_CHARS` (least recently used out first, each cache on its own).
    Subclasses provide ``_count``, the uncached count of a non-empty text."""

    def __init__(self) -> None:
        self._cached = functools.lru_cache(maxsize=COUNT_CACHE)(self._count)
        self._cached_long = functools.lru_cache(maxsize=LONG_COUNT_CACHE)(self._count)

    def count_text(self, text: str) -> int:
        """Tokens of ``text`` (a text of at most :data:`LONG_COUNT_CACHE_CHARS` characters counted
        again is answered from the cache)."""
        if not text:
            return 0
        if len(text) <= COUNT_CACHE_CHARS:
            return self._cached(text)
        return self._cached_long(text) if len(text) <= LONG_COUNT_CACHE_CHARS else self._count(text)

    def _count(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

"""Token counting for prompts.

This is the first estimator (issue #2): each Han, Kana or Hangul character counts
as one token, and every other run of text as ``ceil(chars / 4)`` tokens. The
accounting issue (#3) replaces it with exact tokenizers and a conservative
per-script estimator behind the same :class:`TokenCounter` interface.

Message framing follows OpenAI's published rule for chat models ("How to count
tokens with tiktoken", OpenAI Cookbook): about 3 tokens of framing per message
and 3 to prime the reply. We charge 4 per message to stay on the safe side.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any, Mapping, Protocol, Sequence

from memory.errors import ConfigurationError

MESSAGE_FRAMING = 4
"""Tokens charged per message for role and delimiters (OpenAI's rule is 3; we round up)."""
REPLY_PRIMING = 3
"""Tokens that prime the assistant's reply (OpenAI Cookbook)."""

_CJK = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]"
)


class TokenCounter(Protocol):
    """Counts tokens of text and of chat messages for one model family."""

    name: str
    """A short name for logs, e.g. ``first-estimator``."""

    def count_text(self, text: str) -> int:
        """Tokens of a plain string."""
        ...

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message (``role``, ``content``), framing included."""
        ...

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of a whole request's messages, framing and reply priming included."""
        ...


class FirstEstimator:
    """Han/Kana/Hangul one token each; all other text ``ceil(chars / 4)``."""

    name = "first-estimator"

    def count_text(self, text: str) -> int:
        if not text:
            return 0
        cjk = len(_CJK.findall(text))
        return cjk + math.ceil((len(text) - cjk) / 4)

    def count_message(self, message: Mapping[str, Any]) -> int:
        content = message.get("content")
        return MESSAGE_FRAMING + self._content(content) + self.count_text(str(message.get("name") or ""))

    def count_messages(self, messages: Sequence[Mapping[str, Any]]) -> int:
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING

    def _content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, list):
            total = 0
            for part in content:
                if isinstance(part, Mapping) and part.get("type") == "text":
                    total += self.count_text(str(part.get("text", "")))
                else:
                    kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
                    raise ConfigurationError(
                        f"Cannot count tokens of a content part of type {kind!r}; "
                        "only text parts are supported by this estimator."
                    )
            return total
        raise ConfigurationError(f"Cannot count tokens of message content of type {type(content).__name__}.")


def counter_for(model: str | None) -> TokenCounter:
    """The token counter for a litellm model name (``None``: unknown model)."""
    return FirstEstimator()


def json_tokens(counter: TokenCounter, value: Any) -> int:
    """Tokens of a JSON-serialisable value, counted on its compact JSON text."""
    return counter.count_text(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

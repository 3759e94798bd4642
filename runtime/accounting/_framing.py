"""Message framing and the counter protocol: the constants every counter charges per message,
per tool call and per tool schema (tokens), and :class:`TokenCounter`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Protocol

MESSAGE_FRAMING = 4
"""Tokens charged per message for its delimiters, on top of the role's own tokens.

OpenAI Cookbook ("How to count tokens with tiktoken"): 3 per message for gpt-3.5/gpt-4/gpt-4o; we
round up to 4. DeepSeek's chat template uses at most 3 special tokens per turn."""
REPLY_PRIMING = 3
"""Tokens that prime the assistant's reply, once per request (OpenAI Cookbook: 3)."""
NAME_TOKENS = 1
"""Extra tokens for a message's ``name`` field beyond the name's own tokens (OpenAI Cookbook: 1)."""
TOOL_CALL_FRAMING = 10
"""Tokens per tool call beyond its function name and arguments (the call's wrapper in the chat
template, e.g. OpenAI's ``functions.<name>`` recipient header and delimiters, about 7; rounded up)."""
TOOLS_PREAMBLE = 20
"""Tokens charged once when a request carries tool schemas (the tool section's header in the system
turn; litellm's chat-template accounting uses a similar fixed preamble). Rounded up."""
TOOL_SCHEMA_FRAMING = 10
"""Tokens per tool schema beyond its compact JSON text (OpenAI renders schemas as a TypeScript-like
namespace, which is shorter than the JSON we count; the framing covers per-function headers)."""


class TokenCounter(Protocol):
    """Counts tokens of text and of chat messages for one model family.

    Every method returns a number of tokens. Implementations must never count content they do not
    understand as zero: they raise :class:`errors.UncountableContentError` instead.
    """

    name: str
    """A short name for logs, e.g. ``tiktoken:o200k_base`` or ``estimator``."""

    def count_text(self, text: str) -> int:
        """Tokens of a plain string (no framing)."""
        ...

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message (OpenAI format), framing and role included."""
        ...

    def count_messages(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Tokens of a whole request: every message, the reply priming and the tool schemas."""
        ...

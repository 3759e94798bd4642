"""Typed chat messages: what context assembly builds and the replier sends.

A :class:`Message` is a frozen keyword-only value with a ``kind`` discriminator, like its parts
(:class:`TextPart`, :class:`ImagePart`). It converts to the OpenAI chat format that litellm takes
with :meth:`Message.to_openai`, which only the provider boundary (:mod:`runtime.llm`) calls.

A message also reads as that format (it is a read-only ``Mapping``: ``m["role"]``,
``m.get("content")``), so token counting and trimming, which follow the OpenAI shape of every
message they see (tool calls and tool results from the provider included), treat a typed
message and a provider's dict alike. Equality compares that shape.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any, Literal

Role = Literal["system", "user", "assistant", "tool"]


@dataclass(frozen=True, kw_only=True)
class TextPart:
    """Text inside a message whose content is a list of parts."""

    kind: Literal["text"] = "text"
    text: str

    def to_openai(self) -> dict[str, Any]:
        return {"type": "text", "text": self.text}


@dataclass(frozen=True, kw_only=True)
class ImagePart:
    """An image sent as pixels to a vision model."""

    kind: Literal["image"] = "image"
    url: str
    """A ``data:`` URL of the (re-encoded) image bytes."""
    detail: str = "high"
    """OpenAI's ``detail`` (``low``, ``high``, ``auto``): decides the image's token cost."""

    def to_openai(self) -> dict[str, Any]:
        return {"type": "image_url", "image_url": {"url": self.url, "detail": self.detail}}


Part = TextPart | ImagePart


@dataclass(frozen=True)
class StablePrefix:
    """The start of a request that the next request sends again as it is: its first ``messages``
    messages whole, then the first ``chars`` characters of the message after them (0: none of it).
    A provider's prompt cache can reuse it, so cache markers go at its end."""

    messages: int
    chars: int = 0


@dataclass(frozen=True, kw_only=True, eq=False)
class Message(Mapping[str, Any]):
    """One chat message: a role and its content, text or a tuple of parts."""

    kind: Literal["message"] = "message"
    role: Role
    content: str | tuple[Part, ...]
    name: str | None = None
    """An optional participant name (OpenAI ``name``)."""

    @property
    def text(self) -> str:
        """The message's text: the content, or its text parts joined by newlines."""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text for p in self.content if isinstance(p, TextPart))

    def with_content(self, content: str | tuple[Part, ...]) -> Message:
        """The same message with other content."""
        return replace(self, content=content)

    def to_openai(self) -> dict[str, Any]:
        """The OpenAI chat-format dict litellm takes."""
        out: dict[str, Any] = {
            "role": self.role,
            "content": self.content if isinstance(self.content, str) else [p.to_openai() for p in self.content],
        }
        if self.name is not None:
            out["name"] = self.name
        return out

    # -- the read-only OpenAI view ----------------------------------------------------------
    def __getitem__(self, key: str) -> Any:
        return self.to_openai()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self.to_openai())

    def __len__(self) -> int:
        return len(self.to_openai())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, Mapping):
            return self.to_openai() == dict(other)
        return NotImplemented

    __hash__ = None  # type: ignore[assignment]


def to_openai(messages: Any) -> list[dict[str, Any]]:
    """The OpenAI-format dicts of a message list (typed messages converted, dicts copied)."""
    return [m.to_openai() if isinstance(m, Message) else dict(m) for m in messages]


def with_text(message: Mapping[str, Any], text: str) -> Mapping[str, Any]:
    """``message`` with its text content replaced by ``text``, keeping its type."""
    if isinstance(message, Message):
        return message.with_content(text)
    return {**message, "content": text}

"""What a reply's request used of the provider's prompt cache, and what it cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runtime._offline import quietly
from runtime.messages import StablePrefix

if TYPE_CHECKING:
    from runtime.llm._replier import Reply


def cache_usage(usage: Any) -> tuple[int | None, int | None]:
    """The prompt-cache figures of a litellm ``Usage``: ``cached_tokens`` (read from the cache) and
    ``cache_write_tokens`` (written to it). litellm normalizes each provider's fields into
    ``prompt_tokens_details.cached_tokens`` (OpenAI's own; Anthropic's ``cache_read_input_tokens``;
    DeepSeek's ``prompt_cache_hit_tokens``) and ``cache_creation_input_tokens`` (Anthropic's writes);
    the raw fields are read when the normalized one is missing. ``None``: not reported."""
    if usage is None:
        return None, None
    details = getattr(usage, "prompt_tokens_details", None)
    cached = getattr(details, "cached_tokens", None)
    for raw in ("cache_read_input_tokens", "prompt_cache_hit_tokens"):
        cached = cached if cached is not None else getattr(usage, raw, None)
    written = getattr(usage, "cache_creation_input_tokens", None)
    written = written if written is not None else getattr(details, "cache_write_tokens", None)
    return (int(cached) if isinstance(cached, int) else None, int(written) if isinstance(written, int) else None)


def request_cost(model: str, reply: Reply) -> float | None:
    """The price of the request ``reply`` answered, US dollars, by litellm's cost map (bundled:
    ``LITELLM_LOCAL_MODEL_COST_MAP``), cache reads and writes at the model's own prices; ``None``
    when the provider reported no usage or the map does not price the model."""
    if reply.prompt_tokens is None or reply.completion_tokens is None:
        return None
    try:
        prompt, completion = quietly(
            lambda litellm: litellm.cost_per_token(
                model=model,
                prompt_tokens=reply.prompt_tokens,
                completion_tokens=reply.completion_tokens,
                cache_read_input_tokens=reply.cached_tokens or 0,
                cache_creation_input_tokens=reply.cache_write_tokens or 0,
            )
        )
    except Exception:  # litellm raises for a model its map does not know
        return None
    total = float(prompt) + float(completion)
    return total if total > 0 else None


MARKED_PROVIDERS = frozenset({"anthropic", "bedrock", "vertex_ai", "dashscope"})
"""litellm providers whose prompt cache works only where the request marks it (Anthropic's
``cache_control``, which litellm also sends for Claude on Bedrock and Vertex AI, and DashScope's
explicit cache): the others (OpenAI, DeepSeek, xAI, Gemini 2.5) cache on their own."""


def marks_cache(model: str, setting: str = "auto") -> bool:
    """Whether requests to ``model`` carry cache markers: ``setting`` ``on`` or ``off`` says so;
    ``auto`` marks for the providers of :data:`MARKED_PROVIDERS` (by litellm's reading of the
    model string; a string litellm cannot place is not marked)."""
    if setting != "auto":
        return setting == "on"
    try:
        provider = quietly(lambda litellm: litellm.get_llm_provider(model)[1])
    except Exception:  # noqa: BLE001 - an unknown provider is one that gets no markers
        return False
    return provider in MARKED_PROVIDERS


def cache_points(
    messages: Sequence[Mapping[str, Any]], *, ttl: str | None = None, stable: StablePrefix | None = None
) -> list[dict[str, Any]]:
    """litellm's ``cache_control_injection_points`` for one request: a breakpoint on the persona
    (the first system message), one on the last system message of the head (what changes only at
    compactions in the cache layout, every turn in the classic one), one on the newest assistant
    reply (the conversation up to it, which the next request starts with), and one on the newest
    user message when the next request sends it again whole (``stable``: what it sends again,
    :attr:`~runtime.context.AssembledContext.stable_prefix`; ``None``: not known, no breakpoint
    there; a user message that carries what shows for this turn only gets none here: a write of
    all of it would never be read). At most Anthropic's four. Anthropic reads the longest prefix
    an earlier request wrote at a breakpoint, looking back up to 20 blocks from each of this
    request's (Anthropic's prompt-caching guide). ``ttl``: ``5m`` or ``1h`` (Anthropic's cache
    lifetimes; ``None``: the provider's default, 5 minutes)."""
    head = 0
    while head + 1 < len(messages) and messages[head + 1].get("role") == "system":
        head += 1
    points = sorted({0, head}) if messages and messages[0].get("role") == "system" else []
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last_reply is not None and last_reply > head:
        points.append(last_reply)
    newest = stable.messages - 1 if stable is not None else -1
    if 0 <= newest < len(messages) and newest > max(points, default=-1) and messages[newest].get("role") == "user":
        points.append(newest)
    return [{"location": "message", "index": i, "control": _control(ttl)} for i in points]


def cache_marks(
    messages: Sequence[Mapping[str, Any]], *, ttl: str | None = None, stable: StablePrefix | None = None
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """A request to a provider whose cache needs markers: the OpenAI-format ``messages`` to send
    and litellm's ``cache_control_injection_points`` (:func:`cache_points`). When the next request
    sends only the start of the newest user message again (``stable.chars``: the user's text and
    the recall kept under it, not what shows for this turn only), that message goes as two text
    parts, the first carrying a ``cache_control`` breakpoint: the content-part marker litellm
    documents for Anthropic (an injection point marks a message's last part). The text sent is
    the same. ``messages`` is not changed."""
    sent = [dict(m) for m in messages]
    points = cache_points(sent, ttl=ttl, stable=stable)
    if stable is not None and stable.chars > 0 and stable.messages < len(sent):
        message = sent[stable.messages]
        content = message.get("content")
        if message.get("role") == "user" and isinstance(content, str) and 0 < stable.chars < len(content):
            message["content"] = [
                {"type": "text", "text": content[: stable.chars], "cache_control": _control(ttl)},
                {"type": "text", "text": content[stable.chars :]},
            ]
    return sent, points


def _control(ttl: str | None) -> dict[str, Any]:
    return {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}

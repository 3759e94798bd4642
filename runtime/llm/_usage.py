"""What a reply's request used of the provider's prompt cache, and what it cost."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from runtime._offline import quietly

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


def cache_points(messages: Sequence[Mapping[str, Any]], *, ttl: str | None = None) -> list[dict[str, Any]]:
    """litellm's ``cache_control_injection_points`` for one request: a breakpoint on the last
    system message of the head (the persona and what changes only at compactions) and one on the
    newest assistant reply (the conversation up to it, which the next request starts with; the
    newest user message and what is under it change every turn, so no breakpoint goes there).
    At most two of Anthropic's four. ``ttl``: ``5m`` or ``1h`` (Anthropic's cache lifetimes;
    ``None``: the provider's default, 5 minutes)."""
    control: dict[str, Any] = {"type": "ephemeral", **({"ttl": ttl} if ttl else {})}
    head = 0
    while head + 1 < len(messages) and messages[head + 1].get("role") == "system":
        head += 1
    points = [head] if messages and messages[0].get("role") == "system" else []
    last_reply = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=None)
    if last_reply is not None and last_reply > head:
        points.append(last_reply)
    return [{"location": "message", "index": i, "control": control} for i in points]

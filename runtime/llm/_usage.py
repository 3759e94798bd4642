"""What a reply's request used of the provider's prompt cache, and what it cost."""

from __future__ import annotations

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

"""Model calls: the reply step of a turn.

:class:`LiteLLMReplier` calls any model litellm supports. litellm's exceptions are
mapped to :class:`~memory.errors.ModelCallError` in :func:`map_model_error`, the
one place that does it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol, Sequence

from memory.errors import ModelCallError


@dataclass(frozen=True, kw_only=True)
class Reply:
    """The assistant's reply to one request."""

    content: str
    prompt_tokens: int | None = None
    """Prompt tokens the provider reported for the request, if it did."""
    completion_tokens: int | None = None
    """Completion tokens the provider reported, if it did."""


class Replier(Protocol):
    """Produces the assistant's reply to an assembled message list."""

    def reply(self, messages: Sequence[dict[str, Any]], *, session_id: str) -> Reply:
        """Raises :class:`~memory.errors.ModelCallError` when no reply can be had."""
        ...


def map_model_error(exc: BaseException, *, model: str, session_id: str) -> ModelCallError:
    """Turn an exception from litellm (or the network under it) into a :class:`ModelCallError`."""
    status = getattr(exc, "status_code", None)
    detail = str(exc).splitlines()[0] if str(exc) else ""
    where = f" (HTTP {status})" if status else ""
    return ModelCallError(
        f"The model {model!r} did not reply{where}: {type(exc).__name__}: {detail[:500]}", session_id=session_id
    )


class LiteLLMReplier:
    """Replies through ``litellm.completion``.

    Args:
        model: a litellm model string, e.g. ``gpt-4o-mini`` or ``openai/my-model``.
        api_base: base URL of an OpenAI-compatible server, or ``None`` for the provider's.
        timeout: seconds to wait for the whole reply.
        extra: more keyword arguments for ``litellm.completion`` (e.g. ``mock_response``).
    """

    def __init__(self, *, model: str, api_base: str | None = None, timeout: float = 60.0, **extra: Any) -> None:
        self.model = model
        self.api_base = api_base
        self.timeout = timeout
        self.extra = extra

    def reply(self, messages: Sequence[dict[str, Any]], *, session_id: str) -> Reply:
        import litellm

        try:
            response = litellm.completion(
                model=self.model,
                messages=list(messages),
                api_base=self.api_base,
                timeout=self.timeout,
                num_retries=0,
                **self.extra,
            )
        except Exception as exc:  # every litellm/httpx/openai error becomes one ModelCallError
            raise map_model_error(exc, model=self.model, session_id=session_id) from exc
        content = response.choices[0].message.content or ""
        usage = getattr(response, "usage", None)
        return Reply(
            content=content,
            prompt_tokens=getattr(usage, "prompt_tokens", None),
            completion_tokens=getattr(usage, "completion_tokens", None),
        )

"""Embedders behind an API (litellm's ``embedding()``), and what retrieval calls cost a turn.

:class:`LiteLLMEmbedder` is an :class:`memory.embeddings.Embedder` for any model litellm embeds
with: ``openai/text-embedding-3-small``, ``dashscope/text-embedding-v4``, ``ollama/bge-m3``,
``openai/<name>`` with an ``api_base`` for any OpenAI-compatible server (vLLM, TEI, Xinference,
Infinity, LM Studio), and the rest of litellm's providers. :func:`is_api_model` tells such a name
from a sentence-transformers one.

Each call is cut into requests of at most ``batch`` texts (:func:`provider_batch`: the provider's
own limit where we know it), each retried after a rate limit, a 5xx, a timeout or a lost connection
within one time budget (:class:`~runtime.llm.RetryPolicy`); what still fails raises
:class:`~errors.EmbedderUnavailableError`, and for ``down_seconds`` after that every call fails at
once with it, so that a down API costs each turn nothing but a log line
(the turn then recalls by full text and dates; the vectors come later, :mod:`memory.backfill`).

Costs: each request's price by litellm's cost map is added to the :class:`Spend` of the current
:func:`metered` block (a turn's), where there is one.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import contextvars
import math
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import structlog

from errors import EmbedderUnavailableError, ModelUnavailableError
from runtime._offline import load_litellm
from runtime.llm._errors import map_model_error
from runtime.llm._replier import RetryPolicy

log = structlog.get_logger("companion.embedder")

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=8, thread_name_prefix="companion-embeddings")
"""Where embeddings requests run, so that a caller stops waiting at the request's timeout."""

PROVIDER_BATCH = {
    "openai": 2048,
    "azure": 2048,
    "dashscope": 10,
    "cohere": 96,
    "voyage": 128,
    "gemini": 100,
    "mistral": 512,
}
"""Most texts in one request, by litellm provider, from each provider's API reference (OpenAI's
embeddings ``input`` array: 2,048; DashScope text-embedding-v3/v4: 10; Cohere embed: 96; Voyage:
128; Gemini batchEmbedContents: 100; Mistral: 512). Others: :data:`DEFAULT_BATCH`."""
DEFAULT_BATCH = 32
"""Texts per request for a provider without a known limit (Ollama, Zhipu, vLLM, TEI, ...)."""
DOWN_SECONDS = 30.0
"""After a failure, seconds during which every call fails at once (a down API is not asked again
by every turn)."""
MAX_CHARS = 2048
"""Characters of a text sent to an embeddings API; the rest is cut. Providers refuse an input over
their model's limit (OpenAI's: 8,191 tokens), and 2,048 characters stay under it even at 3 tokens
a character (emoji, rare CJK); a key needs no more (the bundled model reads 256 tokens of a text)."""
PROBE_TEXT = "dimension probe"
"""The text embedded once at start-up to learn a model's dimension when it is not configured."""


def is_api_model(name: str) -> bool:
    """Whether ``name`` is a litellm model (``provider/model``, the provider one litellm knows)
    rather than a sentence-transformers name or folder. A folder that exists is always local,
    and so is a name without a ``/`` (the bundled ``all-MiniLM-L6-v2``); ``BAAI/bge-m3`` is a
    hub name (``BAAI`` is no litellm provider), ``ollama/bge-m3`` an API model."""
    prefix, slash, rest = name.partition("/")
    if not slash or not rest or Path(name).expanduser().exists():
        return False
    return prefix in _providers()


def _providers() -> frozenset[str]:
    litellm = load_litellm()
    return frozenset(p.value for p in litellm.LlmProviders)


def provider_batch(model: str) -> int:
    """Texts per request for ``model`` (:data:`PROVIDER_BATCH`, else :data:`DEFAULT_BATCH`)."""
    return PROVIDER_BATCH.get(model.partition("/")[0], DEFAULT_BATCH)


@dataclass
class Spend:
    """What the embedding and rerank calls of one block cost, US dollars by litellm's cost map."""

    embedding_usd: float | None = None
    """``None``: no priced embedding request (none made, or the model is not in the map)."""
    rerank_usd: float | None = None
    embedded_texts: int = 0
    """Texts sent to an embeddings API."""

    @property
    def usd(self) -> float | None:
        """Both together; ``None`` when neither was priced."""
        if self.embedding_usd is None and self.rerank_usd is None:
            return None
        return (self.embedding_usd or 0.0) + (self.rerank_usd or 0.0)

    def add(self, kind: str, usd: float | None) -> None:
        if usd is None:
            return
        if kind == "rerank":
            self.rerank_usd = (self.rerank_usd or 0.0) + usd
        else:
            self.embedding_usd = (self.embedding_usd or 0.0) + usd


_spend: contextvars.ContextVar[Spend | None] = contextvars.ContextVar("companion_retrieval_spend", default=None)


@contextlib.contextmanager
def metered() -> Iterator[Spend]:
    """A block whose embedding and rerank calls (in this thread or context) add their cost to the
    :class:`Spend` it yields."""
    spend = Spend()
    token = _spend.set(spend)
    try:
        yield spend
    finally:
        _spend.reset(token)


def current_spend() -> Spend | None:
    """The :class:`Spend` of the innermost :func:`metered` block, or ``None`` outside one."""
    return _spend.get()


def charge(kind: str, usd: float | None, texts: int = 0) -> None:
    """Add ``usd`` (an ``embedding`` or ``rerank`` call's cost) to the current :func:`metered` block, if any."""
    spend = _spend.get()
    if spend is not None:
        spend.add(kind, usd)
        spend.embedded_texts += texts


def response_cost(response: Any) -> float | None:
    """A litellm response's price by its cost map, as litellm computed it (``_hidden_params``)."""
    hidden = getattr(response, "_hidden_params", None) or {}
    cost = hidden.get("response_cost") if isinstance(hidden, dict) else None
    return float(cost) if isinstance(cost, (int, float)) and math.isfinite(cost) else None


class LiteLLMEmbedder:
    """An :class:`~memory.embeddings.Embedder` calling an embeddings API through litellm.

    Args:
        model: a litellm model (``openai/text-embedding-3-small``, ``ollama/bge-m3``, ...).
        api_base: the server's base URL (``None``: the provider's own).
        api_key: its key (``None``: the provider's usual variable, ``OPENAI_API_KEY``, ...).
        dimension: the vectors' length. Sent as ``dimensions`` when ``send_dimension`` (OpenAI's
            text-embedding-3, DashScope v3/v4 take it); ``None``: learned by embedding
            :data:`PROBE_TEXT` once, here.
        batch: most texts per request (``None``: :func:`provider_batch`).
        timeout: seconds one request may take.
        retry: the retries and their time budget, per call.
        down_seconds: after a failure, seconds during which calls fail at once.

    Raises:
        EmbedderUnavailableError: (construction) ``dimension`` is ``None`` and the probe failed.
    """

    def __init__(
        self,
        model: str,
        *,
        api_base: str | None = None,
        api_key: str | None = None,
        dimension: int | None = None,
        send_dimension: bool = False,
        batch: int | None = None,
        timeout: float = 10.0,
        retry: RetryPolicy | None = None,
        down_seconds: float = DOWN_SECONDS,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        if batch is not None and batch < 1:
            raise ValueError(f"batch must be at least 1, got {batch}")
        self.name = model
        self.api_base = api_base
        self.api_key = api_key
        self.batch = batch or provider_batch(model)
        self.timeout = timeout
        self.retry = retry or RetryPolicy(retries=2, total_seconds=8.0)
        self.down_seconds = down_seconds
        self.sleep = sleep
        self.send_dimension = send_dimension and dimension is not None
        self._down_until = 0.0
        self._down_reason = ""
        self._lock = threading.Lock()
        self.requests = 0
        """Requests sent so far."""
        self.dimension = dimension if dimension is not None else len(self._request([PROBE_TEXT], check=False)[0])

    @property
    def down(self) -> bool:
        """Whether calls fail at once now (a failure less than ``down_seconds`` ago)."""
        return time.monotonic() < self._down_until

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One unit vector per text, in order, ``batch`` texts per request.

        Raises:
            EmbedderUnavailableError: a request failed after its retries, the API answered vectors
                of another length than ``dimension``, or a failure less than ``down_seconds`` ago.
        """
        if not texts:
            return []
        with self._lock:
            if self.down:
                raise EmbedderUnavailableError(
                    f"The embeddings API of {self.name!r} failed {self._down_reason}; not asked again for "
                    f"{self._down_until - time.monotonic():.0f} s.",
                    model=self.name,
                )
        out: list[list[float]] = []
        for start in range(0, len(texts), self.batch):
            out.extend(self._request(texts[start : start + self.batch]))
        return out

    def _request(self, texts: Sequence[str], *, check: bool = True) -> list[list[float]]:
        """One request with the bounded retries; a failure marks the API down."""
        started = time.monotonic()
        attempt = 0
        while True:
            attempt += 1
            try:
                response = self._once(texts)
                break
            except Exception as exc:  # litellm, openai and httpx errors: classified below
                error = map_model_error(exc, model=self.name, session_id=None)
                elapsed = time.monotonic() - started
                delay = self.retry.delay(attempt, getattr(error, "retry_after", None))
                transient = isinstance(error, ModelUnavailableError) or isinstance(exc, TimeoutError)
                if transient and attempt <= self.retry.retries and elapsed + delay <= self.retry.total_seconds:
                    log.warning(
                        "embedder.retry",
                        model=self.name,
                        attempt=attempt,
                        status=error.status,
                        error=type(exc).__name__,
                        delay_seconds=round(delay, 3),
                    )
                    self.sleep(delay)
                    continue
                raise self._failed(
                    f"after {attempt} attempt{'s' if attempt != 1 else ''} in {elapsed:.1f} s "
                    f"({type(exc).__name__}{f', HTTP {error.status}' if error.status else ''})",
                    error.status,
                ) from exc
        vectors = [[float(x) for x in item["embedding"]] for item in sorted(response.data, key=_index)]
        if len(vectors) != len(texts):
            raise self._failed(f"with {len(vectors)} vectors for {len(texts)} texts", None)
        if check:
            wrong = next((len(v) for v in vectors if len(v) != self.dimension), None)
            if wrong is not None:
                raise self._failed(
                    f"with vectors of {wrong} dimensions where the stored ones have {self.dimension} "
                    "(another model or COMPANION_EMBEDDING_DIMENSIONS behind the same name?)",
                    None,
                )
        charge("embedding", response_cost(response), texts=len(texts))
        return [_unit(v) for v in vectors]

    def _once(self, texts: Sequence[str]) -> Any:
        """One request, given up after ``timeout`` seconds whatever the client does (litellm's own
        timeout was seen to wait for a stalled server's answer); a late answer is dropped."""
        self.requests += 1
        future = _POOL.submit(contextvars.copy_context().run, self._post, texts)
        try:
            return future.result(timeout=self.timeout)
        except concurrent.futures.TimeoutError:
            future.cancel()
            raise TimeoutError(f"no answer in {self.timeout:g} s") from None

    def _post(self, texts: Sequence[str]) -> Any:
        litellm = load_litellm()
        extra: dict[str, Any] = {"dimensions": self.dimension} if self.send_dimension else {}
        return litellm.embedding(
            model=self.name,
            input=[t[:MAX_CHARS] if t.strip() else " " for t in texts],  # providers refuse an empty input
            api_base=self.api_base,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=0,
            drop_params=True,
            **extra,
        )

    def _failed(self, how: str, status: int | None) -> EmbedderUnavailableError:
        with self._lock:
            self._down_until = time.monotonic() + self.down_seconds
            self._down_reason = how
        return EmbedderUnavailableError(
            f"The embeddings API of {self.name!r} failed {how}.", model=self.name, status=status
        )


def _index(item: Any) -> int:
    return int(item["index"]) if isinstance(item, dict) and "index" in item else 0


def _unit(vector: list[float]) -> list[float]:
    norm = math.sqrt(sum(x * x for x in vector))
    return [x / norm for x in vector] if norm > 0 else vector

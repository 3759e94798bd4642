"""SQLModel tables. The schema itself is created by the Alembic migration in ``migrations/``.

Units: ``*_tokens`` fields are tokens; ``*_at`` fields are timezone-aware UTC timestamps.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta, timezone
from enum import Enum
from typing import Any

from sqlalchemy import BigInteger, Column, DateTime, Text
from sqlalchemy.dialects.postgresql import ARRAY, JSONB, TSVECTOR
from sqlmodel import Field, SQLModel

from memory.vectors import Vector

SummaryItemJSON = dict[str, str | int | None]
"""One flat summary entry as stored in ``summaries.items``: a JSON object of strings, integers
and nulls. Its shapes (user quote, assistant line, note) are defined, and converted to typed
values, by the runtime (``runtime.summary_items``); storage reads only ``seq``, ``role`` and
``text`` (carrying a summary into a new session)."""


def utcnow() -> datetime:
    """The current time, timezone-aware UTC."""
    return datetime.now(UTC)


class TurnState(str, Enum):  # noqa: UP042  (str() and format() keep the member's qualified name)
    """Where a stored turn stands. Compaction changes the state; it never deletes a turn."""

    context = "context"
    """The turn is in the recent window."""
    summarized = "summarized"
    """The turn was rolled out: it is archived verbatim and merged into the summary."""
    archived = "archived"
    """The turn was rolled out while the breaker was open: archived verbatim, not summarized."""


class App(SQLModel, table=True):
    """A client application of the HTTP API, with one API key."""

    __tablename__ = "apps"

    id: str = Field(primary_key=True, max_length=200)
    name: str = Field(max_length=200, unique=True)
    key_hash: str = Field(max_length=64, unique=True)
    """SHA-256 (hex) of the API key; the key itself is never stored."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class User(SQLModel, table=True):
    __tablename__ = "users"

    id: str = Field(primary_key=True, max_length=200)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))
    # -- app scoping ---------------------------------------------------------------
    app_id: str | None = Field(default=None, foreign_key="apps.id", max_length=200)
    """The app that owns this user (HTTP API); ``None`` for CLI and replay users."""
    external_id: str | None = Field(default=None, max_length=200)
    """The id the owning app knows the user by (unique per app); ``id`` is server-generated."""
    erasing_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    """When an erasure of the user began (migration 0022); no new turn of theirs starts after it."""


class Character(SQLModel, table=True):
    """A character: the deployment's (``app_id`` ``None``), an app's, or one user's own (``owner_id``)
    (migration 0020). Its cards are its revisions; the newest is :attr:`revision`."""

    __tablename__ = "characters"

    id: str = Field(primary_key=True, max_length=40)
    """``ch_`` plus 32 hex digits."""
    app_id: str | None = Field(default=None, foreign_key="apps.id", max_length=200)
    """The app it belongs to; ``None``: the deployment's, seen (not changed) by every app."""
    owner_id: str | None = Field(default=None, foreign_key="users.id", max_length=200)
    """The user whose own character it is (only they see it); ``None``: every user of the app may talk with it."""
    name: str = Field(max_length=200)
    revision: int = 0
    """The newest revision; 0: none yet (a character made from an old session's persona name,
    which speaks as the deployment's default character until it is given a card)."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))
    updated_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class CharacterRevision(SQLModel, table=True):
    """One revision of a character's card: written once, never changed."""

    __tablename__ = "character_revisions"

    character_id: str = Field(primary_key=True, foreign_key="characters.id", max_length=40)
    revision: int = Field(primary_key=True)
    spec: str = Field(max_length=20)
    """What the card was read from (``persona.CARD_KINDS``)."""
    card: dict[str, Any] = Field(sa_column=Column(JSONB, nullable=False))
    """The Character Card ``data`` object (V2/V3 field names)."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class ChatSession(SQLModel, table=True):
    """One conversation between one user and one character."""

    __tablename__ = "sessions"

    id: str = Field(primary_key=True, max_length=200)
    user_id: str = Field(foreign_key="users.id", index=True, max_length=200)
    character_id: str = Field(foreign_key="characters.id", max_length=40)
    """The character this session talks as."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))
    # -- session life cycle ----------------------------------------------------------
    closed_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    """When the session was closed (it takes no new turns); ``None`` while open."""
    closed_by: str | None = Field(default=None, max_length=200)
    """Who closed it: a close-job worker id, or ``api``."""
    turn_owner: str | None = Field(default=None, max_length=64)
    """The running turn's claim (:meth:`memory.sessions.Sessions.claim`); ``None`` when no turn runs."""
    turn_claimed_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    """When that claim was taken (it lapses after the lease, in case its process died)."""
    last_activity_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))
    """Wall-clock time of the newest stored turn (or of creation): the close job's idleness test."""
    carried_from: str | None = Field(default=None, max_length=200)
    """The previous session whose summary this one started from, if any."""
    recall_block: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """The memory block the cache layout keeps in the session's prompt (migration 0024);
    ``None``: none kept."""
    recall_segments: list[int] | None = Field(default=None, sa_column=Column(ARRAY(BigInteger), nullable=True))
    """The archive segment ids ``recall_block`` and ``recall_tails`` quote."""
    recall_anchor: int | None = None
    """The ``seq`` of the user turn ``recall_block`` sits under."""
    recall_tails: list[dict] | None = Field(default=None, sa_column=Column(JSONB, nullable=True))
    """The recall tails kept under the user turns since ``recall_anchor``, oldest first: objects
    ``{"anchor": seq, "text": str, "segments": [id]}`` (migration 0026)."""
    recall_prefix: str | None = Field(default=None, max_length=64)
    """A fingerprint of the prompt before ``recall_block`` when it was built (``None``: not known)."""


class Turn(SQLModel, table=True):
    """One message in a session, stored verbatim."""

    __tablename__ = "turns"

    id: int | None = Field(default=None, primary_key=True)
    session_id: str = Field(foreign_key="sessions.id", max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    """The session's user (migration 0021: every row a turn reads carries its user; ``None`` when
    written: the session's, by the database)."""
    seq: int
    """Per-session sequence number, from 1, in the order turns were stored."""
    role: str = Field(max_length=20)
    """``user``, ``assistant`` or ``system``."""
    content: str = Field(sa_column=Column(Text, nullable=False))
    tokens: int
    """Estimated tokens of this message, framing included."""
    usage_prompt_tokens: int | None = None
    """The provider's reported prompt tokens for the request that produced this turn, if known."""
    usage_completion_tokens: int | None = None
    """The provider's reported completion tokens for this turn, if known."""
    usage_cached_tokens: int | None = None
    """Prompt tokens the provider read from its prompt cache for that request, if it said (migration 0023)."""
    usage_cache_write_tokens: int | None = None
    """Prompt tokens the provider wrote to its prompt cache for that request, if it said."""
    usage_cost_usd: float | None = None
    """That request's price by litellm's cost map, US dollars; ``None`` when not priced."""
    usage_retrieval_cost_usd: float | None = None
    """What the turn's embedding and rerank calls cost by litellm's cost map, US dollars; ``None``
    when none was made or none is priced (a local model) (migration 0025)."""
    request_estimate_tokens: int | None = None
    """Our raw (uncalibrated) estimate of the request that produced this turn, tokens."""
    request_messages: int | None = None
    """How many messages that request had."""
    request_fingerprint: str | None = Field(default=None, max_length=64)
    """SHA-256 of that request's messages (see ``runtime.accounting.fingerprint``)."""
    interrupted: bool = False
    """True for an assistant reply whose stream broke off; ``content`` is what arrived."""
    state: TurnState = Field(default=TurnState.context, max_length=20)
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))
    """When the turn was said (for replays, the source's date)."""
    utc_offset_minutes: int | None = None
    """The UTC offset the turn's time was given with, minutes (``+08:00``: 480); ``None`` when it
    was not given (the server's clock) (migration 0019)."""
    character_revision: int | None = None
    """The revision of the session's character the turn was made with (migration 0020)."""

    def local_created_at(self) -> datetime:
        """:attr:`created_at` at the offset it was given with (UTC when none was)."""
        return created_at_offset(self.created_at, self.utc_offset_minutes)


def offset_minutes(at: datetime | None) -> int | None:
    """The UTC offset ``at`` was given with, whole minutes; ``None`` for no time or a naive one."""
    offset = at.utcoffset() if at is not None else None
    return None if offset is None else int(offset.total_seconds() // 60)


def created_at_offset(at: datetime, offset_minutes: int | None) -> datetime:
    """``at`` (aware) at ``offset_minutes`` from UTC; UTC when ``None``."""
    zone = timezone(timedelta(minutes=offset_minutes)) if offset_minutes is not None else UTC
    return (at if at.tzinfo is not None else at.replace(tzinfo=UTC)).astimezone(zone)


class TurnVector(SQLModel, table=True):
    """The embedding of one turn's text (``turns.content`` as stored), kept so the text is embedded once.

    A user turn's row is its recall query's vector, written with the turn; the others are
    written by the compaction that archives the turn. Recall queries and archive keys are
    built from these (:func:`memory.archive.compose_window`). Deleted with its turn.
    """

    __tablename__ = "turn_vectors"

    turn_id: int = Field(primary_key=True, foreign_key="turns.id", ondelete="CASCADE")
    user_id: str | None = Field(default=None, max_length=200)
    """The turn's user (``None`` when written: the turn's, by the database)."""
    embedding: Any = Field(sa_column=Column(Vector(), nullable=False))
    """``vector(N)``, N the archive's; unit length."""


class Summary(SQLModel, table=True):
    """The one current flat summary of a session's rolled-out turns."""

    __tablename__ = "summaries"

    session_id: str = Field(primary_key=True, foreign_key="sessions.id", max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    """The session's user (``None`` when written: the session's, by the database)."""
    content: str = Field(sa_column=Column(Text, nullable=False))
    """The rendered summary, as it enters the prompt."""
    items: list[SummaryItemJSON] = Field(default_factory=list, sa_column=Column(JSONB, nullable=False))
    """The summary's flat entries, oldest first (see :data:`SummaryItemJSON`); merged, never nested."""
    first_seq: int
    """First turn seq the summary covers."""
    last_seq: int
    """Last turn seq the summary covers (the roll-out boundary)."""
    tokens: int
    """Estimated tokens of ``content``."""
    dropped_quotes: int = 0
    """User quotes left out so far to keep the summary within its cap (they stay archived)."""
    updated_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class ArchivedSegment(SQLModel, table=True):
    """Verbatim rolled-out turns of one exchange, embedded for recall."""

    __tablename__ = "archived_segments"

    id: int | None = Field(default=None, primary_key=True)
    user_id: str = Field(foreign_key="users.id", max_length=200)
    session_id: str = Field(foreign_key="sessions.id", max_length=200)
    character_id: str = Field(foreign_key="characters.id", max_length=40)
    """The session's character: recall reads one character's segments (or, with the memory scope
    ``user``, all of the user's)."""
    first_seq: int
    last_seq: int
    content: str = Field(sa_column=Column(Text, nullable=False))
    """The turns verbatim, one ``Role: text`` line each."""
    tokens: int
    """Estimated tokens of ``content``."""
    session_date: datetime = Field(sa_type=DateTime(timezone=True))
    """When the segment's first turn was said."""
    embedding: Any = Field(sa_column=Column(Vector(), nullable=True))
    """``vector(N)``; N is fixed by the migration from the embedding model. ``None`` (migration
    0025) while the embedder was down when the segment was archived, until the embeddings
    backfill composes it (:mod:`memory.backfill`)."""
    search: Any = Field(default=None, sa_column=Column(TSVECTOR, nullable=False))
    """Full-text lexemes of ``content``: written as :func:`memory.fulltext.search_vector` (English
    stems by PostgreSQL, CJK words by jieba), matched by recall."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class CompactionState(SQLModel, table=True):
    """Per-session circuit-breaker state for compaction."""

    __tablename__ = "compaction_state"

    session_id: str = Field(primary_key=True, foreign_key="sessions.id", max_length=200)
    user_id: str | None = Field(default=None, max_length=200)
    """The session's user (``None`` when written: the session's, by the database)."""
    consecutive_failures: int = 0
    breaker_opened_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    """Set when the breaker opened; ``None`` while it is closed."""
    last_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    recent_errors: list[str] = Field(default_factory=list, sa_column=Column(JSONB, nullable=False, server_default="[]"))
    """Reasons of the current run of consecutive failures, oldest first (at most the threshold)."""
    compactions: int = 0
    """Successful compactions so far."""


# -- pinned user profiles (knowledge_chunks has no table class: memory.knowledge reads and writes it) --
class UserProfile(SQLModel, table=True):
    """A user's pinned profile, shared by every character, rendered first in the ``memory`` source
    (migration 0006). Facts learned from summaries are kept per character (``learned_facts``,
    :meth:`memory.profiles.Profiles.learned`)."""

    __tablename__ = "user_profiles"

    user_id: str = Field(primary_key=True, foreign_key="users.id", max_length=200)
    name: str | None = Field(default=None, max_length=200)
    """What the user wants to be called; also what ``{{user}}`` becomes."""
    pronouns: str | None = Field(default=None, max_length=100)
    facts: list[str] = Field(default_factory=list, sa_column=Column(JSONB, nullable=False, server_default="[]"))
    """Facts the user or app set; only an explicit set changes them."""
    time_zone: str | None = Field(default=None, max_length=100)
    """The user's IANA time zone (``Asia/Shanghai``), set by the user or app (migration 0019)."""
    updated_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


# -- stored files ---------------------------------------------------------------
class ParseState(str, Enum):  # noqa: UP042  (str() and format() keep the member's qualified name)
    """Where a stored file's parse stands. ``ready``, ``empty``, ``needs_ocr`` and ``failed`` are final."""

    pending = "pending"
    """Stored; no parse has started."""
    parsing = "parsing"
    """A parser claimed it (``parse_started_at``) and is running."""
    ready = "ready"
    """The extract holds text."""
    empty = "empty"
    """Parsed, and there is no text at all (``EXTRACT_EMPTY``)."""
    needs_ocr = "needs_ocr"
    """A PDF with pages but no text layer (scanned); its text needs OCR."""
    failed = "failed"
    """Corrupt, encrypted or unsupported; ``parse_error`` says why."""


FINAL_PARSE_STATES: frozenset[str] = frozenset(
    s.value for s in (ParseState.ready, ParseState.empty, ParseState.needs_ocr, ParseState.failed)
)
"""The parse states that end a wait, as strings."""


class Durability(str, Enum):  # noqa: UP042  (str() and format() keep the member's qualified name)
    """How long a file id stays valid."""

    durable = "durable"
    """Stored until deleted; may be edited or re-exported."""
    ephemeral = "ephemeral"
    """Valid only for its session (``session_id``) or request."""


class FileRow(SQLModel, table=True):
    """One stored document of one user. The bytes are the blob of ``sha256`` in the blob store (:mod:`memory.blobs`)."""

    __tablename__ = "files"

    id: str = Field(primary_key=True, max_length=40)
    """``file_`` plus 20 hex characters."""
    user_id: str = Field(foreign_key="users.id", max_length=200)
    name: str = Field(max_length=255)
    """The file name as uploaded (no directories)."""
    mime: str = Field(max_length=200)
    size_bytes: int
    """Size of the stored bytes, bytes."""
    sha256: str = Field(max_length=64)
    """Hex SHA-256 of the bytes."""
    blob_path: str = Field(max_length=200)
    """The blob's key, ``<sha[:2]>/<sha>`` (content-addressed; the object key in an S3 bucket, under its prefix)."""
    durability: Durability = Field(default=Durability.durable, max_length=20)
    session_id: str | None = Field(default=None, max_length=200)
    """For an ephemeral id: the session it is valid in (``None``: the request only)."""
    parse_state: ParseState = Field(default=ParseState.pending, max_length=20)
    parse_error: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    parse_started_at: datetime | None = Field(default=None, sa_type=DateTime(timezone=True))
    parse_attempts: int = Field(default=0, sa_column_kwargs={"server_default": "0"})
    """Parser claims since the bytes last changed; a claim past :data:`memory.file_parses.MAX_PARSE_ATTEMPTS` fails the file."""
    page_count: int | None = None
    """Pages in ``extract``, once parsed."""
    extract: str | None = Field(default=None, sa_column=Column(Text, nullable=True))
    """The parsed text: pages separated by ``--- page N ---`` lines (``runtime.parsing.serialize``)."""
    body_start_page: int | None = None
    """First page after the front matter (outline, table-of-contents heuristic or catalog), 1-based."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))


class TurnFile(SQLModel, table=True):
    """A file carried by a stored turn. Rows across sessions are the file's reference count."""

    __tablename__ = "turn_files"

    turn_id: int = Field(foreign_key="turns.id", primary_key=True)
    file_id: str = Field(foreign_key="files.id", primary_key=True, max_length=40)
    user_id: str | None = Field(default=None, max_length=200)
    """The turn's user (``None`` when written: the turn's, by the database)."""
    position: int = 0
    """Order of the file among the turn's attachments, from 0."""


class ImageTranscript(SQLModel, table=True):
    """The cached description of one image file: written once, read by every later request.

    The file id is the anchor (``turn_files``); this row is only a cache and goes with its file."""

    __tablename__ = "image_transcripts"

    file_id: str = Field(foreign_key="files.id", primary_key=True, max_length=40)
    text: str = Field(sa_column=Column(Text, nullable=False))
    """The description, never empty."""
    method: str = Field(max_length=20)
    """Which step of the fallback chain wrote it: ``primary``, ``backup``, ``direct``, ``ocr``, ``ocr_model``."""
    model: str | None = Field(default=None, max_length=200)
    """The model that wrote it (``None`` for local OCR)."""
    created_at: datetime = Field(default_factory=utcnow, sa_type=DateTime(timezone=True))

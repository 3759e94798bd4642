"""The one exception hierarchy of companion-runtime.

It lives in its own top-level package, beneath every other one: storage (``memory``),
the pure packages (``persona``, ``runtime.accounting``, ``runtime.context``) and the
provider boundary (``runtime.llm``) all raise these classes, and ``errors`` imports
nothing of the project. So a pure package can raise without importing storage, and
data still flows one way. Errors from third-party libraries are mapped to these in one
place each: litellm in :mod:`runtime.llm`, psycopg/SQLAlchemy in :mod:`memory.database`.

::

    CompanionError
    ├── UsageError                  a mistake by the developer or operator; fix the call or the config
    │   ├── ConfigurationError      a COMPANION_* setting or DATABASE_URL is missing or invalid
    │   ├── UnknownModelError       the model name is not known and no override was given
    │   ├── SchemaError             the database schema is missing or behind; run `companion db upgrade`
    │   ├── EmbeddingDimensionMismatch  table vector(N) differs from the embedding model's dimension
    │   │   └── EmbeddingModelMismatch  the stored vectors were made by another embedding model
    │   ├── DatabaseInUseError      other runtime processes are connected; stop them first (`db reembed`)
    │   ├── PersonaError            a persona file (card JSON/PNG, TOML, YAML) is missing a field or malformed
    │   ├── KnowledgeFileError      a file given to `companion kb add` is missing, unreadable, unsupported, binary or not UTF-8
    │   ├── SessionOwnershipError   the session id belongs to another user
    │   ├── InvalidMessageError     a message has NUL bytes, invalid UTF-8, or is too large
    │   ├── InvalidRequestError     an HTTP API request is missing or misuses a field
    │   │   └── InvalidFieldError   a text field holds NUL, a lone surrogate, or too many characters
    │   ├── AuthenticationError     no API key, or one no app has (HTTP 401)
    │   ├── NotFoundError           no such user or session for this app (HTTP 404)
    │   ├── SessionClosedError      the session was closed; it takes no new turns
    │   ├── TurnInProgressError     another turn (or an edit, a close) of the session is running
    │   └── FileError               a stored-file operation cannot be done as asked
    │       ├── FileInputError      an upload or a file_read argument is bad (name, size, page, limit)
    │       ├── FileNotFound        no such file id for this user (unknown and foreign ids alike)
    │       └── FileParseError      the bytes are corrupt, encrypted or of no supported format
    └── TurnError                   a failure while a turn runs; the user turn is already stored
        ├── ModelCallError          the chat model call failed (network, provider, timeout)
        │   ├── ModelAuthError      401/403: the API key is missing, wrong or not allowed; not retried
        │   ├── ModelRequestError   the provider refused the request (400, 404, 422, policy); not retried
        │   ├── ModelUnavailableError  429, 5xx, timeout or lost connection, still failing after bounded retries
        │   └── ContextOverflowError   the provider said the prompt is too long, again after one harder compaction
        ├── SummarizationError      a summarizer raised or produced an invalid summary
        └── StorageError            the database refused or lost a write
"""

from __future__ import annotations


class CompanionError(Exception):
    """Root of every error this package raises on purpose."""


class UsageError(CompanionError):
    """A mistake in how the runtime is called or configured; nothing ran."""


class ConfigurationError(UsageError):
    """A setting (environment variable or argument) is missing or invalid.

    Attributes:
        setting: the environment variable or argument name, e.g. ``COMPANION_BUDGET_RECENT``.
    """

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class UnknownModelError(UsageError):
    """The model name is unknown to litellm and no context window override was given."""

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message)
        self.model = model


class SchemaError(UsageError):
    """The database has no schema, or an older one than this code expects."""


class EmbeddingDimensionMismatch(UsageError):
    """The archive table's ``vector(N)`` differs from the embedding model's dimension.

    Attributes:
        table_dim: N in the table's ``vector(N)`` column.
        model_dim: the dimension the embedding model produces.
    """

    def __init__(self, *, table: str, table_dim: int, model_dim: int, model_name: str) -> None:
        super().__init__(
            f"The table {table!r} stores vector({table_dim}) embeddings, but the embedding model "
            f"{model_name!r} produces {model_dim} dimensions. Use an embedding model with "
            f"{table_dim} dimensions (COMPANION_EMBEDDING_MODEL), or re-embed every stored vector "
            f"with the new model: `companion db reembed` (with the service stopped)."
        )
        self.table = table
        self.table_dim = table_dim
        self.model_dim = model_dim
        self.model_name = model_name


class EmbeddingModelMismatch(EmbeddingDimensionMismatch):
    """The stored vectors were made by another embedding model than the configured one.

    Two models of the same dimension fit the same ``vector(N)`` columns, but their vectors
    live in different spaces: comparing them ranks recall at random. A subclass of
    :class:`EmbeddingDimensionMismatch`, so a caller that handles that one handles this too.

    Attributes:
        recorded_name: the model the database records (``embedding_model`` table).
        recorded_dim: its dimension.
        model_name: the configured model (``COMPANION_EMBEDDING_MODEL``).
        model_dim: its dimension.
    """

    def __init__(self, *, recorded_name: str, recorded_dim: int, model_name: str, model_dim: int) -> None:
        UsageError.__init__(
            self,
            f"The stored vectors were made by the embedding model {recorded_name!r} ({recorded_dim} dimensions), "
            f"but the configured model is {model_name!r} ({model_dim} dimensions); their vectors cannot be "
            f"compared. Set COMPANION_EMBEDDING_MODEL back to {recorded_name!r}, or re-embed every stored "
            f"vector with the new model: `companion db reembed` (with the service stopped).",
        )
        self.table = "embedding_model"
        self.table_dim = recorded_dim
        self.model_dim = model_dim
        self.model_name = model_name
        self.recorded_name = recorded_name
        self.recorded_dim = recorded_dim


class DatabaseInUseError(UsageError):
    """An operation that needs the database to itself (``companion db reembed``) found other
    processes of the runtime connected to it (``companion serve``, ``companion jobs run``).
    Nothing was changed.

    Attributes:
        processes: how many other runtime processes hold connections.
    """

    def __init__(self, message: str, *, processes: int) -> None:
        super().__init__(message)
        self.processes = processes


class PersonaError(UsageError):
    """A persona file is missing, unreadable, or lacks a required field.

    Attributes:
        path: the file that was read.
        field: the field that is missing or wrong, when one is to blame.
    """

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field


class KnowledgeFileError(UsageError):
    """A file cannot be added to a knowledge base. Nothing was written.

    Attributes:
        path: the file.
        reason: a stable code: ``missing``, ``unreadable``, ``binary``, ``invalid_utf8``, ``empty``, ``unsupported``.
    """

    def __init__(self, message: str, *, path: str, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class SessionOwnershipError(UsageError):
    """A session id was used with a user who does not own it. Nothing was stored.

    Attributes:
        session_id: the session asked for.
    """

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidMessageError(UsageError):
    """A message cannot be stored as given. Nothing was stored.

    Attributes:
        reason: a stable code: ``nul_byte``, ``invalid_utf8``, ``too_large``, ``empty``, ``bad_role``;
            for attachments and edits: ``bad_attachments`` (not a list of file ids),
            ``bad_edit`` (no such user turn, or it has left the recent window), ``no_replier``.
        position: character (or byte, for ``invalid_utf8`` bytes input) offset of the problem, if any.
    """

    def __init__(self, message: str, *, reason: str, position: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.position = position


# -- the HTTP API and the session life cycle ------------------------------------------
class InvalidRequestError(UsageError):
    """An HTTP API request is missing a field or uses one wrongly. Nothing was stored.

    Attributes:
        field: the request field (or header) at fault, e.g. ``user`` or ``X-Session-Id``.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidFieldError(InvalidRequestError):
    """A text field (an id, a name, a profile field) cannot be stored as given. Nothing was stored.

    The rules are the message's (:func:`runtime.turn.validate_message`) applied to any
    text: no NUL, no lone surrogate, at most the field's length.

    Attributes:
        field: the field at fault, e.g. ``user_id``, ``name``, ``facts[2]``.
        reason: a stable code: ``nul_byte``, ``invalid_utf8``, ``too_long``, ``empty``, ``control_character``.
    """

    def __init__(self, message: str, *, field: str, reason: str) -> None:
        super().__init__(message, field=field)
        self.reason = reason


class AuthenticationError(UsageError):
    """The request carries no API key (``Authorization: Bearer KEY``), or one no app has."""


class NotFoundError(UsageError):
    """No such resource for the calling app. Another app's users and sessions are reported
    exactly like missing ones, so that their ids do not leak.

    Attributes:
        kind: ``user`` or ``session``.
        resource_id: the id asked for (as the caller gave it).
    """

    def __init__(self, message: str, *, kind: str, resource_id: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.resource_id = resource_id


class SessionClosedError(UsageError):
    """The session was closed (by the close job or the API) and takes no new turns;
    start a new session of the same user, which begins from this one's summary.

    Attributes:
        session_id: the closed session.
    """

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class TurnInProgressError(UsageError):
    """Another turn of the session is running (or an edit-and-resend, a greeting, a close).
    One session runs one turn at a time; nothing of this request was stored: send it again
    when the running turn has ended (HTTP 409 ``turn_in_progress``).

    Attributes:
        session_id: the busy session.
    """

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


# -- stored files ---------------------------------------------------------------
class FileError(UsageError):
    """A stored-file operation cannot be done as asked. Nothing was stored or changed.

    Attributes:
        file_id: the file id concerned, when there is one.
    """

    def __init__(self, message: str, *, file_id: str | None = None) -> None:
        super().__init__(message)
        self.file_id = file_id


class FileInputError(FileError):
    """An upload or a ``file_read`` argument is bad: empty or unsafe name, empty or too large
    bytes, a page or limit out of range.

    Attributes:
        reason: a stable code: ``bad_name``, ``empty``, ``too_large``, ``bad_durability``,
            ``bad_argument``, ``not_durable`` (an ephemeral id cannot be edited or exported),
            ``duplicate`` (an edit would give bytes the user already has under another id).
    """

    def __init__(self, message: str, *, reason: str, file_id: str | None = None) -> None:
        super().__init__(message, file_id=file_id)
        self.reason = reason


class FileNotFound(FileError):
    """No file with this id for this user. Unknown ids and other users' ids get the same
    message, so the error does not tell whether an id exists."""


class FileParseError(FileError):
    """The bytes cannot be parsed: corrupt, encrypted, or of no supported format.

    The parse service stores the message as the file's ``parse_error`` (state ``failed``).

    Attributes:
        reason: a stable code: ``corrupt``, ``encrypted``, ``unsupported``, ``too_large``, ``too_deep``.
    """

    def __init__(self, message: str, *, reason: str, file_id: str | None = None) -> None:
        super().__init__(message, file_id=file_id)
        self.reason = reason


class TurnError(CompanionError):
    """A failure while a turn runs. The user turn was stored before it happened.

    Attributes:
        session_id: the session whose turn failed.
    """

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class ModelCallError(TurnError):
    """The chat model could not produce a reply.

    Attributes:
        model: the litellm model string that was called, when known.
        status: the provider's HTTP status, when there was one.
    """

    def __init__(
        self, message: str, *, session_id: str | None = None, model: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.model = model
        self.status = status


class ModelAuthError(ModelCallError):
    """The provider refused the credentials (401) or the access (403). Retrying cannot help:
    fix the provider's API key variable (``OPENAI_API_KEY``, ...) or the model name."""


class ModelRequestError(ModelCallError):
    """The provider refused the request itself (bad request, unknown model, content policy,
    unsupported parameter). It was not retried."""


class ModelUnavailableError(ModelCallError):
    """The provider was rate-limited, failed (5xx), timed out or dropped the connection, and
    still did after the bounded retries (``COMPANION_MODEL_RETRIES``, ``COMPANION_MODEL_RETRY_SECONDS``).

    Attributes:
        attempts: requests made, the first one included.
        waited: seconds spent waiting between them.
        retry_after: the provider's last ``Retry-After``, seconds, if it sent one.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        model: str | None = None,
        status: int | None = None,
        attempts: int = 1,
        waited: float = 0.0,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, model=model, status=status)
        self.attempts = attempts
        self.waited = waited
        self.retry_after = retry_after


class ContextOverflowError(ModelCallError):
    """The provider said the prompt exceeds the model's context window.

    The engine compacts harder and retries once; this error reaches the caller only if
    the harder prompt overflows too. The history is intact: nothing was deleted.

    Attributes:
        sent_tokens: our estimates of the prompts sent, tokens, in order.
        window: the context window the prompts were built for, tokens.
        provider_limit: the limit the provider named in its message, tokens, if it named one.
    """

    def __init__(
        self,
        message: str,
        *,
        session_id: str | None = None,
        model: str | None = None,
        status: int | None = None,
        sent_tokens: tuple[int, ...] = (),
        window: int | None = None,
        provider_limit: int | None = None,
    ) -> None:
        super().__init__(message, session_id=session_id, model=model, status=status)
        self.sent_tokens = sent_tokens
        self.window = window
        self.provider_limit = provider_limit


class SummarizationError(TurnError):
    """A summarizer raised, timed out, or produced a summary that failed validation."""


class StorageError(TurnError):
    """The database refused a write or could not be reached."""

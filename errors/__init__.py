"""The one exception hierarchy of companion-runtime.

It lives in its own top-level package, beneath every other one: storage (``memory``),
the pure packages (``persona``, ``runtime.accounting``, ``runtime.context``) and the
provider boundary (``runtime.llm``) all raise these classes, and ``errors`` imports
nothing of the project. So a pure package can raise without importing storage, and
data still flows one way. Errors from third-party libraries are mapped to these in one
place each: litellm in :mod:`runtime.llm`, psycopg/SQLAlchemy in :mod:`memory.database`.

The branches say what the caller can do, not whose code raised. Each class carries a stable
``code`` (the HTTP API's error code, :mod:`runtime.service.api.errors`; the CLI's exit status
follows the branch, :mod:`runtime.cli`).

::

    CompanionError
    ├── InputError                  the caller's input is wrong: fix it and send again (HTTP 4xx, exit 2)
    │   ├── InvalidMessageError     a message has NUL bytes, invalid UTF-8, or is too large
    │   ├── InvalidRequestError     an HTTP API request is missing or misuses a field
    │   │   └── InvalidFieldError   a text field holds NUL, a lone surrogate, or too many characters
    │   ├── UncountableContentError a message or content part whose tokens cannot be counted
    │   ├── PersonaError            a persona file (card JSON/PNG, TOML, YAML) is missing a field or malformed
    │   ├── KnowledgeFileError      a file given to `companion kb add` is missing, unreadable, unsupported, binary or not UTF-8
    │   ├── AuthenticationError     no API key, or one no app has (HTTP 401)
    │   ├── FileInputError          an upload or a file_read argument is bad (name, size, page, limit)
    │   └── FileParseError          the bytes are corrupt, encrypted or of no supported format
    ├── NotFoundError               no such user or session for this app (HTTP 404, exit 2)
    │   └── FileNotFound            no such file id for this user (unknown and foreign ids alike)
    ├── ConflictError               the state forbids it now: wait, or take another way (HTTP 409, exit 2)
    │   ├── SessionOwnershipError   the session id belongs to another user
    │   ├── SessionClosedError      the session was closed; it takes no new turns
    │   ├── TurnInProgressError     another turn (or an edit, a close) of the session is running
    │   ├── TurnsChangedError       turns arrived after the last one the client saw; nothing was deleted
    │   ├── UserErasingError        the user is being erased; nothing new of theirs is stored
    │   ├── CharacterInUseError     the character has sessions; delete them with it, or keep it
    │   └── CharacterReadOnlyError  the deployment's characters are changed by its operator, not by an app
    ├── ConfigurationError          an operator must fix a setting or the deployment (HTTP 500, exit 2)
    │   ├── UnknownModelError       the model name is not known and no override was given
    │   ├── SchemaError             the database schema is missing or behind; run `companion db upgrade`
    │   └── EmbeddingDimensionMismatch  table vector(N) differs from the embedding model's dimension
    │       └── EmbeddingModelMismatch  the stored vectors were made by another embedding model
    └── DependencyError             a service the runtime depends on failed; ``retryable`` says whether
        │                           the same call may succeed later (HTTP 502/503, exit 69)
        ├── ModelCallError          the chat model call failed (network, provider, timeout)
        │   ├── ModelAuthError      401/403: the API key is missing, wrong or not allowed; not retryable
        │   ├── ModelRequestError   the provider refused the request (400, 404, 422, policy); not retryable
        │   ├── ModelUnavailableError  429, 5xx, timeout or lost connection, still failing after bounded retries
        │   └── ContextOverflowError   the provider said the prompt is too long, again after one harder compaction
        ├── EmbedderUnavailableError  the embeddings API failed; turns go on, recalling by full text and dates
        ├── SummarizationError      a summarizer raised or produced an invalid summary
        └── StorageError            the database refused or lost a request

:class:`FileError` is a second base of the stored-file errors (``FileInputError``,
``FileParseError``, ``FileNotFound``), for a caller that handles every file error alike.
Whether a turn's user message was stored before an error is an attribute,
:attr:`CompanionError.user_turn_stored`, set by the turn that stored it.
"""

from __future__ import annotations

from typing import ClassVar


class CompanionError(Exception):
    """Root of every error this package raises on purpose.

    Attributes:
        code: a stable code for the class (the HTTP API's ``error.code``).
        user_turn_stored: ``True`` when a turn stored the user's message before this error (the
            reply failed after it); ``False`` when nothing of the request was stored.
    """

    code: ClassVar[str] = "internal_error"
    user_turn_stored: bool = False


class InputError(CompanionError):
    """The caller's input is wrong: fix it and send it again. Nothing was stored."""

    code = "bad_request"


class NotFoundError(CompanionError):
    """No such resource for the calling app. Another app's users and sessions are reported
    exactly like missing ones, so that their ids do not leak.

    Attributes:
        kind: ``user``, ``session``, ``file`` or ``character``.
        resource_id: the id asked for (as the caller gave it).
    """

    code = "not_found"

    def __init__(self, message: str, *, kind: str, resource_id: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.resource_id = resource_id


class ConflictError(CompanionError):
    """The state of what the request touches forbids it now: wait and send it again, or take
    another way (another session, a new session). Nothing of the request was stored."""

    code = "conflict"


class DependencyError(CompanionError):
    """A service the runtime depends on (the model provider, the database, the summarizer) failed.

    Attributes:
        session_id: the session whose work failed, when there is one.
        retryable: whether the same call may succeed later without any change.
    """

    code = "dependency_failed"
    retryable: bool = False

    def __init__(self, message: str, *, session_id: str | None = None) -> None:
        super().__init__(message)
        self.session_id = session_id


class ConfigurationError(CompanionError):
    """A setting (environment variable or argument) is missing or invalid.

    Attributes:
        setting: the environment variable or argument name, e.g. ``COMPANION_BUDGET_RECENT``.
    """

    code = "server_misconfigured"

    def __init__(self, message: str, *, setting: str | None = None) -> None:
        super().__init__(message)
        self.setting = setting


class UnknownModelError(ConfigurationError):
    """The model name is unknown to litellm and no context window override was given."""

    code = "unknown_model"

    def __init__(self, message: str, *, model: str) -> None:
        super().__init__(message)
        self.model = model


class SchemaError(ConfigurationError):
    """The database has no schema, or an older one than this code expects."""

    code = "schema_out_of_date"


class EmbeddingDimensionMismatch(ConfigurationError):
    """The archive table's ``vector(N)`` differs from the embedding model's dimension.

    Attributes:
        table_dim: N in the table's ``vector(N)`` column.
        model_dim: the dimension the embedding model produces.
    """

    code = "embedding_dimension_mismatch"

    def __init__(self, *, table: str, table_dim: int, model_dim: int, model_name: str) -> None:
        super().__init__(
            f"The table {table!r} stores vector({table_dim}) embeddings, but the embedding model "
            f"{model_name!r} produces {model_dim} dimensions. Use an embedding model with "
            f"{table_dim} dimensions (COMPANION_EMBEDDING_MODEL), or re-embed every stored vector "
            f"with the new model: `companion db reembed`."
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

    code = "embedding_model_mismatch"

    def __init__(self, *, recorded_name: str, recorded_dim: int, model_name: str, model_dim: int) -> None:
        ConfigurationError.__init__(
            self,
            f"The stored vectors were made by the embedding model {recorded_name!r} ({recorded_dim} dimensions), "
            f"but the configured model is {model_name!r} ({model_dim} dimensions); their vectors cannot be "
            f"compared. Set COMPANION_EMBEDDING_MODEL back to {recorded_name!r}, or re-embed every stored "
            f"vector with the new model: `companion db reembed`.",
        )
        self.table = "embedding_model"
        self.table_dim = recorded_dim
        self.model_dim = model_dim
        self.model_name = model_name
        self.recorded_name = recorded_name
        self.recorded_dim = recorded_dim


class TurnsChangedError(ConflictError):
    """Turns arrived in the session after the client last saw it, while a destructive operation
    (an edit-and-resend) waited for the session. Nothing was deleted: the client shows the new
    turns and asks again.

    Attributes:
        session_id: the session.
        expected_last_seq: the last turn the client saw (``seq``).
        last_seq: the session's last turn now.
    """

    code = "turns_changed"

    def __init__(self, message: str, *, session_id: str, expected_last_seq: int, last_seq: int) -> None:
        super().__init__(message)
        self.session_id = session_id
        self.expected_last_seq = expected_last_seq
        self.last_seq = last_seq


class UserErasingError(ConflictError):
    """The user is being erased: no new turn, session or upload of theirs is taken, and a turn that
    was running when the erasure began ends with this error. Nothing was stored.

    Attributes:
        user_id: the user (the runtime's id).
    """

    code = "user_erasing"

    def __init__(self, message: str, *, user_id: str) -> None:
        super().__init__(message)
        self.user_id = user_id


class CharacterInUseError(ConflictError):
    """A character that sessions still use was asked to be deleted without them. Nothing was deleted.

    Attributes:
        character_id: the character.
        sessions: how many sessions use it.
    """

    code = "character_in_use"

    def __init__(self, message: str, *, character_id: str, sessions: int) -> None:
        super().__init__(message)
        self.character_id = character_id
        self.sessions = sessions


class CharacterReadOnlyError(ConflictError):
    """An app asked to change or delete a character of the deployment (``COMPANION_PERSONA``'s, or
    one added with ``companion characters add`` without ``--app``): only its operator may. Nothing
    was changed.

    Attributes:
        character_id: the character.
    """

    code = "character_read_only"

    def __init__(self, message: str, *, character_id: str) -> None:
        super().__init__(message)
        self.character_id = character_id


class PersonaError(InputError):
    """A persona file is missing, unreadable, or lacks a required field.

    Attributes:
        path: the file that was read.
        field: the field that is missing or wrong, when one is to blame.
    """

    code = "persona_invalid"

    def __init__(self, message: str, *, path: str | None = None, field: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.field = field


class KnowledgeFileError(InputError):
    """A file cannot be added to a knowledge base. Nothing was written.

    Attributes:
        path: the file.
        reason: a stable code: ``missing``, ``unreadable``, ``binary``, ``invalid_utf8``, ``empty``, ``unsupported``.
    """

    code = "knowledge_file_invalid"

    def __init__(self, message: str, *, path: str, reason: str) -> None:
        super().__init__(message)
        self.path = path
        self.reason = reason


class SessionOwnershipError(ConflictError):
    """A session id was used with a user who does not own it. Nothing was stored.

    Attributes:
        session_id: the session asked for.
    """

    code = "session_ownership"

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class InvalidMessageError(InputError):
    """A message cannot be stored as given. Nothing was stored.

    Attributes:
        reason: a stable code: ``nul_byte``, ``invalid_utf8``, ``too_large``, ``empty``, ``bad_role``;
            for attachments and edits: ``bad_attachments`` (not a list of file ids),
            ``bad_edit`` (no such user turn, or it has left the recent window), ``no_replier``.
        position: character (or byte, for ``invalid_utf8`` bytes input) offset of the problem, if any.
    """

    code = "invalid_message"

    def __init__(self, message: str, *, reason: str, position: int | None = None) -> None:
        super().__init__(message)
        self.reason = reason
        self.position = position


# -- the HTTP API and the session life cycle ------------------------------------------
class InvalidRequestError(InputError):
    """An HTTP API request is missing a field or uses one wrongly. Nothing was stored.

    Attributes:
        field: the request field (or header) at fault, e.g. ``user`` or ``X-Session-Id``.
    """

    code = "invalid_request"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class InvalidFieldError(InvalidRequestError):
    """A text field (an id, a name, a profile field) cannot be stored as given. Nothing was stored.

    The rules are the message's (:func:`runtime.turn.validate_message`) applied to any
    text: no NUL, no lone surrogate, at most the field's length.

    Attributes:
        field: the field at fault, e.g. ``user_id``, ``name``, ``facts[2]``.
        reason: a stable code: ``nul_byte``, ``invalid_utf8``, ``too_long``, ``empty``, ``control_character``;
            ``other_character``: a turn named a character its session does not talk as.
    """

    code = "invalid_field"

    def __init__(self, message: str, *, field: str, reason: str) -> None:
        super().__init__(message, field=field)
        self.reason = reason


class AuthenticationError(InputError):
    """The request carries no API key (``Authorization: Bearer KEY``), or one no app has."""

    code = "unauthorized"


class SessionClosedError(ConflictError):
    """The session was closed (by the close job or the API) and takes no new turns;
    start a new session of the same user, which begins from this one's summary.

    Attributes:
        session_id: the closed session.
    """

    code = "session_closed"

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


class TurnInProgressError(ConflictError):
    """Another turn of the session is running (or an edit-and-resend, a greeting, a close).
    One session runs one turn at a time; nothing of this request was stored: send it again
    when the running turn has ended (HTTP 409 ``turn_in_progress``).

    Attributes:
        session_id: the busy session.
    """

    code = "turn_in_progress"

    def __init__(self, message: str, *, session_id: str) -> None:
        super().__init__(message)
        self.session_id = session_id


# -- stored files ---------------------------------------------------------------
class FileError(CompanionError):
    """A stored-file operation cannot be done as asked. Nothing was stored or changed.

    Attributes:
        file_id: the file id concerned, when there is one.
    """

    code = "file_error"

    def __init__(self, message: str, *, file_id: str | None = None) -> None:
        super().__init__(message)
        self.file_id = file_id


class FileInputError(InputError, FileError):
    """An upload or a ``file_read`` argument is bad: empty or unsafe name, empty or too large
    bytes, a page or limit out of range.

    Attributes:
        reason: a stable code: ``bad_name``, ``empty``, ``too_large``, ``bad_durability``,
            ``bad_argument``, ``not_durable`` (an ephemeral id cannot be edited or exported),
            ``duplicate`` (an edit would give bytes the user already has under another id).
    """

    code = "file_invalid"

    def __init__(self, message: str, *, reason: str, file_id: str | None = None) -> None:
        FileError.__init__(self, message, file_id=file_id)
        self.reason = reason


class FileNotFound(NotFoundError, FileError):
    """No file with this id for this user. Unknown ids and other users' ids get the same
    message, so the error does not tell whether an id exists."""

    code = "file_not_found"

    def __init__(self, message: str, *, file_id: str | None = None) -> None:
        NotFoundError.__init__(self, message, kind="file", resource_id=file_id or "")
        self.file_id = file_id


class FileParseError(InputError, FileError):
    """The bytes cannot be parsed: corrupt, encrypted, or of no supported format.

    The parse service stores the message as the file's ``parse_error`` (state ``failed``).

    Attributes:
        reason: a stable code: ``corrupt``, ``encrypted``, ``unsupported``, ``too_large``, ``too_deep``.
    """

    code = "file_unparseable"

    def __init__(self, message: str, *, reason: str, file_id: str | None = None) -> None:
        FileError.__init__(self, message, file_id=file_id)
        self.reason = reason


class EmbedderUnavailableError(DependencyError):
    """The embedding model could not embed: an embeddings API that failed, timed out, refused
    the key or was rate-limited past its retries (``COMPANION_EMBEDDING_RETRY_SECONDS``).

    A turn does not fail on it: recall runs on full text and dates, and the vectors it could
    not make are filled in later by the embeddings backfill job (docs/settings.md#embedders-and-rerankers).

    Attributes:
        model: the embedding model (``COMPANION_EMBEDDING_MODEL``).
        status: the provider's last HTTP status, when there was one.
    """

    code = "embedder_unavailable"
    retryable = True

    def __init__(self, message: str, *, model: str, status: int | None = None) -> None:
        super().__init__(message)
        self.model = model
        self.status = status


class ModelCallError(DependencyError):
    """The chat model could not produce a reply.

    Attributes:
        model: the litellm model string that was called, when known.
        status: the provider's HTTP status, when there was one.
    """

    code = "model_error"

    def __init__(
        self, message: str, *, session_id: str | None = None, model: str | None = None, status: int | None = None
    ) -> None:
        super().__init__(message, session_id=session_id)
        self.model = model
        self.status = status


class ModelAuthError(ModelCallError):
    """The provider refused the credentials (401) or the access (403). Retrying cannot help:
    fix the provider's API key variable (``OPENAI_API_KEY``, ...) or the model name."""

    code = "model_auth_failed"


class ModelRequestError(ModelCallError):
    """The provider refused the request itself (bad request, unknown model, content policy,
    unsupported parameter). It was not retried."""

    code = "model_request_rejected"


class ModelUnavailableError(ModelCallError):
    """The provider was rate-limited, failed (5xx), timed out or dropped the connection, and
    still did after the bounded retries (``COMPANION_MODEL_RETRIES``, ``COMPANION_MODEL_RETRY_SECONDS``).

    Attributes:
        attempts: requests made, the first one included.
        waited: seconds spent waiting between them.
        retry_after: the provider's last ``Retry-After``, seconds, if it sent one.
    """

    code = "model_unavailable"
    retryable = True

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

    code = "context_overflow"

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


class SummarizationError(DependencyError):
    """A summarizer raised, timed out, or produced a summary that failed validation."""

    code = "summarization_failed"
    retryable = True


class StorageError(DependencyError):
    """The database refused a request or could not be reached."""

    code = "storage_unavailable"
    retryable = True


class UncountableContentError(InputError):
    """A message, content part or tool call whose tokens cannot be counted: a content type the
    counters do not know, a part without its text, a value that is not JSON. Nothing is ever
    counted as zero instead.

    Attributes:
        field: what could not be counted (``content``, ``tool_calls``, ...), when known.
    """

    code = "uncountable_content"

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field

"""Apps, their API keys, and the users and sessions each app owns (the HTTP API's view).

- An app has one API key, ``ck_`` + ``secrets.token_urlsafe(32)``; only its SHA-256
  (hex) is stored, so a leaked database does not leak keys. :meth:`Directory.create_app`
  returns the key once.
- Users are scoped to their app: the app names a user by ``external_id`` (unique per
  app); ``users.id`` is server-generated (``u_`` + 32 hex digits), so two apps may both
  have an ``alice`` without colliding, and no app can name another app's user.
- Session ids made here are server-generated too (``s_`` + 32 hex digits). Every lookup
  takes the app id and answers :class:`~errors.NotFoundError` for a session or
  user of another app exactly as for a missing one.
- A new session of a user starts from the summary of that user's newest *closed*
  session with the same character (:meth:`Directory.start_session`): the items are copied
  flat (never nested), renumbered to ``seq <= 0`` and marked ``carried_from``, so the
  next compaction keeps or drops them like any other entry, within the summary cap.
"""

from __future__ import annotations

import hashlib
import secrets
import uuid

from sqlalchemy import Engine, text
from sqlmodel import Session, col, select

from errors import InvalidRequestError, NotFoundError
from memory.database import storage_errors
from memory.files import file_not_found
from memory.tables import App, ChatSession, FileRow, Summary, SummaryItemJSON, User
from memory.validation import check_id, check_name

KEY_PREFIX = "ck_"


def hash_key(key: str) -> str:
    """The stored form of an API key: SHA-256, 64 hex digits."""
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class Directory:
    """Apps, app-scoped users and sessions on one SQLAlchemy engine."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine

    # -- apps -----------------------------------------------------------------
    def create_app(self, name: str) -> tuple[App, str]:
        """Create an app; returns it and its API key (shown once, never stored).

        Raises:
            InvalidRequestError: a bad name, or one another app has.
        """
        name = check_name(name, field="name")
        key = KEY_PREFIX + secrets.token_urlsafe(32)
        app = App(id="app_" + uuid.uuid4().hex[:16], name=name, key_hash=hash_key(key))
        with storage_errors(), Session(self.engine) as db:
            if db.exec(select(App).where(App.name == name)).first() is not None:
                raise InvalidRequestError(f"An app named {name!r} exists already; choose another name.", field="name")
            db.add(app)
            db.commit()
            db.refresh(app)
        return app, key

    def apps(self) -> list[App]:
        with storage_errors(), Session(self.engine) as db:
            return list(db.exec(select(App).order_by(col(App.created_at))).all())

    def app_for_key(self, key: str) -> App | None:
        """The app whose key this is, or ``None``."""
        with storage_errors(), Session(self.engine) as db:
            return db.exec(select(App).where(App.key_hash == hash_key(key))).first()

    # -- users ----------------------------------------------------------------
    def ensure_user(self, app_id: str, external_id: str) -> tuple[User, bool]:
        """The app's user ``external_id``, created if missing; and whether it was created."""
        external_id = check_name(external_id, field="user_id")
        with storage_errors(), Session(self.engine) as db:
            inserted = db.execute(
                text(
                    "INSERT INTO users (id, app_id, external_id) VALUES (:id, :a, :e) "
                    "ON CONFLICT (app_id, external_id) DO NOTHING RETURNING id"
                ).bindparams(id="u_" + uuid.uuid4().hex, a=app_id, e=external_id)
            ).first()
            db.commit()
            user = db.exec(select(User).where(User.app_id == app_id, User.external_id == external_id)).one()
            return user, inserted is not None

    def user(self, app_id: str, external_id: str) -> User:
        """Raises :class:`NotFoundError` unless the app has this user; InvalidFieldError for an id that cannot exist."""
        external_id = check_id(external_id, field="user_id")
        with storage_errors(), Session(self.engine) as db:
            user = db.exec(select(User).where(User.app_id == app_id, User.external_id == external_id)).first()
        if user is None:
            raise NotFoundError(f"No user {external_id!r}.", kind="user", resource_id=external_id)
        return user

    def owns(self, app_id: str, user_id: str) -> bool:
        """Whether the user (the runtime's id) is the app's."""
        with storage_errors(), Session(self.engine) as db:
            return db.exec(select(User.id).where(User.id == user_id, User.app_id == app_id)).first() is not None

    def users(self, app_id: str) -> list[User]:
        with storage_errors(), Session(self.engine) as db:
            return list(
                db.exec(select(User).where(User.app_id == app_id).order_by(col(User.created_at), col(User.id))).all()
            )

    # -- files (HTTP API) ----------------------------------------------------------
    def file_owner(self, app_id: str, file_id: str) -> User:
        """The user owning stored file ``file_id``, if the app owns that user.

        Raises:
            FileNotFound: no such file, or another app's (the same answer, the file store's message).
            InvalidFieldError: an id that cannot exist (NUL, a lone surrogate, too long).
        """
        file_id = check_id(file_id, field="file_id")
        with storage_errors(), Session(self.engine) as db:
            user = db.exec(
                select(User)
                .join(FileRow, col(FileRow.user_id) == User.id)
                .where(FileRow.id == file_id, User.app_id == app_id)
            ).first()
        if user is None:
            raise file_not_found(file_id)
        return user

    # -- sessions ---------------------------------------------------------------
    def session(self, app_id: str, session_id: str) -> tuple[ChatSession, User]:
        """The session and its user, if the app owns them.

        Raises:
            NotFoundError: no such session, or another app's (the same answer).
            InvalidFieldError: an id that cannot exist (NUL, a lone surrogate, too long).
        """
        session_id = check_id(session_id, field="session_id")
        with storage_errors(session_id), Session(self.engine) as db:
            row = db.exec(
                select(ChatSession, User)
                .join(User, col(User.id) == ChatSession.user_id)
                .where(ChatSession.id == session_id, User.app_id == app_id)
            ).first()
        if row is None:
            raise NotFoundError(f"No session {session_id!r}.", kind="session", resource_id=session_id)
        return row[0], row[1]

    def sessions(self, app_id: str, external_id: str) -> list[ChatSession]:
        """The user's sessions, oldest first. Raises :class:`NotFoundError` for an unknown user."""
        user = self.user(app_id, external_id)
        with storage_errors(), Session(self.engine) as db:
            return list(
                db.exec(
                    select(ChatSession)
                    .where(ChatSession.user_id == user.id)
                    .order_by(col(ChatSession.created_at), col(ChatSession.id))
                ).all()
            )

    def start_session(self, *, user_id: str, character_id: str) -> ChatSession:
        """A new session of the user (``user_id`` is the internal id), in one transaction.

        It starts from the summary of the user's newest closed session with the same
        character, if that has one: a flat copy of its entries (``seq`` renumbered to
        ``<= 0``, ``carried_from`` set), never a summary nested in a summary.
        """
        with storage_errors(), Session(self.engine) as db:
            session_id = self._start(db, user_id=user_id, character_id=character_id)
            db.commit()
            return db.get_one(ChatSession, session_id)

    def open_session(self, *, user_id: str, character_id: str) -> ChatSession:
        """The user's newest open session with this character, or a new one (as
        :meth:`start_session`). The user row is locked meanwhile, so two requests at once
        for a user with no open session get the same new session."""
        with storage_errors(), Session(self.engine) as db:
            db.execute(text("SELECT id FROM users WHERE id = :u FOR NO KEY UPDATE").bindparams(u=user_id))
            current = db.exec(
                select(ChatSession)
                .where(
                    ChatSession.user_id == user_id,
                    ChatSession.character_id == character_id,
                    col(ChatSession.closed_at).is_(None),
                )
                .order_by(col(ChatSession.created_at).desc(), col(ChatSession.id).desc())
            ).first()
            session_id = (
                current.id if current is not None else self._start(db, user_id=user_id, character_id=character_id)
            )
            db.commit()
            return db.get_one(ChatSession, session_id)

    @staticmethod
    def _start(db: Session, *, user_id: str, character_id: str) -> str:
        """Insert a new session (and its carried-over summary) in ``db``'s transaction; its id."""
        session_id = "s_" + uuid.uuid4().hex
        db.add(ChatSession(id=session_id, user_id=user_id, character_id=character_id))
        db.flush()
        db.execute(text("INSERT INTO compaction_state (session_id) VALUES (:s)").bindparams(s=session_id))
        carry_over(db, session_id=session_id, user_id=user_id, character_id=character_id)
        return session_id


def carry_over(db: Session, *, session_id: str, user_id: str, character_id: str) -> str | None:
    """Start the new session ``session_id`` (already inserted, no summary yet) from the
    summary of the user's newest closed session with the same character, in ``db``'s
    transaction: a flat copy of its entries (see :func:`carry_items`), ``carried_from``
    set on the session. Returns the session carried from, or ``None`` if there was none
    (no closed session, or one without a summary)."""
    previous = db.exec(
        select(ChatSession)
        .where(
            ChatSession.user_id == user_id,
            ChatSession.character_id == character_id,
            col(ChatSession.closed_at).is_not(None),
            ChatSession.id != session_id,
        )
        .order_by(col(ChatSession.closed_at).desc(), col(ChatSession.id).desc())
    ).first()
    old = db.get(Summary, previous.id) if previous is not None else None
    if old is None or not old.items:
        return None
    db.execute(text("UPDATE sessions SET carried_from = :o WHERE id = :s").bindparams(o=old.session_id, s=session_id))
    db.add(
        Summary(
            session_id=session_id,
            content=old.content,
            items=carry_items(old.items, from_session=old.session_id),
            first_seq=0,
            last_seq=0,
            tokens=old.tokens,
        )
    )
    return old.session_id


def carry_items(items: list[SummaryItemJSON], *, from_session: str) -> list[SummaryItemJSON]:
    """Summary entries copied into a new session: same order and text, ``seq`` renumbered
    to ``-(m-1) … 0`` in the order of the old numbers (the old one kept as ``from_seq``),
    and ``carried_from`` naming the session they came from."""
    old = sorted({seq for i in items if isinstance(seq := i.get("seq"), int)})
    new = {seq: rank - (len(old) - 1) for rank, seq in enumerate(old)}
    out: list[SummaryItemJSON] = []
    for item in items:
        copy: SummaryItemJSON = {**item, "carried_from": from_session}
        if isinstance(seq := item.get("seq"), int):
            copy["from_seq"] = item.get("from_seq", seq)
            copy["seq"] = new[seq]
        out.append(copy)
    return out

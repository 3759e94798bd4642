"""The turns room: the only writer of ``turns``, ``turn_vectors`` and ``turn_files``.

:meth:`Turns.add` appends a turn with the next gap-free ``seq`` under the session's row lock
and refuses a closed session. Reads never change state. :meth:`Turns.truncate_from` deletes a
user turn and everything after it (an edit), never a turn that left the recent window.
"""

from __future__ import annotations

import json
from collections.abc import Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, cast

from sqlalchemy import CursorResult, Engine, bindparam, func, text, union_all, update
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlmodel import Session, col, select

from errors import InvalidMessageError, NotFoundError, StorageError, TurnsChangedError
from memory.database import autocommit_engine, storage_errors
from memory.sessions import NO_KEPT_RECALL, closed_error
from memory.tables import Turn, TurnState, TurnVector, offset_minutes, utcnow
from memory.vectors import Vector


@dataclass(frozen=True, kw_only=True)
class RecallTail:
    """A recall tail the cache layout keeps under a user turn of a session (``sessions.recall_tails``)."""

    anchor: int
    """The ``seq`` of the user turn it sits under."""
    text: str
    """The rendered tail."""
    segments: tuple[int, ...] = ()
    """The archive segments it quotes."""


@dataclass(frozen=True, kw_only=True)
class RequestRecord:
    """What an assistant turn keeps of the request its reply was made from: the provider's
    reported usage and our own record of the request, which calibrate the next assembly."""

    prompt_tokens: int | None = None
    """The provider's reported prompt tokens."""
    completion_tokens: int | None = None
    """The provider's reported completion tokens."""
    estimate_tokens: int | None = None
    """Our count of the whole request, tokens."""
    messages: int | None = None
    """Messages the request held."""
    fingerprint: str | None = None
    """A hash of the request's messages (:func:`runtime.accounting.fingerprint`)."""
    interrupted: bool = False
    """True when the reply's stream broke off: the turn holds what arrived."""
    cached_tokens: int | None = None
    """Prompt tokens the provider read from its prompt cache."""
    cache_write_tokens: int | None = None
    """Prompt tokens the provider wrote to its prompt cache."""
    cost_usd: float | None = None
    """The request's price, US dollars (litellm's cost map)."""
    retrieval_cost_usd: float | None = None
    """What the turn's embedding and rerank calls cost, US dollars (litellm's cost map)."""
    recall_block: str | None = None
    """The recall block the session keeps in its prompt after this request (cache layout), stored
    on the session with the reply; ``None``: the session's kept recall did not change."""
    recall_segments: tuple[int, ...] = ()
    """The archive segments ``recall_block`` and ``recall_tails`` quote."""
    recall_anchor: int | None = None
    """The ``seq`` of the user turn ``recall_block`` sits under."""
    recall_tails: tuple[RecallTail, ...] = ()
    """The tails kept under the turns since that one, oldest first."""
    recall_prefix: str | None = None
    """A fingerprint of the prompt before ``recall_block`` when it was built."""


@dataclass(frozen=True, kw_only=True)
class TurnFile:
    """One file as a stored turn carries it: the columns rendering needs, and the extract's head."""

    file_id: str
    name: str
    mime: str
    size_bytes: int
    """Bytes."""
    durability: str
    """``durable`` or ``ephemeral``."""
    parse_state: str
    """``pending``, ``parsing``, ``ready``, ``empty``, ``needs_ocr`` or ``failed``."""
    parse_error: str | None = None
    page_count: int | None = None
    body_start_page: int | None = None
    """First page after the front matter (1-based), when known."""
    text_head: str | None = None
    """The first ``head_chars`` characters of the extract; ``None`` before a parse."""
    text_chars: int | None = None
    """Characters of the whole extract."""
    position: int = 0
    """Order among the turn's attachments, from 0."""


def add_vectors(db: Session, vectors: Mapping[int, Sequence[float]], *, user_id: str | None = None) -> None:
    """Store turn id → vector in ``db``'s transaction; a turn that already has one keeps it.
    ``user_id``: the turns' user (``None``: each turn's, filled by the database)."""
    if not vectors:
        return
    statement = (
        pg_insert(TurnVector)
        .values([{"turn_id": turn_id, "user_id": user_id, "embedding": list(v)} for turn_id, v in vectors.items()])
        .on_conflict_do_nothing(index_elements=["turn_id"])
    )
    db.execute(statement)


def roll_out(
    db: Session, *, session_id: str, turn_ids: Sequence[int], to: TurnState, user_id: str | None = None
) -> None:
    """Move turns out of the recent window in ``db``'s transaction; all of them must still be in it.

    Raises:
        StorageError: a turn was no longer in the recent window (the transaction is rolled back).
    """
    if not turn_ids:
        return
    result = db.exec(
        update(Turn)
        .where(
            col(Turn.session_id) == session_id,
            col(Turn.id).in_(list(turn_ids)),
            col(Turn.state) == TurnState.context,
            *([col(Turn.user_id) == user_id] if user_id is not None else []),
        )
        .values(state=to)
    )
    if result.rowcount != len(turn_ids):
        db.rollback()
        raise StorageError(
            f"Compaction of session {session_id!r} found {len(turn_ids) - result.rowcount} of "
            f"{len(turn_ids)} turns already out of the recent window; nothing was written.",
            session_id=session_id,
        )


def delete_session_rows(db: Session, session_id: str) -> dict[str, int]:
    """Delete the session's ``turn_files``, ``turn_vectors`` (by cascade) and ``turns`` rows in
    ``db``'s transaction; counts by table (``turn_files``, ``turns``)."""
    files = db.execute(
        text("DELETE FROM turn_files WHERE turn_id IN (SELECT id FROM turns WHERE session_id = :s)").bindparams(
            s=session_id
        )
    )
    turns = db.execute(text("DELETE FROM turns WHERE session_id = :s").bindparams(s=session_id))
    return {
        "turn_files": cast("CursorResult[Any]", files).rowcount,
        "turns": cast("CursorResult[Any]", turns).rowcount,
    }


class Turns:
    """The session's turns, their vectors and the files they carry."""

    def __init__(self, engine: Engine) -> None:
        self._engine = engine
        self._one = autocommit_engine(engine)

    def add(
        self,
        *,
        session_id: str,
        role: str,
        content: str,
        tokens: int,
        created_at: datetime | None = None,
        request: RequestRecord | None = None,
        file_ids: Sequence[str] = (),
        vector: Sequence[float] | None = None,
        character_revision: int | None = None,
        user_id: str | None = None,
    ) -> Turn:
        """Append one turn with the next sequence number and commit it: two statements, one
        transaction (plus one per attached file).

        The session row is locked while the number is taken, so concurrent writers
        to one session get distinct, gap-free numbers. The session's
        ``last_activity_at`` moves to now (wall clock, whatever ``created_at`` says).

        Args:
            request: the provider's usage and our record of the request a reply was made from
                (an assistant turn's); ``None`` for a user turn.
            file_ids: files the turn carries (attachments), in order; their ``turn_files``
                rows are written in the same transaction as the turn. The caller checks
                ownership first.
            vector: the embedding of ``content`` (a unit vector of the archive's dimension), stored
                as the turn's :class:`~memory.tables.TurnVector` by the same ``INSERT``.
            character_revision: the revision of the session's character the turn was made with.
            user_id: the session's user, when the caller knows it: every statement then finds the
                session's rows by their user too (``None``: the session's, filled by the database).

        Raises:
            SessionClosedError: the session was closed; nothing was stored.
        """
        request = request or RequestRecord()
        with storage_errors(session_id), Session(self._engine) as db:
            # one statement moves the activity time and locks the session row: concurrent writers
            # of one session wait here, so each takes the next seq in turn
            mine = " AND user_id = :u" if user_id is not None else ""
            bound = {"u": user_id} if user_id is not None else {}
            # a reply whose assembly changed the recall the session keeps in its prompt (a new
            # block, a new tail) stores it here, with the turn (the next assembly reads it); the
            # turn's insert below clears it again if one of its segments was deleted meanwhile
            kept, kept_values = "", {}
            if request.recall_block is not None:
                kept = (
                    ", recall_block = :rb, recall_segments = CAST(:rs AS bigint[]), recall_anchor = :ra, "
                    "recall_tails = CAST(:rt AS jsonb), recall_prefix = :rp"
                )
                kept_values = {
                    "rb": request.recall_block,
                    "rs": list(request.recall_segments),
                    "ra": request.recall_anchor,
                    "rp": request.recall_prefix,
                    "rt": json.dumps(
                        [
                            {"anchor": t.anchor, "text": t.text, "segments": list(t.segments)}
                            for t in request.recall_tails
                        ]
                    ),
                }
            open_row = db.execute(
                text(
                    f"UPDATE sessions SET last_activity_at = now(){kept} WHERE id = :s{mine} AND closed_at IS NULL "
                    "RETURNING id"
                ).bindparams(s=session_id, **bound, **kept_values)
            ).first()
            if open_row is None:
                row = db.execute(text("SELECT closed_at FROM sessions WHERE id = :s").bindparams(s=session_id)).first()
                if row is not None and row[0] is not None:  # a closed session takes no new turns
                    raise closed_error(session_id, row[0])
                if row is None:  # deleted while the turn ran (the session, or its user, erased)
                    raise NotFoundError(
                        f"Session {session_id!r} was deleted while this turn ran; nothing more was stored.",
                        kind="session",
                        resource_id=session_id,
                    )
            insert = (
                "INSERT INTO turns (session_id, seq, role, content, tokens, usage_prompt_tokens, "
                "usage_completion_tokens, request_estimate_tokens, request_messages, request_fingerprint, "
                "interrupted, state, created_at, utc_offset_minutes, character_revision, user_id, "
                "usage_cached_tokens, usage_cache_write_tokens, usage_cost_usd, usage_retrieval_cost_usd) "
                "SELECT :s, coalesce(max(seq), 0) + 1, :role, :content, :tokens, :upt, :uct, :ret, :rm, :rf, "
                f":interrupted, :state, :at, :off, :rev, CAST(:tu AS varchar), :uca, :ucw, :ucost, :rcost "
                f"FROM turns WHERE session_id = :s{mine} RETURNING *"
            )
            # a segment of the recall stored above deleted while the turn ran (forgotten, its message
            # deleted): none is kept, and the next turn builds its own. A statement of its own, so
            # that it reads after any delete the session row's lock waited for; a forgetting locks
            # the user's session rows before it deletes (memory.memories.Memories.forget)
            gone = (
                f"g AS (UPDATE sessions SET {NO_KEPT_RECALL} WHERE id = :s{mine} AND "
                "cardinality(CAST(:rs AS bigint[])) > (SELECT count(*) FROM archived_segments a "
                "WHERE a.user_id = sessions.user_id AND a.id = ANY(CAST(:rs AS bigint[])))), "
                if request.recall_block is not None
                else ""
            )
            statement = (
                text(f"WITH {gone}t AS ({insert}) SELECT * FROM t" if gone else insert)
                if vector is None
                else text(
                    f"WITH {gone}t AS ({insert}), v AS (INSERT INTO turn_vectors (turn_id, user_id, embedding) "
                    "SELECT id, user_id, CAST(:vec AS vector) FROM t) SELECT * FROM t"
                ).bindparams(bindparam("vec", list(vector), type_=Vector()))
            )
            if gone:
                statement = statement.bindparams(rs=list(request.recall_segments))
            inserted = db.execute(
                statement.bindparams(
                    s=session_id,
                    role=role,
                    content=content,
                    tokens=tokens,
                    upt=request.prompt_tokens,
                    uct=request.completion_tokens,
                    ret=request.estimate_tokens,
                    rm=request.messages,
                    rf=request.fingerprint,
                    interrupted=request.interrupted,
                    state=TurnState.context.value,
                    at=created_at or utcnow(),
                    off=offset_minutes(created_at),
                    rev=character_revision,
                    tu=user_id,
                    uca=request.cached_tokens,
                    ucw=request.cache_write_tokens,
                    ucost=request.cost_usd,
                    rcost=request.retrieval_cost_usd,
                    **bound,
                )
            ).one()
            turn = Turn.model_validate(dict(inserted._mapping))
            for position, file_id in enumerate(dict.fromkeys(file_ids)):
                db.execute(
                    text(
                        "INSERT INTO turn_files (turn_id, file_id, position, user_id) VALUES (:t, :f, :p, :u)"
                    ).bindparams(t=turn.id, f=file_id, p=position, u=turn.user_id)
                )
            db.commit()
            return turn

    def add_vectors(self, vectors: Mapping[int, Sequence[float]]) -> None:
        """Store turn id → the embedding of that turn's ``content`` (a unit vector of the
        archive's dimension), in one transaction; a turn that already has one keeps it.

        Raises:
            StorageError: the database failed, or a turn id does not exist; nothing was stored.
        """
        if not vectors:
            return
        with storage_errors(), Session(self._one) as db:
            add_vectors(db, vectors)
            db.commit()

    def vectors(self, turn_ids: Iterable[int], *, user_id: str | None = None) -> dict[int, list[float]]:
        """The stored embeddings of the turns ``turn_ids`` that have one: turn id → vector (the
        embedding of the turn's ``content``). Turns without a stored vector are left out; with
        ``user_id``, so are other users' turns."""
        ids = sorted(set(turn_ids))
        if not ids:
            return {}
        query = select(TurnVector.turn_id, TurnVector.embedding).where(col(TurnVector.turn_id).in_(ids))
        if user_id is not None:
            query = query.where(TurnVector.user_id == user_id)
        with storage_errors(), Session(self._one) as db:
            rows = db.exec(query).all()
            return {turn_id: [float(x) for x in vector] for turn_id, vector in rows}

    def of_session(self, session_id: str, *, state: TurnState | None = None, user_id: str | None = None) -> list[Turn]:
        """The session's turns in ``seq`` order, optionally only those in ``state`` (with
        ``user_id``: found by their user too)."""
        with storage_errors(session_id), Session(self._one) as db:
            query = select(Turn).where(Turn.session_id == session_id)
            if user_id is not None:
                query = query.where(Turn.user_id == user_id)
            if state is not None:
                query = query.where(Turn.state == state)
            return list(db.exec(query.order_by(col(Turn.seq))).all())

    def window(self, session_id: str, *, usage_limit: int, user_id: str | None = None) -> tuple[list[Turn], list[Turn]]:
        """What assembling a context reads of the session's turns, in one statement:
        ``(the turns in the recent window in seq order, the newest usage_limit turns that carry
        the provider's reported usage, newest first)``, as :meth:`of_session` with
        ``state=TurnState.context`` gives the first. Each half is read by its
        partial index (``ix_turns_session_context``, ``ix_turns_session_usage``), so the cost
        does not grow with the session's history. With ``user_id``, the turns are found by their
        user as well."""
        mine = [Turn.user_id == user_id] if user_id is not None else []
        context = select(Turn).where(Turn.session_id == session_id, Turn.state == TurnState.context, *mine)
        usage = (
            select(Turn)
            .where(Turn.session_id == session_id, col(Turn.usage_prompt_tokens).is_not(None), *mine)
            .order_by(col(Turn.seq).desc())
            .limit(usage_limit)
        )
        both = union_all(context, usage.subquery().select()).order_by(text("seq"))
        with storage_errors(session_id), Session(self._one) as db:
            rows = list(db.exec(select(Turn).from_statement(both)).scalars().all())  # type: ignore[call-overload]
        # a turn in both halves comes back twice, as one object (the session's identity map)
        unique = list({t.id: t for t in rows}.values())
        window = [t for t in unique if t.state == TurnState.context]
        with_usage = [t for t in reversed(unique) if t.usage_prompt_tokens is not None][:usage_limit]
        return window, with_usage

    def user_texts(
        self,
        session_id: str,
        *,
        through_seq: int,
        seqs: Collection[int] | None = None,
        user_id: str | None = None,
    ) -> dict[int, str]:
        """The user's turns with ``seq <= through_seq``, ``seq`` → verbatim text (for validating
        quotes); only those whose seq is in ``seqs`` when it is given (read by the
        ``(session_id, seq)`` key, however long the session)."""
        query = select(Turn.seq, Turn.content).where(
            Turn.session_id == session_id, Turn.role == "user", Turn.seq <= through_seq
        )
        if user_id is not None:
            query = query.where(Turn.user_id == user_id)
        if seqs is not None:
            if not seqs:
                return {}
            query = query.where(col(Turn.seq).in_(sorted(seqs)))
        with storage_errors(session_id), Session(self._one) as db:
            return {seq: content for seq, content in db.exec(query).all()}

    def rolled_out_count(self, session_id: str, *, excluding: Collection[int] = (), user_id: str | None = None) -> int:
        """How many of the session's turns are no longer in the recent window (summarized or
        archived), leaving out those whose seq is in ``excluding``. One count, no rows read back."""
        query = (
            select(func.count()).select_from(Turn).where(Turn.session_id == session_id, Turn.state != TurnState.context)
        )
        if user_id is not None:
            query = query.where(Turn.user_id == user_id)
        if excluding:
            query = query.where(col(Turn.seq).not_in(sorted(excluding)))
        with storage_errors(session_id), Session(self._one) as db:
            return int(db.exec(query).one())

    # -- attachments --------------------------------------------------------------
    def attachments(self, session_id: str, *, head_chars: int) -> dict[int, list[TurnFile]]:
        """The files carried by the session's turns: turn id -> :class:`TurnFile` rows in attachment
        order, each with the first ``head_chars`` characters of its extract. A read: nothing changes.
        """
        with storage_errors(session_id), Session(self._one) as db:
            rows = (
                db.execute(
                    text(
                        "SELECT tf.turn_id, tf.position, f.id AS file_id, f.name, f.mime, f.size_bytes, f.durability, "
                        "f.parse_state, f.parse_error, f.page_count, f.body_start_page, "
                        "left(f.extract, :head) AS text_head, length(f.extract) AS text_chars "
                        "FROM turn_files tf JOIN turns t ON t.id = tf.turn_id JOIN files f ON f.id = tf.file_id "
                        "WHERE t.session_id = :s ORDER BY t.seq, tf.position"
                    ).bindparams(s=session_id, head=max(int(head_chars), 0))
                )
                .mappings()
                .all()
            )
        out: dict[int, list[TurnFile]] = {}
        for row in rows:
            values = dict(row)
            out.setdefault(values.pop("turn_id"), []).append(TurnFile(**values))
        return out

    def existing_file_ids(self, file_ids: Iterable[str], *, user_id: str) -> set[str]:
        """Those of ``file_ids`` that exist and belong to ``user_id``."""
        ids = list(dict.fromkeys(file_ids))
        if not ids:
            return set()
        with storage_errors(), Session(self._one) as db:
            rows = db.execute(
                text("SELECT id FROM files WHERE user_id = :u AND id = ANY(:ids)").bindparams(u=user_id, ids=ids)
            ).all()
        return {r[0] for r in rows}

    def last_seq(self, session_id: str) -> int:
        """The session's last turn's ``seq`` (0 for none)."""
        with storage_errors(session_id), Session(self._engine) as db:
            return int(db.exec(select(func.coalesce(func.max(Turn.seq), 0)).where(Turn.session_id == session_id)).one())

    def truncate_from(self, session_id: str, *, seq: int, expected_last_seq: int | None = None) -> dict[str, Any]:
        """Delete the session's turns with ``seq >= seq`` (and their ``turn_files`` rows) in one
        transaction, for editing and resending the turn ``seq``. ``expected_last_seq``: the last
        turn the caller saw; if the session holds a later one, nothing is deleted (checked under
        the session row's lock, in the same transaction).

        Returns ``{"turns": deleted count, "file_ids": ids those turns carried}``; the files
        themselves stay (the caller removes those nothing references any more, afterwards).

        Raises:
            InvalidMessageError: ``reason="bad_edit"``: no such turn, it is not a user turn, or a
                turn from it on has left the recent window (summarized or archived turns are
                never deleted).
            TurnsChangedError: the session's last turn is after ``expected_last_seq``.
        """
        with storage_errors(session_id), Session(self._engine) as db:
            db.execute(text("SELECT id FROM sessions WHERE id = :s FOR UPDATE").bindparams(s=session_id))
            if expected_last_seq is not None:
                last = int(
                    db.exec(select(func.coalesce(func.max(Turn.seq), 0)).where(Turn.session_id == session_id)).one()
                )
                if last > expected_last_seq:
                    raise TurnsChangedError(
                        f"Session {session_id!r} has turns up to {last}, after turn {expected_last_seq}, the last one "
                        "seen when the edit was asked; nothing was deleted. Show the new turns and edit again.",
                        session_id=session_id,
                        expected_last_seq=expected_last_seq,
                        last_seq=last,
                    )
            target = db.exec(select(Turn).where(Turn.session_id == session_id, Turn.seq == seq)).first()
            if target is None or target.role != "user":
                raise InvalidMessageError(
                    f"Session {session_id!r} has no user turn {seq}; only a stored user turn can be edited and resent.",
                    reason="bad_edit",
                )
            rolled = db.exec(
                select(func.count())
                .select_from(Turn)
                .where(Turn.session_id == session_id, Turn.seq >= seq, Turn.state != TurnState.context)
            ).one()
            if rolled:
                raise InvalidMessageError(
                    f"Turn {seq} of session {session_id!r} has left the recent window (it is summarized or "
                    "archived); only turns still in the recent window can be edited and resent.",
                    reason="bad_edit",
                )
            file_ids = [
                r[0]
                for r in db.execute(
                    text(
                        "SELECT tf.file_id FROM turn_files tf JOIN turns t ON t.id = tf.turn_id "
                        "WHERE t.session_id = :s AND t.seq >= :q ORDER BY t.seq, tf.position"
                    ).bindparams(s=session_id, q=seq)
                ).all()
            ]
            db.execute(
                text(
                    "DELETE FROM turn_files WHERE turn_id IN (SELECT id FROM turns WHERE session_id = :s AND seq >= :q)"
                ).bindparams(s=session_id, q=seq)
            )
            deleted = cast(
                "CursorResult[Any]",
                db.execute(
                    text("DELETE FROM turns WHERE session_id = :s AND seq >= :q").bindparams(s=session_id, q=seq)
                ),
            ).rowcount
            db.commit()
        return {"turns": int(deleted), "file_ids": list(dict.fromkeys(file_ids))}

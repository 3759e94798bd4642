"""What a character remembers of a user: seen, searched, forgotten one by one, and messages deleted.

A memory is an archived segment. Forgetting one deletes its row (its text, vector and lexemes are
that row) and rewrites every summary of the user that holds the forgotten turns: the entries of
those turns (a quote, an assistant line, a note made from them; in the session's own summary and
in every summary that carried them on) are left out by their typed ``seq``/``from_seq``, and so is
a model note that quotes the forgotten words; the summary is rendered again from what is left. A
profile note left out takes the learned fact made from it (the same text) with it. The transcript
keeps the turns. Deleting a message does the same for one turn and deletes the turn too, with its
vector, its ``turn_files`` rows and the files no other turn carries, under the session's claim (a
running turn is waited for, as an edit waits).
"""

from __future__ import annotations

import contextlib
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import structlog

from errors import ConflictError, EmbedderUnavailableError, NotFoundError, SessionClosedError
from memory.embeddings import Embedder
from memory.files import FileStore
from memory.memories import Forgetting, SummaryRewrite
from memory.recall import RecallPreset
from memory.store import Store
from memory.tables import ArchivedSegment
from runtime.accounting import TokenCounter
from runtime.compaction import render_summary
from runtime.context import summary_profile_facts
from runtime.summary_items import SummaryItem, SummaryNote, items_from_json, items_to_json
from runtime.turn._runner import TurnRunner

log = structlog.get_logger("companion.memories")

ATTEMPTS = 3
"""Forgetting is tried this many times while a compaction holds a summary's lock or rewrote it meanwhile."""
LOCK_RETRY_SECONDS = 0.5
"""Pause before the next try, times the try's number, seconds."""
_QUOTED = re.compile(r"[\"“「『‘]([^\"”」』’]{3,})[\"”」』’]")
"""Words in quotation marks in a model note: the user's own words, by the summarizer's rule."""


@dataclass(frozen=True, kw_only=True)
class Memory:
    """One thing a character remembers of a user: an archived segment."""

    id: str
    """``seg_`` and the segment's number: what ``DELETE /v1/memories/{id}`` takes."""
    session_id: str
    character_id: str
    first_seq: int
    last_seq: int
    content: str
    date: datetime
    score: float | None = None
    """The recall score, for a search."""


def memory_id(segment_id: int) -> str:
    return f"seg_{segment_id}"


def segment_number(memory: str) -> int | None:
    """The segment number of a memory id, or ``None`` for an id no memory can have."""
    if not memory.startswith("seg_") or not memory[4:].isdigit() or len(memory) > 24:
        return None
    return int(memory[4:])


class MemoryOps:
    """Seeing, searching and forgetting what characters remember of users."""

    def __init__(
        self,
        *,
        store: Store,
        files: FileStore | None,
        runner: TurnRunner,
        embedder: Embedder,
        counter: TokenCounter,
        preset: RecallPreset,
    ) -> None:
        self.store, self.files, self.runner = store, files, runner
        self.embedder, self.counter, self.preset = embedder, counter, preset

    # -- seeing ------------------------------------------------------------------
    def page(
        self,
        user_id: str,
        *,
        character_id: str | None = None,
        before: datetime | None = None,
        after: datetime | None = None,
        limit: int = 50,
        cursor: str | None = None,
    ) -> list[Memory]:
        """The user's memories (of ``character_id``'s sessions, when given), newest first."""
        after_id = segment_number(cursor) if cursor else None
        rows = self.store.memories.page(
            user_id, character_id=character_id, before=before, after=after, limit=limit, cursor=after_id
        )
        return [_memory(s) for s in rows]

    def search(self, user_id: str, query: str, *, character_id: str | None = None, limit: int = 20) -> list[Memory]:
        """The user's memories that recall finds for ``query``, best first (the turn's recall; by
        full text and dates alone while the embedder is down)."""
        try:
            vector: list[float] | None = self.embedder.embed([query])[0]
        except EmbedderUnavailableError as exc:
            log.warning("embedder.unavailable", at="memory_search", model=exc.model, status=exc.status)
            vector = None
        found = self.store.archive.recall(
            self.preset.query(user_id=user_id, character_id=character_id, query_embedding=vector, query_text=query)
        )
        characters = self.store.memories.sessions_of(user_id)
        out = []
        for s in found:
            if s.neighbour_of is not None:
                continue
            out.append(
                Memory(
                    id=memory_id(s.id),
                    session_id=s.session_id,
                    character_id=characters.get(s.session_id, ""),
                    first_seq=s.first_seq,
                    last_seq=s.last_seq,
                    content=s.content,
                    date=s.session_date,
                    score=s.score,
                )
            )
        return out[:limit]

    def learned(self, user_id: str, *, character_id: str | None = None) -> list[str]:
        return self.store.profiles.learned(user_id, character_id=character_id)

    def quotes(self, user_id: str, *, character_id: str | None = None) -> list[dict[str, Any]]:
        """The user's words quoted in the current summaries (of ``character_id``'s sessions)."""
        characters = self.store.memories.sessions_of(user_id)
        out = []
        for summary in self.store.memories.summaries(user_id):
            if character_id is not None and characters.get(summary.session_id) != character_id:
                continue
            for item in items_from_json(summary.items, session_id=summary.session_id):
                if item.role == "user":
                    out.append(
                        {"session_id": summary.session_id, "seq": item.seq, "date": item.date, "text": item.text}
                    )
        return out

    # -- forgetting ----------------------------------------------------------------
    def forget(self, user_id: str, memory: str) -> dict[str, int]:
        """Forget one memory of ``user_id`` (see the module docstring). Counts by table.

        Raises:
            NotFoundError: no such memory of this user.
            ConflictError: compactions kept rewriting the summaries meanwhile; nothing was forgotten.
        """
        number = segment_number(memory)
        segment = self.store.memories.segment(number, user_id=user_id) if number is not None else None
        if segment is None:
            raise NotFoundError(f"No memory {memory!r}.", kind="memory", resource_id=memory)
        turns = self.store.memories.turns(
            segment.session_id, user_id=user_id, first_seq=segment.first_seq, last_seq=segment.last_seq
        )
        seqs = set(range(segment.first_seq, segment.last_seq + 1))
        assert segment.id is not None
        counts = self._forget(
            user_id, segment.session_id, seqs, [t.content for t in turns if t.role == "user"], [segment.id], []
        )
        log.info("memory.forgotten", session_id=segment.session_id, **counts)
        return counts

    def delete_turn(self, user_id: str, session_id: str, seq: int) -> dict[str, int]:
        """Delete the message ``seq`` of the session everywhere: the turn, its vector, the segments
        that hold it, its entries in every summary, the learned facts made from them, and the
        files only it carried. Under the session's claim (a closed session needs none). Counts by table
        (``files``: files deleted).

        Raises:
            NotFoundError: no such turn. TurnInProgressError: a turn of the session kept running.
            ConflictError: compactions kept rewriting the summaries; nothing was deleted.
        """
        try:
            claim: contextlib.AbstractContextManager[Any] = self.runner.claim(session_id, user_id=user_id)
        except SessionClosedError:  # a closed session runs no turn: nothing to wait for
            claim = contextlib.nullcontext()
        with claim:
            found = self.store.memories.turns(session_id, user_id=user_id, first_seq=seq, last_seq=seq)
            if not found:
                raise NotFoundError(f"No turn {seq} in session {session_id!r}.", kind="turn", resource_id=str(seq))
            turn = found[0]
            assert turn.id is not None
            file_ids = [f.file_id for f in self.store.turns.attachments(session_id, head_chars=0).get(turn.id, [])]
            segments = [s.id for s in self.store.memories.covering(session_id, user_id=user_id, seq=seq) if s.id]
            said = [turn.content] if turn.role == "user" else []
            counts = self._forget(user_id, session_id, {seq}, said, segments, [turn.id])
        if self.files is not None and file_ids:
            counts["files"] = len(self.files.delete_unreferenced(file_ids))
        log.info("turn.deleted", session_id=session_id, seq=seq, **counts)
        return counts

    def _forget(
        self,
        user_id: str,
        session_id: str,
        seqs: set[int],
        said: Sequence[str],
        segment_ids: Sequence[int],
        turn_ids: Sequence[int],
    ) -> dict[str, int]:
        """Rewrite and write, holding the compaction lock of every session whose summary changes
        (and of ``session_id``), so that no compaction that read a summary before brings the
        forgotten words back; a busy lock or a summary changed meanwhile is tried again."""
        for attempt in range(ATTEMPTS):
            summaries, facts = self._rewrites(user_id, session_id, seqs, said)
            sessions = sorted({session_id, *(r.session_id for r in summaries)})
            with contextlib.ExitStack() as locks:
                held = all(locks.enter_context(self.store.compaction.lock(s)) for s in sessions)
                if held:
                    try:
                        return self.store.memories.forget(
                            user_id,
                            Forgetting(segment_ids=segment_ids, turn_ids=turn_ids, summaries=summaries, facts=facts),
                        )
                    except ConflictError:
                        if attempt == ATTEMPTS - 1:
                            raise
            if not held and attempt == ATTEMPTS - 1:
                raise ConflictError(
                    f"A compaction of session {session_id!r} or a session carrying its summary kept running; "
                    "nothing was forgotten. Try again."
                )
            time.sleep(LOCK_RETRY_SECONDS * (attempt + 1))
        raise AssertionError("unreachable")

    def _rewrites(
        self, user_id: str, session_id: str, seqs: set[int], said: Sequence[str]
    ) -> tuple[list[SummaryRewrite], dict[str, list[str]]]:
        """Every summary of the user without the entries of ``seqs`` of ``session_id`` (and the
        notes quoting ``said``), rendered again; and the learned facts of the profile notes left out."""
        characters = self.store.memories.sessions_of(user_id)
        folded = [_fold(s) for s in said if s.strip()]
        rewrites: list[SummaryRewrite] = []
        facts: dict[str, list[str]] = {}

        def gone(item: SummaryItem, own: str) -> bool:
            if item.carried_from == session_id and item.from_seq in seqs:
                return True
            if own == session_id and item.carried_from is None and item.seq in seqs:
                return True
            return isinstance(item, SummaryNote) and any(
                any(q in s for s in folded) for q in (_fold(m) for m in _QUOTED.findall(item.text))
            )

        for summary in self.store.memories.summaries(user_id):
            items = items_from_json(summary.items, session_id=summary.session_id)
            kept = [i for i in items if not gone(i, summary.session_id)]
            if len(kept) == len(items):
                continue
            learned = summary_profile_facts([i for i in items if gone(i, summary.session_id)])
            character = characters.get(summary.session_id)
            if character is not None and learned:
                facts.setdefault(character, []).extend(learned)
            in_summary = {i.seq for i in kept if i.seq is not None and i.seq > 0 and i.carried_from is None}
            omitted = self.store.turns.rolled_out_count(summary.session_id, excluding=in_summary, user_id=user_id)
            content = render_summary(kept, omitted, compact=summary.content.startswith("<summary>\n"))
            rewrites.append(
                SummaryRewrite(
                    session_id=summary.session_id,
                    seen=summary.updated_at,
                    content=content,
                    items=items_to_json(kept),
                    tokens=self.counter.count_text(content),
                )
            )
        return rewrites, facts


def _fold(text: str) -> str:
    return " ".join(text.split()).casefold()


def _memory(s: ArchivedSegment) -> Memory:
    assert s.id is not None
    return Memory(
        id=memory_id(s.id),
        session_id=s.session_id,
        character_id=s.character_id,
        first_seq=s.first_seq,
        last_seq=s.last_seq,
        content=s.content,
        date=s.session_date,
    )

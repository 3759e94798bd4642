"""Typed summary items: the flat entries a rolling summary is made of.

A summary (see :mod:`runtime.compaction`) is a flat list of items, oldest first: the user's own
words (:class:`UserQuote`), the companion's shortened lines (:class:`AssistantLine`, from the
model-free summarizer) and the model summarizer's notes (:class:`SummaryNote`). Each is a frozen
keyword-only value with a ``kind`` discriminator, like :mod:`runtime.messages`.

Storage keeps them as JSON objects in ``summaries.items`` (:class:`memory.tables.Summary`), and
storage imports nothing from the runtime, so the runtime converts where it reads or writes that
column, and only there: :func:`items_from_json` and :func:`items_to_json`. The JSON shapes are
the ones every stored row already has (a loaded row converts back to the same JSON object):

- a user quote: ``{"seq": int, "role": "user", "date": "YYYY-MM-DD", "text": str}``, plus
  ``"section": "quotes"`` from the model summarizer and ``"cut_of": int`` (characters of the
  whole turn) when only a prefix of an oversized turn is quoted;
- an assistant line: ``{"seq": int, "role": "assistant", "date": "YYYY-MM-DD", "text": str}``;
- a note: ``{"role": "note", "section": one of NOTE_SECTIONS, "date": "YYYY-MM-DD" or null,
  "text": str}``; profile notes of early model-free summaries also carry the turn's ``"seq"``;
- any of them carried into a new session (``memory.apps.carry_items``) also has
  ``"carried_from"`` (the old session's id) and, when it has a seq, ``"from_seq"`` (its seq
  there); its ``seq`` is renumbered to ``-(m-1) … 0``.

A quote's ``date`` is ``"?"`` when the model quoted a turn whose date was not known.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Literal, cast, get_args

from errors import StorageError

ItemJSON = dict[str, str | int | None]
"""One item as stored: a JSON object whose values are strings, integers or null."""

NoteSection = Literal["profile", "relationship", "preferences", "open_threads"]
"""A model note's part of the summary (the quotes are the fifth)."""

NOTE_SECTIONS: tuple[NoteSection, ...] = get_args(NoteSection)
"""The model summary's parts besides the quotes, in the order they are rendered."""


@dataclass(frozen=True, kw_only=True)
class UserQuote:
    """The user's own words, verbatim: the whole turn or (``cut_of`` set) a prefix of it."""

    kind: Literal["quote"] = "quote"
    seq: int
    """The quoted turn's per-session sequence number (``<= 0`` for a carried-over quote)."""
    date: str
    """When it was said, ISO date (``YYYY-MM-DD``); ``"?"`` if not known."""
    text: str
    """The quoted words: an exact substring of the turn (only whitespace may differ)."""
    cut_of: int | None = None
    """Length of the whole turn, characters, when :attr:`text` is only a prefix of it."""
    section: Literal["quotes"] | None = None
    """``"quotes"`` when the model summarizer wrote it; ``None`` (no key in the JSON) otherwise."""
    carried_from: str | None = None
    """The session it was carried over from, if any."""
    from_seq: int | None = None
    """Its seq in :attr:`carried_from`, for a carried-over item."""

    @property
    def role(self) -> Literal["user"]:
        """The JSON ``role``."""
        return "user"


@dataclass(frozen=True, kw_only=True)
class AssistantLine:
    """The first sentence of one companion reply, shortened (model-free summarizer)."""

    kind: Literal["assistant_line"] = "assistant_line"
    seq: int
    """The reply's per-session sequence number (``<= 0`` for a carried-over line)."""
    date: str
    """When it was said, ISO date (``YYYY-MM-DD``)."""
    text: str
    """The shortened line (at most ``ASSISTANT_LINE_CHARS`` characters of the summarizers)."""
    carried_from: str | None = None
    """The session it was carried over from, if any."""
    from_seq: int | None = None
    """Its seq in :attr:`carried_from`, for a carried-over item."""

    @property
    def role(self) -> Literal["assistant"]:
        """The JSON ``role``."""
        return "assistant"


@dataclass(frozen=True, kw_only=True)
class SummaryNote:
    """A note the model summarizer wrote in one of the :data:`NOTE_SECTIONS`."""

    kind: Literal["note"] = "note"
    section: NoteSection
    text: str
    """The note, in the model's words; words in quotation marks must be the user's own."""
    date: str | None = None
    """ISO date (``YYYY-MM-DD``) of the event it records, or ``None``."""
    seq: int | None = None
    """The turn it came from; only profile notes of early model-free summaries have one."""
    carried_from: str | None = None
    """The session it was carried over from, if any."""
    from_seq: int | None = None
    """Its seq in :attr:`carried_from`, for a carried-over note with a seq."""

    @property
    def role(self) -> Literal["note"]:
        """The JSON ``role``."""
        return "note"


SummaryItem = UserQuote | AssistantLine | SummaryNote
"""One flat summary entry."""


# -- the storage boundary ------------------------------------------------------------------
_KEYS: dict[str, frozenset[str]] = {
    "user": frozenset({"seq", "role", "date", "text", "cut_of", "section", "carried_from", "from_seq"}),
    "assistant": frozenset({"seq", "role", "date", "text", "carried_from", "from_seq"}),
    "note": frozenset({"seq", "role", "section", "date", "text", "carried_from", "from_seq"}),
}


class _Reader:
    """Reads one stored JSON object's fields, raising :class:`StorageError` naming the field."""

    def __init__(self, data: Mapping[str, object], *, index: int, session_id: str | None) -> None:
        self.data, self.index, self.session_id = data, index, session_id

    def error(self, what: str) -> StorageError:
        where = f" of session {self.session_id!r}" if self.session_id is not None else ""
        return StorageError(
            f"Summary entry {self.index}{where} is not a summary item: {what}.", session_id=self.session_id
        )

    def integer(self, key: str) -> int:
        value = self.data.get(key)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self.error(f"{key!r} is not an integer")
        return value

    def string(self, key: str) -> str:
        value = self.data.get(key)
        if not isinstance(value, str):
            raise self.error(f"{key!r} is not a string")
        return value

    def optional_integer(self, key: str) -> int | None:
        """``None`` when the key is absent (a stored ``null`` is an error: no shape writes one)."""
        return self.integer(key) if key in self.data else None

    def optional_string(self, key: str) -> str | None:
        return self.string(key) if key in self.data else None


def item_from_json(data: Mapping[str, object], *, index: int = 0, session_id: str | None = None) -> SummaryItem:
    """The typed item a stored JSON object holds (shapes in the module docstring).

    Args:
        index: the entry's 0-based position in its summary, for the error message.
        session_id: the summary's session, for the error message.

    Raises:
        StorageError: the object has an unknown ``role``, a key its role does not have, or a
            field of the wrong type; the message names the entry and the field.
    """
    read = _Reader(data, index=index, session_id=session_id)
    role = data.get("role")
    if not isinstance(role, str) or role not in _KEYS:
        raise read.error("'role' is not user, assistant or note")
    unknown = sorted(set(data) - _KEYS[role])
    if unknown:
        raise read.error(f"a {role} entry has an unknown key {unknown[0]!r}")
    carried_from, from_seq = read.optional_string("carried_from"), read.optional_integer("from_seq")
    if role == "note":
        section = data.get("section")
        if section not in NOTE_SECTIONS:
            raise read.error(f"'section' is not one of {', '.join(NOTE_SECTIONS)}")
        if "date" not in data:
            raise read.error("'date' is missing")
        return SummaryNote(
            section=cast(NoteSection, section),
            text=read.string("text"),
            date=None if data["date"] is None else read.string("date"),
            seq=read.optional_integer("seq"),
            carried_from=carried_from,
            from_seq=from_seq,
        )
    seq, date, text = read.integer("seq"), read.string("date"), read.string("text")
    if role == "assistant":
        return AssistantLine(seq=seq, date=date, text=text, carried_from=carried_from, from_seq=from_seq)
    if data.get("section", "quotes") != "quotes":
        raise read.error("a user entry's 'section' is not 'quotes'")
    return UserQuote(
        seq=seq,
        date=date,
        text=text,
        cut_of=read.optional_integer("cut_of"),
        section="quotes" if "section" in data else None,
        carried_from=carried_from,
        from_seq=from_seq,
    )


def item_to_json(item: SummaryItem) -> ItemJSON:
    """The JSON object storage keeps for ``item``: optional keys only when set, a note's
    ``date`` always (``null`` when unknown)."""
    out: ItemJSON = {}
    if item.seq is not None:
        out["seq"] = item.seq
    out["role"] = item.role
    if not isinstance(item, AssistantLine) and item.section is not None:
        out["section"] = item.section
    out["date"] = item.date
    out["text"] = item.text
    if isinstance(item, UserQuote) and item.cut_of is not None:
        out["cut_of"] = item.cut_of
    if item.carried_from is not None:
        out["carried_from"] = item.carried_from
    if item.from_seq is not None:
        out["from_seq"] = item.from_seq
    return out


def items_from_json(rows: Iterable[Mapping[str, object]], *, session_id: str | None = None) -> list[SummaryItem]:
    """A stored summary's items, in order. Raises :class:`StorageError` as :func:`item_from_json`."""
    return [item_from_json(row, index=n, session_id=session_id) for n, row in enumerate(rows)]


def items_to_json(items: Iterable[SummaryItem]) -> list[ItemJSON]:
    """The JSON objects storage keeps for ``items``, in order."""
    return [item_to_json(item) for item in items]

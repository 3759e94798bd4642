"""Attachments as a turn extension: checking a turn's attachment ids, warming their parses,
building each turn's blocks for assembly, and the ``file_read`` tool for a reply.

Rendering itself is :mod:`runtime.context`; the tool schema and loop glue
:mod:`runtime.files`; the turn loop :mod:`runtime.turn._runner`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, replace
from typing import Any

from errors import ConfigurationError, InvalidMessageError
from memory.files import FileStore, StoredFile
from memory.store import Store, TurnFile
from memory.tables import Turn
from runtime.accounting import TokenCounter
from runtime.config import FileSettings
from runtime.context import (
    AssembledContext,
    AttachedFile,
    TurnBlocks,
    compact_block,
    first_turn_block,
    folded_block,
    is_image_mime,
    is_text_mime,
    placeholder_ids,
    strip_placeholders,
)
from runtime.files import FileReader, ParseService, file_read_spec, file_tools, spec_tokens
from runtime.llm import Tools
from runtime.turn._extensions import Gathered

HEAD_MARGIN = 4000
"""Characters of an extract loaded beyond the inline limit (page markers, previews past the front matter)."""
UTF8_MAX_BYTES = 4
"""Bytes a character takes at most in UTF-8: a text file of at most ``4 * inline chars`` bytes may inline."""


def check_attachments(
    files: FileStore | None, *, user_id: str, session_id: str, attachments: Sequence[str]
) -> list[StoredFile]:
    """The stored files for ``attachments``, in order, duplicates dropped, after checking every id.
    Stores nothing.

    Raises:
        InvalidMessageError: ``bad_attachments``: not a list of id strings.
        ConfigurationError: attachments given but no file store.
        FileNotFound: an unknown id, another user's, or another session's ephemeral id.
    """
    if isinstance(attachments, str) or not all(isinstance(a, str) for a in attachments):
        raise InvalidMessageError(
            "attachments must be a list of file id strings, e.g. ['file_0123456789abcdef0123'].",
            reason="bad_attachments",
        )
    if not attachments:
        return []
    if files is None:
        raise ConfigurationError(
            "This engine has no file store, so a turn cannot carry attachments. Open it with "
            "runtime.service.open_engine (COMPANION_BLOB_STORE).",
            setting="COMPANION_BLOB_STORE",
        )
    return list(files.get_many(list(attachments), user_id=user_id, session_id=session_id, with_extract=False).values())


def warm(parses: ParseService | None, attached: Sequence[StoredFile], *, settings: FileSettings) -> None:
    """Ask for the parses of new attachments (:meth:`ParseService.request`); wait (at most ``COMPANION_FILE_READ_WAIT`` seconds
    each) for small text files, so that the first turn can inline them."""
    if parses is None:
        return
    for stored in attached:
        if stored.is_final:
            continue
        parses.request(stored.id)
        if is_text_mime(stored.mime) and stored.size_bytes <= UTF8_MAX_BYTES * settings.inline_file_chars:
            with parses.watch(stored.id) as handle:
                handle.wait(settings.read_wait)


def attached(row: TurnFile) -> AttachedFile:
    """The context's value for a stored turn-file row."""
    return AttachedFile(**asdict(row))


def session_attachments(
    store: Store, *, user_id: str, session_id: str, turns: list[Turn], settings: FileSettings, has_files: bool = True
) -> Gathered:
    """The attachment blocks of the user turns in ``turns``, the files of the session's
    rolled-out turns, and ``turns`` without echoed placeholders of deleted files. A read;
    ``has_files`` ``False`` (no turn of the session carries a file) skips reading the files."""
    rows = store.turns.attachments(session_id, head_chars=settings.inline_file_chars + HEAD_MARGIN) if has_files else {}
    blocks: dict[int, TurnBlocks] = {}
    images: dict[int, list[AttachedFile]] = {}
    for turn in turns:
        files = [attached(row) for row in rows.get(turn.id or -1, [])]
        if any(is_image_mime(f.mime) for f in files):  # images: the images extension renders them
            images[turn.seq] = [f for f in files if is_image_mime(f.mime)]
            files = [f for f in files if not is_image_mime(f.mime)]
        if not files or turn.role != "user":
            continue
        blocks[turn.seq] = TurnBlocks(
            first=first_turn_block(files, inline_chars=settings.inline_file_chars),
            folded=folded_block(files, preview_chars=settings.preview_chars),
            compact=compact_block(files),
            file_ids=tuple(f.file_id for f in files),
        )
    in_window = {t.id for t in turns}
    shown = {fid for b in blocks.values() for fid in b.file_ids}
    earlier: dict[str, AttachedFile] = {}
    for turn_id, turn_rows in rows.items():  # in turn order
        if turn_id in in_window:
            continue
        for row in turn_rows:
            if row.file_id not in shown:
                earlier.pop(row.file_id, None)  # attached again later: listed at its latest place
                earlier[row.file_id] = attached(row)
    named = placeholder_ids(t.content for t in turns)
    if named:
        live = store.turns.existing_file_ids(named, user_id=user_id)
        if live != named:
            turns = [
                t.model_copy(update={"content": strip_placeholders(t.content, keep=live.__contains__)}) for t in turns
            ]
    return Gathered(turns=turns, blocks=blocks, earlier=list(earlier.values()), images=images)


class FileTool:
    """``file_read`` as offered to the model: while a context shows any file, for one reply."""

    def __init__(self, reader: FileReader | None, *, settings: FileSettings, counter: TokenCounter) -> None:
        self.reader = reader
        self.settings = settings
        self.counter = counter
        self.spec: dict[str, Any] = file_read_spec(max_pages=settings.read_pages, max_chars=settings.read_chars)
        self.tokens: int = spec_tokens(self.spec, counter)
        """Tokens the schema adds to a request that offers it."""

    @property
    def available(self) -> bool:
        return self.reader is not None and self.settings.tool_rounds >= 1

    def offered(self, context: AssembledContext) -> bool:
        """True if a reply to ``context`` is offered the tool."""
        return self.available and bool(context.attached_files)

    def for_reply(self, context: AssembledContext, *, user_id: str, session_id: str, window: int) -> Tools | None:
        """The tool for a reply to ``context`` in a ``window``-token window, or ``None`` if not offered.
        Results of one round may take half of the room the context leaves."""
        if not self.offered(context):
            return None
        assert self.reader is not None
        limit = window - context.reply_reserve - self.tokens - context.overhead_tokens
        return file_tools(
            self.reader,
            user_id=user_id,
            session_id=session_id,
            spec=self.spec,
            counter=self.counter,
            limit=limit,
            result_cap=(limit - (context.total_tokens - context.overhead_tokens)) // 2,
            max_rounds=self.settings.tool_rounds,
        )


class AttachmentsExtension:
    """Documents attached to turns (:class:`~runtime.turn._extensions.TurnExtension`): their blocks,
    the files of rolled-out turns, and ``file_read`` while any is shown."""

    name = "attachments"

    def __init__(
        self,
        *,
        store: Store,
        parses: ParseService | None,
        reader: FileReader | None,
        settings: FileSettings,
        counter: TokenCounter,
    ) -> None:
        self.store = store
        self.parses = parses
        self.settings = settings
        self.file_tool = FileTool(reader, settings=settings, counter=counter)

    def stored(self, attached: Sequence[StoredFile]) -> None:
        warm(self.parses, attached, settings=self.settings)

    def prepare(self, *, session_id: str) -> None:
        return None

    def gather(self, gathered: Gathered, *, user_id: str, session_id: str) -> Gathered:
        found = session_attachments(
            self.store,
            user_id=user_id,
            session_id=session_id,
            turns=gathered.turns,
            settings=self.settings,
            has_files=gathered.files,
        )
        # while files are shown, the file_read schema goes with every request
        schema = self.file_tool.tokens if self.file_tool.available and (found.blocks or found.earlier) else 0
        return replace(
            gathered,
            turns=found.turns,
            blocks={**gathered.blocks, **found.blocks},
            earlier=[*gathered.earlier, *found.earlier],
            images={**gathered.images, **found.images},
            reserved_tokens=gathered.reserved_tokens + schema,
        )

    def finish(self, context: AssembledContext, gathered: Gathered) -> AssembledContext:
        return context

    def tools(
        self, tools: Tools | None, context: AssembledContext, *, user_id: str, session_id: str, window: int
    ) -> Tools | None:
        return self.file_tool.for_reply(context, user_id=user_id, session_id=session_id, window=window) or tools

    def request_tokens(self, context: AssembledContext) -> int:
        return self.file_tool.tokens if self.file_tool.offered(context) else 0

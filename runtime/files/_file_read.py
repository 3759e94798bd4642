"""The ``file_read`` tool: a bounded window of a stored file's pages.

:func:`read_window` slices an extract (``--- page N ---`` text, see
``runtime.parsing``) knowing only page numbers. A window holds at most
``max_pages`` pages (``COMPANION_FILE_READ_PAGES``, 8) and about ``max_chars``
characters (``COMPANION_FILE_READ_CHARS``, 28,000); its text always says which pages
it holds, how many there are, and how to read on.

Where a window starts, in order of authority:

1. an explicit ``start_page``;
2. ``focus``: the first page containing the keyword (case-insensitive), with one page
   before it for context when the window has room. Without ``start_page`` the body is
   searched first and the front matter after it (a contents page names every chapter,
   so it would win every search); with ``start_page`` the search starts there;
3. the file's ``body_start_page``, set by the parser from (a) the PDF outline's first
   body entry, (b) the scored table-of-contents heuristic over the first pages, or
   (c) the catalog page of a container (ZIP, EPUB). The skipped pages are named, and
   ``start_page=1`` reads them;
4. page 1.

:class:`FileReader` adds the readiness rules: an unknown or foreign id fails at once
(:class:`~errors.FileNotFound`); an extract not ready yet is waited for at most
``COMPANION_FILE_READ_WAIT`` seconds (a shared wait, see ``runtime.files``),
then the result says "still processing", never an empty or stale page. A finished
parse with no text says ``EXTRACT_EMPTY``; a scanned PDF says ``NEEDS_OCR``; a failed
parse gives its error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import prompts
from errors import FileInputError
from memory.files import FileStore, StoredFile
from runtime.files._parse_service import ParseService
from runtime.parsing import MARKER, pages_of, unescape_page

DEFAULT_MAX_PAGES = 8
"""``COMPANION_FILE_READ_PAGES`` default: pages per window."""
DEFAULT_MAX_CHARS = 28_000
"""``COMPANION_FILE_READ_CHARS`` default: characters of page text per window (about 7,000 tokens)."""
DEFAULT_WAIT_SECONDS = 3.0
"""``COMPANION_FILE_READ_WAIT`` default: seconds ``file_read`` waits for a parse in progress."""
MAX_FOCUS_CHARS = 200
"""Longest ``focus`` keyword accepted, characters."""


@dataclass(frozen=True, kw_only=True)
class WindowLimits:
    """The most one ``file_read`` call returns."""

    max_pages: int = DEFAULT_MAX_PAGES
    """Pages per window."""
    max_chars: int = DEFAULT_MAX_CHARS
    """Characters of page text per window (the markers and notes not counted)."""

    def __post_init__(self) -> None:
        if self.max_pages < 1 or self.max_chars < 100:
            raise FileInputError(
                f"Window limits must be at least 1 page and 100 characters, got {self.max_pages} and {self.max_chars}.",
                reason="bad_argument",
            )


def _whole(value: object, name: str, *, file_id: str | None) -> int | None:
    """``value`` as a positive whole number (``None`` stays ``None``); digit strings are accepted
    because models sometimes send numbers as strings."""
    if value is None:
        return None
    if isinstance(value, bool):
        value = None
    elif isinstance(value, str) and value.strip().isdigit():
        value = int(value.strip())
    elif isinstance(value, float) and value.is_integer():
        value = int(value)
    if not isinstance(value, int) or value < 1:
        raise FileInputError(
            f"{name} must be a whole number from 1, got {value!r}.", reason="bad_argument", file_id=file_id
        )
    return value


def _arguments(
    start_page: object, max_pages: object, max_chars: object, focus: object, *, file_id: str | None
) -> tuple[int | None, int | None, int | None, str | None]:
    """The ``file_read`` arguments checked and normalised. Raises FileInputError (``bad_argument``)."""
    checked = (
        _whole(start_page, "start_page", file_id=file_id),
        _whole(max_pages, "max_pages", file_id=file_id),
        _whole(max_chars, "max_chars", file_id=file_id),
    )
    if focus is not None:
        focus = str(focus).strip()
        if not focus or len(focus) > MAX_FOCUS_CHARS:
            raise FileInputError(
                f"focus must be a keyword of 1 to {MAX_FOCUS_CHARS} characters, got {len(focus)} characters.",
                reason="bad_argument",
                file_id=file_id,
            )
    return (*checked, focus)


def read_window(
    source: StoredFile | PageSource | str,
    *,
    start_page: int | None = None,
    max_pages: int | None = None,
    focus: str | None = None,
    max_chars: int | None = None,
    limits: WindowLimits | None = None,
    body_start_page: int | None = None,
) -> str:
    """The ``file_read`` result for ``source``: a header, the pages with their markers, and a
    line on how to read more (or that the file ends).

    Args:
        source: a stored file (its parse state decides), its pages read from the database
            (:class:`PageSource`, taken as ready), or an extract text (taken as ready).
        start_page: first page to return, 1-based; overrides the front-matter skip and ``focus``'s start.
        max_pages: pages wanted; more than ``limits.max_pages`` is lowered to it (and said so).
        focus: a keyword: the window starts at (one page before) the first page containing it,
            searching from ``start_page`` or page 1.
        max_chars: characters wanted; at most ``limits.max_chars``.
        body_start_page: for a text ``source``, where its body starts (a stored file carries its own).

    Raises:
        FileInputError: ``bad_argument`` for a page or count below 1 or not a whole number,
            or an empty or over-long ``focus``.
    """
    limits = limits or WindowLimits()
    if isinstance(source, StoredFile):
        file_id, name = source.id, source.name
        state, text, body_start = source.parse_state, source.extract, source.body_start_page
        total_hint = source.page_count or 0
    elif isinstance(source, PageSource):
        file_id, name, state, text, body_start, total_hint = (
            source.file_id,
            source.name,
            "ready",
            None,
            source.body_start_page,
            0,
        )
    else:
        file_id, name, state, text, body_start, total_hint = "-", "text", "ready", source, body_start_page, 0
    start_page, asked_pages, asked_chars, focus = _arguments(start_page, max_pages, max_chars, focus, file_id=file_id)
    ids = {"file_id": file_id, "file_name": name}
    if state in ("pending", "parsing"):
        return prompts.render("file_read_processing", state=state, **ids)
    if state == "failed":
        return prompts.render(
            "file_read_failed",
            error=(source.parse_error if isinstance(source, StoredFile) else "") or "unknown error",
            **ids,
        )
    if state == "needs_ocr":
        return prompts.render("file_read_needs_ocr", total=total_hint, **ids)
    pages: Pages = source if isinstance(source, PageSource) else ListPages(pages_of(text))
    if state == "empty" or (isinstance(pages, ListPages) and not any(p.strip() for p in pages.pages)):
        return prompts.render("file_read_empty", **ids)
    total = len(pages)
    page_cap = min(asked_pages or limits.max_pages, limits.max_pages)
    char_cap = min(asked_chars or limits.max_chars, limits.max_chars)
    notes: list[str] = []
    if asked_pages is not None and asked_pages > limits.max_pages:
        notes.append(prompts.render("file_read_note_clamped", asked=asked_pages, limit=limits.max_pages))

    if start_page is not None and start_page > total:
        return prompts.render("file_read_past_end", start=start_page, total=total, **ids)
    if focus is not None:
        if start_page is None and body_start and 1 < body_start <= total:
            # the body first (a contents page names every chapter), then the front matter
            hit = pages.find(focus, start=body_start) or pages.find(focus, start=1, stop=body_start - 1)
        else:
            hit = pages.find(focus, start=start_page or 1)
        if hit is None:
            return prompts.render("file_read_focus_missing", focus=focus, total=total, **ids)
        first = (
            hit - 1
            if hit > (start_page or body_start or 1)
            and page_cap >= 3
            and len(pages[hit - 2]) + len(pages[hit - 1]) <= char_cap
            else hit
        )
        notes.insert(0, prompts.render("file_read_note_focus", focus=focus, hit=hit))
    elif start_page is not None:
        first = start_page
    elif body_start and 1 < body_start <= total:
        first = body_start
        notes.insert(
            0,
            prompts.render(
                "file_read_note_skipped", skipped="page 1" if body_start == 2 else f"pages 1-{body_start - 1}"
            ),
        )
    else:
        first = 1

    shown: list[str] = []
    used = 0
    page_no = first
    while page_no <= total and len(shown) < page_cap:
        body = pages[page_no - 1]
        if shown and used + len(body) > char_cap:
            break
        if len(body) > char_cap:  # only ever the window's first page
            body = body[:char_cap]
            notes.append(prompts.render("file_read_note_cut", page=page_no, chars=f"{char_cap:,}"))
        shown.append(f"{MARKER.format(n=page_no)}\n{body if body.strip() else prompts.render('file_read_blank_page')}")
        used += len(body)
        page_no += 1
    last = page_no - 1
    parts = [
        prompts.render("file_read_header", first=first, last=last, total=total, note="".join(notes), **ids),
        *shown,
    ]
    if last < total:
        parts.append(prompts.render("file_read_more", next=last + 1, total=total, **ids))
    else:
        parts.append(prompts.render("file_read_end", total=total))
    return "\n".join(parts)


def _folded(text: str) -> str:
    return " ".join(text.lower().split())


class Pages(Protocol):
    """The pages a window is cut from: ``len()``, ``pages[i]`` (0-based) and a keyword search."""

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> str: ...

    def find(self, focus: str, *, start: int, stop: int | None = None) -> int | None:
        """The first page number in ``start..stop`` (1-based, inclusive; ``stop`` ``None``: the last)
        whose text contains ``focus`` (case- and spacing-insensitive)."""
        ...


class ListPages:
    """Pages held in memory (an extract text given whole)."""

    def __init__(self, pages: list[str]) -> None:
        self.pages = pages

    def __len__(self) -> int:
        return len(self.pages)

    def __getitem__(self, index: int) -> str:
        return self.pages[index]

    def find(self, focus: str, *, start: int, stop: int | None = None) -> int | None:
        needle = _folded(focus)
        for number in range(start, min(stop or len(self.pages), len(self.pages)) + 1):
            if needle in _folded(self.pages[number - 1]):
                return number
        return None


class PageSource:
    """A stored file's pages, read one at a time from the database
    (:meth:`~memory.files.FileStore.extract_page`): a window costs its own pages, never the
    whole extract. The keyword search runs in the database too
    (:meth:`~memory.files.FileStore.extract_search`) and each candidate is checked here."""

    CACHE_PAGES = 16
    """Pages kept after reading (a window reads each of its pages at most once)."""

    def __init__(self, files: FileStore, stored: StoredFile) -> None:
        self.files = files
        self.file_id = stored.id
        self.name = stored.name
        self.total = stored.page_count or 0
        self.body_start_page = stored.body_start_page
        self._cache: dict[int, str] = {}

    def __len__(self) -> int:
        return self.total

    def __getitem__(self, index: int) -> str:
        number = index + 1 if index >= 0 else self.total + index + 1
        if number not in self._cache:
            if len(self._cache) >= self.CACHE_PAGES:
                self._cache.pop(next(iter(self._cache)))
            raw = self.files.extract_page(self.file_id, number)
            self._cache[number] = unescape_page(raw) if raw is not None else ""
        return self._cache[number]

    def find(self, focus: str, *, start: int, stop: int | None = None) -> int | None:
        needle = _folded(focus)
        stop = min(stop or self.total, self.total)
        number = start
        while number <= stop:
            candidate = self.files.extract_search(self.file_id, needle, start=number)
            if candidate is None or candidate > stop:
                return None
            if needle in _folded(self[candidate - 1]):
                return candidate
            number = candidate + 1  # the match spanned a page marker: search on after it
        return None


class FileReader:
    """Runs ``file_read`` for a user: ownership, the bounded readiness wait, the window.

    Args:
        files: the file store.
        parses: the parse service (its shared waits; it starts a pending parse).
        wait_seconds: longest wait for a parse in progress, seconds (``COMPANION_FILE_READ_WAIT``).
        limits: the window limits (``COMPANION_FILE_READ_PAGES``, ``COMPANION_FILE_READ_CHARS``).
    """

    def __init__(
        self,
        files: FileStore,
        parses: ParseService,
        *,
        wait_seconds: float = DEFAULT_WAIT_SECONDS,
        limits: WindowLimits | None = None,
    ) -> None:
        self.files = files
        self.parses = parses
        self.wait_seconds = wait_seconds
        self.limits = limits or WindowLimits()

    def file_read(
        self,
        file_id: str,
        user_id: str,
        *,
        start_page: int | None = None,
        max_pages: int | None = None,
        focus: str | None = None,
        session_id: str | None = None,
    ) -> str:
        """The tool result text for ``file_read(file_id, start_page?, max_pages?, focus?)``.

        Args:
            session_id: the session asking; an ephemeral id of another session is not found.

        Raises:
            FileNotFound: unknown id, another user's id, or another session's ephemeral id
                (at once, before any wait).
            FileInputError: a bad argument (see :func:`read_window`), before any wait.
        """
        stored = self.files.get(file_id, user_id=user_id, session_id=session_id, with_extract=False)
        _arguments(start_page, max_pages, None, focus, file_id=stored.id)  # bad arguments fail before any wait
        if not stored.is_final:
            with self.parses.watch(stored.id) as handle:
                handle.wait(self.wait_seconds)
        stored = self.files.get(file_id, user_id=user_id, session_id=session_id, with_extract=False)
        if stored.parse_state == "ready" and stored.page_count:
            source: StoredFile | PageSource = PageSource(self.files, stored)
        else:
            source = stored  # not ready: the state (or its error) answers; nothing to read
        return read_window(source, start_page=start_page, max_pages=max_pages, focus=focus, limits=self.limits)

"""Attachments in turns: how the files a user sent appear in the prompt.

The file id is the anchor; nothing of a file is stored in a turn's text. A turn's
files are rows of ``turn_files`` and every block below is rendered at assembly time,
so deleting a file (its rows) leaves no trace in any assembled context, and a turn
whose files are all gone renders no block at all, header included.

- **First turn** (:func:`first_turn_block`, the newest user message): a small text file
  (text, Markdown, code; at most ``inline_chars`` characters, ``COMPANION_INLINE_FILE_CHARS``)
  is inlined in full under its placeholder line; a large or binary one gets a pointer:
  its placeholder line (name, id, pages) and a line telling the model to call ``file_read``.
- **History** (:func:`folded_block`): every older turn's block folds into a "referenced
  files" placeholder: the placeholder line and a preview of about ``preview_chars``
  (``COMPANION_FILE_PREVIEW_CHARS``, 400) characters; :func:`compact_block` drops the
  previews when the retrieval budget is short.
- **Rolled out** (:func:`earlier_block`): files of turns that compaction moved out of the
  recent window stay listed, placeholder lines only, with the summary, while the
  retrieval budget has room after the folded blocks.
- **Footer** (:func:`footer`): what the model may do with the listed files; editing and
  re-exporting are offered only for durable ids, and it says whether all, some or none
  of them are durable.

Three kinds of text must not be confused: the provider's structured tool calls (only
those run, in :mod:`runtime.llm`), the runtime's placeholders, and model-written text
that merely looks like a call. :func:`is_placeholder` recognises a runtime placeholder
only when all five gates pass (the issue's rule):

1. fully enclosed by ``[[`` and ``]]`` (and no other ``[[``/``]]`` inside);
2. shorter than 200 characters;
3. a single line;
4. the fixed tool keyword: it starts ``[[file_read file_id=``;
5. no Markdown table pipes, headings (``#``) or backticks (:func:`safe_name` keeps all three
   out of the names the runtime writes, so a genuine placeholder never has them).

Anything else is ordinary text: never cached as file content and never a tool call.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from prompts import fence, render

OPEN, CLOSE = "[[", "]]"
"""The delimiters of a runtime placeholder."""
TOOL_KEYWORD = "file_read"
"""The fixed tool keyword every placeholder carries."""
MAX_PLACEHOLDER_CHARS = 200
"""A placeholder is shorter than this, characters (gate 2)."""
DEFAULT_PREVIEW_CHARS = 400
"""Characters of a folded file's preview (the issue's "about 400")."""

_PREFIX = f"{OPEN}{TOOL_KEYWORD} file_id="
_FILE_ID = re.compile(r"file_id=([A-Za-z0-9_\-]+)")
_NAME_UNSAFE = re.compile(r"[\x00-\x1f\x7f|`\[\]\"#\\]")

TEXT_MIMES = frozenset(
    {
        "application/json",
        "application/xml",
        "application/javascript",
        "application/x-javascript",
        "application/x-sh",
        "application/x-python",
        "application/x-yaml",
        "application/yaml",
        "application/toml",
        "application/sql",
        "application/x-tex",
    }
)
"""MIME types besides ``text/*`` that are plain text (code, data, markup)."""


@dataclass(frozen=True, kw_only=True)
class AttachedFile:
    """One file as a turn carries it, with what rendering needs of its extract."""

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
    """The start of the extract (``--- page N ---`` form), as loaded; ``None`` before a parse."""
    text_chars: int | None = None
    """Characters of the whole extract; ``text_head`` is all of it when the lengths match."""
    position: int = 0
    """Order among the turn's attachments, from 0."""

    @property
    def durable(self) -> bool:
        return self.durability == "durable"

    @property
    def is_text(self) -> bool:
        """Plain text, Markdown or code (by MIME type)."""
        return is_text_mime(self.mime)


def is_text_mime(mime: str) -> bool:
    """True for plain text, Markdown and code MIME types (``text/*`` and :data:`TEXT_MIMES`)."""
    base = mime.split(";")[0].strip().lower()
    return base.startswith("text/") or base in TEXT_MIMES


def is_image_mime(mime: str) -> bool:
    """True for raster image MIME types (``image/*`` except SVG, which is XML text)."""
    base = mime.split(";")[0].strip().lower()
    return base.startswith("image/") and base != "image/svg+xml"


def _pages(text: str | None) -> list[str]:
    from runtime.parsing import pages_of

    return pages_of(text) if text else []


def full_text(f: AttachedFile) -> str | None:
    """The file's whole text without page markers, or ``None`` if not parsed or not fully loaded."""
    if f.parse_state != "ready" or f.text_head is None or f.text_chars is None or len(f.text_head) < f.text_chars:
        return None
    return "\n\n".join(p.strip("\n") for p in _pages(f.text_head))


def inlines(f: AttachedFile, *, inline_chars: int) -> bool:
    """True if ``f`` goes into its first turn in full: a parsed text file of at most ``inline_chars`` characters."""
    if not f.is_text:
        return False
    text = full_text(f)
    return text is not None and len(text) <= inline_chars


def safe_name(name: str, room: int = 80) -> str:
    """``name`` fit for a placeholder: no delimiters, quotes, pipes, backticks, ``#`` or
    control characters, at most ``room`` characters (the middle elided)."""
    clean = _NAME_UNSAFE.sub("_", name).strip() or "file"
    if len(clean) > room:
        keep = room - 1
        clean = clean[: keep - keep // 3] + "\u2026" + clean[len(clean) - keep // 3 :]
    return clean


def placeholder(f: AttachedFile) -> str:
    """The one-line runtime placeholder of ``f``; it always passes :func:`is_placeholder`."""
    pages = f.page_count if f.page_count is not None else "?"
    line = render("attachment_placeholder", file_id=f.file_id, file_name=safe_name(f.name), pages=pages)
    if len(line) >= MAX_PLACEHOLDER_CHARS:  # a very long id: shorten the name further
        over = len(line) - MAX_PLACEHOLDER_CHARS + 1
        line = render(
            "attachment_placeholder", file_id=f.file_id, file_name=safe_name(f.name, max(8, 80 - over)), pages=pages
        )
    return line


def is_placeholder(text: str) -> bool:
    """True only if ``text`` passes all five gates of a runtime placeholder (module docstring)."""
    if not (text.startswith(OPEN) and text.endswith(CLOSE)):  # 1. enclosed
        return False
    inner = text[len(OPEN) : -len(CLOSE)]
    if OPEN in inner or CLOSE in inner:
        return False
    if len(text) >= MAX_PLACEHOLDER_CHARS:  # 2. short
        return False
    if "\n" in text or "\r" in text:  # 3. one line
        return False
    if not text.startswith(_PREFIX):  # 4. the tool keyword
        return False
    if "|" in inner or "`" in inner or "#" in inner:  # 5. no table, code or heading markup (names never carry them)
        return False
    return True


def placeholder_file_id(text: str) -> str | None:
    """The file id a genuine placeholder names; ``None`` for anything that is not one."""
    if not is_placeholder(text):
        return None
    match = _FILE_ID.match(text, len(OPEN) + len(TOOL_KEYWORD) + 1)
    return match.group(1) if match else None


def strip_placeholders(text: str, *, keep: Callable[[str], bool]) -> str:
    """``text`` without the genuine placeholder lines naming a file id ``keep`` rejects (e.g. a
    deleted file's line that a reply echoed). Other lines, look-alikes included, stay as they are."""
    lines = text.split("\n")
    kept = [line for line in lines if (fid := placeholder_file_id(line.strip())) is None or keep(fid)]
    return text if len(kept) == len(lines) else "\n".join(kept)


def placeholder_ids(texts: Iterable[str]) -> set[str]:
    """File ids named by genuine placeholder lines in ``texts``."""
    found = set()
    for text in texts:
        if OPEN not in text:
            continue
        for line in text.split("\n"):
            fid = placeholder_file_id(line.strip())
            if fid:
                found.add(fid)
    return found


def footer(files: Sequence[AttachedFile]) -> str:
    """What the model may do with ``files``: editing offered only for durable ids; all, some or none durable."""
    durable = [f for f in files if f.durable]
    if len(durable) == len(files):
        return render("attachments_footer_durable")
    if not durable:
        return render("attachments_footer_ephemeral")
    names = ", ".join(f'"{safe_name(f.name)}" ({f.file_id})' for f in durable)
    return render("attachments_footer_mixed", durable=names)


def _pointer_reason(f: AttachedFile, inline_chars: int) -> str:
    state = f.parse_state
    if state in ("pending", "parsing"):
        return "it is still being processed; file_read will say when it is ready"
    if state == "needs_ocr":
        return "a scan with no text layer: it needs OCR, and file_read cannot return its text"
    if state == "failed":
        return f"it could not be parsed: {(f.parse_error or 'unknown error').splitlines()[0][:120]}"
    if state == "empty":
        return "it has no text (EXTRACT_EMPTY)"
    pages = f"{f.page_count} page{'s' if f.page_count != 1 else ''}" if f.page_count is not None else "pages"
    if f.is_text:
        size = f"{f.text_chars:,} characters" if f.text_chars is not None else "large"
        return f"text of {size} in {pages}, over the {inline_chars:,}-character inline limit"
    return f"{f.mime}, {pages}"


def first_turn_block(files: Sequence[AttachedFile], *, inline_chars: int) -> str:
    """The block under the message that carries ``files``: small text files inline, the rest as pointers.
    Empty when ``files`` is."""
    if not files:
        return ""
    parts = [render("attachments_header")]
    for f in files:
        parts.append(placeholder(f))
        if inlines(f, inline_chars=inline_chars):
            parts.append(render("attachment_inline", file_id=f.file_id, text=fence(full_text(f) or "")))
        else:
            parts.append(render("attachment_pointer", file_id=f.file_id, what=_pointer_reason(f, inline_chars)))
    parts.append(footer(files))
    return "\n".join(parts)


def preview(f: AttachedFile, chars: int = DEFAULT_PREVIEW_CHARS) -> str:
    """About ``chars`` characters from the start of the body (front matter skipped when known),
    whitespace collapsed, quoted; or a note on why there is none."""
    pages = _pages(f.text_head) if f.parse_state == "ready" else []
    if not pages:
        return "(no text yet)" if f.parse_state in ("pending", "parsing") else f"(no text: {f.parse_state})"
    start = (f.body_start_page or 1) - 1
    body = " ".join(pages[start:] if start < len(pages) else pages)
    body = " ".join(body.split())
    if len(body) > chars:
        cut = body.rfind(" ", 0, chars)
        body = body[: cut if cut > chars // 2 else chars] + "\u2026"
    return f'"{body}"'


def folded_block(
    files: Sequence[AttachedFile],
    *,
    preview_chars: int = DEFAULT_PREVIEW_CHARS,
    header: str = "attachments_folded_header",
) -> str:
    """The "referenced files" placeholder an older turn's block folds into. Empty when ``files`` is."""
    if not files:
        return ""
    parts = [render(header)]
    for f in files:
        parts.append(placeholder(f))
        if preview_chars > 0:
            parts.append(render("attachment_preview", preview=preview(f, preview_chars)))
    parts.append(footer(files))
    return "\n".join(parts)


def compact_block(files: Sequence[AttachedFile]) -> str:
    """:func:`folded_block` without previews, for a short retrieval budget."""
    return folded_block(files, preview_chars=0)


def earlier_block(files: Sequence[AttachedFile]) -> str:
    """Placeholder lines (no previews) for files of turns compaction has rolled out of the recent
    window, so their ids stay known. Empty when ``files`` is."""
    return folded_block(files, preview_chars=0, header="attachments_earlier_header")


def with_block(message: str, block: str) -> str:
    """The message text with an attachment block under it (the message alone for an empty block)."""
    return f"{message}\n\n{block}" if block else message

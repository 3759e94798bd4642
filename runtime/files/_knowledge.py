"""Adding files to a persona's knowledge base: read, split, embed, store.

Splitting (:func:`split_document`) is a small splitter of our own, on Markdown
headings and blank-line paragraphs, packed up to ``max_tokens`` by the runtime's own
token counter: each chunk starts with the heading path it sits under (``# A > ## B``),
so a chunk read alone still says what it is about; a paragraph longer than the cap is
split at sentence ends, then at the cap. Fenced code blocks are never read as headings.
We chose this over ``langchain-text-splitters`` (which brings ``langchain-core`` and
its dependencies) and ``chonkie`` (its own tokenizer stack) because the cap must be in
the tokens this runtime counts, and that is a few dozen lines here.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import structlog

from errors import KnowledgeFileError
from memory.embeddings import Embedder
from memory.knowledge import Knowledge, NewChunk
from runtime.accounting import TokenCounter, longest_fitting_prefix

log = structlog.get_logger("companion.knowledge")

TEXT_SUFFIXES = (".txt", ".md", ".markdown", ".text", "")
DOCUMENT_SUFFIXES = (".pdf", ".docx", ".pptx", ".xlsx", ".epub")
"""Documents read through the attachment parsers (:func:`runtime.parsing.parse_document`):
their pages' text, front matter included, joined by blank lines."""
"""Suffixes ``kb add`` accepts: plain text and Markdown."""
MAX_FILE_BYTES = 20_000_000
"""Largest file accepted, bytes (our choice: a book is a few MB)."""

_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")
_SENTENCE = re.compile(r"(?<=[.!?。！？])\s+|(?<=[。！？])")


@dataclass(frozen=True, kw_only=True)
class AddedFile:
    source: str
    """The file name the chunks are stored under."""
    chunks: int
    tokens: int


def read_document(path: Path) -> str:
    """The text of a plain-text or Markdown file, or of a document (:data:`DOCUMENT_SUFFIXES`).

    Raises:
        KnowledgeFileError: missing, unreadable (for a document: corrupt or encrypted), not a
            supported suffix, binary (NUL bytes), not UTF-8, or empty (a scanned PDF with no
            text layer included); the message names the file and the problem.
    """
    name = str(path)
    if not path.is_file():
        raise KnowledgeFileError(f"Knowledge file {name!r} does not exist.", path=name, reason="missing")
    suffix = path.suffix.lower()
    if suffix not in TEXT_SUFFIXES and suffix not in DOCUMENT_SUFFIXES:
        raise KnowledgeFileError(
            f"Knowledge file {name!r}: only plain text, Markdown ({', '.join(s for s in TEXT_SUFFIXES if s)}) and "
            f"documents ({', '.join(DOCUMENT_SUFFIXES)}) can be added; convert it to text first.",
            path=name,
            reason="unsupported",
        )
    try:
        if path.stat().st_size > MAX_FILE_BYTES:
            raise KnowledgeFileError(
                f"Knowledge file {name!r} is larger than {MAX_FILE_BYTES} bytes; split it first.",
                path=name,
                reason="unsupported",
            )
        raw = path.read_bytes()
    except OSError as exc:
        raise KnowledgeFileError(
            f"Knowledge file {name!r} cannot be read ({exc.strerror or exc}).", path=name, reason="unreadable"
        ) from exc
    text = _document_text(raw, path) if suffix in DOCUMENT_SUFFIXES else _plain_text(raw, name)
    if not text.strip():
        raise KnowledgeFileError(f"Knowledge file {name!r} is empty.", path=name, reason="empty")
    return text


def read_documents(paths: Sequence[Path]) -> dict[str, str]:
    """File name -> text (:func:`read_document`) of every file, all checked before any is
    used. Knowledge is stored by file name, so two files may not share one.

    Raises:
        KnowledgeFileError: two files share a name, or a bad file.
    """
    names = [Path(p).name for p in paths]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise KnowledgeFileError(
            f"Two files share the name {duplicates[0]!r}; knowledge is stored by file name, so rename one.",
            path=duplicates[0],
            reason="unsupported",
        )
    return {Path(p).name: read_document(Path(p)) for p in paths}


def _plain_text(raw: bytes, name: str) -> str:
    if b"\x00" in raw:
        raise KnowledgeFileError(
            f"Knowledge file {name!r} is binary (it holds NUL bytes), not text.", path=name, reason="binary"
        )
    try:
        return raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise KnowledgeFileError(
            f"Knowledge file {name!r} is not valid UTF-8 (byte {exc.start}); save it as UTF-8.",
            path=name,
            reason="invalid_utf8",
        ) from None


def _document_text(raw: bytes, path: Path) -> str:
    """The pages' text of a document, parsed as attachments are (one serializer per format)."""
    from errors import FileParseError
    from runtime.parsing import parse_document

    name = str(path)
    try:
        extract = parse_document(raw, name=path.name)
    except FileParseError as exc:
        raise KnowledgeFileError(
            f"Knowledge file {name!r} cannot be parsed: {exc}", path=name, reason="unreadable"
        ) from exc
    text = "\n\n".join(page.strip() for page in extract.pages if page.strip())
    if not text and extract.needs_ocr:
        raise KnowledgeFileError(
            f"Knowledge file {name!r} is empty: its pages have no text layer (scanned; run OCR first).",
            path=name,
            reason="empty",
        )
    return text


def _sections(text: str) -> list[tuple[str, list[str]]]:
    """(heading path, paragraphs) in document order."""
    path: list[tuple[int, str]] = []
    out: list[tuple[str, list[str]]] = [("", [])]
    para: list[str] = []
    fenced = False

    def flush() -> None:
        if para and "\n".join(para).strip():
            out[-1][1].append("\n".join(para).strip())
        para.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            fenced = not fenced
            para.append(line)
            continue
        heading = None if fenced else _HEADING.match(line)
        if heading:
            flush()
            level = len(heading.group(1))
            path = [p for p in path if p[0] < level] + [(level, heading.group(2))]
            out.append((" > ".join("#" * lvl + " " + title for lvl, title in path), []))
        elif not fenced and not line.strip():
            flush()
        else:
            para.append(line)
    flush()
    return [(h, ps) for h, ps in out if ps]


def _pieces(paragraph: str, limit: int, counter: TokenCounter) -> list[str]:
    """``paragraph`` split so that each piece is at most ``limit`` tokens."""
    if counter.count_text(paragraph) <= limit:
        return [paragraph]
    pieces: list[str] = []
    current = ""
    for sentence in (s for s in _SENTENCE.split(paragraph) if s):
        trial = f"{current} {sentence}".strip() if current else sentence
        if counter.count_text(trial) <= limit:
            current = trial
            continue
        if current:
            pieces.append(current)
        while counter.count_text(sentence) > limit:  # one sentence longer than the cap: cut it
            cut = longest_fitting_prefix(len(sentence), functools.partial(_fits, counter, sentence, limit), least=1)
            pieces.append(sentence[:cut])
            sentence = sentence[cut:].lstrip()
        current = sentence
    if current:
        pieces.append(current)
    return pieces


def split_document(text: str, *, max_tokens: int, counter: TokenCounter) -> list[str]:
    """Chunks of at most ``max_tokens`` tokens (heading line included), in document order."""
    chunks: list[str] = []
    for heading, paragraphs in _sections(text):
        prefix = heading + "\n" if heading else ""
        room = max(max_tokens - counter.count_text(prefix), max_tokens // 2)
        current: list[str] = []
        for paragraph in paragraphs:
            for piece in _pieces(paragraph, room, counter):
                if current and counter.count_text("\n\n".join([*current, piece])) > room:
                    chunks.append(prefix + "\n\n".join(current))
                    current = []
                current.append(piece)
        if current:
            chunks.append(prefix + "\n\n".join(current))
    return chunks


def add_files(
    knowledge: Knowledge,
    *,
    character_id: str,
    paths: Sequence[Path],
    embedder: Embedder,
    counter: TokenCounter,
    max_tokens: int,
) -> list[AddedFile]:
    """Add files to the knowledge base of character ``character_id``, each under its file name.

    Every file is read and checked before anything is written; then all are chunked,
    embedded and written in one transaction, each replacing the chunks an earlier add
    of the same file name left (so adding a file twice never duplicates).

    Args:
        knowledge: the knowledge room (``store.knowledge``).

    Raises:
        KnowledgeFileError: a bad file (nothing was written).
        StorageError: the database failed (nothing was written).
    """
    return add_texts(
        knowledge,
        character_id=character_id,
        texts=read_documents(paths),
        embedder=embedder,
        counter=counter,
        max_tokens=max_tokens,
    )


def add_texts(
    knowledge: Knowledge,
    *,
    character_id: str,
    texts: Mapping[str, str],
    embedder: Embedder,
    counter: TokenCounter,
    max_tokens: int,
) -> list[AddedFile]:
    """Add already read files (file name -> text, from :func:`read_documents`) to the character's
    knowledge base: chunked, embedded and written in one transaction, as :func:`add_files`.

    Raises:
        StorageError: the database failed (nothing was written).
    """
    sources: dict[str, list[NewChunk]] = {}
    for name, text in texts.items():
        pieces = split_document(text, max_tokens=max_tokens, counter=counter)
        vectors = embedder.embed(pieces)
        sources[name] = [
            NewChunk(content=piece, tokens=counter.count_text(piece), embedding=vec)
            for piece, vec in zip(pieces, vectors, strict=False)
        ]
    knowledge.replace_sources(character_id=character_id, sources=sources)
    added = [AddedFile(source=n, chunks=len(c), tokens=sum(x.tokens for x in c)) for n, c in sources.items()]
    log.info("knowledge.added", character_id=character_id, files=len(added), chunks=sum(a.chunks for a in added))
    return added


def _fits(counter: TokenCounter, text: str, limit: int, n: int) -> bool:
    """True if the first ``n`` characters of ``text`` fit ``limit`` tokens."""
    return counter.count_text(text[:n]) <= limit

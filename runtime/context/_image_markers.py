"""The transcript marker: how an image's description sits in a user turn on the text-only path.

A transcript is rendered under its turn as the marker line, then the description::

    [[image_read file_id=file_0123456789abcdef0123 transcript]]
    A photo of a red bicycle against a brick wall; a sign reads "NO PARKING".

The marker line is recognised with the five gates of :func:`runtime.context.is_placeholder`
(enclosed in ``[[ ]]``, under 200 characters, one line, the fixed keyword ``image_read
file_id=``, no table pipes, backticks or ``#``). Recognition also accepts the earlier wordings
in :data:`TRANSCRIPT_MARKERS` (a turn text written by an older version, or by a client, that
already holds a transcript), so images in old sessions are not transcribed again.

A description runs from its marker to the next marker line (of any wording) or the end of
the text. If a turn holds two transcripts of one image, the first is kept and the rest are
dropped (:func:`split_transcripts`).
"""

from __future__ import annotations

import re

CURRENT_MARKER = "[[image_read file_id={file_id} transcript]]"
"""The marker the runtime writes."""
TRANSCRIPT_MARKERS = (
    CURRENT_MARKER,
    "[image {file_id}: transcript]",
    "[Image transcript {file_id}]",
    "【图片转写 {file_id}】",
)
"""Every marker wording recognised on read, the current one first; older ones stay forever."""

_ID = r"(file_[A-Za-z0-9_\-]+)"


def _pattern(wording: str) -> re.Pattern[str]:
    head, _, tail = wording.partition("{file_id}")
    return re.compile(r"^\s*" + re.escape(head) + _ID + re.escape(tail) + r"[ \t]*(.*)$")


_PATTERNS = [_pattern(w) for w in TRANSCRIPT_MARKERS]
_GATE_UNSAFE = re.compile(r"[|`#]")


def marker(file_id: str) -> str:
    """The current marker line of ``file_id``."""
    return CURRENT_MARKER.format(file_id=file_id)


def render_transcript(file_id: str, text: str) -> str:
    """The marker line and the description under it."""
    return f"{marker(file_id)}\n{text.strip()}"


def _gated(line: str) -> bool:
    """The five gates, applied to the marker token (the current wording's enclosure)."""
    inner = line[2:-2]
    return (
        line.startswith("[[")
        and line.endswith("]]")
        and "[[" not in inner
        and "]]" not in inner
        and len(line) < 200
        and "\n" not in line
        and line.startswith("[[image_read file_id=")
        and not _GATE_UNSAFE.search(inner)
    )


def marker_of(line: str) -> tuple[str, str] | None:
    """``(file_id, text after the marker on the same line)`` if ``line`` starts with a marker of any
    known wording (the current one must pass the five gates), else ``None``."""
    for i, pattern in enumerate(_PATTERNS):
        match = pattern.match(line)
        if match:
            if i == 0 and not _gated(line.strip()[: line.strip().index("]]") + 2]):
                return None
            return match.group(1), match.group(2)
    return None


def split_transcripts(text: str) -> tuple[str, dict[str, str], int]:
    """``text`` without its transcripts, the transcripts (file id -> description, first one of
    each image kept, in order), and how many duplicates were dropped."""
    head: list[str] = []
    found: dict[str, list[str]] = {}
    current: list[str] | None = None
    dropped = 0
    for line in text.split("\n"):
        hit = marker_of(line)
        if hit is not None:
            file_id, rest = hit
            if file_id in found:
                dropped += 1
                current = []  # a duplicate: collected, then discarded
            else:
                current = found.setdefault(file_id, [])
            if rest.strip():
                current.append(rest)
            continue
        (current if current is not None else head).append(line)
    transcripts = {fid: "\n".join(lines).strip() for fid, lines in found.items()}
    return "\n".join(head).rstrip(), {k: v for k, v in transcripts.items() if v}, dropped


def dedupe(text: str) -> str:
    """``text`` with every transcript after the first of the same image dropped (unchanged
    when there is none to drop). The kept transcripts are re-rendered in the current wording."""
    body, transcripts, dropped = split_transcripts(text)
    if not dropped:
        return text
    return "\n\n".join([body, *(render_transcript(fid, t) for fid, t in transcripts.items())]).strip()

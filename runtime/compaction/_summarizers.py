"""Summarizers: turn rolled-out turns plus the current summary into a new flat summary.

Two summarizers share one interface, :class:`Summarizer`:

- :class:`ExtractiveSummarizer`, model-free: the user's lines verbatim and the
  assistant's first sentences, newest first, until the cap is full.
- :class:`~runtime.compaction.LiteLLMSummarizer` (``_model_summarizer``): a model writes a structured summary in five parts (who
  the user is; the relationship and shared events, dated; preferences and taboos;
  open threads and promises; the user's own words as exact quotes) from the template
  ``prompts/summary_model_system.txt``.

A summary is a flat list of items rendered under one header. Merging hands the
current summary's *items* (never its rendered text) plus the rolled-out turns to the
summarizer, and the result replaces the current summary, so summaries cannot nest.
When a merged summary exceeds its token cap, the oldest user quotes leave first
(:func:`fit_to_cap`); they are archived verbatim, so they can still be recalled.

Every summary is checked by :func:`validate_summary` before it is accepted. Errors
from litellm are classified by the replier's mapping (:func:`runtime.llm.map_model_error`)
and wrapped in a :class:`~errors.SummarizationError` by :func:`runtime.compaction.map_summarizer_error`.

Items are typed values (:mod:`runtime.summary_items`): :class:`~runtime.summary_items.UserQuote`,
:class:`~runtime.summary_items.AssistantLine` (extractive) and :class:`~runtime.summary_items.SummaryNote`
(model). The summarizers take and return them; the compactor converts them from and to the JSON
storage keeps.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Protocol

from errors import SummarizationError
from prompts import fence, render
from runtime.accounting import TokenCounter, longest_fitting_prefix
from runtime.summary_items import NOTE_SECTIONS, AssistantLine, SummaryItem, SummaryNote, UserQuote

if TYPE_CHECKING:
    pass

ASSISTANT_LINE_CHARS = 80
"""Longest shortened assistant line, in characters (our choice: one short sentence)."""

MIN_QUOTE_PREFIX_CHARS = 20
"""Shortest prefix of a user line the extractive summarizer keeps when the whole line does not fit, characters."""

_QUOTED = re.compile(r"[\"“”]([^\"“”]{4,})[\"“”]")


@dataclass(frozen=True, kw_only=True)
class RolledTurn:
    """One turn handed to a summarizer: what it may read of a rolled-out turn."""

    seq: int
    """The turn's per-session sequence number."""
    role: str
    """``user`` or ``assistant``."""
    date: str
    """When it was said, ISO date (``YYYY-MM-DD``)."""
    text: str
    """The turn's text; for an oversized turn, a prefix of it (see :attr:`chars`)."""
    chars: int
    """Length of the whole stored turn, characters. ``len(text) < chars`` means it was cut."""

    @property
    def cut(self) -> bool:
        """True if :attr:`text` is only a prefix of the stored turn."""
        return len(self.text) < self.chars


@dataclass(frozen=True, kw_only=True)
class SummaryDraft:
    """A proposed summary, not yet validated or stored."""

    content: str
    """The rendered summary as it enters the prompt."""
    items: list[SummaryItem]
    """The flat entries kept, oldest first."""
    tokens: int
    """Tokens of ``content`` by the session's counter; at most the cap it was made for."""
    dropped: int
    """Entries (old and new) this merge left out to fit the cap; they remain in the archive."""
    dropped_quote_seqs: list[int] = field(default_factory=list)
    """Seqs of the user quotes this merge left out to fit the cap, oldest first."""


class Summarizer(Protocol):
    """Makes a new flat summary from the previous items and the turns rolled out."""

    name: str

    def summarize(
        self,
        *,
        previous: Sequence[SummaryItem],
        turns: Sequence[RolledTurn],
        cap: int,
        counter: TokenCounter,
        omitted_before: int = 0,
        session_id: str | None = None,
        assistant_name: str = "Companion",
    ) -> SummaryDraft:
        """Merge ``turns`` into ``previous`` within ``cap`` tokens.

        Args:
            previous: the current summary's items, oldest first.
            turns: the turns being rolled out, oldest first; never empty.
            cap: the summary's token cap.
            omitted_before: earlier entries no longer in the summary (shown as a count).
            session_id: for error messages.
            assistant_name: how the companion is called in the conversation.

        Raises:
            SummarizationError: no summary could be made.
        """
        ...


# -- rendering ------------------------------------------------------------------
def shorten(text: str, limit: int = ASSISTANT_LINE_CHARS) -> str:
    """The first sentence of ``text`` (whitespace folded), cut to ``limit`` characters with "…"."""
    flat = " ".join(text.split())
    match = re.match(r"(.+?[.!?。！？])(\s|$)", flat)
    first = match.group(1) if match else flat
    return first if len(first) <= limit else first[: limit - 1].rstrip() + "…"


def render_line(item: SummaryItem, *, compact: bool = False) -> str:
    """One summary line for ``item``; ``compact`` leaves out the date and the cut note's numbers
    (the form for caps too small for the full one)."""
    if isinstance(item, UserQuote):
        if compact:
            return render(
                "summary_line_user_cut_compact" if item.cut_of else "summary_line_user_compact", text=fence(item.text)
            )
        if item.cut_of:
            return render(
                "summary_line_user_cut", date=item.date, text=fence(item.text), shown=len(item.text), total=item.cut_of
            )
        return render("summary_line_user", date=item.date, text=fence(item.text))
    if isinstance(item, AssistantLine):
        if compact:
            return render("summary_line_assistant_compact", text=fence(item.text))
        return render("summary_line_assistant", date=item.date, text=fence(item.text))
    if item.date:
        return render("summary_line_note_dated", date=item.date, text=fence(item.text))
    return render("summary_line_note", text=fence(item.text))


def render_summary(items: Sequence[SummaryItem], omitted: int, *, compact: bool = False) -> str:
    """Render items (oldest first): as dated lines, or in up to five titled parts (empty
    parts left out) when any item is a model note.

    ``compact``: the short block (``prompts/summary_block_compact.txt``) with undated
    lines and no count of archived lines, for caps too small for the full block; it holds
    user and assistant lines only."""
    if compact:
        return render("summary_block_compact", body="\n".join(render_line(i, compact=True) for i in items))
    notice = render("summary_omitted", count=omitted) if omitted else ""
    if not any(isinstance(item, SummaryNote) for item in items):
        return render("summary_block", omitted=notice, body="\n".join(render_line(i) for i in items))
    parts: dict[str, list[str]] = {s: [] for s in (*NOTE_SECTIONS, "quotes")}
    for item in items:
        parts[item.section if isinstance(item, SummaryNote) else "quotes"].append(render_line(item))
    body = [render(f"summary_section_{section}", lines="\n".join(lines)) for section, lines in parts.items() if lines]
    return render("summary_block", omitted=notice, body="\n".join(body))


def fit_to_cap(
    items: Sequence[SummaryItem], *, omitted: int, cap: int, counter: TokenCounter
) -> tuple[list[SummaryItem], list[int]]:
    """Drop the oldest user quotes until the rendered summary fits ``cap`` tokens.

    Returns the items kept and the seqs of the quotes dropped, oldest first. If the
    summary still does not fit without any quotes, the rest is returned as it is and
    validation rejects it.
    """
    kept = list(items)
    dropped: list[int] = []
    while counter.count_text(render_summary(kept, omitted + len(dropped))) > cap:
        quotes = [i for i in kept if isinstance(i, UserQuote)]
        if not quotes:
            break
        oldest = min(quotes, key=lambda i: i.seq)
        kept.remove(oldest)
        dropped.append(oldest.seq)
    return kept, dropped


# -- validation -----------------------------------------------------------------
def _folded(text: str) -> str:
    return " ".join(text.split())


def validate_summary(
    draft: SummaryDraft,
    *,
    cap: int,
    counter: TokenCounter,
    boundary_seq: int,
    user_turns: Mapping[int, str],
    session_id: str | None = None,
) -> None:
    """Accept a summary or raise :class:`SummarizationError` saying why not.

    A summary is accepted only if it is non-empty and one flat block; fits ``cap``
    tokens (counted again here with ``counter``); quotes the user only with exact
    substrings of the user's own turn it names (only whitespace may differ), and puts
    no other text in quotation marks that is not the user's; and summarizes no turn
    newer than ``boundary_seq``.

    Args:
        user_turns: the user's turns up to the boundary, ``seq`` → verbatim text.
    """

    def reject(reason: str) -> SummarizationError:
        return SummarizationError(f"Summary rejected: {reason}", session_id=session_id)

    if not draft.content.strip() or not draft.items:
        raise reject("it is empty")
    tokens = counter.count_text(draft.content)
    if tokens > cap:
        raise reject(f"{tokens} tokens exceed its cap of {cap} (tokens={tokens})")
    # a user's own words may mention "<summary" (rendering fences them); a note may not carry a summary
    if draft.content.count("<summary") != 1 or any(
        "<summary" in i.text for i in draft.items if isinstance(i, SummaryNote)
    ):
        raise reject("it nests a summary inside itself")
    folded_turns = {seq: _folded(text) for seq, text in user_turns.items() if seq <= boundary_seq}
    for item in draft.items:
        seq, text = item.seq, item.text
        if seq is not None and seq > boundary_seq:
            raise reject(f"it summarizes turn {seq}, newer than the roll-out boundary {boundary_seq}")
        if not text.strip():
            raise reject(f"an entry (seq {seq}) is empty")
        if isinstance(item, UserQuote):
            source = folded_turns.get(item.seq)
            if source is None or _folded(text) not in source:
                raise reject(
                    f"the quote attributed to user turn {seq} is not an exact quote of it ({len(text)} characters)"
                )
        elif isinstance(item, SummaryNote):
            for span in _QUOTED.findall(text):
                if not any(_folded(span) in t for t in folded_turns.values()):
                    raise reject(f"a {item.section} note quotes words the user never said ({len(span)} characters)")


def turns_to_check(draft: SummaryDraft) -> set[int] | None:
    """The user turns :func:`validate_summary` needs the text of for ``draft``: the seqs its
    user quotes name, or ``None`` (every user turn up to the boundary) when a note puts words
    in quotation marks, as those may come from any of the user's turns."""
    if any(isinstance(i, SummaryNote) and _QUOTED.search(i.text) for i in draft.items):
        return None
    return {i.seq for i in draft.items if isinstance(i, UserQuote) and i.seq is not None}


# -- the model-free summarizer ----------------------------------------------------
class ExtractiveSummarizer:
    """The model-free summarizer.

    It keeps the user's lines verbatim and the assistant's first sentences, newest
    first, until the cap is full. Older entries fall out first; they are archived
    verbatim before the summary changes, so they can still be recalled.

    It always returns a non-empty summary within ``cap`` when one can exist: when the
    newest user line does not fit whole, a prefix of it is quoted (at least
    :data:`MIN_QUOTE_PREFIX_CHARS` characters); when even that does not fit the full
    block, the compact block is used (:func:`render_summary` with ``compact=True``: no
    date, no archived-lines count, earlier model notes left to the archive), which fits
    the summary cap of the smallest window (21 tokens at 256); the compact block is also
    chosen when the full one could keep only the companion's lines. Only a cap below the
    compact block with one short quote raises :class:`SummarizationError`.
    """

    name = "extractive"

    def summarize(
        self,
        *,
        previous: Sequence[SummaryItem],
        turns: Sequence[RolledTurn],
        cap: int,
        counter: TokenCounter,
        omitted_before: int = 0,
        session_id: str | None = None,
        assistant_name: str = "Companion",
    ) -> SummaryDraft:
        new_items: list[UserQuote | AssistantLine] = [
            UserQuote(seq=t.seq, date=t.date, text=t.text, cut_of=t.chars if t.cut else None)
            if t.role == "user"
            else AssistantLine(seq=t.seq, date=t.date, text=shorten(t.text))
            for t in turns
            if t.text.strip()
        ]
        # model notes from an earlier model summary are carried over as they are (full block only)
        notes = [i for i in previous if isinstance(i, SummaryNote)]
        lines = [i for i in previous if not isinstance(i, SummaryNote)]
        candidates = sorted([*lines, *new_items], key=lambda i: i.seq)
        drafts = [
            d
            for compact in (False, True)
            if (d := _fill(notes, candidates, omitted_before=omitted_before, cap=cap, counter=counter, compact=compact))
        ]
        wants_quote = any(isinstance(i, UserQuote) for i in candidates)
        for draft in drafts:  # the full block when it quotes the user, else the compact one
            if not wants_quote or any(isinstance(i, UserQuote) for i in draft.items):
                return draft
        if drafts:
            return drafts[0]
        smallest = counter.count_text(
            render_summary([UserQuote(seq=0, date="", text="x" * MIN_COMPACT_QUOTE_CHARS, cut_of=1)], 0, compact=True)
        )
        raise SummarizationError(
            f"The summary cap of {cap} tokens is below the smallest summary ({smallest} tokens): "
            "raise the summary budget or the context window.",
            session_id=session_id,
        )


MIN_COMPACT_QUOTE_CHARS = 8
"""Shortest prefix of a user line the compact block quotes, characters (our choice: one or two words)."""


def _fill(
    notes: list[SummaryNote],
    candidates: list[UserQuote | AssistantLine],
    *,
    omitted_before: int,
    cap: int,
    counter: TokenCounter,
    compact: bool,
) -> SummaryDraft | None:
    """Fill one block form newest first; ``None`` when it cannot hold even one entry within ``cap``."""
    notes = [] if compact else notes
    # room is reserved for the largest archived-lines count this merge can show, so the final
    # render (with the real count) never outgrows what the scan measured
    most_omitted = omitted_before + len(candidates) + len(notes)
    base = counter.count_text(render_summary(notes, 0 if compact else max(most_omitted, 1), compact=compact))
    least = MIN_COMPACT_QUOTE_CHARS if compact else MIN_QUOTE_PREFIX_CHARS
    kept: list[UserQuote | AssistantLine] = []
    used = base
    for item in reversed(candidates):
        line = counter.count_text(render_line(item, compact=compact)) + 1
        if used + line > cap:
            if isinstance(item, AssistantLine):
                continue  # a shortened assistant line may be skipped; user lines stop the scan
            if not any(isinstance(i, UserQuote) for i in kept):  # the newest quote is cut rather than lost
                cut = _prefix_that_fits(item, cap - used, counter, least=least, compact=compact)
                if cut is None and kept:  # make room: assistant lines give way to the user's words
                    cut = _prefix_that_fits(item, cap - base, counter, least=least, compact=compact)
                    if cut is not None:
                        kept = []
                if cut is not None:
                    kept.append(cut)
            break
        kept.append(item)
        used += line
    kept.reverse()
    kept_seqs = {i.seq for i in kept}
    dropped_quotes = [i.seq for i in candidates if isinstance(i, UserQuote) and i.seq not in kept_seqs]
    items: list[SummaryItem] = [*notes, *kept]
    dropped = len(candidates) + len(notes) - len(items)
    content = render_summary(items, omitted_before + dropped, compact=compact)
    while items and counter.count_text(content) > cap:  # a safety net; the reserve above makes it rare
        gone = items.pop(0)
        dropped += 1
        if isinstance(gone, UserQuote):
            dropped_quotes.append(gone.seq)
        content = render_summary(items, omitted_before + dropped, compact=compact)
    if not items:
        return None
    return SummaryDraft(
        content=content,
        items=items,
        tokens=counter.count_text(content),
        dropped=dropped,
        dropped_quote_seqs=sorted(dropped_quotes),
    )


def _prefix_that_fits(
    item: UserQuote,
    room: int,
    counter: TokenCounter,
    *,
    least: int = MIN_QUOTE_PREFIX_CHARS,
    compact: bool = False,
) -> UserQuote | None:
    """The longest prefix of a user line (an exact substring) whose line fits ``room`` tokens;
    ``None`` when that prefix is shorter than ``least`` characters."""
    text = item.text
    total = item.cut_of or len(text)

    def fits(n: int) -> bool:
        return counter.count_text(render_line(replace(item, text=text[:n], cut_of=total), compact=compact)) + 1 <= room

    prefix = text[: longest_fitting_prefix(len(text), fits)].rstrip()
    return replace(item, text=prefix, cut_of=total) if len(prefix) >= least else None


# -- the model summarizer -----------------------------------------------------------

"""Context assembly: persona, memory, retrieval, summary and recent turns, each within its cap.

Longer than 400 lines on purpose: the budgets of the five sources interact (unused budget
flows, shared framing, folded files charged to retrieval); their arithmetic reads best in one place.

Assembly is a read: it takes values (:mod:`runtime.context._values`, converted from stored
rows by the turn layer) and returns messages, changing nothing.
The message list is::

    system   persona (never cut, never squeezed; example dialogues go first when over its cap)
    system   summary block, memory block (pinned profile, recalled segments), retrieval block
             (lorebook entries, knowledge chunks), when there are any
    user / assistant ...  the recent turns, oldest first, ending with the current user message
                          (lorebook entries placed at a depth are inserted among them, charged
                          to ``retrieval``)
    system   the persona's post-history instructions, if it has any (counted to ``persona``)

A user turn that carried files gets its attachment block under its text (see
:mod:`runtime.context`): the newest user message, when it ends the prompt, in its
first-turn form (inline text or pointers; charged to ``recent``); every older one folded
into a "referenced files" placeholder, charged to ``retrieval`` and kept within its cap
(newest first; previews dropped, then whole entries, with a notice, when it is short).

Each source is cut to its cap before it enters the prompt, and every cut says so
in the prompt. Budget left unused by memory, retrieval and summary flows to
``recent``. The total (framing and reply priming included) plus the reply reserve
never exceeds the window.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, cast

from persona import Persona
from prompts import fence, render
from runtime.accounting import REPLY_PRIMING, SOURCES, Baseline, Budgets, TokenCounter, baseline_total
from runtime.context._attachments import AttachedFile, earlier_block, with_block
from runtime.context._persona import DEFAULT_USER_NAME, render_persona
from runtime.context._profile import render_profile
from runtime.context._retrieval import RetrievalItem, fit_retrieval, insert_at_depth
from runtime.context._trim import fit_messages
from runtime.context._values import PinnedProfile, RecalledItem, RecentTurn, SummaryText
from runtime.messages import Message, Role


@dataclass(frozen=True, kw_only=True)
class SourceReport:
    """What one source put into the prompt."""

    source: str
    tokens: int
    """Tokens this source used, its share of message framing included."""
    cap: int
    """The source's cap in tokens, for its content: ``tokens`` may pass it by the source's share of
    message framing. For ``memory``: its cap plus what the persona, the summary and retrieval left
    of theirs (when that flow is on); for ``recent``: its cap plus what all the others left."""
    items: int
    """Entries included: turns, segments, summary lines."""
    cut: str | None = None
    """What was cut, as said in the prompt; ``None`` if nothing was."""


@dataclass(frozen=True, kw_only=True)
class TurnBlocks:
    """The attachment block of one stored user turn, in each of its forms (texts, not tokens)."""

    first: str
    """First-turn form: small text files inline, the rest as pointers."""
    folded: str
    """History form: placeholder lines with previews."""
    compact: str
    """History form without previews, for a short retrieval budget."""
    file_ids: tuple[str, ...]
    """The files the turn carries, in order."""


@dataclass(frozen=True, kw_only=True)
class AssembledContext:
    """The prompt for one model call, with its accounting by source."""

    session_id: str
    messages: list[Mapping[str, Any]]
    """The chat messages: typed :class:`~runtime.messages.Message` values (a trimmed list may hold
    the provider's own tool messages); :func:`runtime.messages.to_openai` gives litellm's dicts."""
    sources: dict[str, SourceReport]
    total_tokens: int
    """Estimated tokens of ``messages``, framing and reply priming included."""
    window: int
    """The model's context window, tokens."""
    reply_reserve: int
    """Tokens kept free for the reply."""
    recalled: list[RecalledItem] = field(default_factory=list)
    """The archive segments shown in the memory block."""
    retrieved: list[RetrievalItem] = field(default_factory=list)
    """The lorebook entries and knowledge chunks shown (in the retrieval block or inserted at a depth), in order."""
    recent_seqs: list[int] = field(default_factory=list)
    """Seqs of the stored turns shown in the recent window."""
    pending_turns: int = 0
    """Stored turns kept out of view because they are over the ``recent`` cap and no compaction
    has rolled them out yet (the summary block says their summary is pending)."""
    source_text: dict[str, str] = field(default_factory=dict)
    """The rendered text each source contributed (for inspection and evaluation)."""
    post_history_messages: int = 0
    """Trailing messages that are the persona's post-history instructions (0 or 1); the
    engine's calibration baseline fingerprints the request without them."""
    lore_messages: list[int] = field(default_factory=list)
    """Indexes in ``messages`` of lorebook entries inserted at a depth among the recent turns."""
    calibration: float = 1.0
    """The session's correction factor applied to every estimate (>= 1.0)."""
    overhead_tokens: int = 0
    """Tokens the provider adds per request beyond our estimate (from calibration), included in ``total_tokens``."""
    baseline_tokens: int | None = None
    """The request's size by the provider's last reported usage plus the messages added since,
    when the request starts with that last request; ``total_tokens`` is never below it."""
    attached_files: list[str] = field(default_factory=list)
    """Ids of the files whose blocks (first-turn or folded) the messages show, in turn order."""

    @property
    def overflow(self) -> bool:
        """True if the prompt plus the reply reserve exceeds the window."""
        return self.total_tokens + self.reply_reserve > self.window


def assemble_context(
    *,
    session_id: str,
    persona: Persona,
    summary: SummaryText | None,
    candidates: Sequence[RecalledItem],
    turns: Sequence[RecentTurn],
    pending: str | None,
    budgets: Budgets,
    window: int,
    counter: TokenCounter,
    baseline: Baseline | None = None,
    calibration: float = 1.0,
    overhead: int = 0,
    profile: PinnedProfile | None = None,
    retrieval: Sequence[RetrievalItem] = (),
    attachments: dict[int, TurnBlocks] | None = None,
    earlier_files: Sequence[AttachedFile] = (),
    idle_to_memory: bool = True,
) -> AssembledContext:
    """Build the prompt within budgets. Pure: it reads its arguments only.

    Args:
        summary: the session's current summary, or ``None``.
        candidates: recalled segments, best first; they fill ``memory`` in that order. The
            memory cap grows by what the persona, the summary and retrieval leave of their
            caps (tokens), so a window with no lorebook or a short summary recalls more.
        turns: the session's turns in the recent window (state ``context``), oldest first.
        pending: a user message to end the prompt with that is *not* stored (e.g. an
            evaluation question); ``None`` when the last stored turn is the current message.
        window: the context window in tokens; ``budgets`` should total to it.
        counter: the session's (calibrated) counter.
        baseline: the provider's last reported request size; when this request starts
            with that one, its size is the baseline plus the messages added, and the
            recent window shrinks if that says it does not fit.
        calibration: the factor already applied by ``counter``, reported back as is.
        overhead: tokens the provider adds per request (from calibration); reserved
            out of the room for ``recent`` and included in the total.
        profile: the user's pinned profile, shown first in ``memory``; its name is what
            ``{{user}}`` becomes (default ``User``).
        retrieval: fired lorebook entries and knowledge chunks (see ``runtime/retrieval.py``).
        attachments: turn ``seq`` -> the attachment blocks of that user turn.
        earlier_files: files of turns rolled out of the recent window, oldest first; listed
            (placeholder lines) in the system context while ``retrieval`` has room after the
            folded blocks, newest kept first.
        idle_to_memory: let what the persona, the summary and retrieval leave of their caps
            flow to recalled segments (``False`` for an overflow retry, which must send less).

    Raises:
        ConfigurationError: the persona's parts that are never cut exceed its cap.
    """
    sources: dict[str, SourceReport] = {}
    texts: dict[str, str] = {}

    user_name = (profile.name if profile is not None and profile.name else None) or DEFAULT_USER_NAME
    rendered = render_persona(
        persona,
        cap=budgets.persona,
        counter=counter,
        user_name=user_name,
        calibration=calibration,
        session_id=session_id,
    )
    persona_msg = rendered.system
    post_history: list[Mapping[str, Any]] = [rendered.post_history] if rendered.post_history else []
    sources["persona"] = SourceReport(
        source="persona",
        tokens=rendered.tokens,
        cap=budgets.persona,
        items=1 + rendered.examples_kept + len(post_history),
        cut=rendered.cut,
    )
    texts["persona"] = "\n\n".join(m["content"] for m in [persona_msg, *post_history])

    blocks: list[str] = []
    summary_text, sources["summary"] = _summary_block(summary, budgets.summary, counter)
    if summary_text:
        blocks.append(summary_text)
        texts["summary"] = summary_text
    # retrieval: the folded file references of older turns first (they anchor what the user
    # sent), then rolled-out turns' files, then lorebook entries and knowledge chunks in what is left
    newest = turns[-1].seq if turns and pending is None and turns[-1].role == "user" else None
    first_block = {newest: attachments[newest].first} if attachments and newest in attachments else {}
    folded, fold_costs, listed, fold_cut = _fold(attachments or {}, newest, budgets.retrieval, counter)
    fold_total = sum(fold_costs.values())
    earlier_text, earlier_listed = _earlier(earlier_files, budgets.retrieval - fold_total, counter)
    earlier_cost = counter.count_text(earlier_text) if earlier_text else 0
    book = persona.character_book
    found = fit_retrieval(
        retrieval,
        cap=max(budgets.retrieval - fold_total - earlier_cost, 0),
        counter=counter,
        lore_cap=book.token_budget if book is not None else None,
    )
    cuts = [c for c in (fold_cut, found.cut) if c]
    if len(earlier_listed) < len(earlier_files):
        cuts.append(f"{len(earlier_files) - len(earlier_listed)} files of rolled-out turns not listed")
    sources["retrieval"] = SourceReport(
        source="retrieval",
        tokens=fold_total + earlier_cost + found.tokens,
        cap=budgets.retrieval,
        items=len(folded) + len(earlier_listed) + len(found.shown),
        cut="; ".join(cuts) or None,
    )
    if found.text:
        blocks.append(found.text)
    if earlier_text:
        blocks.append(earlier_text)
    pinned = render_profile(profile, cap=budgets.memory, counter=counter)  # always first in memory
    # what the persona, the summary and retrieval leave of their caps flows to recalled segments
    idle = (
        (budgets.persona - sources["persona"].tokens)
        + (budgets.summary - sources["summary"].tokens)
        + (budgets.retrieval - sources["retrieval"].tokens)
    )
    memory_cap = budgets.memory + (max(idle, 0) if idle_to_memory else 0)
    room_for_recalled = memory_cap - pinned.tokens - (1 if pinned.text else 0)
    memory_text, recalled, recalled_report = _memory_block(candidates, room_for_recalled, counter)
    if pinned.text:
        memory_text = pinned.text + ("\n" + memory_text if memory_text else "")
    sources["memory"] = SourceReport(
        source="memory",
        tokens=counter.count_text(memory_text) if memory_text else 0,
        cap=memory_cap,
        items=recalled_report.items + (1 if pinned.text else 0),
        cut="; ".join(c for c in (pinned.cut, recalled_report.cut) if c) or None,
    )
    if memory_text:
        blocks.insert(1 if summary_text else 0, memory_text)  # summary, memory, retrieval
        texts["memory"] = memory_text

    head: list[Mapping[str, Any]] = [persona_msg]
    retrieval_framing = 0
    if blocks:
        context_msg = Message(role="system", content="\n\n".join(blocks))
        head.append(context_msg)
        # framing of the shared system message is charged to the sources in it
        framing = counter.count_message(context_msg) - sum(counter.count_text(b) for b in blocks)
        first = "summary" if summary_text else "memory" if memory_text else "retrieval"
        sources[first] = _add_tokens(sources[first], framing)
        retrieval_framing = framing if first == "retrieval" else 0

    used_by_others = sum(s.tokens for s in sources.values())
    room = window - budgets.reply_reserve - REPLY_PRIMING - used_by_others - overhead
    blocks_in = {**folded, **first_block}

    def recent(room: int) -> tuple[list[Mapping[str, Any]], list[int], SourceReport]:
        # folded blocks sit inside the recent messages but are charged to retrieval (already out of room)
        msgs, kept, report = _recent(turns, pending, room + fold_total, budgets.recent, counter, blocks_in)
        shown_fold = sum(cost for seq, cost in fold_costs.items() if seq in kept)
        sources["retrieval"] = replace(
            sources["retrieval"],
            tokens=shown_fold + earlier_cost + found.tokens + retrieval_framing,
            items=sum(len((attachments or {})[q].file_ids) for q in folded if q in kept)
            + len(earlier_listed)
            + len(found.shown),
        )
        return msgs, kept, replace(report, tokens=max(report.tokens - shown_fold, 0), cap=max(budgets.recent, room))

    recent_msgs, shown, recent_report = recent(room)
    # lorebook entries placed at a depth go among the recent turns (their tokens are retrieval's)
    with_lore, lore_at = insert_at_depth(recent_msgs, found.inserted)
    messages = head + with_lore + post_history
    total = counter.count_messages(messages)
    # the provider's baseline covers the previous request without its post-history message
    # (the engine fingerprints it so), whose tokens its reported usage already holds
    by_baseline = baseline_total(baseline, messages[: len(messages) - len(post_history)], counter)
    if by_baseline is not None and by_baseline > total:
        # the provider counts this prefix higher than we do: shrink recent by the difference
        recent_msgs, shown, recent_report = recent(room - (by_baseline - total))
        with_lore, lore_at = insert_at_depth(recent_msgs, found.inserted)
        messages = head + with_lore + post_history
        total = counter.count_messages(messages)
        refit = baseline_total(baseline, messages[: len(messages) - len(post_history)], counter)
        by_baseline = refit
        total = max(total, refit or 0)
    sources["recent"] = recent_report
    texts["recent"] = "\n".join(_text(m) for m in recent_msgs)
    retrieval_texts = (
        [t for t in (found.text, earlier_text) if t]
        + [folded[q] for q in sorted(folded) if q in shown]
        + [i.text for i in found.inserted]
    )
    if retrieval_texts:
        texts["retrieval"] = "\n\n".join(retrieval_texts)
    total += overhead
    return AssembledContext(
        session_id=session_id,
        messages=messages,
        sources={s: sources[s] for s in SOURCES},
        total_tokens=total,
        window=window,
        reply_reserve=budgets.reply_reserve,
        recalled=recalled,
        retrieved=list(found.shown),
        recent_seqs=shown,
        pending_turns=summary.pending if summary is not None else 0,
        source_text=texts,
        post_history_messages=len(post_history),
        lore_messages=[len(head) + i for i in lore_at],
        calibration=calibration,
        overhead_tokens=overhead,
        baseline_tokens=by_baseline,
        attached_files=list(
            dict.fromkeys(
                [f.file_id for f in earlier_listed]
                + [
                    fid
                    for q in sorted(listed | set(first_block))
                    if q in shown
                    for fid in (attachments or {})[q].file_ids
                ]
            )
        ),
    )


def _role(role: str) -> Role:
    """A stored turn's role (``user`` or ``assistant``; the store accepts no other)."""
    return cast(Role, role)


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def _add_tokens(report: SourceReport, extra: int) -> SourceReport:
    return SourceReport(
        source=report.source, tokens=report.tokens + extra, cap=report.cap, items=report.items, cut=report.cut
    )


def _summary_block(summary: SummaryText | None, cap: int, counter: TokenCounter) -> tuple[str, SourceReport]:
    """The summary block within ``cap`` tokens, with the pending-summary line when turns wait for
    their compaction (that line is never cut: without it the prompt would hide a gap)."""
    if summary is not None and summary.pending:
        note = render("notice_summary_pending", count=summary.pending)
        if not summary.content:
            tokens = counter.count_text(note)
            return note, SourceReport(source="summary", tokens=tokens, cap=cap, items=0)
        content, report = _summary_body(summary, cap - counter.count_text(note) - 1, counter)
        if not content:
            tokens = counter.count_text(note)
            return note, replace(report, tokens=tokens, cap=cap)
        lines = content.split("\n")
        content = "\n".join([*lines[:-1], note, *lines[-1:]])
        return content, replace(report, tokens=counter.count_text(content), cap=cap)
    return _summary_body(summary, cap, counter)


def _summary_body(summary: SummaryText | None, cap: int, counter: TokenCounter) -> tuple[str, SourceReport]:
    if summary is None or not summary.content:
        return "", SourceReport(source="summary", tokens=0, cap=cap, items=0)
    content = summary.content
    tokens = counter.count_text(content)
    lines = content.split("\n")
    cut_note = None
    if tokens > cap:
        # keep the header (first two lines) and the closing tag; drop the oldest entries first
        header, body, footer = lines[:2], lines[2:-1], lines[-1:]
        dropped = 0
        while body:
            body.pop(0)
            dropped += 1
            cut_note = render("notice_summary_cut", count=dropped)
            content = "\n".join([*header, cut_note, *body, *footer])
            tokens = counter.count_text(content)
            if tokens <= cap:
                break
        if tokens > cap:
            return "", SourceReport(
                source="summary", tokens=0, cap=cap, items=0, cut="summary omitted: larger than its cap"
            )
    items = summary.items
    return content, SourceReport(source="summary", tokens=tokens, cap=cap, items=items, cut=cut_note)


def _memory_block(
    candidates: Sequence[RecalledItem], cap: int, counter: TokenCounter
) -> tuple[str, list[RecalledItem], SourceReport]:
    if not candidates or cap <= 0:
        return "", [], SourceReport(source="memory", tokens=0, cap=cap, items=0)
    used = counter.count_text(render("memory_block", body=""))
    chosen: list[tuple[RecalledItem, str]] = []
    for seg in candidates:
        entry = render("memory_entry", date=seg.session_date.date().isoformat(), content=fence(seg.content))
        cost = counter.count_text(entry) + 1
        if used + cost <= cap:
            chosen.append((seg, entry))
            used += cost
    if not chosen:
        cut: str | None = f"{len(candidates)} recalled segments did not fit the memory budget"
        return "", [], SourceReport(source="memory", tokens=0, cap=cap, items=0, cut=cut)
    chosen.sort(key=lambda pair: (pair[0].session_date, pair[0].first_seq))  # chronological reads best
    text = render("memory_block", body="\n".join(entry for _, entry in chosen))
    tokens = counter.count_text(text)
    while tokens > cap and chosen:  # the per-entry sum is an estimate of the joined text; make sure
        chosen.pop()
        text = render("memory_block", body="\n".join(entry for _, entry in chosen))
        tokens = counter.count_text(text)
    left = len(candidates) - len(chosen)
    cut = f"{left} more recalled segments not shown" if left else None
    return (
        text,
        [seg for seg, _ in chosen],
        SourceReport(source="memory", tokens=tokens, cap=cap, items=len(chosen), cut=cut),
    )


def _fold(
    attachments: dict[int, TurnBlocks], newest: int | None, cap: int, counter: TokenCounter
) -> tuple[dict[int, str], dict[int, int], set[int], str | None]:
    """The folded block of each older turn within the retrieval ``cap`` (tokens), newest turn
    first: with previews while they fit, then without, then a one-line notice, then nothing.

    Returns ``seq -> block``, ``seq -> tokens it adds``, the seqs whose files are listed (not
    just counted in a notice), and what was cut (or ``None``).
    """
    chosen: dict[int, str] = {}
    listed: set[int] = set()
    costs: dict[int, int] = {}
    used = 0
    compacted = omitted = 0
    for seq in sorted((q for q in attachments if q != newest), reverse=True):
        blocks = attachments[seq]
        count = len(blocks.file_ids)
        forms = [(blocks.folded, 0), (blocks.compact, 1), (render("notice_files_omitted", count=count), 2)]
        for text, level in forms:
            cost = counter.count_text("\n\n" + text)
            if used + cost <= cap:
                chosen[seq], costs[seq] = text, cost
                used += cost
                compacted += level == 1
                omitted += count if level == 2 else 0
                if level < 2:
                    listed.add(seq)
                break
        else:
            omitted += count
    notes = []
    if compacted:
        notes.append(f"previews of {compacted} earlier attachment blocks dropped")
    if omitted:
        notes.append(f"{omitted} earlier attached files not listed")
    return chosen, costs, listed, "; ".join(notes) or None


def _earlier(files: Sequence[AttachedFile], cap: int, counter: TokenCounter) -> tuple[str, list[AttachedFile]]:
    """The block listing ``files`` (oldest first) within ``cap`` tokens, dropping the oldest first
    (and saying how many in the block)."""
    listed = list(files)
    while listed:
        dropped = len(files) - len(listed)
        text = earlier_block(listed) + ("\n" + render("notice_files_omitted", count=dropped) if dropped else "")
        if counter.count_text(text) <= cap:
            return text, listed
        listed.pop(0)
    return "", []


def _recent(
    turns: Sequence[RecentTurn],
    pending: str | None,
    room: int,
    cap: int,
    counter: TokenCounter,
    blocks: dict[int, str] | None = None,
) -> tuple[list[Mapping[str, Any]], list[int], SourceReport]:
    """Newest whole exchanges first until ``room`` is full; the newest user message is cut rather than dropped.
    ``blocks`` (turn seq -> attachment block) go under their turns' text."""
    blocks = blocks or {}
    seqs: list[int | None] = [t.seq for t in turns]
    messages: list[Mapping[str, Any]] = [
        Message(role=_role(t.role), content=with_block(t.content, blocks.get(t.seq, ""))) for t in turns
    ]
    if pending is not None:
        seqs.append(None)
        messages.append(Message(role="user", content=pending))
    fit = fit_messages(messages, limit=max(room, 0) + REPLY_PRIMING, counter=counter)
    shown = [seq for i in fit.kept if (seq := seqs[i]) is not None]
    report = SourceReport(
        source="recent",
        tokens=fit.tokens - REPLY_PRIMING if fit.messages else 0,
        cap=max(cap, room),
        items=len(fit.messages),
        cut="; ".join(fit.cut) or None,
    )
    return list(fit.messages), shown, report

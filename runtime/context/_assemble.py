"""Context assembly: persona, memory, retrieval, summary and recent turns, each within its cap.

Assembly is a read: it takes values (:mod:`runtime.context._values`, converted from stored
rows by the turn layer) and returns messages, changing nothing.
The message list, in the ``classic`` layout, is::

    system   persona (never cut, never squeezed; example dialogues go first when over its cap)
    system   summary block, memory block (pinned profile, recalled segments), retrieval block
             (lorebook entries, knowledge chunks), when there are any
    user / assistant ...  the recent turns, oldest first, ending with the current user message
                          (lorebook entries placed at a depth are inserted among them, charged
                          to ``retrieval``)
    system   the persona's post-history instructions, if it has any (counted to ``persona``)

In the ``cache`` layout (:attr:`ContextInputs.layout`) the second system message holds only what
changes at compactions (summary, pinned profile, files of rolled-out turns); the session's kept
recall block goes under the text of its anchor turn, and the recall tail, fired lorebook entries
and knowledge hits under the current user message's text (:mod:`runtime.context._stable_recall`).
Each is charged to its source (``memory``, ``retrieval``), not to ``recent``.

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
from datetime import UTC, datetime, timedelta, tzinfo
from typing import Any, Literal

from persona import Persona
from runtime.accounting import REPLY_PRIMING, SOURCES, Baseline, Budgets, TokenCounter, baseline_total, fingerprint
from runtime.context._attachments import AttachedFile, with_block
from runtime.context._blocks import memory_block, summary_block
from runtime.context._persona import DEFAULT_USER_NAME, render_persona
from runtime.context._pieces import (
    TurnBlocks,
    add_tokens,
    before_blocks,
    earlier,
    fold,
    recent,
    text_of,
    unseen_margin,
    with_tail,
)
from runtime.context._profile import render_profile
from runtime.context._report import SourceReport
from runtime.context._retrieval import RetrievalBlock, RetrievalItem, fit_retrieval, insert_at_depth
from runtime.context._stable_recall import Keep, StableRecall, split_recall
from runtime.context._values import PinnedProfile, RecalledItem, RecentTurn, SummaryText
from runtime.messages import Message, StablePrefix


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
    """For inspection: the provider's count of the last reported request plus the raw estimate of
    what this one adds after the messages both start with (``None`` when it does not start with
    them). An upper bound of the provider's count, looser than ``total_tokens`` when the previous
    newest message carried a recall tail (both hold it)."""
    attached_files: list[str] = field(default_factory=list)
    """Ids of the files whose blocks (first-turn or folded) the messages show, in turn order."""
    zone: tzinfo = UTC
    """The user's time zone the context's dates are shown in (:attr:`ContextInputs.zone`)."""
    layout: Layout = "classic"
    """The layout the messages follow (:attr:`ContextInputs.layout`)."""
    rebuilt_recall: StableRecall | None = None
    """Cache layout: the recall this assembly built a new block in (``None`` when the kept block
    stayed, or in the classic layout)."""
    recall_withheld: list[RecalledItem] = field(default_factory=list)
    """Cache layout: the segments recall selected that this turn does not show (the kept block
    stayed; the classic layout would show them), chronological."""
    kept_recall: StableRecall | None = None
    """Cache layout: the recall the session keeps after this turn (its block and tails, anchored),
    to be stored with the reply; ``None`` when it did not change (or in the classic layout)."""
    newest_stable: int | None = None
    """Cache layout: the leading characters of the newest user message the next request sends again:
    all when nothing under it shows for this turn only, else the text and the recall kept under it
    (``None``: not known: the classic layout; a first-turn file block or a lorebook entry at a depth)."""

    @property
    def baseline_messages(self) -> int:
        """How many leading messages the next request sends again as they are: those before the
        newest user message (which the next request sends without what goes under it only for this
        turn), or all but the post-history message when there is no user message. The engine
        fingerprints this prefix with the provider's reported usage (:class:`~runtime.accounting.Baseline`)."""
        end = len(self.messages) - self.post_history_messages
        return next((i for i in range(end - 1, -1, -1) if self.messages[i].get("role") == "user"), end)

    @property
    def stable_prefix(self) -> StablePrefix:
        """What the next request sends again as it is, as far as this assembly knows: the messages
        before the newest user message (:attr:`baseline_messages`) and its first :attr:`newest_stable`
        characters. A provider's cache markers go at its end (:func:`runtime.llm.cache_marks`)."""
        end = self.baseline_messages
        content = self.messages[end].get("content") if end < len(self.messages) else None
        if self.newest_stable is None or not isinstance(content, str) or self.messages[end].get("role") != "user":
            return StablePrefix(end)
        if self.newest_stable >= len(content):
            return StablePrefix(end + 1)
        return StablePrefix(end, self.newest_stable)

    @property
    def overflow(self) -> bool:
        """True if the prompt plus the reply reserve exceeds the window."""
        return self.total_tokens + self.reply_reserve > self.window


@dataclass(frozen=True, kw_only=True)
class ContextInputs:
    """What one assembly is built from: values the turn layer converted from storage rows."""

    session_id: str
    persona: Persona
    summary: SummaryText | None
    """The session's current summary, or ``None``."""
    candidates: Sequence[RecalledItem]
    """Recalled segments, best first; they fill ``memory`` in that order."""
    turns: Sequence[RecentTurn]
    """The session's turns in the recent window (state ``context``), oldest first."""
    pending: str | None = None
    """A user message to end the prompt with that is *not* stored (e.g. an evaluation question);
    ``None`` when the last stored turn is the current message."""
    baseline: Baseline | None = None
    """The provider's last reported request size; when this request starts with that one, its size
    is the baseline plus the messages added, and the recent window shrinks if that says it does
    not fit."""
    calibration: float = 1.0
    """The factor the counter already applies, reported back as is."""
    overhead: int = 0
    """Tokens the provider adds per request (from calibration) and tokens reserved for what the
    request carries beyond its text; reserved out of the room for ``recent``, in the total."""
    profile: PinnedProfile | None = None
    """The user's pinned profile, shown first in ``memory``; its name is what ``{{user}}``
    becomes (default ``User``)."""
    retrieval: Sequence[RetrievalItem] = ()
    """Fired lorebook entries and knowledge chunks."""
    attachments: Mapping[int, TurnBlocks] = field(default_factory=dict)
    """Turn ``seq`` -> the attachment blocks of that user turn."""
    earlier_files: Sequence[AttachedFile] = ()
    """Files of turns rolled out of the recent window, oldest first; listed (placeholder lines) in
    the system context while ``retrieval`` has room after the folded blocks, newest kept first."""
    idle_to_memory: bool = True
    """Let what the persona, the summary and retrieval leave of their caps flow to recalled
    segments (``False`` for an overflow retry, which must send less)."""
    zone: tzinfo = UTC
    """The user's time zone (:func:`runtime.context.user_zone`): recalled segments are dated in it."""
    now: datetime | None = None
    """The turn's time on the user's clock, for the cards' clock macros (``None``: left as written)."""
    idle: timedelta | None = None
    """Time since the user's message before this one, for ``{{idle_duration}}``."""
    layout: Layout = "classic"
    """``classic``: the summary, memory and retrieval blocks in the system context after the
    persona. ``cache``: only what changes at compactions there (the summary, the pinned profile,
    the session's kept recall block, rolled-out turns' files); what changes every turn (the recall
    tail, fired lorebook entries, knowledge hits) under the newest user message
    (:mod:`runtime.context._stable_recall`)."""
    kept_recall: StableRecall | None = None
    """The session's stored recall: its block and kept tails (cache layout; ``None``: none kept yet)."""
    tail_share: float = 0.1
    """Cache layout: the share of the memory budget a rebuilt block leaves and one turn's recall may
    add under its message before the kept block is rebuilt (0 to 1; a third of it is never kept)."""
    keep: Keep = "all"
    """Cache layout: the rule that keeps the recall block (:data:`runtime.context._stable_recall.Keep`)."""
    same_topic: bool = False
    """Cache layout: the message has not moved on from the user's message before it (its embedding
    is at least ``COMPANION_RECALL_SAME_TOPIC`` similar): the kept recall block stays on the terms
    of :func:`runtime.context._stable_recall.split_recall`."""


CONTEXT_LAYOUT: tuple[str, ...] = ("summary", "memory", "retrieval")
"""The order of the sources in the system context message after the persona (and in the cache
layout's tail under the newest user message); message framing is charged to the first one present."""

Layout = Literal["cache", "classic"]
"""How the prompt is laid out (:attr:`ContextInputs.layout`)."""


@dataclass(frozen=True, kw_only=True)
class Section:
    """What one source adds to the system context: its blocks (texts) and its report."""

    blocks: tuple[str, ...]
    report: SourceReport
    tail: tuple[str, ...] = ()
    """Cache layout: blocks that go under the newest user message instead."""


@dataclass(frozen=True, kw_only=True)
class _Retrieval:
    """The retrieval source before the recent window is fitted: what it placed, and at what cost."""

    section: Section
    found: RetrievalBlock
    folded: dict[int, str]
    """Seq -> folded attachment block of an older turn."""
    fold_costs: dict[int, int]
    listed: set[int]
    first_block: dict[int, str]
    """The newest user turn's first-turn block, when it ends the prompt."""
    earlier_text: str
    earlier_cost: int
    earlier_listed: list[AttachedFile]


@dataclass(frozen=True, kw_only=True)
class _RecentFit:
    """The recent window fitted into its room, and the retrieval tokens it shows (folded blocks)."""

    messages: list[Mapping[str, Any]]
    shown: list[int]
    report: SourceReport
    retrieval: SourceReport
    """The retrieval report corrected for the folded blocks among the shown turns."""


def assemble_context(
    inputs: ContextInputs, *, budgets: Budgets, window: int, counter: TokenCounter
) -> AssembledContext:
    """Build the prompt within budgets. Pure: it reads its arguments only.

    ``window``: the context window in tokens (``budgets`` should total to it); ``counter``: the
    session's (calibrated) counter. The memory cap grows by what the persona, the summary and
    retrieval leave of their caps (tokens), so a window with no lorebook or a short summary
    recalls more.

    Raises:
        ConfigurationError: the persona's parts that are never cut exceed its cap.
    """
    user_name = (inputs.profile.name if inputs.profile is not None and inputs.profile.name else None) or (
        DEFAULT_USER_NAME
    )
    rendered = render_persona(
        inputs.persona,
        cap=budgets.persona,
        counter=counter,
        user_name=user_name,
        calibration=inputs.calibration,
        session_id=inputs.session_id,
        now=inputs.now,
        idle=inputs.idle,
    )
    post_history: list[Mapping[str, Any]] = [rendered.post_history] if rendered.post_history else []
    persona = SourceReport(
        source="persona",
        tokens=rendered.tokens,
        cap=budgets.persona,
        items=1 + rendered.examples_kept + len(post_history),
        cut=rendered.cut,
    )
    texts = {"persona": "\n\n".join(m["content"] for m in [rendered.system, *post_history])}
    summary = _summary_section(inputs.summary, budgets.summary, counter)
    retrieval = _retrieval_section(inputs, budgets.retrieval, counter)
    # what the persona, the summary and retrieval leave of their caps flows to recalled segments
    idle = (
        (budgets.persona - persona.tokens)
        + (budgets.summary - summary.report.tokens)
        + (budgets.retrieval - retrieval.section.report.tokens)
    )
    memory = _memory_section(
        inputs,
        # what the prompt holds before the memory block, bar the pinned profile (added there)
        before=[rendered.system["content"], *summary.blocks, *retrieval.section.blocks],
        pinned_cap=budgets.memory,
        cap=budgets.memory + (max(idle, 0) if inputs.idle_to_memory else 0),
        counter=counter,
    )
    sections = {"summary": summary, "memory": memory.section, "retrieval": retrieval.section}
    sources: dict[str, SourceReport] = {"persona": persona, **{s: sections[s].report for s in CONTEXT_LAYOUT}}
    head: list[Mapping[str, Any]] = [rendered.system]
    blocks = [b for s in CONTEXT_LAYOUT for b in sections[s].blocks]
    retrieval_framing = 0
    if blocks:
        context_msg = Message(role="system", content="\n\n".join(blocks))
        head.append(context_msg)
        # framing of the shared system message is charged to the sources in it
        framing = counter.count_message(context_msg) - sum(counter.count_text(b) for b in blocks)
        first = next(s for s in CONTEXT_LAYOUT if sections[s].blocks)
        sources[first] = add_tokens(sources[first], framing)
        retrieval_framing = framing if first == "retrieval" else 0
    texts.update({s: sections[s].blocks[0] for s in ("summary", "memory") if sections[s].blocks})
    tail = [b for s in CONTEXT_LAYOUT for b in sections[s].tail]
    ends_with_user = inputs.pending is not None or bool(inputs.turns and inputs.turns[-1].role == "user")
    if tail and not ends_with_user:
        # no user message to go under: the tail is a message of its own, framing charged to its first source
        alone = counter.count_message(Message(role="system", content="\n\n".join(tail)))
        framing = max(alone - sum(counter.count_text("\n\n" + b) for b in tail), 0)
        first = next(s for s in CONTEXT_LAYOUT if sections[s].tail)
        sources[first] = add_tokens(sources[first], framing)

    # when the session's factor is below 1, what no reported request held is counted at no less
    # than the raw estimate (it may be in another language than what set the factor): the newest
    # message, the reply before it, and what changes every turn (the cache layout's blocks under
    # the newest message, a rebuilt recall block among them; the classic layout's memory and
    # retrieval blocks)
    conservative: TokenCounter = getattr(counter, "conservative", counter)
    volatile = tail if inputs.layout == "cache" else [*memory.section.blocks, *retrieval.section.blocks]
    margin = unseen_margin(inputs.turns, inputs.pending, counter, conservative, volatile)
    overhead = inputs.overhead + margin
    room = window - budgets.reply_reserve - REPLY_PRIMING - sum(r.tokens for r in sources.values()) - overhead
    fit = _fit_recent(inputs, retrieval, room, budgets.recent, counter, framing=retrieval_framing, memory=memory.kept)
    # lorebook entries placed at a depth go among the recent turns (their tokens are retrieval's)
    with_lore, lore_at = insert_at_depth(fit.messages, retrieval.found.inserted)
    with_lore = with_tail(with_lore, tail, under=ends_with_user)
    messages = head + with_lore + post_history
    total = counter.count_messages(messages)
    steady_newest = inputs.layout == "cache" and ends_with_user and not (retrieval.first_block or lore_at)
    # for inspection: the provider's count of the last request plus the raw estimate of what this
    # one adds after the prefix both sent (an upper bound; the previous newest message and what
    # was under it are in both)
    by_baseline = baseline_total(inputs.baseline, messages[: len(messages) - len(post_history)], conservative)
    sources["recent"], sources["retrieval"] = fit.report, fit.retrieval
    if inputs.layout == "cache":
        # the kept block shows only when its anchor turn does; charged to memory only then
        shown = [b for seq, b in memory.kept.items() if seq in fit.shown]
        unshown = sum(counter.count_text("\n\n" + b) for seq, b in memory.kept.items() if seq not in fit.shown)
        sources["memory"] = add_tokens(sources["memory"], -unshown)
        texts["memory"] = "\n".join(t for t in (texts.get("memory", ""), *shown, *memory.section.tail) if t)
    # blocks under a turn's text are counted alone, framing included, and charged to their source:
    # the total is never below what the sources were charged
    total = max(total, sum(r.tokens for r in sources.values()))
    texts["recent"] = "\n".join(text_of(m) for m in fit.messages)
    retrieval_texts = (
        [t for t in (retrieval.found.text, retrieval.earlier_text) if t]
        + [retrieval.folded[q] for q in sorted(retrieval.folded) if q in fit.shown]
        + [i.text for i in retrieval.found.inserted]
    )
    if retrieval_texts:
        texts["retrieval"] = "\n\n".join(retrieval_texts)
    return AssembledContext(
        session_id=inputs.session_id,
        messages=messages,
        sources={s: sources[s] for s in SOURCES},
        total_tokens=total + overhead,
        window=window,
        reply_reserve=budgets.reply_reserve,
        recalled=memory.recalled,
        retrieved=list(retrieval.found.shown),
        recent_seqs=fit.shown,
        pending_turns=inputs.summary.pending if inputs.summary is not None else 0,
        source_text=texts,
        post_history_messages=len(post_history),
        lore_messages=[len(head) + i for i in lore_at],
        calibration=inputs.calibration,
        overhead_tokens=overhead,
        baseline_tokens=by_baseline,
        attached_files=_attached_files(inputs, retrieval, fit.shown),
        zone=inputs.zone,
        layout=inputs.layout,
        rebuilt_recall=memory.rebuilt,
        recall_withheld=list(memory.withheld),
        kept_recall=memory.store,
        # the newest user message less what shows under it for this turn only (which closes it)
        newest_stable=before_blocks(messages, [*memory.once, *retrieval.section.tail]) if steady_newest else None,
    )


def _summary_section(summary: SummaryText | None, cap: int, counter: TokenCounter) -> Section:
    text, report = summary_block(summary, cap, counter)
    return Section(blocks=(text,) if text else (), report=report)


@dataclass(frozen=True, kw_only=True)
class _Memory:
    section: Section
    recalled: list[RecalledItem]
    rebuilt: StableRecall | None = None
    """Cache layout: the kept recall with the block built this assembly (``None``: the stored block stayed)."""
    store: StableRecall | None = None
    """Cache layout: what the session keeps after this turn, when it changed (``None``: unchanged)."""
    kept: dict[int, str] = field(default_factory=dict)
    """Cache layout: anchor seq -> the kept block and tails shown under that stored turn (tokens charged to memory)."""
    once: tuple[str, ...] = ()
    """Cache layout: the recall block under the newest message shown for this turn only (none or one)."""
    withheld: tuple[RecalledItem, ...] = ()
    """Cache layout: the selected segments not shown (:attr:`~runtime.context._stable_recall.RecallSplit.withheld`)."""


def _memory_section(
    inputs: ContextInputs,
    *,
    before: Sequence[str],
    pinned_cap: int,
    cap: int,
    counter: TokenCounter,
) -> _Memory:
    """The pinned profile (always first, within ``pinned_cap`` tokens, the memory budget), then
    the recalled segments that fit what is left of ``cap`` tokens (the budget with idle flow).
    In the cache layout the recalled segments are split between the kept block (with the profile,
    in the stable context) and the tail (:func:`~runtime.context._stable_recall.split_recall`)."""
    pinned = render_profile(inputs.profile, cap=pinned_cap, counter=counter)
    room_for_recalled = cap - pinned.tokens - (1 if pinned.text else 0)
    if inputs.layout == "cache":
        seqs = {t.seq for t in inputs.turns}
        newest = inputs.turns[-1] if inputs.turns and inputs.pending is None else None
        current = newest.seq if newest is not None and newest.role == "user" else None
        # the persona and the system context: when they changed since the block was built (a
        # compaction, an edited profile), the provider's cache holds nothing after them, so the
        # block is rebuilt for the current message at no cost to the cached prefix
        prefix = fingerprint([{"role": "system", "content": t} for t in (*before, pinned.text)])
        stored = inputs.kept_recall
        if stored is not None and stored.prefix is not None and stored.prefix != prefix:
            stored = None
        split = split_recall(
            inputs.candidates,
            # the block's anchor turn must be in view; a tail shows under its turn while that turn
            # is in view and is not the current message (whose tail this turn builds again)
            replace(stored, tails=tuple(t for t in stored.tails if t.anchor in seqs and t.anchor != current))
            if stored is not None and stored.anchor in seqs
            else None,
            cap=room_for_recalled,
            tail_cap=int(max(room_for_recalled, 0) * inputs.tail_share),
            counter=counter,
            zone=inputs.zone,
            keep=inputs.keep,
            same_topic=inputs.same_topic,
        )
        head = pinned.text
        # the kept block and tails sit under their turns' text; what this turn builds goes under the newest message
        kept: dict[int, str] = {}
        for anchor, piece in split.stable.pieces:
            if anchor is not None and piece:
                kept[anchor] = f"{kept[anchor]}\n\n{piece}" if anchor in kept else piece
        # under the newest message: a rebuilt block, the tail kept with it, then what shows this turn only
        new = tuple(t for t in ((split.stable.text if split.rebuilt else ""), split.tail, split.volatile) if t)
        tokens = sum(counter.count_text("\n\n" + t) for t in (*kept.values(), *new)) + (
            counter.count_text(head) if head else 0
        )
        report = SourceReport(
            source="memory",
            tokens=tokens,
            cap=cap,
            items=len(split.stable.all_segment_ids | set(split.volatile_ids)) + (1 if pinned.text else 0),
            cut="; ".join(c for c in (pinned.cut, split.cut) if c) or None,
        )
        return _Memory(
            section=Section(blocks=(head,) if head else (), report=report, tail=new),
            recalled=split.recalled,
            rebuilt=split.stable if split.rebuilt else None,
            # what this turn built is stored under the current message's turn (nowhere when it is not stored)
            store=(replace(split.stable, prefix=prefix) if split.rebuilt else split.stable).anchored(current)
            if split.changed
            else None,
            kept=kept,
            once=(split.volatile,) if split.volatile else (),
            withheld=split.withheld,
        )
    memory_text, recalled, recalled_report = memory_block(inputs.candidates, room_for_recalled, counter, inputs.zone)
    if pinned.text:
        memory_text = pinned.text + ("\n" + memory_text if memory_text else "")
    report = SourceReport(
        source="memory",
        tokens=counter.count_text(memory_text) if memory_text else 0,
        cap=cap,
        items=recalled_report.items + (1 if pinned.text else 0),
        cut="; ".join(c for c in (pinned.cut, recalled_report.cut) if c) or None,
    )
    return _Memory(section=Section(blocks=(memory_text,) if memory_text else (), report=report), recalled=recalled)


def _retrieval_section(inputs: ContextInputs, cap: int, counter: TokenCounter) -> _Retrieval:
    """The folded file references of older turns first (they anchor what the user sent), then
    rolled-out turns' files, then lorebook entries and knowledge chunks in what is left of ``cap``."""
    turns, attachments = inputs.turns, inputs.attachments
    newest = turns[-1].seq if turns and inputs.pending is None and turns[-1].role == "user" else None
    first_block = {newest: attachments[newest].first} if newest is not None and newest in attachments else {}
    folded, fold_costs, listed, fold_cut = fold(attachments, newest, cap, counter)
    fold_total = sum(fold_costs.values())
    earlier_text, earlier_listed = earlier(inputs.earlier_files, cap - fold_total, counter)
    earlier_cost = counter.count_text(earlier_text) if earlier_text else 0
    book = inputs.persona.character_book
    found = fit_retrieval(
        inputs.retrieval,
        cap=max(cap - fold_total - earlier_cost, 0),
        counter=counter,
        lore_cap=book.token_budget if book is not None else None,
    )
    cuts = [c for c in (fold_cut, found.cut) if c]
    if len(earlier_listed) < len(inputs.earlier_files):
        cuts.append(f"{len(inputs.earlier_files) - len(earlier_listed)} files of rolled-out turns not listed")
    # in the cache layout the fired entries and hits go under the newest user message, joined by a blank line
    joint = counter.count_text("\n\n" + found.text) - counter.count_text(found.text) if found.text else 0
    report = SourceReport(
        source="retrieval",
        tokens=fold_total + earlier_cost + found.tokens + (joint if inputs.layout == "cache" else 0),
        cap=cap,
        items=len(folded) + len(earlier_listed) + len(found.shown),
        cut="; ".join(cuts) or None,
    )
    section = (
        Section(blocks=(earlier_text,) if earlier_text else (), tail=(found.text,) if found.text else (), report=report)
        if inputs.layout == "cache"
        else Section(blocks=tuple(t for t in (found.text, earlier_text) if t), report=report)
    )
    return _Retrieval(
        section=section,
        found=found,
        folded=folded,
        fold_costs=fold_costs,
        listed=listed,
        first_block=first_block,
        earlier_text=earlier_text,
        earlier_cost=earlier_cost,
        earlier_listed=earlier_listed,
    )


def _fit_recent(
    inputs: ContextInputs,
    retrieval: _Retrieval,
    room: int,
    cap: int,
    counter: TokenCounter,
    *,
    framing: int,
    memory: Mapping[int, str],
) -> _RecentFit:
    """The recent window within ``room`` tokens. Folded blocks sit inside the recent messages but
    are charged to retrieval (already out of ``room``): the fit returns retrieval's report for the
    turns it shows (``framing``: the shared message's framing retrieval was charged)."""
    fold_total = sum(retrieval.fold_costs.values())
    blocks = {**retrieval.folded, **retrieval.first_block}
    for seq, block in memory.items():  # the kept recall block under its anchor turn (memory's tokens)
        blocks[seq] = with_block(blocks.get(seq, ""), block) if seq in blocks else block
    memory_cost = sum(counter.count_text("\n\n" + b) for b in memory.values())
    msgs, kept, report = recent(inputs.turns, inputs.pending, room + fold_total + memory_cost, cap, counter, blocks)
    shown_fold = sum(cost for seq, cost in retrieval.fold_costs.items() if seq in kept)
    shown_kept = sum(counter.count_text("\n\n" + b) for seq, b in memory.items() if seq in kept)  # memory's
    corrected = replace(
        retrieval.section.report,
        tokens=shown_fold + retrieval.earlier_cost + retrieval.found.tokens + framing,
        items=sum(len(inputs.attachments[q].file_ids) for q in retrieval.folded if q in kept)
        + len(retrieval.earlier_listed)
        + len(retrieval.found.shown),
    )
    return _RecentFit(
        messages=msgs,
        shown=kept,
        report=replace(report, tokens=max(report.tokens - shown_fold - shown_kept, 0), cap=max(cap, room)),
        retrieval=corrected,
    )


def _attached_files(inputs: ContextInputs, retrieval: _Retrieval, shown: Sequence[int]) -> list[str]:
    """Ids of the files whose blocks the messages show, in turn order."""
    return list(
        dict.fromkeys(
            [f.file_id for f in retrieval.earlier_listed]
            + [
                fid
                for q in sorted(retrieval.listed | set(retrieval.first_block))
                if q in shown
                for fid in inputs.attachments[q].file_ids
            ]
        )
    )

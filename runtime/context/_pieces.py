"""Pieces of context assembly that read no assembly state: the recent window's fit, folded file
references, and what the cache layout adds under the newest user message."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

from prompts import render
from runtime.accounting import REPLY_PRIMING, TokenCounter
from runtime.context._attachments import AttachedFile, earlier_block, with_block
from runtime.context._report import SourceReport
from runtime.context._trim import fit_messages
from runtime.context._values import RecentTurn
from runtime.messages import Message, Role


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


def unseen_margin(
    turns: Sequence[RecentTurn],
    pending: str | None,
    counter: TokenCounter,
    conservative: TokenCounter,
    volatile: Sequence[str] = (),
) -> int:
    """Tokens to add so that what no reported request held counts at least its raw estimate: the
    two newest stored turns (the newest user message and the reply before it), the message not
    stored, and the ``volatile`` texts (0 when ``counter`` is already conservative)."""
    if conservative is counter:
        return 0
    texts = [t.content for t in list(turns)[-2:]] + ([pending] if pending is not None else [])
    return sum(max(conservative.count_text(t) - counter.count_text(t), 0) for t in [*texts, *volatile])


def with_tail(messages: list[Mapping[str, Any]], tail: Sequence[str], *, under: bool) -> list[Mapping[str, Any]]:
    """``messages`` with the cache layout's tail blocks under the newest message's text when
    ``under`` (the prompt ends with the current user message), else as a system message after it."""
    if not tail:
        return messages
    joined = "\n\n".join(tail)
    last = messages[-1] if messages else None
    if under and last is not None and last.get("role") == "user" and isinstance(last.get("content"), str):
        return [*messages[:-1], {**last, "content": with_block(last["content"], joined)}]
    return [*messages, Message(role="system", content=joined)]


def before_blocks(messages: Sequence[Mapping[str, Any]], blocks: Sequence[str]) -> int | None:
    """How many characters of the newest user message's text come before ``blocks``, which close
    it as :func:`with_tail` joins them (all of it for none; ``None``: no such message, its content
    is not text, or it does not end with them)."""
    newest = next((m for m in reversed(messages) if m.get("role") == "user"), None)
    content = newest.get("content") if newest is not None else None
    suffix = "".join("\n\n" + b for b in blocks)
    if not isinstance(content, str) or not content.endswith(suffix):
        return None
    return len(content) - len(suffix)


def role_of(role: str) -> Role:
    """A stored turn's role (``user`` or ``assistant``; the store accepts no other)."""
    return cast(Role, role)


def text_of(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    return content if isinstance(content, str) else ""


def add_tokens(report: SourceReport, extra: int) -> SourceReport:
    return SourceReport(
        source=report.source, tokens=report.tokens + extra, cap=report.cap, items=report.items, cut=report.cut
    )


def fold(
    attachments: Mapping[int, TurnBlocks], newest: int | None, cap: int, counter: TokenCounter
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


def earlier(files: Sequence[AttachedFile], cap: int, counter: TokenCounter) -> tuple[str, list[AttachedFile]]:
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


def recent(
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
        Message(role=role_of(t.role), content=with_block(t.content, blocks.get(t.seq, ""))) for t in turns
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

"""Fitting a chat message list into a token limit without making it invalid.

The rules, each taken from failures reported against other context managers:

- system messages at the head are pinned: never evicted;
- an assistant message with ``tool_calls`` and all of its tool results stay or go together
  (an orphaned tool result is a 400 from OpenAI-compatible APIs);
- the first message after the system messages is a user message (Anthropic and several
  open-model chat templates reject a leading assistant turn);
- eviction takes whole units from the oldest end; the newest user message is never evicted,
  and is cut (with a notice) only if it alone does not fit;
- one tool result is capped at ``tool_result_cap`` tokens, and all the results of one
  assistant message at ``tool_results_cap`` tokens, so a parallel burst whose results
  each pass the single cap still fails the aggregate cap;
- every cut says so in the prompt, with how much was cut and where the full text is;
- a list that already fits and breaks no cap comes back unchanged (the same object).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from errors import ConfigurationError
from prompts import render
from runtime.accounting import REPLY_PRIMING, TokenCounter, longest_fitting_prefix
from runtime.messages import with_text

Message = Mapping[str, Any]


@dataclass(frozen=True, kw_only=True)
class FitResult:
    """A fitted message list and what fitting did."""

    messages: list[Message]
    kept: list[int] = field(default_factory=list)
    """Indexes into the input of the messages kept, in order."""
    dropped: int = 0
    """Messages evicted from the oldest end."""
    cut: list[str] = field(default_factory=list)
    """One line per cut, as said in the prompt."""
    tokens: int = 0
    """Tokens of ``messages`` (framing and reply priming included)."""


def units(messages: Sequence[Message]) -> list[list[int]]:
    """Group message indexes into eviction units.

    Each unit starts at a user message (or at the first message), and an assistant
    message with tool calls always shares a unit with the tool results that answer it.
    """
    groups: list[list[int]] = []
    for i, msg in enumerate(messages):
        role = msg.get("role")
        if not groups or role == "user":
            groups.append([i])
        else:
            groups[-1].append(i)
    return groups


def _content_text(msg: Message) -> str:
    content = msg.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "\n".join(str(p.get("text", "")) for p in content if isinstance(p, Mapping) and p.get("type") == "text")
    return ""


def cut_text_to(
    msg: Message, room: int, counter: TokenCounter, notice: str, *, notice_args: dict[str, Any]
) -> Message | None:
    """The longest prefix of ``msg``'s text content that fits ``room`` tokens with ``notice`` appended.

    ``notice`` names a template in ``prompts/`` that receives ``shown`` and ``total``
    (characters) plus ``notice_args``. Returns ``None`` if not even the notice fits.
    """
    text = _content_text(msg)

    def build(n: int) -> Message:
        return with_text(msg, text[:n] + render(notice, shown=n, total=len(text), **notice_args))

    if counter.count_message(build(0)) > room:
        return None
    return build(longest_fitting_prefix(len(text), lambda n: counter.count_message(build(n)) <= room))


def _cap_tool_results(
    messages: list[Message], counter: TokenCounter, single: int | None, aggregate: int | None
) -> tuple[list[Message], list[str]]:
    notes: list[str] = []
    out = list(messages)
    i = 0
    while i < len(out):
        msg = out[i]
        if msg.get("role") == "assistant" and msg.get("tool_calls"):
            ids = {c.get("id") for c in msg["tool_calls"] if isinstance(c, Mapping)}
            results = [
                j for j in range(i + 1, len(out)) if out[j].get("role") == "tool" and out[j].get("tool_call_id") in ids
            ]
            sizes = {j: counter.count_message(out[j]) for j in results}
            allowed = {j: min(sizes[j], single) if single is not None else sizes[j] for j in results}
            if aggregate is not None and sum(allowed.values()) > aggregate:
                # water-filling: small results keep their size, large ones share what is left
                remaining, pending = aggregate, sorted(results, key=lambda j: allowed[j])
                while pending:
                    share = remaining // len(pending)
                    j = pending.pop(0)
                    allowed[j] = min(allowed[j], share)
                    remaining -= allowed[j]
            for j in results:
                if sizes[j] > allowed[j]:
                    where = f"The full result is stored with call id {out[j].get('tool_call_id')}; call the tool again with a narrower request to see more."
                    cut = cut_text_to(
                        out[j], allowed[j], counter, "notice_tool_result_cut", notice_args={"where": where}
                    )
                    if cut is None:
                        cut = with_text(out[j], "[Tool result omitted: no budget left for it.]")
                    out[j] = cut
                    notes.append(
                        f"tool result {out[j].get('tool_call_id')} cut from {sizes[j]} to {counter.count_message(cut)} tokens"
                    )
        i += 1
    return out, notes


def fit_messages(
    messages: Sequence[Message],
    *,
    limit: int,
    counter: TokenCounter,
    tool_result_cap: int | None = None,
    tool_results_cap: int | None = None,
) -> FitResult:
    """Fit ``messages`` into ``limit`` tokens (framing and reply priming included).

    Args:
        limit: tokens the whole list may take.
        tool_result_cap: tokens one tool result may take (``None``: no cap).
        tool_results_cap: tokens all tool results of one assistant message may take.

    Returns:
        A :class:`FitResult`; its ``messages`` is ``messages`` itself when nothing had to change.

    Raises:
        ConfigurationError: the leading system messages alone exceed ``limit``.
    """
    original = messages if isinstance(messages, list) else list(messages)
    capped, notes = _cap_tool_results(list(original), counter, tool_result_cap, tool_results_cap)
    costs = [counter.count_message(m) for m in capped]
    total = sum(costs) + REPLY_PRIMING
    if total <= limit and not notes:
        return FitResult(messages=original, kept=list(range(len(original))), tokens=total)

    head = 0
    while head < len(capped) and capped[head].get("role") == "system":
        head += 1
    body_units = [[head + i for i in u] for u in units(capped[head:])]
    used = sum(costs[:head]) + REPLY_PRIMING
    if used > limit:
        raise ConfigurationError(
            f"The system messages alone take {used} tokens (reply priming included); the limit is {limit}. "
            "Shorten the system prompt or raise the window."
        )
    # keep units from the newest end while they fit
    kept_units: list[list[int]] = []
    for unit in reversed(body_units):
        cost = sum(costs[i] for i in unit)
        if used + cost > limit:
            break
        kept_units.append(unit)
        used += cost
    kept_units.reverse()
    # the first message after the system messages must be a user message
    while kept_units and capped[kept_units[0][0]].get("role") != "user":
        used -= sum(costs[i] for i in kept_units.pop(0))
    kept = [i for u in kept_units for i in u]
    result = [capped[i] for i in range(head)] + [capped[i] for i in kept]

    if not kept and body_units:
        # not even the newest unit fits: keep its user message, cut to fit
        last_user = next((i for i in reversed(range(head, len(capped))) if capped[i].get("role") == "user"), None)
        if last_user is not None:
            room = limit - used
            cut = cut_text_to(capped[last_user], room, counter, "notice_turn_cut", notice_args={})
            if cut is not None:
                result.append(cut)
                kept = [last_user]
                used += counter.count_message(cut)
                notes.append(f"the newest user message was cut to {counter.count_message(cut)} tokens")
    dropped = len(capped) - head - len(kept)
    if dropped:
        notes.insert(0, f"{dropped} earlier messages not shown")
        first = head
        if (
            first < len(result)
            and result[first].get("role") == "user"
            and isinstance(result[first].get("content"), str)
        ):
            notice = render("notice_messages_dropped", count=dropped)
            with_notice = with_text(result[first], notice + "\n" + result[first]["content"])
            extra = counter.count_message(with_notice) - counter.count_message(result[first])
            if used + extra <= limit:
                result[first] = with_notice
                used += extra
    return FitResult(messages=result, kept=list(range(head)) + kept, dropped=dropped, cut=notes, tokens=used)

"""The user's pinned profile in the prompt, and what a summary teaches it.

The profile block (``prompts/profile_block.txt``) opens the ``memory`` source: name,
pronouns, user-set facts, then learned facts. If it alone exceeds the memory cap,
learned facts leave first (oldest first), then user-set facts (last first), and a
notice (``prompts/notice_profile_cut.txt``) counts them; name and pronouns stay.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from prompts import fence, render
from runtime.accounting import TokenCounter
from runtime.context._values import PinnedProfile
from runtime.summary_items import SummaryItem, SummaryNote


@dataclass(frozen=True, kw_only=True)
class ProfileBlock:
    text: str
    """The rendered block; empty when there is nothing to show or it cannot fit."""
    tokens: int
    items: int
    """Lines shown (name, pronouns and facts)."""
    cut: str | None = None


def summary_profile_facts(items: Sequence[SummaryItem]) -> list[str]:
    """The texts of a summary's profile notes (model summarizer, ``section == "profile"``), in order.

    The extractive summarizer writes no profile section, so it teaches nothing.
    """
    return [i.text for i in items if isinstance(i, SummaryNote) and i.section == "profile" and i.text]


def render_profile(profile: PinnedProfile | None, *, cap: int, counter: TokenCounter) -> ProfileBlock:
    """The profile block within ``cap`` tokens (see the module docstring for what is cut first)."""
    if profile is None:
        return ProfileBlock(text="", tokens=0, items=0)
    head = []
    if profile.name:
        head.append(render("profile_line_name", value=fence(profile.name)))
    if profile.pronouns:
        head.append(render("profile_line_pronouns", value=fence(profile.pronouns)))
    user_facts = list(profile.facts or [])
    learned = list(profile.learned or [])
    if not head and not user_facts and not learned:
        return ProfileBlock(text="", tokens=0, items=0)

    def build(user: list[str], known: list[str], dropped: int) -> str:
        lines = head + [render("profile_line_fact", text=fence(f)) for f in [*user, *known]]
        if dropped:
            lines.append(render("notice_profile_cut", count=dropped))
        return render("profile_block", body="\n".join(lines))

    dropped = 0
    text = build(user_facts, learned, 0)
    while counter.count_text(text) > cap and (learned or user_facts):
        if learned:
            learned.pop(0)
        else:
            user_facts.pop()
        dropped += 1
        text = build(user_facts, learned, dropped)
    tokens = counter.count_text(text)
    if tokens > cap:
        return ProfileBlock(text="", tokens=0, items=0, cut="profile omitted: larger than the memory cap")
    cut = f"{dropped} profile facts left out" if dropped else None
    return ProfileBlock(text=text, tokens=tokens, items=len(head) + len(user_facts) + len(learned), cut=cut)

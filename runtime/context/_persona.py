"""Rendering a persona into its prompt messages within the ``persona`` budget.

The persona system message is, in order: the card's system prompt (or the default
framing in ``prompts/persona_default_system.txt`` when the card has none), the
description, the personality and the scenario, which are never cut, then the example
dialogues, added whole and in order while they fit. Every example left out is counted
in one notice line (``prompts/notice_examples_cut.txt``). The post-history
instructions become a second system message placed after the recent turns; their
tokens count to ``persona`` too. Creator notes are never rendered.

Macros are replaced in every field (see ``persona/_macros.py``): ``{{char}}`` is the
card's nickname when it has one, ``{{original}}`` in the card's system prompt is the
default framing, and ``{{pick}}`` is stable within a session (:func:`macro_context`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from errors import ConfigurationError
from persona import MacroContext, Persona, expand, format_moment, humanize
from prompts import render
from runtime.accounting import TokenCounter
from runtime.messages import Message

DEFAULT_USER_NAME = "User"
"""What ``{{user}}`` becomes when the user's pinned profile has no name."""


def macro_context(
    persona: Persona,
    *,
    user_name: str = DEFAULT_USER_NAME,
    session_id: str = "",
    now: datetime | None = None,
    idle: timedelta | None = None,
    clock_note: bool = False,
) -> MacroContext:
    """What ``persona``'s macros resolve to for ``user_name`` in session ``session_id``; the clock
    macros to ``now`` (the turn's time on the user's clock) and ``idle``, or with ``clock_note``
    to a pointer to the clock note (:func:`clock_note`)."""
    examples = "".join(f"<START>\n{e}\n" for e in persona.example_dialogues).rstrip("\n")
    return MacroContext(
        char=persona.char_name,
        user=user_name,
        session=session_id,
        original=render("persona_default_system", char=persona.char_name, user=user_name),
        fields={
            "description": persona.description,
            "personality": persona.personality,
            "scenario": persona.scenario,
            "charprompt": persona.system_prompt,
            "charinstruction": persona.post_history_instructions,
            "charcreatornotes": persona.creator_notes,
            "charversion": persona.character_version,
            "mesexamples": examples,
            "mesexamplesraw": examples,
        },
        greetings=persona.greetings,
        now=now,
        idle=idle,
        clock_note=clock_note,
    )


def clock_note(now: datetime, idle: timedelta | None, *, user_name: str) -> str:
    """The short clock note that carries the clock macros' values for text that must stay the same
    from turn to turn (the persona): the time, weekday and date on the user's clock, and how long
    since their message before this one."""
    return render(
        "clock_note",
        user=user_name,
        time=format_moment(now, "h:mm A"),
        weekday=format_moment(now, "dddd"),
        date=format_moment(now, "MMMM D, YYYY"),
        isodate=format_moment(now, "YYYY-MM-DD"),
        isotime=format_moment(now, "HH:mm"),
        offset=format_moment(now, "Z"),
        idle=f" Their last message was {humanize(idle)} ago." if idle is not None else "",
    )


@dataclass(frozen=True, kw_only=True)
class RenderedPersona:
    """A persona's prompt messages and their accounting."""

    system: Message
    """The persona system message (first in every context)."""
    post_history: Message | None
    """The post-history instructions as a system message for after the recent turns, if any."""
    tokens: int
    """Tokens of both messages (framing included), by the counter given."""
    raw_tokens: int
    """The same, uncalibrated: what is checked against the cap."""
    examples_total: int
    examples_kept: int
    parts: dict[str, int] = field(default_factory=dict)
    """Tokens of each part's text alone (system_prompt, description, personality, scenario,
    examples, post_history_instructions), for ``companion persona show``."""

    @property
    def cut(self) -> str | None:
        """The cut as reported (``None`` when every example is in)."""
        left = self.examples_total - self.examples_kept
        return f"{left} example dialogues left out" if left else None


def render_persona(
    persona: Persona,
    *,
    cap: int,
    counter: TokenCounter,
    user_name: str = DEFAULT_USER_NAME,
    calibration: float = 1.0,
    session_id: str = "",
    now: datetime | None = None,
    idle: timedelta | None = None,
) -> RenderedPersona:
    """Render ``persona`` within ``cap`` tokens.

    Args:
        cap: the persona budget, tokens; checked on the uncalibrated count (``tokens /
            calibration``), so that calibration never turns a valid persona into an error.
        counter: the session's (possibly calibrated) counter.
        user_name: what ``{{user}}`` becomes.
        session_id: seeds ``{{pick}}`` (the same choice every turn of one session).

    Raises:
        ConfigurationError: the parts that are never cut (system prompt, description,
            personality, scenario, post-history instructions) alone exceed ``cap``.
    """

    # clock macros point to the clock note, which goes with the post-history message after the
    # recent turns: the persona's own text stays the same from turn to turn (a cacheable prefix)
    ctx = macro_context(persona, user_name=user_name, session_id=session_id, now=now, idle=idle, clock_note=True)

    def macro(text: str, field: str) -> str:
        return expand(text, ctx, field=field)

    def raw(tokens: int) -> int:
        return math.ceil(tokens / calibration)

    system_prompt = macro(persona.system_prompt, "system_prompt").strip() or ctx.original
    fixed = [system_prompt]
    parts = {"system_prompt": counter.count_text(system_prompt)}
    for name, text in (
        ("description", persona.description),
        ("personality", persona.personality),
        ("scenario", persona.scenario),
    ):
        text = macro(text, name).strip() if text else ""
        if text:
            block = render(f"persona_{name}", char=persona.char_name, text=text)
            fixed.append(block)
            parts[name] = counter.count_text(block)
    post_text = macro(persona.post_history_instructions, "post_history_instructions").strip()
    examples = [m for i, e in enumerate(persona.example_dialogues) if (m := macro(e, f"mes_example[{i}]")).strip()]
    if ctx.clock_used and now is not None:
        note = clock_note(now, idle, user_name=user_name)
        post_text = f"{note}\n\n{post_text}" if post_text else note
    post = Message(role="system", content=post_text) if post_text else None
    post_tokens = counter.count_message(post) if post else 0
    if post:
        parts["post_history_instructions"] = post_tokens

    def system_with(examples: list[str], dropped: int) -> Message:
        blocks = list(fixed)
        if examples:
            body = "\n".join(render("persona_example", text=e) for e in examples)
            blocks.append(render("persona_examples", char=persona.char_name, body=body))
        if dropped:
            blocks.append(render("notice_examples_cut", count=dropped))
        return Message(role="system", content="\n\n".join(blocks))

    base = counter.count_message(system_with([], 0)) + post_tokens
    if raw(base) > cap:
        raise ConfigurationError(
            f"The persona {persona.name!r} is {raw(base)} tokens without its example dialogues "
            f"(system prompt, description, personality, scenario and post-history instructions are never cut); "
            f"its budget is {cap}. Shorten the card or raise COMPANION_BUDGET_PERSONA.",
            setting="COMPANION_BUDGET_PERSONA",
        )
    kept: list[str] = []
    for example in examples:
        trial = system_with([*kept, example], len(examples) - len(kept) - 1)
        if raw(counter.count_message(trial) + post_tokens) > cap:
            break  # in order: a later example never jumps ahead of one that did not fit
        kept.append(example)
    message = system_with(kept, len(examples) - len(kept))
    tokens = counter.count_message(message)
    if raw(tokens + post_tokens) > cap:  # the notice alone did not fit beside the examples kept
        kept = []
        message = system_with([], len(examples))
        tokens = counter.count_message(message)
        if raw(tokens + post_tokens) > cap:
            message, tokens = system_with([], 0), counter.count_message(system_with([], 0))
    if kept:
        parts["examples"] = counter.count_text("\n".join(kept))
    return RenderedPersona(
        system=message,
        post_history=post,
        tokens=tokens + post_tokens,
        raw_tokens=raw(tokens + post_tokens),
        examples_total=len(examples),
        examples_kept=len(kept),
        parts=parts,
    )

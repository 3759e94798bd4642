"""``companion persona`` and ``companion profile``: persona files and pinned profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli._common import _id_arg, _settings


# -- personas, knowledge base, pinned profiles ----------------------------------
def cmd_persona_show(args: argparse.Namespace) -> int:
    """Print the persona as the model sees it, with tokens per part and the budget."""
    from persona import load_persona
    from runtime.accounting import counter_for
    from runtime.context import render_persona

    settings = _settings()
    persona = load_persona(Path(args.file))
    budgets = settings.scaled_budgets
    rendered = render_persona(persona, cap=budgets.persona, counter=counter_for(settings.model), user_name=args.user)
    print(rendered.system["content"])
    if rendered.post_history:
        print("\n[after the recent turns]\n" + rendered.post_history["content"])
    print(f"\n{persona.name} ({persona.source}): {rendered.tokens} of {budgets.persona} persona tokens")
    for part, tokens in rendered.parts.items():
        print(f"  {part}: {tokens}")
    print(f"  example dialogues: {rendered.examples_kept} of {rendered.examples_total} shown")
    book = persona.character_book
    print(
        f"  lorebook entries: {len(book.entries) if book else 0}; first message: {'yes' if persona.first_message else 'no'}"
    )
    return 0


def cmd_lorebook_import(args: argparse.Namespace) -> int:
    """Read a SillyTavern World Info file, check it as a card's lorebook is checked, and write it as
    the ``character_book`` object of a V2/V3 card (to put under a card's ``data``)."""
    import json

    from persona import load_world_info

    _settings()
    book, raw = load_world_info(args.file)
    text = json.dumps(raw, ensure_ascii=False, indent=1)
    if args.out is not None:
        args.out.write_text(text + "\n", encoding="utf-8")
    else:
        print(text)
    constant = sum(1 for e in book.entries if e.constant)
    keys = sum(len(e.keys) for e in book.entries)
    print(f"{len(book.entries)} entries ({constant} constant), {keys} keys", file=sys.stderr)
    return 0


def _profiles():
    settings = _settings(database=True)

    from memory.profiles import Profiles
    from runtime.service import connect

    return Profiles(connect(settings).engine)


def _print_profile(user: str, profile) -> None:
    if profile is None:
        print(f"{user}: no profile")
        return
    print(
        f"{user}: name {profile.name or '-'}; pronouns {profile.pronouns or '-'}; time zone {profile.time_zone or '-'}"
    )
    for fact in profile.facts:
        print(f"  fact: {fact}")


def _print_learned(profiles, user: str) -> None:
    for fact in profiles.learned(user):
        print(f"  learned: {fact}")


def cmd_profile_show(args: argparse.Namespace) -> int:
    profiles = _profiles()
    _print_profile(args.user, profiles.get(args.user))
    _print_learned(profiles, args.user)
    return 0


def cmd_profile_set(args: argparse.Namespace) -> int:
    profiles = _profiles()
    facts = None
    if args.clear_facts or args.fact:
        before = profiles.get(args.user)
        facts = ([] if args.clear_facts or before is None else list(before.facts)) + list(args.fact or [])
    _print_profile(
        args.user,
        profiles.set(args.user, name=args.name, pronouns=args.pronouns, facts=facts, time_zone=args.time_zone),
    )
    _print_learned(profiles, args.user)
    return 0


def _add_persona_commands(sub) -> None:
    persona = sub.add_parser("persona", help="persona files")
    p_sub = persona.add_subparsers(dest="persona_command", required=True)
    show = p_sub.add_parser("show", help="print a persona as the model sees it, with tokens per part")
    show.add_argument("file", help="a card (.json, .png) or our .toml/.yaml file")
    show.add_argument("--user", default="User", help="what {{user}} becomes (default: User)")
    show.set_defaults(func=cmd_persona_show)
    lorebook = p_sub.add_parser("lorebook", help="lorebooks")
    lb_sub = lorebook.add_subparsers(dest="lorebook_command", required=True)
    imported = lb_sub.add_parser(
        "import", help="read a SillyTavern World Info JSON as a lorebook and write it as a card's character_book"
    )
    imported.add_argument("file", help="the World Info .json")
    imported.add_argument("--out", type=Path, help="write the character_book JSON here (default: standard output)")
    imported.set_defaults(func=cmd_lorebook_import)

    profile = sub.add_parser("profile", help="a user's pinned profile")
    pr_sub = profile.add_subparsers(dest="profile_command", required=True)
    pshow = pr_sub.add_parser("show", help="the user's name, pronouns, facts, and what each character learned")
    pshow.add_argument("user", type=_id_arg)
    pshow.set_defaults(func=cmd_profile_show)
    pset = pr_sub.add_parser("set", help="set name, pronouns or facts")
    pset.add_argument("user", type=_id_arg)
    pset.add_argument("--name", help="what the user wants to be called ('' clears)")
    pset.add_argument("--pronouns", help="e.g. she/her ('' clears)")
    pset.add_argument("--fact", action="append", help="add a fact (repeatable)")
    pset.add_argument("--clear-facts", action="store_true", help="remove the user-set facts first")
    pset.add_argument("--time-zone", help="the user's IANA time zone, e.g. Asia/Shanghai ('' clears)")
    pset.set_defaults(func=cmd_profile_set)

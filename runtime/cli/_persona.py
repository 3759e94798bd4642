"""``companion persona``, ``companion kb`` and ``companion profile``: personas, knowledge bases, pinned profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli._common import EXIT_USAGE, _id_arg, _settings


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


def _persona_name(value: str) -> str:
    """A persona name, or the name inside a persona file when ``value`` ends in a persona suffix."""
    from persona import SUFFIXES, load_persona

    path = Path(value).expanduser()
    if path.suffix.lower() in SUFFIXES:  # a persona file (a missing one is an error, not a name)
        return load_persona(path).name
    return value


def _kb_engine():
    from runtime.service import open_engine

    return open_engine(_settings(), with_model=False)


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


def cmd_kb_add(args: argparse.Namespace) -> int:
    from runtime.files import add_texts, read_documents

    persona = _persona_name(args.persona)
    # every file is read (and checked) once, before the database and the embedding model start
    texts = read_documents([Path(f).expanduser() for f in args.files])
    engine = _kb_engine()
    added = add_texts(
        engine.store.knowledge,
        persona=persona,
        texts=texts,
        embedder=engine.embedder,
        counter=engine.counter,
        max_tokens=engine.settings.knowledge_chunk_tokens,
    )
    for item in added:
        print(f"{persona}: {item.source}: {item.chunks} chunks, {item.tokens} tokens")
    return 0


def cmd_kb_list(args: argparse.Namespace) -> int:
    persona = _persona_name(args.persona)
    sources = _kb_engine().store.knowledge.list_sources(persona=persona)
    if not sources:
        print(f"{persona}: no knowledge files")
    for item in sources:
        print(
            f"{persona}: {item.source}: {item.chunks} chunks, {item.tokens} tokens, added {item.added_at:%Y-%m-%d %H:%M}"
        )
    return 0


def cmd_kb_remove(args: argparse.Namespace) -> int:
    persona = _persona_name(args.persona)
    deleted = _kb_engine().store.knowledge.remove_source(persona=persona, source=Path(args.file).name)
    if not deleted:
        print(f"error: {persona} has no knowledge file {Path(args.file).name!r}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{persona}: removed {Path(args.file).name} ({deleted} chunks)")
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
    for fact in profile.learned:
        print(f"  learned: {fact}")


def cmd_profile_show(args: argparse.Namespace) -> int:
    _print_profile(args.user, _profiles().get(args.user))
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

    kb = sub.add_parser("kb", help="a persona's knowledge base")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    add = kb_sub.add_parser("add", help="split text/Markdown files into chunks and embed them for the persona")
    add.add_argument("persona", type=_id_arg, help="the persona's name, or a persona file to take the name from")
    add.add_argument("files", nargs="+", help="plain text or Markdown files; adding a file again replaces it")
    add.set_defaults(func=cmd_kb_add)
    lst = kb_sub.add_parser("list", help="the persona's knowledge files")
    lst.add_argument("persona", type=_id_arg)
    lst.set_defaults(func=cmd_kb_list)
    rm = kb_sub.add_parser("remove", help="remove one file's chunks")
    rm.add_argument("persona", type=_id_arg)
    rm.add_argument("file")
    rm.set_defaults(func=cmd_kb_remove)

    profile = sub.add_parser("profile", help="a user's pinned profile")
    pr_sub = profile.add_subparsers(dest="profile_command", required=True)
    pshow = pr_sub.add_parser("show", help="the user's name, pronouns, facts and learned facts")
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

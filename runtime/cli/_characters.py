"""``companion characters`` and ``companion kb``: the deployment's characters and each character's knowledge base.

A ``CHARACTER`` argument is a character id (``ch_…``), the name of a deployment character, or a
card file (its name). ``kb add`` makes what it names if missing: a card file's character from the
card, a name's without a card (``characters add`` gives it one later, as a new revision). ``--app NAME`` works on an app's characters instead of the deployment's.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli._common import EXIT_USAGE, _id_arg, _settings


def _engine():
    from runtime.service import open_engine

    return open_engine(_settings(database=True), with_model=False)


def _app_id(engine, name: str | None) -> str | None:
    if name is None:
        return None
    from errors import NotFoundError

    for app in engine.store.apps.apps():
        if app.name == name:
            return app.id
    raise NotFoundError(f"No app named {name!r} (`companion apps list`).", kind="app", resource_id=name)


def resolve(engine, value: str, *, create: bool = False):
    """The character ``value`` names (see the module docstring).

    Raises:
        NotFoundError: no such character. PersonaError: a bad card file.
    """
    from errors import NotFoundError
    from memory.characters import OPERATOR
    from persona import SUFFIXES

    path = Path(value).expanduser()
    if path.suffix.lower() in SUFFIXES:  # a card file (a missing one is an error, not a name)
        card = engine.characters.read(_read(path), name=path.name)
        found = engine.store.characters.named(card.persona.name)
        if found is None and create:
            found, _ = engine.store.characters.ensure_deployment(name=card.persona.name, spec=card.kind, card=card.data)
        value = found.id if found is not None else card.persona.name
    if value.startswith("ch_"):
        return engine.store.characters.visible(value, OPERATOR)
    found = engine.store.characters.named(value)
    if found is None and create:  # a knowledge base first, its card later (`characters add` revises it)
        found = engine.store.characters.placeholder(value)
    if found is None:
        raise NotFoundError(
            f"No deployment character named {value!r}; add one with `companion characters add FILE`.",
            kind="character",
            resource_id=value,
        )
    return found


def _read(path: Path) -> bytes:
    from errors import PersonaError

    try:
        return path.read_bytes()
    except OSError as exc:
        raise PersonaError(f"Cannot read {path.name!r}: {exc.strerror or exc}.", path=path.name) from exc


def _line(row) -> str:
    from runtime.turn import scope_of

    return f"{row.id}  {row.name}  revision {row.revision}  ({scope_of(row)})"


def cmd_characters_add(args: argparse.Namespace) -> int:
    """Store a card as a new character (a deployment character of the same name gets a new revision)."""
    engine = _engine()
    path = Path(args.file).expanduser()
    card = engine.characters.read(_read(path), name=path.name)
    app_id = _app_id(engine, args.app)
    existing = engine.store.characters.named(card.persona.name) if app_id is None else None
    row = (
        engine.characters.revise(existing, card) if existing is not None else engine.characters.add(card, app_id=app_id)
    )
    print(_line(row))
    return 0


def cmd_characters_list(args: argparse.Namespace) -> int:
    from memory.characters import MAX_PAGE, Viewer

    engine = _engine()
    viewer = Viewer(app_id=_app_id(engine, args.app))
    after = None
    while True:
        page = engine.store.characters.page(viewer, name=args.name, limit=MAX_PAGE, after=after)
        for row in page:
            print(_line(row))
        if len(page) < MAX_PAGE:
            return 0
        after = page[-1].id


def cmd_characters_show(args: argparse.Namespace) -> int:
    engine = _engine()
    row = resolve(engine, args.character)
    persona = engine.cast.newest(row.id).persona
    print(_line(row))
    print(f"  sessions: {engine.store.characters.session_count(row.id)}")
    print(f"  greetings: {len([g for g in persona.greetings if g])}")
    print(f"  lorebook entries: {len(persona.character_book.entries) if persona.character_book else 0}")
    for number, at in engine.store.characters.revisions(row.id):
        print(f"  revision {number}: {at}")
    return 0


def cmd_characters_export(args: argparse.Namespace) -> int:
    engine = _engine()
    row = resolve(engine, args.character)
    out = engine.characters.export(row, args.format, revision=args.revision)
    Path(args.out).expanduser().write_bytes(out.body)
    print(f"{row.id}: wrote {args.out} ({out.media_type}, {len(out.body)} bytes)")
    return 0


def cmd_characters_remove(args: argparse.Namespace) -> int:
    engine = _engine()
    row = resolve(engine, args.character)
    deleted = engine.characters.remove(row, cascade=args.cascade)
    print(f"{row.id}: deleted" + (f", with {deleted} session(s)" if deleted else ""))
    return 0


def cmd_kb_add(args: argparse.Namespace) -> int:
    from runtime.files import add_texts, read_documents

    # every file is read (and checked) once, before the database and the embedding model start
    texts = read_documents([Path(f).expanduser() for f in args.files])
    engine = _engine()
    row = resolve(engine, args.character, create=True)
    added = add_texts(
        engine.store.knowledge,
        character_id=row.id,
        texts=texts,
        embedder=engine.embedder,
        counter=engine.counter,
        max_tokens=engine.settings.knowledge_chunk_tokens,
    )
    for item in added:
        print(f"{row.name}: {item.source}: {item.chunks} chunks, {item.tokens} tokens")
    return 0


def cmd_kb_list(args: argparse.Namespace) -> int:
    engine = _engine()
    row = resolve(engine, args.character)
    sources = engine.store.knowledge.list_sources(character_id=row.id)
    if not sources:
        print(f"{row.name}: no knowledge files")
    for item in sources:
        print(
            f"{row.name}: {item.source}: {item.chunks} chunks, {item.tokens} tokens, added {item.added_at:%Y-%m-%d %H:%M}"
        )
    return 0


def cmd_kb_remove(args: argparse.Namespace) -> int:
    engine = _engine()
    row = resolve(engine, args.character)
    deleted = engine.store.knowledge.remove_source(character_id=row.id, source=Path(args.file).name)
    if not deleted:
        print(f"error: {row.name} has no knowledge file {Path(args.file).name!r}", file=sys.stderr)
        return EXIT_USAGE
    print(f"{row.name}: removed {Path(args.file).name} ({deleted} chunks)")
    return 0


def add_character_commands(sub) -> None:
    characters = sub.add_parser("characters", help="the deployment's (or an app's) characters")
    c_sub = characters.add_subparsers(dest="characters_command", required=True)
    add = c_sub.add_parser("add", help="store a card (.json, .png, .toml, .yaml) as a character")
    add.add_argument("file")
    add.add_argument("--app", help="an app's character (by app name) instead of the deployment's")
    add.set_defaults(func=cmd_characters_add)
    lst = c_sub.add_parser("list", help="the characters, oldest first")
    lst.add_argument("--app", help="an app's characters (and the deployment's)")
    lst.add_argument("--name", help="only names containing this (any case)")
    lst.set_defaults(func=cmd_characters_list)
    show = c_sub.add_parser("show", help="a character's revisions, sessions and card parts")
    show.add_argument("character", help="an id, a deployment character's name, or a card file")
    show.set_defaults(func=cmd_characters_show)
    export = c_sub.add_parser("export", help="write a character's card as V2 or V3 JSON or a PNG")
    export.add_argument("character")
    export.add_argument("out", help="the file to write")
    export.add_argument("--format", choices=["v2", "v3", "png"], default="v3")
    export.add_argument("--revision", type=int, help="an earlier revision (default: the newest)")
    export.set_defaults(func=cmd_characters_export)
    remove = c_sub.add_parser("remove", help="delete a character (refused while it has sessions)")
    remove.add_argument("character")
    remove.add_argument("--cascade", action="store_true", help="delete its sessions with it")
    remove.set_defaults(func=cmd_characters_remove)

    kb = sub.add_parser("kb", help="a character's knowledge base")
    kb_sub = kb.add_subparsers(dest="kb_command", required=True)
    kadd = kb_sub.add_parser("add", help="split text/Markdown files into chunks and embed them for the character")
    kadd.add_argument("character", type=_id_arg, help="a character id, a deployment character's name, or a card file")
    kadd.add_argument("files", nargs="+", help="plain text or Markdown files; adding a file again replaces it")
    kadd.set_defaults(func=cmd_kb_add)
    klst = kb_sub.add_parser("list", help="the character's knowledge files")
    klst.add_argument("character", type=_id_arg)
    klst.set_defaults(func=cmd_kb_list)
    krm = kb_sub.add_parser("remove", help="remove one file's chunks")
    krm.add_argument("character", type=_id_arg)
    krm.add_argument("file")
    krm.set_defaults(func=cmd_kb_remove)

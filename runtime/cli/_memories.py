"""``companion memories`` and ``companion users``: what a character remembers of a user, and a
user's data exported or erased (docs/privacy.md). USER is the runtime's user id (the id the
command line and replays use; an app's user is ``u_…``, as ``GET /v1/users/{id}/export`` shows)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from runtime.cli._common import _id_arg, _settings


def _engine():
    from runtime.service import open_engine

    return open_engine(_settings(database=True), with_model=False)


def _character(engine, value: str | None) -> str | None:
    if value is None:
        return None
    from runtime.cli._characters import resolve

    return resolve(engine, value).id


def cmd_memories_list(args: argparse.Namespace) -> int:
    engine = _engine()
    character = _character(engine, args.character)
    for memory in engine.memories.page(args.user, character_id=character, limit=args.limit):
        print(f"{memory.id}  {memory.date:%Y-%m-%d}  {memory.session_id}  {memory.content[:160]!r}")
    for fact in engine.memories.learned(args.user, character_id=character):
        print(f"learned: {fact}")
    return 0


def cmd_memories_search(args: argparse.Namespace) -> int:
    engine = _engine()
    character = _character(engine, args.character)
    for memory in engine.memories.search(args.user, args.query, character_id=character, limit=args.limit):
        print(f"{memory.id}  {memory.score or 0:.4f}  {memory.date:%Y-%m-%d}  {memory.content[:160]!r}")
    return 0


def cmd_memories_forget(args: argparse.Namespace) -> int:
    counts = _engine().memories.forget(args.user, args.memory)
    print(f"{args.memory}: forgotten ({', '.join(f'{k} {v}' for k, v in counts.items())})")
    return 0


def cmd_users_export(args: argparse.Namespace) -> int:
    exported = _engine().users.export(args.user)
    Path(args.out).expanduser().write_text(json.dumps(exported, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    turns = sum(len(s["turns"]) for s in exported["sessions"])
    print(
        f"{args.user}: {len(exported['sessions'])} sessions, {turns} turns, {len(exported['files'])} files -> {args.out}"
    )
    return 0


def cmd_users_erase(args: argparse.Namespace) -> int:
    erased = _engine().users.erase(args.user)
    if not erased.counts:
        print(f"{args.user}: no such user (nothing to erase)")
        return 0
    print(f"{args.user}: erased ({', '.join(f'{k} {v}' for k, v in sorted(erased.counts.items()) if v)})")
    if not erased.finished:
        print("a queue job of the user was still running: run the command again to finish")
        return 1
    return 0


def add_memory_commands(sub) -> None:
    memories = sub.add_parser("memories", help="what a character remembers of a user")
    m_sub = memories.add_subparsers(dest="memories_command", required=True)
    lst = m_sub.add_parser("list", help="the user's memories, newest first, and the learned facts")
    lst.add_argument("user", type=_id_arg)
    lst.add_argument("--character", help="only this character's (an id, or a deployment character's name)")
    lst.add_argument("--limit", type=int, default=50)
    lst.set_defaults(func=cmd_memories_list)
    search = m_sub.add_parser("search", help="the user's memories recall finds for a query")
    search.add_argument("user", type=_id_arg)
    search.add_argument("query")
    search.add_argument("--character")
    search.add_argument("--limit", type=int, default=20)
    search.set_defaults(func=cmd_memories_search)
    forget = m_sub.add_parser("forget", help="forget one memory (seg_N): out of recall and every summary")
    forget.add_argument("user", type=_id_arg)
    forget.add_argument("memory")
    forget.set_defaults(func=cmd_memories_forget)

    users = sub.add_parser("users", help="a user's data as a whole")
    u_sub = users.add_subparsers(dest="users_command", required=True)
    export = u_sub.add_parser("export", help="everything stored about the user, as JSON")
    export.add_argument("user", type=_id_arg)
    export.add_argument("out", help="the JSON file to write")
    export.set_defaults(func=cmd_users_export)
    erase = u_sub.add_parser("erase", help="erase every row, vector, blob and job of the user (safe to run again)")
    erase.add_argument("user", type=_id_arg)
    erase.set_defaults(func=cmd_users_erase)

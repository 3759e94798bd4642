"""The ``companion`` command line.

::

    companion replay PATH [--conversation ID] [--window TOKENS] [--report FILE] [--plot FILE.png|FILE.html]
    companion inspect SESSION
    companion chat --user USER --session SESSION [--persona FILE]
    companion db upgrade | db reembed [--batch N]
    companion breaker show SESSION
    companion breaker reset SESSION
    companion files add USER PATH... [--ephemeral --session SESSION] [--no-wait]
    companion files list USER
    companion files show ID
    companion files read ID [--start-page N] [--max-pages N] [--focus WORD]
    companion files delete ID
    companion files export ID PATH
    companion files edit ID PATH
    companion session delete SESSION --user USER

    companion persona show FILE [--user NAME]
    companion characters add FILE [--app NAME] | list [--app NAME] [--name TEXT] | show CHARACTER
    companion characters export CHARACTER OUT [--format v2|v3|png] | remove CHARACTER [--cascade]
    companion kb add CHARACTER FILE... | kb list CHARACTER | kb remove CHARACTER FILE
    companion memories list USER [--character C] | search USER QUERY | forget USER MEMORY
    companion users export USER OUT.json | users erase USER
    companion profile show USER | profile set USER [--name N] [--pronouns P] [--fact F ...] [--clear-facts]
    companion serve [--host H] [--port P]
    companion apps create NAME | companion apps list
    companion jobs run | companion jobs close-idle --once [--idle-hours H] [--worker ID]

In ``companion chat``, ``/attach PATH_OR_ID ...`` attaches files to the next message.

Errors of the runtime print one line to stderr and exit with status 2, or 69 (sysexits.h's
``EX_UNAVAILABLE``) when a dependency failed: the database, the model provider, the summarizer.
"""

from __future__ import annotations

import argparse
import atexit
import functools
import gc
import os
import sys

from errors import CompanionError
from runtime.cli._admin import (
    cmd_breaker_reset,
    cmd_breaker_show,
    cmd_db_reembed,
    cmd_db_upgrade,
    cmd_session_delete,
)
from runtime.cli._characters import add_character_commands
from runtime.cli._chat import cmd_chat, cmd_inspect
from runtime.cli._common import EXIT_INTERRUPTED, _id_arg, exit_status
from runtime.cli._files import _add_files_parser
from runtime.cli._memories import add_memory_commands
from runtime.cli._persona import _add_persona_commands
from runtime.cli._replay import cmd_replay
from runtime.cli._service import _add_service_commands


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="companion", description="companion-runtime: long-running companion chat.")
    sub = parser.add_subparsers(dest="command", required=True)

    replay = sub.add_parser("replay", help="replay a stored conversation (LoCoMo .json or .jsonl) through the engine")
    replay.add_argument("path", help="a LoCoMo JSON file or a JSONL file of {role, content, timestamp}")
    replay.add_argument("--conversation", help="LoCoMo sample_id to replay (default: all)")
    replay.add_argument("--window", type=int, help="the model's context window in tokens; every budget scales to it")
    replay.add_argument("--report", help="write the figures as JSON to this file")
    replay.add_argument(
        "--plot",
        help="draw the replay per turn (context by source, compactions, archive, recall) to a .png or .html file",
    )
    replay.set_defaults(func=cmd_replay)

    inspect = sub.add_parser("inspect", help="show a session's assembled context by source")
    inspect.add_argument("session", type=_id_arg)
    inspect.add_argument(
        "--window", type=int, help="the context window the session runs with (e.g. a replay's --window)"
    )
    inspect.set_defaults(func=cmd_inspect)

    chat = sub.add_parser("chat", help="a terminal chat that streams the replies (/context, /quit)")
    chat.add_argument("--user", required=True, type=_id_arg, help="the user id")
    chat.add_argument("--session", required=True, type=_id_arg, help="the session id (new or existing)")
    chat.add_argument(
        "--persona",
        help="a persona file: card .json/.png, .toml, .yaml (default: COMPANION_PERSONA or the bundled one)",
    )
    chat.add_argument(
        "--greeting",
        type=int,
        default=0,
        help="which greeting opens a new session: 0 the card's first message (default), N its N-th alternate greeting",
    )
    chat.set_defaults(func=cmd_chat)

    db = sub.add_parser("db", help="database commands")
    db_sub = db.add_subparsers(dest="db_command", required=True)
    up = db_sub.add_parser("upgrade", help="apply the migrations")
    up.add_argument(
        "--embedding-dim", type=int, help="vector(N) for a new archive table (default: the embedding model's)"
    )
    up.set_defaults(func=cmd_db_upgrade)
    reembed = db_sub.add_parser(
        "reembed",
        help="re-embed every stored vector (turns, archive keys, knowledge) with COMPANION_EMBEDDING_MODEL "
        "and record it; one transaction (stop the service first)",
    )
    reembed.add_argument("--batch", type=int, default=256, help="texts embedded per step (default 256)")
    reembed.set_defaults(func=cmd_db_reembed)

    breaker = sub.add_parser("breaker", help="compaction circuit breaker")
    b_sub = breaker.add_subparsers(dest="breaker_command", required=True)
    show = b_sub.add_parser("show", help="a session's breaker state and the reasons of its current failures")
    show.add_argument("session", type=_id_arg)
    show.set_defaults(func=cmd_breaker_show)
    reset = b_sub.add_parser("reset", help="close a session's breaker")
    reset.add_argument("session", type=_id_arg)
    reset.set_defaults(func=cmd_breaker_reset)
    _add_files_parser(sub)
    session = sub.add_parser("session", help="session commands")
    s_sub = session.add_subparsers(dest="session_command", required=True)
    s_delete = s_sub.add_parser("delete", help="delete a session and the files no other session references")
    s_delete.add_argument("session", type=_id_arg)
    s_delete.add_argument("--user", required=True, type=_id_arg, help="the session's owner (checked)")
    s_delete.set_defaults(func=cmd_session_delete)
    _add_persona_commands(sub)
    add_character_commands(sub)
    add_memory_commands(sub)
    _add_service_commands(sub)
    return parser


@functools.cache
def _skip_final_collection() -> None:
    """At this process's exit (an ``atexit`` hook; the others, the embedded server's stop among
    them, still run), move every object into the collector's permanent generation
    (:func:`gc.freeze`): the interpreter's last full collection then skips them, and the
    operating system frees the memory (``docs/decisions/measurements.md#the-last-collection-at-exit``).
    Python does not promise to run ``__del__`` for objects
    still alive at exit; the standard streams are flushed as before. Registered once per process."""
    atexit.register(gc.freeze)


def main(argv: list[str] | None = None) -> int:
    _skip_final_collection()
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except CompanionError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exit_status(exc)
    except KeyboardInterrupt:  # Ctrl-C: one line, the shell's status for SIGINT, no traceback
        print("interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`companion files read ID | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # the Python docs' recipe for SIGPIPE
        return 1

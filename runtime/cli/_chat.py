"""``companion chat`` and ``companion inspect``: a terminal chat, and a session's context by source."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli._common import EXIT_USAGE, _check_window, _settings, exit_status


def context_table(context):
    """The assembled context by source (tokens, cap, items, what was cut): one rich table,
    printed by ``companion inspect`` and by ``/context`` in ``companion chat``. Its caption says
    how many of the segments recall selected the prompt does not show (the cache layout's kept
    block stayed: :attr:`~runtime.context.AssembledContext.recall_withheld`), when any."""
    from rich.table import Table

    title = f"context of {context.session_id} ({context.total_tokens} + {context.reply_reserve} reserved of {context.window} tokens)"
    caption = (
        "tokens include each source's share of message framing; the caps of memory and recent "
        "include what the other sources left unused"
    )
    if context.recall_withheld:
        withheld = context.recall_withheld
        caption += (
            f"; memory does not show {len(withheld)} of the {len(withheld) + len(context.recalled)} segments "
            f"recall selected ({sum(s.tokens for s in withheld)} stored tokens): the kept recall block stayed "
            "(COMPANION_LAYOUT=classic shows them all)"
        )
    table = Table(title=title, min_width=len(title), caption=caption)
    for col in ("source", "tokens", "cap", "items", "cut"):
        table.add_column(col)
    for report in context.sources.values():
        table.add_row(report.source, str(report.tokens), str(report.cap), str(report.items), report.cut or "")
    return table


def cmd_inspect(args: argparse.Namespace) -> int:
    _check_window(args.window)
    settings = _settings(database=True)

    from rich.console import Console

    from runtime.service import open_engine

    engine = open_engine(settings)
    if args.window is not None:
        engine = engine.derive(window=args.window)
    session = engine.store.sessions.get(args.session)
    if session is None:
        print(f"error: no session {args.session!r}", file=sys.stderr)
        return EXIT_USAGE
    Console().print(context_table(engine.assemble(user_id=session.user_id, session_id=session.id)))
    _, usage = engine.store.turns.window(session.id, usage_limit=1, user_id=session.user_id)
    if usage:
        last = usage[0]
        cost = f", ${last.usage_cost_usd:.6f}" if last.usage_cost_usd is not None else ""
        if last.usage_retrieval_cost_usd is not None:
            cost += f", embeddings and rerank ${last.usage_retrieval_cost_usd:.6f}"
        print(
            f"last reply (turn {last.seq}): prompt {last.usage_prompt_tokens} tokens, "
            f"cached {last.usage_cached_tokens if last.usage_cached_tokens is not None else '-'}, "
            f"cache written {last.usage_cache_write_tokens if last.usage_cache_write_tokens is not None else '-'}"
            f"{cost}"
        )
    return 0


class _Speaker:
    """Writes a streamed reply to stdout, behind ``NAME> `` printed with its first piece (so
    that anything logged while the context is prepared comes before it)."""

    def __init__(self, name: str) -> None:
        self.prefix = f"{name}> "
        self.started = False

    def __call__(self, piece: str) -> None:
        if not self.started:
            sys.stdout.write(self.prefix)
            self.started = True
        sys.stdout.write(piece)
        sys.stdout.flush()


def cmd_chat(args: argparse.Namespace) -> int:
    """A terminal chat: each line is a user turn; the reply streams back. ``/context`` prints
    the assembled context by source, ``/attach PATH_OR_ID ...`` attaches files (a path is
    stored first) to the next line, ``/quit`` or end of input (Ctrl-D) ends it."""
    from rich.console import Console

    settings = _settings(database=True)

    from errors import DependencyError, FileError, InvalidMessageError, ModelAuthError
    from persona import load_persona
    from runtime._offline import load_litellm
    from runtime.service import open_engine

    litellm = load_litellm()
    litellm.suppress_debug_info = True  # its "Give Feedback" banners would land in the conversation on stdout
    persona = load_persona(Path(args.persona)) if args.persona else None
    engine = open_engine(settings, persona=persona)
    existing = engine.store.sessions.get(args.session)
    if existing is not None and existing.user_id != args.user:
        print(
            f"error: session {args.session!r} belongs to user {existing.user_id!r}, not {args.user!r}", file=sys.stderr
        )
        return EXIT_USAGE
    console = Console(width=max(Console().width, 100))
    echo = not sys.stdin.isatty()  # piped input: show each line after its prompt, as a terminal would
    name = engine.persona.name
    print(
        f"companion chat: session {args.session} (user {args.user}) with {name} on {engine.settings.model}, "
        f"window {engine.window} tokens. /context shows the context; /attach PATH_OR_ID attaches files to "
        "your next line; /quit or Ctrl-D ends.",
        flush=True,
    )
    attach: list[str] = []  # file ids for the next line
    if existing is None:  # a new session opens with the character's first message, if it has one
        greeting = engine.greet(user_id=args.user, session_id=args.session, greeting=args.greeting)
        if greeting is not None:
            print(f"{name}> {greeting.content}", flush=True)
    while True:
        try:
            line = input("you> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        if echo:
            print(line, flush=True)
        command = line.strip()
        if not command:
            continue
        if command == "/quit":
            return 0
        if command == "/context":
            console.print(context_table(engine.assemble(user_id=args.user, session_id=args.session)))
            continue
        if command.startswith("/attach"):
            try:
                attach.extend(_attach(engine, args.user, command.split()[1:]))
            except FileError as exc:
                print(f"error: {exc}", file=sys.stderr, flush=True)
            print(f"[attached to your next message: {', '.join(attach) or 'nothing'}]", flush=True)
            continue
        if command.startswith("/") and " " not in command:
            print("commands: /context (the assembled context by source), /attach PATH_OR_ID ..., /quit")
            continue
        speaker = _Speaker(name)
        try:
            result = engine.turn(
                user_id=args.user, session_id=args.session, message=line, on_delta=speaker, attachments=attach
            )
            attach = []
        except FileError as exc:  # an attachment is not the user's; nothing was stored
            print(f"error: {exc}", file=sys.stderr, flush=True)
            attach = []
            continue
        except ModelAuthError as exc:  # no later line can fix a refused key
            print("", end="\n" if speaker.started else "", flush=True)
            print(f"error: {exc}", file=sys.stderr)
            return exit_status(exc)
        except (DependencyError, InvalidMessageError) as exc:  # the user turn, if valid, is stored; carry on
            print("", end="\n" if speaker.started else "", flush=True)
            print(f"error: {exc}", file=sys.stderr, flush=True)
            continue
        if not speaker.started:  # an empty reply
            sys.stdout.write(speaker.prefix)
        print()
        if result.assistant_turn.interrupted:
            print("[the reply broke off; what arrived is stored, marked interrupted]")
        for outcome in result.compactions:
            if outcome.ok and outcome.summarized:
                print(
                    f"[compacted: {outcome.rolled_turns} turns rolled out into the summary "
                    f"({outcome.summary_tokens} tokens) and {outcome.segments} archived segments]"
                )
            elif outcome.ok:
                print(
                    f"[compacted, breaker open: {outcome.rolled_turns} turns archived in {outcome.segments} segments]"
                )
            else:
                print(f"[compaction failed: {outcome.error}]")
        sys.stdout.flush()


def _attach(engine, user_id: str, targets: list[str]) -> list[str]:
    """File ids for ``/attach``: an existing path is stored (and its parse started), anything else is an id."""
    ids = []
    for target in targets:
        path = Path(target).expanduser()
        if path.is_file():
            ids.append(engine.file_services.upload(user_id=user_id, name=path.name, data=path.read_bytes()).id)
        else:
            ids.append(target)
    return ids

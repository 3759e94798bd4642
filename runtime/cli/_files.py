"""``companion files``: stored files (add, list, show, read, delete, export, edit, import-blobs)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from runtime.cli._common import EXIT_USAGE, _id_arg, _settings

# -- files ----------------------------------------------------------------------
FILES_ADD_WAIT_SECONDS = 600.0


def _file_services(settings=None):
    """The file services on the configured database (migrated first when embedded)."""
    from memory.database import current_revision, head_revision, require_schema, upgrade
    from runtime.files import open_file_services
    from runtime.service import connect

    settings = settings or _settings()
    database = connect(settings)
    if database.embedded and current_revision(database.engine) != head_revision():
        from memory.embeddings import SentenceTransformerEmbedder

        upgrade(database.engine, embedding_dim=SentenceTransformerEmbedder(settings.embedding_model).dimension)
    require_schema(database.engine)
    return open_file_services(settings, database.engine)


def _file_line(stored) -> str:
    pages = f"{stored.page_count} page(s)" if stored.page_count is not None else "pages unknown"
    body = f", body from page {stored.body_start_page}" if stored.body_start_page else ""
    scope = stored.durability + (f" (session {stored.session_id})" if stored.session_id else "")
    return (
        f"{stored.id}  {stored.name}  {stored.mime}  {stored.size_bytes:,} bytes  {scope}  "
        f"{stored.parse_state}, {pages}{body}"
    )


def cmd_files_add(args: argparse.Namespace) -> int:
    if args.ephemeral != (args.session is not None):
        print(
            "error: --ephemeral and --session go together: an ephemeral file is valid in one session.", file=sys.stderr
        )
        return EXIT_USAGE
    paths = [Path(p).expanduser() for p in args.paths]
    for path in paths:  # check every path before storing anything
        if not path.is_file():
            print(f"error: {str(path)!r} is not a readable file.", file=sys.stderr)
            return EXIT_USAGE
    services = _file_services()
    status = 0
    try:
        store = services.files.add if args.no_wait else services.upload  # --no-wait: parsed on first read
        contents = [(path, path.read_bytes()) for path in paths]
        for path, data in contents:  # every file's name and size are checked before any is stored
            services.files.check(name=path.name, data=data)
        stored = [
            store(
                user_id=args.user,
                name=path.name,
                data=data,
                durability="ephemeral" if args.ephemeral else "durable",
                session_id=args.session,
            )
            for path, data in contents
        ]
        for item in stored:
            if not args.no_wait:
                services.parses.wait(item.id, FILES_ADD_WAIT_SECONDS)
            item = services.files.get(item.id, user_id=args.user, with_extract=False)
            print(_file_line(item))
            if item.parse_state == "failed":
                print(f"  parse error: {item.parse_error}")
                status = 1
    finally:
        services.close()
    return status


def cmd_files_list(args: argparse.Namespace) -> int:
    services = _file_services()
    for item in services.files.list(user_id=args.user):
        print(_file_line(item))
    return 0


def cmd_files_show(args: argparse.Namespace) -> int:
    services = _file_services()
    item = services.files.lookup(args.file_id)
    print(_file_line(item))
    print(
        f"owner {item.user_id}; sha256 {item.sha256}; stored {item.created_at.isoformat()}; "
        f"referenced by {services.files.reference_count(item.id)} turn(s)"
    )
    if item.parse_error:
        print(f"parse error: {item.parse_error}")
    if item.extract:
        print(f"extract: {len(item.extract):,} characters")
    return 0


def cmd_files_read(args: argparse.Namespace) -> int:
    services = _file_services()
    try:
        owner = services.files.lookup(args.file_id).user_id
        print(
            services.reader.file_read(
                args.file_id, owner, start_page=args.start_page, max_pages=args.max_pages, focus=args.focus
            )
        )
    finally:
        services.close()
    return 0


def cmd_files_delete(args: argparse.Namespace) -> int:
    services = _file_services()
    item = services.files.lookup(args.file_id)
    references = services.files.reference_count(item.id)
    services.files.delete(item.id, user_id=item.user_id)
    print(f"deleted {item.id} ({item.name}); {references} turn reference(s) removed")
    return 0


def cmd_files_export(args: argparse.Namespace) -> int:
    out = Path(args.path).expanduser()
    if not out.parent.is_dir():
        print(f"error: the directory of {args.path!r} does not exist; create it first.", file=sys.stderr)
        return EXIT_USAGE
    services = _file_services()
    owner = services.files.lookup(args.file_id).user_id
    stored, data = services.files.export(args.file_id, user_id=owner)
    out.write_bytes(data)
    print(f"wrote {len(data):,} bytes of {stored.id} ({stored.name}) to {out}")
    return 0


def cmd_files_edit(args: argparse.Namespace) -> int:
    path = Path(args.path).expanduser()
    if not path.is_file():
        print(f"error: {args.path!r} is not a readable file.", file=sys.stderr)
        return EXIT_USAGE
    services = _file_services()
    try:
        owner = services.files.lookup(args.file_id).user_id
        stored = services.edit(args.file_id, user_id=owner, data=path.read_bytes(), name=path.name)
        services.parses.wait(stored.id, FILES_ADD_WAIT_SECONDS)
        print(_file_line(services.files.get(stored.id, user_id=owner, with_extract=False)))
    finally:
        services.close()
    return 0


def cmd_files_import_blobs(args: argparse.Namespace) -> int:
    settings = _settings()
    source = Path(args.source).expanduser() if args.source else settings.files_path
    if not source.is_dir():
        print(f"error: {str(source)!r} is not a directory; give the old files directory with --from.", file=sys.stderr)
        return EXIT_USAGE
    services = _file_services(settings)
    try:
        report = services.files.import_blobs(source)
    finally:
        services.close()
    print(
        f"blob store {services.files.blobs.kind}: imported {report.imported}, already stored {report.present}, "
        f"missing {len(report.missing)}, not matching their SHA-256 {len(report.corrupt)}"
    )
    for sha in report.missing:
        print(f"  missing {sha}")
    for sha in report.corrupt:
        print(f"  corrupt {sha}")
    return 1 if report.missing or report.corrupt else 0


def _add_files_parser(sub) -> None:
    files = sub.add_parser(
        "files", help="stored files: add, list, show, read (the file_read window), delete, export, edit"
    )
    f_sub = files.add_subparsers(dest="files_command", required=True)
    add = f_sub.add_parser("add", help="store files for a user and parse them")
    add.add_argument("user", type=_id_arg, help="the owner's user id")
    add.add_argument("paths", nargs="+", metavar="PATH")
    add.add_argument("--ephemeral", action="store_true", help="valid only in --session (default: durable)")
    add.add_argument("--session", help="the session an ephemeral, type=_id_arg file is valid in")
    add.add_argument("--no-wait", action="store_true", help="store only; the parse runs on the first read or wait")
    add.set_defaults(func=cmd_files_add)
    lst = f_sub.add_parser("list", help="a user's files")
    lst.add_argument("user", type=_id_arg)
    lst.set_defaults(func=cmd_files_list)
    show = f_sub.add_parser("show", help="one file's metadata and parse state")
    show.add_argument("file_id")
    show.set_defaults(func=cmd_files_show)
    read = f_sub.add_parser("read", help="print what the file_read tool returns for a file")
    read.add_argument("file_id")
    read.add_argument("--start-page", type=int)
    read.add_argument("--max-pages", type=int)
    read.add_argument("--focus")
    read.set_defaults(func=cmd_files_read)
    delete = f_sub.add_parser("delete", help="delete a file, its blob and every turn's reference to it")
    delete.add_argument("file_id")
    delete.set_defaults(func=cmd_files_delete)
    export = f_sub.add_parser("export", help="write a durable file's stored bytes to PATH")
    export.add_argument("file_id")
    export.add_argument("path")
    export.set_defaults(func=cmd_files_export)
    edit = f_sub.add_parser("edit", help="replace a durable file's bytes with PATH, keeping its id, and parse again")
    edit.add_argument("file_id")
    edit.add_argument("path")
    edit.set_defaults(func=cmd_files_edit)
    imp = f_sub.add_parser(
        "import-blobs",
        help="copy the bytes of stored files from a local files directory (earlier versions kept them there) "
        "into the blob store (COMPANION_BLOB_STORE)",
    )
    imp.add_argument("--from", dest="source", help="the old files directory (default: COMPANION_FILES_DIR)")
    imp.set_defaults(func=cmd_files_import_blobs)

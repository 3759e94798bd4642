"""Every statement a turn sends finds each per-user row by its user: the schema can be sharded by
user (docs/architecture.md#sharding-by-user).

The statements of steady turns (the session exists; with recall, a lorebook, knowledge, a file,
and a turn with a compaction) are recorded at the driver and parsed (sqlglot, PostgreSQL's
dialect). Each read or write of a per-user table must carry its user: an equality on that table's
``user_id`` in the statement's own conditions (its ``WHERE`` or a join's ``ON``), or ``user_id`` in
an ``INSERT``'s columns. Catalogue tables (apps, characters, knowledge) are shared and exempt."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import event

sqlglot = pytest.importorskip("sqlglot")
from sqlglot import exp  # noqa: E402

PER_USER = {
    "users": "id",
    "sessions": "user_id",
    "turns": "user_id",
    "turn_vectors": "user_id",
    "turn_files": "user_id",
    "summaries": "user_id",
    "compaction_state": "user_id",
    "user_profiles": "user_id",
    "learned_facts": "user_id",
    "archived_segments": "user_id",
    "archive_counts": "user_id",
    "files": "user_id",
}
"""Per-user tables and the column that names the user."""


def _scope(node: exp.Expression) -> exp.Expression:
    """The statement a table reference belongs to: its nearest SELECT, UPDATE, DELETE or INSERT."""
    parent = node.parent
    while parent is not None and not isinstance(parent, (exp.Select, exp.Update, exp.Delete, exp.Insert)):
        parent = parent.parent
    return parent if parent is not None else node.root()


def _keyed(table: exp.Table, column: str) -> bool:
    """Whether the table reference is found by its user in its own statement."""
    scope = _scope(table)
    if isinstance(scope, exp.Insert) and scope.this is not None and table in scope.this.find_all(exp.Table):
        columns = [c.name for c in scope.this.find_all(exp.Identifier)] if isinstance(scope.this, exp.Schema) else []
        return column in columns
    names = {table.alias_or_name, table.name}
    conditions = [scope.args.get("where")] + [j.args.get("on") for j in scope.args.get("joins") or []]
    for condition in filter(None, conditions):
        for eq in condition.find_all(exp.EQ):
            for side in (eq.left, eq.right):
                if isinstance(side, exp.Column) and side.name == column and (not side.table or side.table in names):
                    return True
    return False


def unkeyed(sql: str) -> list[str]:
    """The per-user tables ``sql`` reads or writes without its user, by name."""
    parsed = sqlglot.parse_one(re.sub(r"%\((\w+)\)s", r":\1", sql), read="postgres")
    ctes = {c.alias for c in parsed.find_all(exp.CTE)}
    return [
        t.name
        for t in parsed.find_all(exp.Table)
        if t.name in PER_USER and t.name not in ctes and not _keyed(t, PER_USER[t.name])
    ]


def test_the_check_finds_a_statement_without_the_user():
    assert unkeyed("SELECT * FROM turns WHERE session_id = %(s)s") == ["turns"]
    assert unkeyed("SELECT * FROM turns WHERE session_id = %(s)s AND user_id = %(u)s") == []
    assert unkeyed("SELECT 1 FROM summaries s JOIN turns t ON t.id = s.x WHERE s.user_id = %(u)s") == ["turns"]
    assert unkeyed("INSERT INTO turn_files (turn_id, file_id) VALUES (1, 'f')") == ["turn_files"]
    assert unkeyed("INSERT INTO turn_files (turn_id, file_id, user_id) VALUES (1, 'f', 'u')") == []


def test_every_hot_statement_of_a_turn_filters_on_the_user(make_engine_for, store, fake_llm):
    from tests.cards import v2_card

    engine = make_engine_for(window=1024)
    card = engine.characters.read(__import__("json").dumps(v2_card(name="Aria")).encode())
    aria = engine.characters.add(card)
    store.sessions.ensure(session_id="old", user_id="u1", character_id=aria.id)
    store.sessions.ensure(session_id="s1", user_id="u1", character_id=aria.id)
    at = datetime(2026, 5, 1, 9, tzinfo=UTC)
    for i in range(6):  # an older session with an archive, so that recall has rows to read
        engine.turn(user_id="u1", session_id="old", message=f"old {i} " + "words " * 40, reply="ok " * 30, at=at)
    engine.turn(user_id="u1", session_id="s1", message="Hello, tell me about the lamp", reply="Hi!", at=at)
    seen: list[str] = []

    def record(conn, cursor, statement, params, context, executemany):
        seen.append(statement)

    engines = (store.engine, store.compaction._lock_engine)
    for e in engines:
        event.listen(e, "before_cursor_execute", record)
    try:
        for i in range(8):  # steady turns: the last ones compact
            engine.turn(
                user_id="u1",
                session_id="s1",
                message=f"The lamp, day {i}: " + "tell me more " * 25,
                reply="Sure. " * 30,
                at=at + timedelta(minutes=i),
            )
        engine.assemble(user_id="u1", session_id="s1", pending="What did I say about the lamp yesterday?")
    finally:
        for e in engines:
            event.remove(e, "before_cursor_execute", record)
    assert store.compaction.state("s1").compactions >= 1  # the recorded turns include a compaction
    statements = list(dict.fromkeys(seen))
    assert any("archived_segments" in s for s in statements)
    offending = {s: unkeyed(s) for s in statements}
    assert {s[:200]: t for s, t in offending.items() if t} == {}

"""Every table a turn reads carries its user: the schema can be sharded by user.

``turns``, ``turn_vectors``, ``turn_files``, ``summaries`` and ``compaction_state`` get
``user_id`` (the session's user, filled from ``sessions``), so that a turn finds every row it
reads by its user as well as by its own key, and a sharded deployment (Citus distributes by one
column) can keep each user's rows together with ``user_id`` as the distribution column. A row
inserted without ``user_id`` takes its session's (or its turn's) by a ``BEFORE INSERT`` trigger. The
catalogue tables (``apps``, ``characters``, ``character_revisions``, ``character_avatars``,
``knowledge_chunks``) are shared by an app's users: reference tables.

Revision ID: 0021
Revises: 0020
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0021"
down_revision = "0020"
branch_labels = None
depends_on = None

_FILLED = {
    "turns": "UPDATE turns AS t SET user_id = s.user_id FROM sessions AS s WHERE s.id = t.session_id",
    "summaries": "UPDATE summaries AS t SET user_id = s.user_id FROM sessions AS s WHERE s.id = t.session_id",
    "compaction_state": (
        "UPDATE compaction_state AS t SET user_id = s.user_id FROM sessions AS s WHERE s.id = t.session_id"
    ),
    "turn_vectors": "UPDATE turn_vectors AS v SET user_id = t.user_id FROM turns AS t WHERE t.id = v.turn_id",
    "turn_files": "UPDATE turn_files AS f SET user_id = t.user_id FROM turns AS t WHERE t.id = f.turn_id",
}
"""Each table and how its ``user_id`` is filled (in this order: turns first)."""


_FROM = {
    "turns": "SELECT user_id FROM sessions WHERE id = NEW.session_id",
    "summaries": "SELECT user_id FROM sessions WHERE id = NEW.session_id",
    "compaction_state": "SELECT user_id FROM sessions WHERE id = NEW.session_id",
    "turn_vectors": "SELECT user_id FROM turns WHERE id = NEW.turn_id",
    "turn_files": "SELECT user_id FROM turns WHERE id = NEW.turn_id",
}
"""A row written without its user takes its session's (or turn's): the runtime's turn path writes
the user itself; the trigger keeps every other writer (bulk loads, older code) correct."""


def upgrade() -> None:
    for table, fill in _FILLED.items():
        op.add_column(table, sa.Column("user_id", sa.String(200), nullable=True))
        op.execute(fill)
        op.alter_column(table, "user_id", nullable=False)
        op.execute(
            f"CREATE FUNCTION companion_{table}_user() RETURNS trigger LANGUAGE plpgsql AS $$ "
            f"BEGIN NEW.user_id := ({_FROM[table]}); RETURN NEW; END $$"
        )
        op.execute(
            f"CREATE TRIGGER {table}_user BEFORE INSERT ON {table} FOR EACH ROW WHEN (NEW.user_id IS NULL) "
            f"EXECUTE FUNCTION companion_{table}_user()"
        )


def downgrade() -> None:
    for table in reversed(list(_FILLED)):
        op.execute(f"DROP TRIGGER {table}_user ON {table}")
        op.execute(f"DROP FUNCTION companion_{table}_user()")
        op.drop_column(table, "user_id")

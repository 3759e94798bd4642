"""Apps and their API keys, app-scoped users, session life cycle (closing, idleness,
carry-over from the previous session).

- ``apps``: one row per client application; ``key_hash`` is the SHA-256 (hex) of its
  API key, never the key itself.
- ``users.app_id`` / ``users.external_id``: a user created through the HTTP API belongs
  to one app and is known to it by ``external_id``; ``users.id`` stays the global,
  server-generated primary key. Users made by the CLI or replay have both NULL.
- ``sessions.closed_at`` / ``closed_by``: when and by whom (a job worker, or ``api``) the
  session was closed; a closed session takes no new turns.
- ``sessions.last_activity_at``: wall-clock time of the newest stored turn (or of the
  session's creation); the close job's idleness test. Replayed turns keep their
  historical ``created_at``, so idleness is not derived from it.
- ``sessions.carried_from``: the previous session whose summary this one started from.

Revision ID: 0007
Revises: 0005
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "apps",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("name", sa.String(200), nullable=False, unique=True),
        sa.Column("key_hash", sa.String(64), nullable=False, unique=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.add_column("users", sa.Column("app_id", sa.String(200), sa.ForeignKey("apps.id"), nullable=True))
    op.add_column("users", sa.Column("external_id", sa.String(200), nullable=True))
    op.create_unique_constraint("uq_users_app_external", "users", ["app_id", "external_id"])
    op.add_column("sessions", sa.Column("closed_at", sa.DateTime(timezone=True), nullable=True))
    op.add_column("sessions", sa.Column("closed_by", sa.String(200), nullable=True))
    op.add_column(
        "sessions",
        sa.Column("last_activity_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.add_column(
        "sessions",
        sa.Column("carried_from", sa.String(200), sa.ForeignKey("sessions.id", ondelete="SET NULL"), nullable=True),
    )
    op.create_index(
        "ix_sessions_open_activity", "sessions", ["last_activity_at"], postgresql_where=sa.text("closed_at IS NULL")
    )


def downgrade() -> None:
    op.drop_index("ix_sessions_open_activity", table_name="sessions")
    for column in ("carried_from", "last_activity_at", "closed_by", "closed_at"):
        op.drop_column("sessions", column)
    op.drop_constraint("uq_users_app_external", "users", type_="unique")
    op.drop_column("users", "external_id")
    op.drop_column("users", "app_id")
    op.drop_table("apps")

"""Initial schema: users, sessions, turns, summaries, archived segments, compaction state.

The archive's ``vector(N)`` takes N from the embedding model: ``companion db upgrade``
passes it as the ``embedding_dim`` attribute (or ``-x embedding_dim=N`` on the CLI;
default 384, all-MiniLM-L6-v2).

Revision ID: 0001
Revises:
Create Date: 2026-11-30
"""

from alembic import context, op
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects.postgresql import JSONB

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def _embedding_dim() -> int:
    dim = context.config.attributes.get("embedding_dim") or context.get_x_argument(as_dictionary=True).get(
        "embedding_dim", 384
    )
    return int(dim)


def upgrade() -> None:
    op.execute("CREATE EXTENSION IF NOT EXISTS vector")
    op.create_table(
        "users",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "sessions",
        sa.Column("id", sa.String(200), primary_key=True),
        sa.Column("user_id", sa.String(200), sa.ForeignKey("users.id"), nullable=False, index=True),
        sa.Column("persona", sa.String(200), nullable=False, server_default=""),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "turns",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("session_id", sa.String(200), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("seq", sa.Integer, nullable=False),
        sa.Column("role", sa.String(20), nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("usage_prompt_tokens", sa.Integer),
        sa.Column("usage_completion_tokens", sa.Integer),
        sa.Column("state", sa.String(20), nullable=False, server_default="context"),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("session_id", "seq", name="uq_turns_session_seq"),
        sa.CheckConstraint("role IN ('user', 'assistant', 'system')", name="ck_turns_role"),
        sa.CheckConstraint("state IN ('context', 'summarized')", name="ck_turns_state"),
    )
    op.create_table(
        "summaries",
        sa.Column("session_id", sa.String(200), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("items", JSONB, nullable=False, server_default="[]"),
        sa.Column("first_seq", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_table(
        "archived_segments",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("user_id", sa.String(200), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("session_id", sa.String(200), sa.ForeignKey("sessions.id"), nullable=False),
        sa.Column("first_seq", sa.Integer, nullable=False),
        sa.Column("last_seq", sa.Integer, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("session_date", TS, nullable=False),
        sa.Column("embedding", Vector(_embedding_dim()), nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
    )
    op.create_index("ix_archived_segments_user_id", "archived_segments", ["user_id"])
    op.create_index(
        "ix_archived_segments_embedding_hnsw",
        "archived_segments",
        ["embedding"],
        postgresql_using="hnsw",
        postgresql_ops={"embedding": "vector_cosine_ops"},
    )
    op.create_table(
        "compaction_state",
        sa.Column("session_id", sa.String(200), sa.ForeignKey("sessions.id"), primary_key=True),
        sa.Column("consecutive_failures", sa.Integer, nullable=False, server_default="0"),
        sa.Column("breaker_opened_at", TS),
        sa.Column("last_error", sa.Text),
        sa.Column("compactions", sa.Integer, nullable=False, server_default="0"),
    )


def downgrade() -> None:
    for table in ("compaction_state", "archived_segments", "summaries", "turns", "sessions", "users"):
        op.drop_table(table)

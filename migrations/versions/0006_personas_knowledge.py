"""Personas' knowledge base and users' pinned profiles.

- ``knowledge_chunks``: chunks of text files added with ``companion kb add``, scoped to
  a persona by name, each with a ``vector(N)`` embedding. N is read from the existing
  ``archived_segments.embedding`` column, so both tables always hold the same model's
  vectors (``memory.database.check_dimension`` checks that one). No HNSW index:
  retrieval ranks within one persona's rows, found by the ``(persona, source)`` btree,
  exactly.
- ``user_profiles``: name, pronouns, user-set facts and facts learned from summaries.

Revision ID: 0006
Revises: 0005
Create Date: 2026-12-03
"""

from alembic import op
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector
from sqlalchemy.dialects.postgresql import JSONB

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def _archive_dim() -> int:
    row = op.get_bind().execute(
        sa.text(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'archived_segments'::regclass "
            "AND attname = 'embedding' AND NOT attisdropped"
        )
    ).fetchone()
    return int(row[0])


def upgrade() -> None:
    op.create_table(
        "knowledge_chunks",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("persona", sa.String(200), nullable=False),
        sa.Column("source", sa.String(500), nullable=False),
        sa.Column("chunk_index", sa.Integer, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.Column("tokens", sa.Integer, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("embedding", Vector(_archive_dim()), nullable=False),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.UniqueConstraint("persona", "source", "chunk_index", name="uq_knowledge_chunks_position"),
    )
    op.create_table(
        "user_profiles",
        sa.Column("user_id", sa.String(200), sa.ForeignKey("users.id"), primary_key=True),
        sa.Column("name", sa.String(200)),
        sa.Column("pronouns", sa.String(100)),
        sa.Column("facts", JSONB, nullable=False, server_default="[]"),
        sa.Column("learned", JSONB, nullable=False, server_default="[]"),
        sa.Column("updated_at", TS, nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("user_profiles")
    op.drop_table("knowledge_chunks")

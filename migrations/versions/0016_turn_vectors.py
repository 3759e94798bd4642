"""Turn vectors: each turn's text embedded once, kept for reuse.

``turn_vectors`` holds the embedding of one turn's text (``turns.content`` as it is), so
that a user message's recall query and the archive keys of later compactions reuse it
instead of embedding the text again: a window key's vector is composed from the vectors of
its turns (:func:`memory.archive.compose_window`). Rows go with their turn (``ON DELETE
CASCADE``). ``vector(N)`` takes N from the archive's column, like the knowledge base's.

Revision ID: 0016
Revises: 0015
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa
from pgvector.sqlalchemy import Vector

revision = "0016"
down_revision = "0015"
branch_labels = None
depends_on = None


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
        "turn_vectors",
        sa.Column("turn_id", sa.BigInteger, sa.ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("embedding", Vector(_archive_dim()), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("turn_vectors")

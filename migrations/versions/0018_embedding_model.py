"""The embedding model that made the stored vectors.

``embedding_model`` holds one row (``id = 1``): the name and dimension of the model whose
vectors fill ``turn_vectors``, ``archived_segments.embedding`` and
``knowledge_chunks.embedding``. Two models of the same dimension produce vectors of
different spaces, which ``vector(N)`` alone cannot tell apart; the runtime compares this
row with the configured model when it opens the database
(:func:`memory.vector_model.check_model`) and records it when the row is missing, and
``companion db reembed`` rewrites it with every vector. The migration leaves the table
empty: it does not know the model's name.

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0018"
down_revision = "0017"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "embedding_model",
        sa.Column("id", sa.SmallInteger, primary_key=True, server_default="1"),
        sa.Column("name", sa.Text, nullable=False),
        sa.Column("dimension", sa.Integer, nullable=False),
        sa.Column("recorded_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("id = 1", name="ck_embedding_model_one_row"),
    )


def downgrade() -> None:
    op.drop_table("embedding_model")

"""The recalled segments a session keeps at a fixed place in its prompt (the cache layout).

``sessions.recall_block``: the rendered memory block the cache layout keeps in the session's
prompt until recall moves on (``NULL``: none kept yet);
``sessions.recall_segments``: the archive segment ids that block quotes, so forgetting a segment
or deleting its message can drop the block; ``sessions.recall_anchor``: the ``seq`` of the user turn
the block sits under.

Revision ID: 0024
Revises: 0023
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0024"
down_revision = "0023"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("recall_block", sa.Text, nullable=True))
    op.add_column("sessions", sa.Column("recall_segments", postgresql.ARRAY(sa.BigInteger), nullable=True))
    op.add_column("sessions", sa.Column("recall_anchor", sa.Integer, nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "recall_anchor")
    op.drop_column("sessions", "recall_segments")
    op.drop_column("sessions", "recall_block")

"""The recall tails the cache layout keeps under the user turns they were first shown under.

``sessions.recall_tails``: a JSON array of ``{"anchor": seq, "text": str, "segments": [id]}``, one
per user turn since ``recall_anchor`` whose request added recalled segments the kept block lacked,
oldest first (``NULL``: none). ``sessions.recall_segments`` now lists the segments of the block and
of these tails, so forgetting one of them drops both. ``sessions.recall_prefix``: a fingerprint of
the prompt before the block (the persona and the system context) when it was built; when the
prompt before it changes (a compaction), the provider has nothing cached after it and the next
turn rebuilds the block at no cost.

Revision ID: 0026
Revises: 0025
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects import postgresql

revision = "0026"
down_revision = "0025"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("recall_tails", postgresql.JSONB, nullable=True))
    op.add_column("sessions", sa.Column("recall_prefix", sa.String(64), nullable=True))


def downgrade() -> None:
    op.drop_column("sessions", "recall_prefix")
    op.drop_column("sessions", "recall_tails")

"""One turn at a time per session: the running turn's claim on its session row.

``turn_owner`` names the turn that holds the session (a random id per turn) and
``turn_claimed_at`` when it took it. A claim lapses after ``COMPANION_TURN_LEASE_SECONDS``,
so a process that died mid-turn does not block its session for good.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-30
"""

import sqlalchemy as sa
from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("sessions", sa.Column("turn_owner", sa.String(64)))
    op.add_column("sessions", sa.Column("turn_claimed_at", sa.DateTime(timezone=True)))


def downgrade() -> None:
    op.drop_column("sessions", "turn_claimed_at")
    op.drop_column("sessions", "turn_owner")

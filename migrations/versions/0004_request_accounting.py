"""Request accounting on assistant turns: our raw estimate of the request, its message
count and fingerprint, for self-calibration and the provider baseline.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("request_estimate_tokens", sa.Integer))
    op.add_column("turns", sa.Column("request_messages", sa.Integer))
    op.add_column("turns", sa.Column("request_fingerprint", sa.String(64)))


def downgrade() -> None:
    for column in ("request_fingerprint", "request_messages", "request_estimate_tokens"):
        op.drop_column("turns", column)

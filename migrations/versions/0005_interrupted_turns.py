"""Interrupted replies: a flag on turns for an assistant reply whose stream broke off;
its content is what arrived before it did.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("interrupted", sa.Boolean, nullable=False, server_default=sa.false()))


def downgrade() -> None:
    op.drop_column("turns", "interrupted")

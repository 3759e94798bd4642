"""Parse attempts: how many times a parser claimed a file since its bytes last changed.

A parse that never reports back (the process was killed under it) leaves its claim;
the claim is taken again once stale. ``parse_attempts`` lets the second stale claim
mark the file ``failed`` instead of parsing it again, so a file that kills its parser
cannot do so on every restart.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("files", sa.Column("parse_attempts", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("files", "parse_attempts")

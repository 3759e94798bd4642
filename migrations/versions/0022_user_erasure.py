"""A user being erased: ``users.erasing_at``.

An erasure marks the user first (committed), so that no new turn, session or upload of the user
starts while their rows are deleted; it then deletes the rows session by session, and the user's
row last. An erasure that stopped half-way is finished by running it again.

Revision ID: 0022
Revises: 0021
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0022"
down_revision = "0021"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("users", sa.Column("erasing_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("users", "erasing_at")

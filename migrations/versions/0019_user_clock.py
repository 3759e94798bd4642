"""The user's own clock: the UTC offset each turn's time was given with, and a profile time zone.

``turns.utc_offset_minutes`` keeps the offset of the time a turn was given with (``+08:00`` is
480), so that what the user said at 07:30 in Shanghai is dated on their day, not on the UTC
date before it; ``NULL`` when the time was not given (the server's clock). ``user_profiles.time_zone``
is an IANA zone name (``Asia/Shanghai``) the user or app sets; without it, the user's zone is
the offset of their last turn that carried one.

Revision ID: 0019
Revises: 0018
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0019"
down_revision = "0018"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("utc_offset_minutes", sa.SmallInteger, nullable=True))
    op.add_column("user_profiles", sa.Column("time_zone", sa.Text, nullable=True))


def downgrade() -> None:
    op.drop_column("user_profiles", "time_zone")
    op.drop_column("turns", "utc_offset_minutes")

"""Compaction you can trust: an ``archived`` turn state, breaker failure reasons, dropped quotes.

- ``turns.state`` may now be ``archived``: the turn was rolled out of the recent window
  while the session's circuit breaker was open, so it is archived verbatim (and can be
  recalled) but is not in the summary. The CHECK constraint ``ck_turns_state`` is
  widened to allow it.
- ``compaction_state.recent_errors``: the reasons of the current run of consecutive
  failures (JSON list of strings, oldest first), so the event that opens the breaker
  can name them all, whichever process saw them.
- ``summaries.dropped_quotes``: user quotes left out of the summary so far to keep it
  within its token cap (they stay archived verbatim).

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import JSONB

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_constraint("ck_turns_state", "turns", type_="check")
    op.create_check_constraint("ck_turns_state", "turns", "state IN ('context', 'summarized', 'archived')")
    op.add_column(
        "compaction_state", sa.Column("recent_errors", JSONB, nullable=False, server_default=sa.text("'[]'::jsonb"))
    )
    op.add_column("summaries", sa.Column("dropped_quotes", sa.Integer, nullable=False, server_default="0"))


def downgrade() -> None:
    op.drop_column("summaries", "dropped_quotes")
    op.drop_column("compaction_state", "recent_errors")
    # an archived turn is out of the recent window and in the archive, like a summarized one
    op.execute("UPDATE turns SET state = 'summarized' WHERE state = 'archived'")
    op.drop_constraint("ck_turns_state", "turns", type_="check")
    op.create_check_constraint("ck_turns_state", "turns", "state IN ('context', 'summarized')")

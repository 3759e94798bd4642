"""What the provider's prompt cache did for each reply, and what the request cost.

``turns.usage_cached_tokens``: prompt tokens the provider read from its cache;
``turns.usage_cache_write_tokens``: prompt tokens it wrote to it; ``turns.usage_cost_usd``: the
request's price by litellm's cost map (cache reads and writes at their own prices). ``NULL``: not
reported, or a model the map does not price.

Revision ID: 0023
Revises: 0022
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0023"
down_revision = "0022"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("usage_cached_tokens", sa.Integer, nullable=True))
    op.add_column("turns", sa.Column("usage_cache_write_tokens", sa.Integer, nullable=True))
    op.add_column("turns", sa.Column("usage_cost_usd", sa.Float, nullable=True))


def downgrade() -> None:
    op.drop_column("turns", "usage_cost_usd")
    op.drop_column("turns", "usage_cache_write_tokens")
    op.drop_column("turns", "usage_cached_tokens")

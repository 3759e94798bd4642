"""The archive's HNSW index over half-precision keys.

Recall's index path (``memory.recall``, large archives) walks an HNSW graph whose pages hold
the keys. ``vector(N)`` keys take 4 bytes a dimension there, ``halfvec(N)`` 2; at 100,000
segments of 384 dimensions the index is 197 MB as ``vector`` and 113 MB as ``halfvec``, so
more of it stays in PostgreSQL's shared buffers. The ranker reads the index in half precision
and re-sorts its candidates by the single-precision distance of the stored ``vector`` column,
which is unchanged. Measured with ``scripts/bench_turn.py`` (see ``docs/evaluation.md``).

The expression must match the one recall orders by, ``CAST(embedding AS halfvec(N))``, with
N read from the archive's column. Building the index reads the whole table (about 45 s for
100,000 segments on a 2-core machine).

Revision ID: 0017
Revises: 0016
Create Date: 2026-12-01
"""

from alembic import op
import sqlalchemy as sa

revision = "0017"
down_revision = "0016"
branch_labels = None
depends_on = None

INDEX = "ix_archived_segments_embedding_hnsw"


def _archive_dim() -> int:
    row = op.get_bind().execute(
        sa.text(
            "SELECT atttypmod FROM pg_attribute WHERE attrelid = 'archived_segments'::regclass "
            "AND attname = 'embedding' AND NOT attisdropped"
        )
    ).fetchone()
    return int(row[0])


def upgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
    op.execute(
        f"CREATE INDEX {INDEX} ON archived_segments "
        f"USING hnsw ((CAST(embedding AS halfvec({_archive_dim()}))) halfvec_cosine_ops)"
    )


def downgrade() -> None:
    op.execute(f"DROP INDEX IF EXISTS {INDEX}")
    op.execute(f"CREATE INDEX {INDEX} ON archived_segments USING hnsw (embedding vector_cosine_ops)")

"""File blobs in PostgreSQL: the bytes of stored files, shared by every process.

``file_blobs`` holds one row per distinct content (SHA-256, hex), so the ``files`` rows of
equal bytes share one blob, as they shared one file on disk before. Bytes that were kept in
a local files directory are copied in by ``companion files import-blobs``.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa
from sqlalchemy.dialects.postgresql import BYTEA

revision = "0015"
down_revision = "0014"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "file_blobs",
        sa.Column("sha256", sa.String(64), primary_key=True),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("data", BYTEA, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.text("now()")),
    )
    # the bytes are already compressed in most formats (PDF streams, ZIP, PNG, JPEG): keep them out of line, uncompressed
    op.execute("ALTER TABLE file_blobs ALTER COLUMN data SET STORAGE EXTERNAL")


def downgrade() -> None:
    op.drop_table("file_blobs")

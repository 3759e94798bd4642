"""Images: the transcript cache of image files.

``image_transcripts`` holds one description per image file, written by the vision model
(or OCR) the first time a text-only model needed it. The file id stays the anchor in
``turn_files``; a transcript is only a cache, deleted with its file (ON DELETE CASCADE).

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "image_transcripts",
        sa.Column("file_id", sa.String(40), sa.ForeignKey("files.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("text", sa.Text, nullable=False),
        sa.Column("method", sa.String(20), nullable=False),
        sa.Column("model", sa.String(200)),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("length(text) > 0", name="ck_image_transcripts_text"),
    )


def downgrade() -> None:
    op.drop_table("image_transcripts")

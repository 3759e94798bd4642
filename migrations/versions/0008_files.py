"""Files: uploaded documents (``files``) and the turns that carry them (``turn_files``).

``files`` holds one row per stored document: owner, name, MIME type, size, SHA-256,
the blob's path under the files directory, its durability, the parse state and the
extract (pages separated by ``--- page N ---`` markers). One user's same bytes are one
row per durability (and per session for ephemeral ids); blobs are content-addressed,
so equal bytes are one blob on disk whoever uploaded them.

``turn_files`` links a stored turn to the files it carries, in order; counting its
rows across sessions is the reference count that decides when a file may go.

Revision ID: 0008
Revises: 0005
Create Date: 2026-11-30
"""

from alembic import op
import sqlalchemy as sa

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        "files",
        sa.Column("id", sa.String(40), primary_key=True),
        sa.Column("user_id", sa.String(200), sa.ForeignKey("users.id"), nullable=False),
        sa.Column("name", sa.String(255), nullable=False),
        sa.Column("mime", sa.String(200), nullable=False),
        sa.Column("size_bytes", sa.BigInteger, nullable=False),
        sa.Column("sha256", sa.String(64), nullable=False),
        sa.Column("blob_path", sa.String(200), nullable=False),
        sa.Column("durability", sa.String(20), nullable=False, server_default="durable"),
        sa.Column("session_id", sa.String(200)),
        sa.Column("parse_state", sa.String(20), nullable=False, server_default="pending"),
        sa.Column("parse_error", sa.Text),
        sa.Column("parse_started_at", TS),
        sa.Column("page_count", sa.Integer),
        sa.Column("extract", sa.Text),
        sa.Column("body_start_page", sa.Integer),
        sa.Column("created_at", TS, nullable=False, server_default=sa.func.now()),
        sa.CheckConstraint("durability IN ('durable', 'ephemeral')", name="ck_files_durability"),
        sa.CheckConstraint(
            "parse_state IN ('pending', 'parsing', 'ready', 'empty', 'needs_ocr', 'failed')", name="ck_files_parse_state"
        ),
        sa.CheckConstraint("size_bytes >= 0", name="ck_files_size"),
    )
    op.create_index("ix_files_user_id", "files", ["user_id"])
    op.create_index("ix_files_sha256", "files", ["sha256"])
    op.create_index(
        "uq_files_user_sha_durable", "files", ["user_id", "sha256"], unique=True,
        postgresql_where=sa.text("durability = 'durable'"),
    )
    op.create_index(
        "uq_files_user_sha_ephemeral", "files", ["user_id", "sha256", sa.text("coalesce(session_id, '')")], unique=True,
        postgresql_where=sa.text("durability = 'ephemeral'"),
    )
    op.create_table(
        "turn_files",
        sa.Column("turn_id", sa.BigInteger, sa.ForeignKey("turns.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("file_id", sa.String(40), sa.ForeignKey("files.id", ondelete="CASCADE"), primary_key=True),
        sa.Column("position", sa.Integer, nullable=False, server_default="0"),
    )
    op.create_index("ix_turn_files_file_id", "turn_files", ["file_id"])


def downgrade() -> None:
    op.drop_index("ix_turn_files_file_id", table_name="turn_files")
    op.drop_table("turn_files")
    op.drop_index("uq_files_user_sha_ephemeral", table_name="files")
    op.drop_index("uq_files_user_sha_durable", table_name="files")
    op.drop_index("ix_files_sha256", table_name="files")
    op.drop_index("ix_files_user_id", table_name="files")
    op.drop_table("files")

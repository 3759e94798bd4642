"""Vectors that arrive later, a re-embedding that can stop and resume, and what retrieval calls cost.

``archived_segments.embedding`` may be ``NULL``: a compaction that ran while the embeddings API
was down stores its segments without keys, and the embeddings backfill job composes them later
(recall's vector ranker skips them until then; full text and dates find them).

``turns.usage_retrieval_cost_usd``: what the embedding and rerank calls made for the turn cost
by litellm's cost map (``NULL``: none made, a local model, or a model the map does not price).

``reembed_target`` (one row) and the ``reembed_*`` tables hold a switch to another embedding
model while it runs (``companion db reembed``): the new model's vectors of turns
(``reembed_turn_vectors``), knowledge chunks (``reembed_chunk_vectors``) and segments keyed by
their content (``reembed_segment_keys``), committed batch by batch beside the old ones, which
recall keeps using until the switch completes. Each row goes with the row it embeds
(``ON DELETE CASCADE``). Their columns are ``vector`` without a dimension: the new model's may
differ.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-04
"""

from alembic import op
import sqlalchemy as sa

revision = "0025"
down_revision = "0024"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.alter_column("archived_segments", "embedding", nullable=True)
    op.add_column("turns", sa.Column("usage_retrieval_cost_usd", sa.Float, nullable=True))
    op.execute(
        "CREATE TABLE reembed_target (id integer PRIMARY KEY CHECK (id = 1), name text NOT NULL, "
        "dimension integer NOT NULL, started_at timestamptz NOT NULL DEFAULT now())"
    )
    op.execute(
        "CREATE TABLE reembed_turn_vectors (turn_id bigint PRIMARY KEY REFERENCES turns(id) ON DELETE CASCADE, "
        "embedding vector NOT NULL)"
    )
    op.execute(
        "CREATE TABLE reembed_chunk_vectors (chunk_id bigint PRIMARY KEY "
        "REFERENCES knowledge_chunks(id) ON DELETE CASCADE, embedding vector NOT NULL)"
    )
    op.execute(
        "CREATE TABLE reembed_segment_keys (segment_id bigint PRIMARY KEY "
        "REFERENCES archived_segments(id) ON DELETE CASCADE, embedding vector NOT NULL)"
    )


def downgrade() -> None:
    op.execute("DROP TABLE reembed_segment_keys")
    op.execute("DROP TABLE reembed_chunk_vectors")
    op.execute("DROP TABLE reembed_turn_vectors")
    op.execute("DROP TABLE reembed_target")
    op.drop_column("turns", "usage_retrieval_cost_usd")
    op.execute("DELETE FROM archived_segments WHERE embedding IS NULL")
    op.alter_column("archived_segments", "embedding", nullable=False)

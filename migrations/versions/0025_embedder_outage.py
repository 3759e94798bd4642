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

``companion_vector_model_guard``: a trigger on the three vector tables that compares the writing
connection's ``companion.embedding_model`` setting (the runtime sets it to its model) with the
recorded model; while they differ (the database switched to another model and the writing process
runs the old one), a ``turn_vectors`` row is skipped, an archive key is stored as ``NULL`` and a
knowledge chunk is refused. A connection without the setting is not checked.

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


GUARD = """
CREATE FUNCTION companion_vector_model_guard() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    mine text := nullif(current_setting('companion.embedding_model', true), '');
    recorded text := (SELECT name FROM embedding_model WHERE id = 1);
BEGIN
    IF mine IS NULL OR recorded IS NULL OR mine = recorded THEN
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'archived_segments' THEN
        NEW.embedding := NULL;
        RETURN NEW;
    END IF;
    IF TG_TABLE_NAME = 'turn_vectors' THEN
        RETURN NULL;
    END IF;
    RAISE EXCEPTION 'the database records the embedding model %, not %: restart with it', recorded, mine
        USING ERRCODE = 'object_not_in_prerequisite_state';
END
$$
"""


def upgrade() -> None:
    op.alter_column("archived_segments", "embedding", nullable=True)
    op.execute(GUARD)
    for table in ("turn_vectors", "archived_segments", "knowledge_chunks"):
        op.execute(
            f"CREATE TRIGGER {table}_model_guard BEFORE INSERT OR UPDATE ON {table} "
            "FOR EACH ROW EXECUTE FUNCTION companion_vector_model_guard()"
        )
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
    for table in ("turn_vectors", "archived_segments", "knowledge_chunks"):
        op.execute(f"DROP TRIGGER {table}_model_guard ON {table}")
    op.execute("DROP FUNCTION companion_vector_model_guard()")
    op.execute("DROP TABLE reembed_segment_keys")
    op.execute("DROP TABLE reembed_chunk_vectors")
    op.execute("DROP TABLE reembed_turn_vectors")
    op.execute("DROP TABLE reembed_target")
    op.drop_column("turns", "usage_retrieval_cost_usd")
    op.execute("DELETE FROM archived_segments WHERE embedding IS NULL")
    op.alter_column("archived_segments", "embedding", nullable=False)

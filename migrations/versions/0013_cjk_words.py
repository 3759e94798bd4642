"""Chinese full text by words: the archive's ``search`` column is computed in Python, no longer generated.

Before, ``archived_segments.search`` was generated in SQL from the content, with CJK
text indexed by character bigrams (migration 0002). Now the writer supplies it:

- ``companion_search_vector(doc text, cjk_terms text[]) -> tsvector``: the English part
  exactly as before (``to_tsvector('english', …)`` of the text with CJK runs blanked
  out), concatenated with the given CJK lexemes as they are (``array_to_tsvector``);
- ``companion_search_terms(query text, cjk_terms text[]) -> text[]``: the distinct
  lexemes of that vector for a query, what recall matches one by one;
- ``archived_segments.search`` becomes a plain ``tsvector NOT NULL`` column (its values
  are kept); :class:`memory.store.Store` writes ``companion_search_vector(content,
  cjk_terms(content))`` with the CJK lexemes of :func:`memory.fulltext.cjk_terms`
  (jieba words).

Existing segments that contain CJK text are recomputed here, in batches, by
:func:`memory.fulltext.reindex` (loads jieba's dictionary only if there is such a row).
Segments without CJK text keep their vector, which is the same under both definitions.
The one-argument functions of migration 0002 stay for the downgrade.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-30
"""

from alembic import op

from memory.fulltext import CJK_PATTERN, reindex

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION companion_search_vector(doc text, cjk_terms text[]) RETURNS tsvector
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
            SELECT to_tsvector('english'::regconfig, regexp_replace(doc, '{CJK_PATTERN}+', ' ', 'g'))
                   || array_to_tsvector(cjk_terms)
        $fn$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE FUNCTION companion_search_terms(query text, cjk_terms text[]) RETURNS text[]
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
            SELECT tsvector_to_array(companion_search_vector(query, cjk_terms))
        $fn$
        """
    )
    op.execute("ALTER TABLE archived_segments ALTER COLUMN search DROP EXPRESSION")
    reindex(op.get_bind())
    op.execute("ALTER TABLE archived_segments ALTER COLUMN search SET NOT NULL")


def downgrade() -> None:
    op.execute("ALTER TABLE archived_segments DROP COLUMN search")
    op.execute(
        "ALTER TABLE archived_segments ADD COLUMN search tsvector "
        "GENERATED ALWAYS AS (companion_search_vector(content)) STORED"
    )
    # dropping the column dropped 0012's GIN index on it; 0012's downgrade expects it
    op.execute("CREATE INDEX ix_archived_segments_search ON archived_segments USING gin (search)")
    op.execute("DROP FUNCTION companion_search_terms(text, text[])")
    op.execute("DROP FUNCTION companion_search_vector(text, text[])")

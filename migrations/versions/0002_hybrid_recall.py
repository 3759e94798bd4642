"""Hybrid recall: a generated full-text column on the archive, English plus CJK bigrams.

Adds three immutable SQL functions and one stored generated column:

- ``companion_cjk_bigrams(text) -> text[]``: overlapping two-character grams of every
  run of Han, kana or Hangul characters (a run of one character gives itself).
  Chinese is written without spaces, so PostgreSQL's parser would keep a whole run as
  one "word"; character bigrams are the usual space-free indexing unit for CJK
  (as in Lucene's CJKAnalyzer).
- ``companion_search_vector(text) -> tsvector``: ``to_tsvector('english', …)`` of the
  text with CJK runs blanked out (stemming, English stop words), concatenated with the
  bigrams as lexemes (``array_to_tsvector``, no further processing).
- ``companion_search_terms(text) -> text[]``: the distinct lexemes of
  ``companion_search_vector`` of a query, what recall matches one by one.
- ``archived_segments.search``: ``tsvector GENERATED ALWAYS AS
  (companion_search_vector(content)) STORED``, so the index text is always the verbatim
  segment content and never drifts from it.

No GIN index: recall ranks within one user's rows, found by the ``user_id`` btree
(see ``memory/recall.py`` and ``scripts/bench_recall.py``).

Revision ID: 0002
Revises: 0001
Create Date: 2026-12-01
"""

from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

CJK = r"[\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff\u3040-\u30ff\uac00-\ud7af]"
"""Han (CJK Unified Ideographs, Extension A, Compatibility), Hiragana, Katakana, Hangul syllables."""


def upgrade() -> None:
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION companion_cjk_bigrams(doc text) RETURNS text[]
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
            SELECT coalesce(array_agg(DISTINCT substr(r.run, i, 2)), '{{}}')
            FROM (SELECT m[1] AS run FROM regexp_matches(doc, '({CJK}+)', 'g') AS m) AS r,
                 generate_series(1, greatest(length(r.run) - 1, 1)) AS i
        $fn$
        """
    )
    op.execute(
        f"""
        CREATE OR REPLACE FUNCTION companion_search_vector(doc text) RETURNS tsvector
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
            SELECT to_tsvector('english'::regconfig, regexp_replace(doc, '{CJK}+', ' ', 'g'))
                   || array_to_tsvector(companion_cjk_bigrams(doc))
        $fn$
        """
    )
    op.execute(
        """
        CREATE OR REPLACE FUNCTION companion_search_terms(query text) RETURNS text[]
        LANGUAGE sql IMMUTABLE STRICT PARALLEL SAFE AS $fn$
            SELECT tsvector_to_array(companion_search_vector(query))
        $fn$
        """
    )
    op.execute(
        "ALTER TABLE archived_segments ADD COLUMN search tsvector "
        "GENERATED ALWAYS AS (companion_search_vector(content)) STORED"
    )


def downgrade() -> None:
    op.execute("ALTER TABLE archived_segments DROP COLUMN search")
    op.execute("DROP FUNCTION companion_search_terms(text)")
    op.execute("DROP FUNCTION companion_search_vector(text)")
    op.execute("DROP FUNCTION companion_cjk_bigrams(text)")

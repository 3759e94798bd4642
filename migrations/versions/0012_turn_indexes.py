"""Indexes that keep a turn's reads flat as a session's history and a user's archive grow.

Turns (one session may hold 100,000 turns after a few years of daily chats):

- ``ix_turns_session_context``: ``turns (session_id, seq) WHERE state = 'context'``, the
  recent window. Without it the planner reads the whole session (every row of it
  matches ``session_id``) and filters on ``state``: a sequential scan of the table at
  100,000 rows.
- ``ix_turns_session_usage``: ``turns (session_id, seq) WHERE usage_prompt_tokens IS NOT
  NULL``, the newest turns with reported usage (calibration), read backwards.

Archive (``memory/recall.py`` says how each ranker uses these):

- ``ix_archived_segments_search``: GIN on the generated ``search`` tsvector, so full text
  reads only the rows that contain a query term.
- ``ix_archived_segments_user_date``: ``(user_id, session_date)``, the date ranker's spans.
- ``ix_archived_segments_session_seq``: ``(session_id, last_seq)``, for the turns next to a
  hit (neighbour expansion), the segments still in view (left out of recall) and a
  session's segments.
- ``archive_counts (user_id, segments)``: each user's number of archived segments, kept
  by statement-level triggers on insert and delete (a row is removed at 0). Recall reads
  it for the BM25 idf's N and to choose between exact and HNSW vector search, instead of
  counting the user's rows on every query.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-30
"""

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.execute("CREATE INDEX ix_turns_session_context ON turns (session_id, seq) WHERE state = 'context'")
    op.execute("CREATE INDEX ix_turns_session_usage ON turns (session_id, seq) WHERE usage_prompt_tokens IS NOT NULL")
    op.execute("CREATE INDEX ix_archived_segments_search ON archived_segments USING gin (search)")
    op.execute("CREATE INDEX ix_archived_segments_user_date ON archived_segments (user_id, session_date)")
    op.execute("CREATE INDEX ix_archived_segments_session_seq ON archived_segments (session_id, last_seq)")
    op.execute(
        """
        CREATE TABLE archive_counts (
            user_id varchar(200) PRIMARY KEY,
            segments bigint NOT NULL CHECK (segments > 0)
        )
        """
    )
    op.execute(
        "INSERT INTO archive_counts (user_id, segments) "
        "SELECT user_id, count(*) FROM archived_segments GROUP BY user_id"
    )
    op.execute(
        """
        CREATE FUNCTION companion_archive_counted() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN
            IF TG_OP = 'INSERT' THEN
                INSERT INTO archive_counts AS c (user_id, segments)
                SELECT user_id, count(*) FROM added GROUP BY user_id ORDER BY user_id
                ON CONFLICT (user_id) DO UPDATE SET segments = c.segments + excluded.segments;
            ELSE
                DELETE FROM archive_counts AS c
                USING (SELECT user_id, count(*) AS n FROM removed GROUP BY user_id) AS d
                WHERE c.user_id = d.user_id AND c.segments <= d.n;
                UPDATE archive_counts AS c SET segments = c.segments - d.n
                FROM (SELECT user_id, count(*) AS n FROM removed GROUP BY user_id) AS d
                WHERE c.user_id = d.user_id;
            END IF;
            RETURN NULL;
        END $$
        """
    )
    op.execute(
        "CREATE TRIGGER archive_counts_insert AFTER INSERT ON archived_segments "
        "REFERENCING NEW TABLE AS added FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )
    op.execute(
        "CREATE TRIGGER archive_counts_delete AFTER DELETE ON archived_segments "
        "REFERENCING OLD TABLE AS removed FOR EACH STATEMENT EXECUTE FUNCTION companion_archive_counted()"
    )


def downgrade() -> None:
    op.execute("DROP TRIGGER archive_counts_delete ON archived_segments")
    op.execute("DROP TRIGGER archive_counts_insert ON archived_segments")
    op.execute("DROP FUNCTION companion_archive_counted()")
    op.execute("DROP TABLE archive_counts")
    op.execute("DROP INDEX ix_archived_segments_session_seq")
    op.execute("DROP INDEX ix_archived_segments_user_date")
    op.execute("DROP INDEX ix_archived_segments_search")
    op.execute("DROP INDEX ix_turns_session_usage")
    op.execute("DROP INDEX ix_turns_session_context")

"""Where a marker string is stored: every column of every table of the database, and the blobs.

:func:`traces` searches text columns (as written), ``tsvector`` columns (by lexeme: the marker
lower-cased, as the parsers store a word), JSON and array columns (their text, the queue's job
arguments among them) and ``bytea`` columns (the bytes of the marker in UTF-8: blobs stored in
PostgreSQL), and, given an S3 client and bucket, every object's bytes. A deletion that promised to
clear the marker is proved by an empty answer.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, text

_SEARCH = {
    "text": "strpos({c}, :m) > 0",
    "character varying": "strpos({c}, :m) > 0",
    "character": "strpos({c}, :m) > 0",
    "tsvector": "strpos(CAST({c} AS text), lower(:m)) > 0",
    "json": "strpos(CAST({c} AS text), :m) > 0",
    "jsonb": "strpos(CAST({c} AS text), :m) > 0",
    "ARRAY": "strpos(CAST({c} AS text), :m) > 0",
    "bytea": "position(convert_to(:m, 'UTF8') IN {c}) > 0",
}
"""How a column of each type is searched (``information_schema.columns.data_type``)."""


def traces(engine: Engine, marker: str, *, s3: Any = None, bucket: str | None = None) -> dict[str, int]:
    """``table.column`` (or ``s3:KEY``) → rows holding ``marker``, for every place it is found."""
    found: dict[str, int] = {}
    with engine.connect() as conn:
        columns = conn.execute(
            text(
                "SELECT c.table_name, c.column_name, CASE WHEN c.data_type = 'USER-DEFINED' THEN c.udt_name "
                "ELSE c.data_type END FROM information_schema.columns AS c JOIN information_schema.tables AS t "
                "ON t.table_schema = c.table_schema AND t.table_name = c.table_name "
                "WHERE c.table_schema = current_schema() AND t.table_type = 'BASE TABLE'"
            )
        ).all()
        for table, column, kind in columns:
            search = _SEARCH.get(kind)
            if search is None:
                continue
            n = conn.execute(
                text(f'SELECT count(*) FROM "{table}" WHERE ' + search.format(c=f'"{column}"')), {"m": marker}
            ).scalar_one()
            if n:
                found[f"{table}.{column}"] = int(n)
    if s3 is not None:
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket=bucket):
            for item in page.get("Contents", []):
                body = s3.get_object(Bucket=bucket, Key=item["Key"])["Body"].read()
                if marker.encode("utf-8") in body:
                    found[f"s3:{item['Key']}"] = 1
    return found

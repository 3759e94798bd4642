"""Chinese full text by jieba words: the lexemes, what recall finds by them, the migration, the lazy load."""

from __future__ import annotations

import json
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import text

from memory.fulltext import cjk_terms, reindex
from memory.recall import recall_segments
from memory.store import NewSegment

ROOT = Path(__file__).resolve().parent.parent
T0 = datetime(2024, 3, 1, 12, 0, tzinfo=UTC)

CAT = "User: 我养了一只猫，它叫咪咪。"
ACADEMY = "User: 我在中国科学院工作了三年。"
OTHERS = [
    "User: 最近工作压力很大，经常加班到很晚。",
    "User: 我最近在学做饭，昨天做了红烧肉。",
    "User: 周末和朋友一起去看了一部科幻电影。",
    "User: 我很喜欢弹钢琴，每天练习一个小时。",
]


def _archive(store, embedder, *, user_id: str, contents: list[str]) -> None:
    session_id = f"{user_id}-1"
    store.ensure_session(session_id=session_id, user_id=user_id)
    vectors = embedder.embed(contents)
    store.commit_compaction(
        session_id=session_id,
        user_id=user_id,
        turn_ids=[],
        segments=[
            NewSegment(
                first_seq=i + 1,
                last_seq=i + 1,
                content=c,
                tokens=len(c),
                session_date=T0 + timedelta(days=i),
                embedding=v,
            )
            for i, (c, v) in enumerate(zip(contents, vectors, strict=True))
        ],
        summary_content="s",
        summary_items=[],
        summary_first_seq=1,
        summary_last_seq=len(contents),
        summary_tokens=1,
    )


def _by_text(store, embedder, user_id: str, query: str, **kw):
    """Recall's hits for ``query`` that matched by full text, best first."""
    hits = recall_segments(
        store.engine,
        user_id=user_id,
        query_embedding=embedder.embed([query])[0],
        query_text=query,
        limit=10,
        pool=10,
        **kw,
    )
    return sorted((h for h in hits if h.text_rank is not None), key=lambda h: h.text_rank)


@pytest.mark.parametrize(
    ("text_", "terms"),
    [
        pytest.param("猫最近好吗？", ["猫", "最近", "好", "吗"], id="one-character-word-is-a-lexeme"),
        pytest.param(
            "我在中国科学院工作",
            ["我", "在", "中国", "科学", "学院", "科学院", "中国科学院", "工作"],
            id="a-long-word-and-the-words-inside-it",
        ),
        pytest.param("I went to 杭州 in May", ["杭州"], id="only-the-cjk-part"),
        pytest.param("東京タワー", ["東京", "タワ", "ワー"], id="kana-by-bigrams"),
        pytest.param("Nothing Chinese here.", [], id="no-cjk"),
    ],
)
def test_cjk_terms_are_jieba_search_words_and_kana_bigrams(text_, terms):
    assert cjk_terms(text_) == terms


def test_a_one_character_word_finds_its_segment_where_no_character_bigram_does(store, embedder):
    """The query "猫最近好吗？" shares no bigram with the cat segment ("猫最" is not in "一只猫"), only the
    word 猫; its bigram 最近 is in two other segments, so by bigrams those come back instead."""
    query = "猫最近好吗？"
    _archive(store, embedder, user_id="li", contents=[CAT, *OTHERS])

    by_words = _by_text(store, embedder, "li", query)
    assert by_words[0].content == CAT  # 猫 is the rarest matching word

    with store.engine.begin() as conn:
        reindex(conn, method="bigrams", user_id="li")  # the same archive indexed the old way
    by_bigrams = _by_text(store, embedder, "li", query, cjk="bigrams")
    assert CAT not in [h.content for h in by_bigrams]
    assert {h.content for h in by_bigrams} == set(OTHERS[:2])  # the two segments with 最近


def test_a_word_inside_a_longer_word_is_found(store, embedder):
    """jieba alone keeps 中国科学院 as one word; its search mode also indexes 科学院 inside it."""
    _archive(store, embedder, user_id="li", contents=[ACADEMY, *OTHERS])

    found = _by_text(store, embedder, "li", "科学院那边怎么样？")
    assert [h.content for h in found] == [ACADEMY]

    with store.engine.begin() as conn:
        reindex(conn, method="words", user_id="li")
    assert _by_text(store, embedder, "li", "科学院那边怎么样？", cjk="words") == []


def test_the_migration_stores_words_for_existing_chinese_rows_and_keeps_english_rows(store):
    from alembic import command

    from memory.database import _alembic_config, head_revision

    english = "User: I went hiking in the mountains with my sister."
    with store.engine.begin() as conn:
        command.downgrade(_alembic_config(conn, 384), "0011")
        conn.execute(text("INSERT INTO users (id) VALUES ('u')"))
        conn.execute(text("INSERT INTO sessions (id, user_id) VALUES ('s', 'u')"))
        for seq, content in enumerate([ACADEMY, english], start=1):
            conn.execute(
                text(
                    "INSERT INTO archived_segments (user_id, session_id, first_seq, last_seq, content, tokens, "
                    "session_date, embedding) VALUES ('u', 's', :seq, :seq, :c, 10, now(), :e)"
                ),
                {"seq": seq, "c": content, "e": "[" + ",".join(["0.1"] * 384) + "]"},
            )
        before = dict(conn.execute(text("SELECT first_seq, search::text FROM archived_segments")).fetchall())
        assert "'国科'" in before[1]  # generated by bigrams

        command.upgrade(_alembic_config(conn, 384), head_revision())
        after = dict(conn.execute(text("SELECT first_seq, search::text FROM archived_segments")).fetchall())
        generated = conn.execute(
            text(
                "SELECT attgenerated FROM pg_attribute "
                "WHERE attrelid = 'archived_segments'::regclass AND attname = 'search'"
            )
        ).scalar()

    assert "'科学院'" in after[1] and "'中国科学院'" in after[1] and "'国科'" not in after[1]
    assert "'user'" in after[1]  # the English part is still there ("User:")
    assert after[2] == before[2]  # no CJK: the same vector
    assert generated == ""  # a plain column now, written by the store


def test_importing_storage_and_recalling_english_never_loads_jieba():
    probe = (
        "import json, sys\n"
        "import memory.store, memory.recall\n"
        "from memory.fulltext import cjk_terms\n"
        "english = cjk_terms('What did I cook on Sunday?')\n"
        "before = 'jieba' in sys.modules\n"
        "chinese = cjk_terms('我在中国科学院工作')\n"
        "print(json.dumps([before, 'jieba' in sys.modules, english, len(chinese)]))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after, english, chinese = json.loads(done.stdout.strip().splitlines()[-1])
    assert (before, after, english) == (False, True, [])
    assert chinese > 0

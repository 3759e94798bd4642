"""The user's own clock: a turn keeps the UTC offset its time was given with; dates in the memory
block, the summary and /context are shown on the user's day; relative dates are read on their
clock; a profile can carry an IANA time zone."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta, timezone

import pytest

from errors import InvalidFieldError
from memory.store import NewSegment, NewSummary
from tests.test_api import client

SHANGHAI = timezone(timedelta(hours=8))
MORNING = datetime(2023, 5, 20, 7, 30, tzinfo=SHANGHAI)
"""Saturday 07:30 in Shanghai: Friday 23:30 UTC."""


def _archive(store, embedder, *, user_id, session_id, dated):
    store.sessions.ensure(session_id=session_id, user_id=user_id, character_id=store.characters.placeholder("Mira").id)
    vectors = embedder.embed([c for _, c in dated])
    store.compaction.commit(
        session_id=session_id,
        user_id=user_id,
        turn_ids=[],
        segments=[
            NewSegment(first_seq=i + 1, last_seq=i + 1, content=c, tokens=len(c) // 2 + 1, session_date=at, embedding=v)
            for i, ((at, c), v) in enumerate(zip(dated, vectors, strict=True))
        ],
        summary=NewSummary(content="s", items=[], first_seq=1, last_seq=len(dated), tokens=1),
    )


def test_a_turn_keeps_the_offset_its_time_was_given_with(make_engine_for):
    engine = make_engine_for(window=4096)
    result = engine.turn(user_id="mei", session_id="s", message="早上好", reply="早上好！", at=MORNING)
    assert result.user_turn.utc_offset_minutes == 480
    assert result.user_turn.local_created_at().date().isoformat() == "2023-05-20"  # not the UTC 2023-05-19
    naive_now = engine.turn(user_id="mei", session_id="s", message="还在吗", reply="在")
    assert naive_now.user_turn.utc_offset_minutes is None  # the server's clock: no offset of the user's


def test_recalled_memories_are_dated_on_the_users_day_and_yesterday_is_their_yesterday(
    make_engine_for, store, embedder
):
    # Friday 09:00 in Shanghai is Friday 01:00 UTC; Thursday 10:00 in Shanghai is Thursday 02:00 UTC.
    # Asked on Saturday 07:30 in Shanghai (Friday 23:30 UTC), "昨天" is Friday on the user's clock,
    # and would be Thursday on UTC's.
    friday = (datetime(2023, 5, 19, 9, 0, tzinfo=SHANGHAI), "User: 那天早上我出门去了花市。")
    thursday = (datetime(2023, 5, 18, 10, 0, tzinfo=SHANGHAI), "User: 那天早上我出门去了书店。")
    _archive(store, embedder, user_id="mei", session_id="old", dated=[thursday, friday])
    engine = make_engine_for(window=4096)
    engine.turn(user_id="mei", session_id="now", message="早上好", reply="早上好！", at=MORNING)
    context = engine.assemble(user_id="mei", session_id="now", pending="我昨天早上去了哪里？")
    best = max(context.recalled, key=lambda s: (s.score, -s.distance))
    assert best.content == friday[1]
    memory = context.source_text["memory"]
    assert "2023-05-19" in memory and "2023-05-18" in memory  # each dated on the user's day
    assert context.zone.utcoffset(None) == timedelta(hours=8)


def test_a_profile_time_zone_is_the_users_zone(make_engine_for, store, embedder):
    said = datetime(2023, 5, 19, 23, 30, tzinfo=UTC)  # the 19th in UTC, the 19th 19:30 in New York
    _archive(store, embedder, user_id="ana", session_id="old", dated=[(said, "User: I planted tomatoes tonight.")])
    engine = make_engine_for(window=4096)
    engine.set_profile(user_id="ana", time_zone="Asia/Tokyo")  # the 20th 08:30 in Tokyo
    engine.turn(user_id="ana", session_id="now", message="Good morning", reply="Morning!")
    context = engine.assemble(user_id="ana", session_id="now", pending="What did I plant?")
    assert "2023-05-20" in context.source_text["memory"]
    with pytest.raises(InvalidFieldError) as info:
        engine.set_profile(user_id="ana", time_zone="Mars/Olympus_Mons")
    assert (info.value.field, info.value.reason) == ("time_zone", "unknown_time_zone")


def test_summary_quotes_are_dated_on_the_day_the_user_said_them(make_engine_for, store):
    engine = make_engine_for(window=1024)
    base = datetime(2023, 5, 20, 0, 30, tzinfo=SHANGHAI)  # 16:30 UTC the day before
    for i in range(14):
        engine.turn(
            user_id="mei",
            session_id="s",
            message=f"第{i}件事：我今天在公园里看到了很多很多的花，还有人在放风筝，真是美好的一天。" * 2,
            reply="听起来很美好，谢谢你告诉我这些。" * 3,
            at=base + timedelta(minutes=i),
        )
    summary = store.compaction.summary("s")
    assert summary is not None and summary.items
    dates = {item["date"] for item in summary.items if item.get("role") == "user"}
    assert dates == {"2023-05-20"}


def test_the_api_takes_the_time_with_its_offset_and_shows_recalled_dates_on_the_users_clock(api_server, new_app):
    _, key = new_app()
    http = client(api_server, key)
    session = http.post("/v1/sessions", json={"user_id": "mei-api"}).json()
    sent = http.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"content": "早上好", "stream": False, "sent_at": "2023-05-20T07:30:00+08:00"},
    )
    assert sent.status_code == 200, sent.text
    turns = http.get(f"/v1/sessions/{session['id']}/turns").json()
    assert turns[0]["created_at"].startswith("2023-05-19T23:30")  # stored in UTC, its offset kept with it
    naive = http.post(
        f"/v1/sessions/{session['id']}/messages",
        json={"content": "x", "stream": False, "sent_at": "2023-05-20T07:30:00"},
    )
    assert naive.status_code == 422 and "sent_at" in json.dumps(naive.json())
    bad_zone = http.put("/v1/users/mei-api/profile", json={"time_zone": "Nowhere/City"})
    assert bad_zone.status_code == 422 and bad_zone.json()["error"]["param"] == "time_zone"
    ok_zone = http.put("/v1/users/mei-api/profile", json={"time_zone": "Asia/Shanghai"})
    assert ok_zone.json()["time_zone"] == "Asia/Shanghai"
    http.close()


def test_a_replay_file_with_offsets_keeps_them(make_engine_for, tmp_path):
    from runtime.service import load_conversations

    path = tmp_path / "talk.jsonl"
    path.write_text(
        "\n".join(
            json.dumps(line, ensure_ascii=False)
            for line in (
                {"role": "user", "content": "早上好", "timestamp": "2023-05-20T07:30:00+08:00"},
                {"role": "assistant", "content": "早上好！", "timestamp": "2023-05-20T07:30:05+08:00"},
            )
        ),
        encoding="utf-8",
    )
    (conversation,) = load_conversations(path)
    assert conversation.turns[0].at.utcoffset() == timedelta(hours=8)

"""Replay input files: every bad file is a clear error, and nothing is half-written."""

from __future__ import annotations

import json

import pytest

from errors import ConfigurationError, InvalidMessageError
from runtime.service import load_conversations, replay_conversation


def _jsonl(tmp_path, lines, name="conv.jsonl"):
    path = tmp_path / name
    path.write_bytes(b"\n".join(lines))
    return path


GOOD = json.dumps({"role": "user", "content": "hi", "timestamp": "2026-03-01T09:00:00+00:00"}).encode()
REPLY = json.dumps({"role": "assistant", "content": "hello", "timestamp": "2026-03-01T09:00:05+00:00"}).encode()


@pytest.mark.parametrize(
    "lines, words",
    [
        pytest.param(
            [GOOD, b'{"role": "user", "content": "caf\xe9", "timestamp": "2026-03-01T09:01:00"}'],
            "not valid UTF-8",
            id="invalid-utf8",
        ),
        pytest.param(
            [GOOD, b'{"role": "user", "content": null, "timestamp": "2026-03-01T09:01:00"}'],
            "Line 2",
            id="null-content",
        ),
        pytest.param([], "no turns", id="empty-file"),
        pytest.param([GOOD, b"not json"], "Line 2", id="bad-line"),
        pytest.param(
            [b'{"role": "system", "content": "x", "timestamp": "2026-03-01T09:00:00"}'],
            "role must be user or assistant",
            id="system-role",
        ),
    ],
)
def test_bad_jsonl_is_a_clear_error(tmp_path, lines, words):
    with pytest.raises(ConfigurationError, match=words):
        load_conversations(_jsonl(tmp_path, lines))


def test_locomo_file_missing_a_field_is_a_clear_error(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([{"sample_id": "x", "conversation": {"speaker_a": "A"}}]))
    with pytest.raises(ConfigurationError, match="not a well-formed LoCoMo file"):
        load_conversations(path)


def test_a_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ConfigurationError, match="Cannot read"):
        load_conversations(tmp_path)


def test_a_replay_with_a_bad_turn_stores_nothing(tmp_path, make_engine_for, store):
    nul = json.dumps({"role": "user", "content": "bad\u0000turn", "timestamp": "2026-03-01T09:02:00+00:00"}).encode()
    conv = load_conversations(_jsonl(tmp_path, [GOOD, REPLY, nul]))[0]
    with pytest.raises(InvalidMessageError, match="Turn 3") as info:
        replay_conversation(make_engine_for(), conv, run_id="t")
    assert info.value.reason == "nul_byte"
    with store.engine.connect() as conn:
        from sqlalchemy import text

        assert conn.execute(text("SELECT count(*) FROM turns")).scalar() == 0
        assert conn.execute(text("SELECT count(*) FROM sessions")).scalar() == 0


BOM = b"\xef\xbb\xbf"


@pytest.mark.parametrize(
    "prefix, newline",
    [
        pytest.param(BOM, b"\n", id="bom-lf"),
        pytest.param(BOM, b"\r\n", id="bom-crlf"),
        pytest.param(b"", b"\r\n", id="crlf"),
    ],
)
def test_jsonl_with_a_byte_order_mark_or_crlf_loads_every_turn(tmp_path, prefix, newline):
    path = tmp_path / "conv.jsonl"
    path.write_bytes(prefix + newline.join([GOOD, REPLY]) + newline)
    (conversation,) = load_conversations(path)
    assert [(t.role, t.text) for t in conversation.turns] == [("user", "hi"), ("assistant", "hello")]


@pytest.mark.parametrize("newline", [pytest.param("\n", id="lf"), pytest.param("\r\n", id="crlf")])
def test_locomo_file_with_a_byte_order_mark_loads(tmp_path, newline):
    sample = {
        "sample_id": "bom-1",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "Café at noon?"},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Sure."},
            ],
        },
        "qa": [],
    }
    path = tmp_path / "locomo.json"
    path.write_bytes(BOM + json.dumps([sample], ensure_ascii=False, indent=1).replace("\n", newline).encode("utf-8"))
    (conversation,) = load_conversations(path)
    assert [t.text for t in conversation.turns] == ["Café at noon?", "Sure."]
    assert conversation.user_name == "Ana"


@pytest.mark.parametrize("user", [pytest.param("A" * 300, id="over-the-profile-limit"), pytest.param(7, id="a-number")])
def test_a_user_name_that_cannot_be_pinned_still_replays(tmp_path, make_engine_for, user):
    """The replay pins the user's name in their profile, so recall knows whom a question names; a
    name the profile refuses is left out, and the conversation replays as before."""
    sample = {
        "sample_id": "odd-name",
        "conversation": {
            "speaker_a": user,
            "speaker_b": "Bo",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": user, "dia_id": "D1:1", "text": "I went to the harbour today."},
                {"speaker": "Bo", "dia_id": "D1:2", "text": "Lovely, what did you see?"},
            ],
        },
        "qa": [{"question": "Where did they go?", "evidence": ["D1:1"], "category": 4}],
    }
    path = tmp_path / "locomo.json"
    path.write_text(json.dumps([sample]), encoding="utf-8")
    (conversation,) = load_conversations(path)

    report = replay_conversation(make_engine_for(window=1024), conversation, run_id="odd")

    assert conversation.user_name == str(user)
    assert report.turns == 2

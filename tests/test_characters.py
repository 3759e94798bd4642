"""Characters as data: cards in and out, many characters on one server, memory per user and
character, isolation between apps and users, revisions and deletion. A real server on a real
database; the model is the loopback fake."""

from __future__ import annotations

import base64
import io
import json

import httpx
import pytest
from sqlalchemy import text

from memory.apps import Directory
from persona import DEFAULT_PERSONA_FILE, card_data, export_card, export_png, load_persona, persona_from_card, read_card
from runtime.accounting import counter_for
from runtime.context import render_persona
from tests.cards import encode, v2_card, v3_card, write_card_png
from tests.conftest import serve

COUNTER = counter_for("gpt-4o-mini")


def _prompt(persona) -> list[str]:
    """The persona's prompt as a turn renders it: the system message and the post-history one."""
    rendered = render_persona(persona, cap=100_000, counter=COUNTER)
    return [str(rendered.system.content), str(rendered.post_history.content if rendered.post_history else "")]


def _same_persona(a, b) -> bool:
    """Equal but for where each came from and the decorators the first read dropped."""
    from dataclasses import replace

    def norm(p):
        book = replace(p.character_book, ignored_decorators=()) if p.character_book else None
        return replace(p, source="", character_book=book)

    return norm(a) == norm(b)


def _png(card: dict, tmp_path, keyword: str = "chara") -> bytes:
    return write_card_png(tmp_path / "card.png", {keyword: encode(card)}).read_bytes()


# -- cards in and out --------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["v2-json", "v3-json", "v2-png", "v3-png", "toml"])
def test_a_card_exported_and_read_again_gives_the_same_prompt(kind, tmp_path):
    raw = {
        "v2-json": lambda: json.dumps(v2_card()).encode(),
        "v3-json": lambda: json.dumps(v3_card(nickname="Ari")).encode(),
        "v2-png": lambda: _png(v2_card(), tmp_path),
        "v3-png": lambda: _png(v3_card(), tmp_path, "ccv3"),
        "toml": lambda: DEFAULT_PERSONA_FILE.read_bytes(),
    }[kind]()
    first = read_card(raw)
    for spec in ("v2", "v3"):
        again = read_card(json.dumps(export_card(first.data, spec)).encode())
        assert _same_persona(again.persona, first.persona), spec
        assert _prompt(again.persona) == _prompt(first.persona)
    png = export_png(first.data, first.image)
    from PIL import Image

    with Image.open(io.BytesIO(png)) as image:
        chunks = dict(image.text)  # what SillyTavern reads: chara (V2) and ccv3 (V3), base64 JSON
    assert json.loads(base64.b64decode(chunks["chara"]))["spec"] == "chara_card_v2"
    assert json.loads(base64.b64decode(chunks["ccv3"]))["spec"] == "chara_card_v3"
    assert _same_persona(read_card(png).persona, first.persona)


def test_card_data_of_a_persona_reads_back_equal():
    persona = load_persona()
    assert persona_from_card(card_data(persona), kind=persona.source) == persona


# -- one server, three characters, two users ---------------------------------------------
@pytest.fixture
def server(make_engine_for, store):
    engine = make_engine_for(window=1024)
    with serve(engine) as base:
        yield base, engine, Directory(store.engine)


def _client(base: str, key: str) -> httpx.Client:
    return httpx.Client(base_url=base, headers={"Authorization": f"Bearer {key}"}, timeout=60)


def _card(name: str, **extra) -> dict:
    return v2_card(name=name, description=f"{{{{char}}}} is {name}, a friend.", character_book=None, **extra)


def _talk(c: httpx.Client, session_id: str, message: str) -> dict:
    r = c.post(f"/v1/sessions/{session_id}/messages", json={"content": message, "stream": False})
    assert r.status_code == 200, r.text
    return r.json()


def test_three_characters_each_recall_only_their_own_conversations_and_share_the_profile(server, fake_llm):
    base, engine, directory = server
    _, key = directory.create_app("catalogue")
    with _client(base, key) as c:
        ids = {}
        for name in ("Aria", "Bram", "Cleo"):
            r = c.post("/v1/characters", json=_card(name))
            assert r.status_code == 201, r.text
            ids[name] = r.json()["id"]
        for user in ("ana", "ben"):
            assert c.post("/v1/users", json={"id": user}).status_code == 201
            r = c.put(f"/v1/users/{user}/profile", json={"facts": [f"{user} keeps bees on the roof."]})
            assert r.status_code == 200, r.text
        sessions = {}
        for user in ("ana", "ben"):
            for name, character in ids.items():
                r = c.post("/v1/sessions", json={"user_id": user, "character_id": character})
                assert r.status_code == 201, r.text
                assert r.json()["character_id"] == character and r.json()["persona"] == name
                sid = sessions[(user, name)] = r.json()["id"]
                _talk(c, sid, f"Remember this: my locker code for {name} is {user.upper()}-{name.upper()}-4417.")
                for i in range(8):  # enough to roll the code's exchange out of a 1,024-token window
                    _talk(c, sid, f"Filler {i}: " + "the weather was mild and the garden was quiet today. " * 6)
        for (user, name), sid in sessions.items():
            _talk(c, sid, "What is my locker code?")
            prompt = "\n".join(m["content"] for m in fake_llm.requests[-1]["messages"] if isinstance(m["content"], str))
            mine = f"{user.upper()}-{name.upper()}-4417"
            assert mine in prompt, (user, name)
            others = [f"{u.upper()}-{n.upper()}-4417" for (u, n) in sessions if (u, n) != (user, name)]
            assert not [o for o in others if o in prompt], (user, name)
            assert f"{user} keeps bees on the roof." in prompt  # the profile reaches every character
            other_user = "ben" if user == "ana" else "ana"
            assert f"{other_user} keeps bees" not in prompt


def test_memory_scope_user_recalls_across_the_users_characters(make_engine_for, store, fake_llm):
    engine = make_engine_for(window=1024, memory_scope="user")
    directory = Directory(store.engine)
    _, key = directory.create_app("shared-memory")
    with serve(engine) as base, _client(base, key) as c:
        a = c.post("/v1/characters", json=_card("Aria")).json()["id"]
        b = c.post("/v1/characters", json=_card("Bram")).json()["id"]
        first = c.post("/v1/sessions", json={"user_id": "ana", "character_id": a}).json()["id"]
        _talk(c, first, "Remember: my locker code is ANA-SHARED-5521.")
        for i in range(8):
            _talk(c, first, f"Filler {i}: " + "the weather was mild and the garden was quiet today. " * 6)
        second = c.post("/v1/sessions", json={"user_id": "ana", "character_id": b}).json()["id"]
        _talk(c, second, "What is my locker code?")
    prompt = "\n".join(m["content"] for m in fake_llm.requests[-1]["messages"] if isinstance(m["content"], str))
    assert "ANA-SHARED-5521" in prompt


# -- revisions ---------------------------------------------------------------------------
def test_an_edit_is_a_new_revision_that_the_next_turn_uses(server, fake_llm):
    base, _, directory = server
    _, key = directory.create_app("revisions")
    with _client(base, key) as c:
        made = c.post("/v1/characters", json=_card("Aria", system_prompt="You are {{char}}. ALPHA-PROMPT.")).json()
        assert made["revision"] == 1 and made["scope"] == "app"
        sid = c.post("/v1/sessions", json={"user_id": "ana", "character_id": made["id"]}).json()["id"]
        _talk(c, sid, "Hello")
        assert any("ALPHA-PROMPT" in m["content"] for m in fake_llm.requests[-1]["messages"])
        edited = c.put(
            f"/v1/characters/{made['id']}", json=_card("Aria", system_prompt="You are {{char}}. BETA-PROMPT.")
        )
        assert edited.status_code == 200 and edited.json()["revision"] == 2
        _talk(c, sid, "Hello again")
        system = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "system"]
        assert any("BETA-PROMPT" in s for s in system) and not any("ALPHA-PROMPT" in s for s in system)
        turns = c.get(f"/v1/sessions/{sid}/turns").json()
        assert [t["character_revision"] for t in turns] == [1, 1, 1, 2, 2]  # the greeting, then two turns
        shown = c.get(f"/v1/characters/{made['id']}").json()
        assert [r["revision"] for r in shown["revisions"]] == [1, 2]
        old = c.get(f"/v1/characters/{made['id']}/card", params={"format": "v2", "revision": 1})
        assert "ALPHA-PROMPT" in old.json()["data"]["system_prompt"]


# -- a SillyTavern card in and out -------------------------------------------------------
def test_a_sillytavern_png_card_goes_in_is_used_and_comes_out_the_same(server, fake_llm, tmp_path):
    base, _, directory = server
    _, key = directory.create_app("tavern")
    card = v2_card(name="Aria")
    card["data"]["extensions"] = {"talkativeness": "0.5", "depth_prompt": {"prompt": "x", "depth": 4}}
    png = _png(card, tmp_path)
    with _client(base, key) as c:
        r = c.post("/v1/characters", files={"file": ("aria.png", png, "image/png")})
        assert r.status_code == 201, r.text
        made = r.json()
        assert made["has_avatar"] and made["spec"] == "chara_card_v2" and made["lorebook_entries"] >= 1
        sid = c.post("/v1/sessions", json={"user_id": "ana", "character_id": made["id"]}).json()
        assert sid["greeting"]["content"].startswith("Welcome, User.")
        _talk(c, sid["id"], "Tell me about the lamp.")
        prompt = "\n".join(m["content"] for m in fake_llm.requests[-1]["messages"])
        assert "Fresnel lens from 1890" in prompt  # its lorebook fired
        out = c.get(f"/v1/characters/{made['id']}/card", params={"format": "png"})
        assert out.status_code == 200 and out.headers["content-type"] == "image/png"
        back = read_card(out.content)
        assert back.data["extensions"] == card["data"]["extensions"]  # what we do not use is kept
        assert _prompt(back.persona) == _prompt(read_card(png).persona)
        for spec in ("v2", "v3"):
            exported = c.get(f"/v1/characters/{made['id']}/card", params={"format": spec}).json()
            assert exported["spec"] == f"chara_card_{spec}"
            again = c.post("/v1/characters", json=exported)
            assert again.status_code == 201, again.text
        avatar = c.get(f"/v1/characters/{made['id']}/avatar")
        assert avatar.status_code == 200 and avatar.content == png


# -- bad cards ---------------------------------------------------------------------------
def _bad_cards(tmp_path) -> dict[str, tuple[dict, str]]:
    regex = v2_card()
    regex["data"]["character_book"]["entries"][0]["keys"] = ["/([a-z/"]
    return {
        "malformed json": ({"content": b'{"spec": "chara_card_v2", "data": {'}, "json"),
        "png without a card": (
            {"files": {"file": ("x.png", write_card_png(tmp_path / "x.png", {}).read_bytes())}},
            "chara",
        ),
        "huge description": (
            {"content": json.dumps(v2_card(description="x" * 20_000_000)).encode()},
            "data.description",
        ),
        "bad regex key": ({"content": json.dumps(regex).encode()}, "data.character_book.entries[0].keys[0]"),
        "unknown spec": ({"content": json.dumps({"spec": "chara_card_v9", "data": {"name": "X"}}).encode()}, "spec"),
    }


@pytest.mark.parametrize(
    "case", ["malformed json", "png without a card", "huge description", "bad regex key", "unknown spec"]
)
def test_a_bad_card_is_a_422_naming_the_field_and_nothing_is_stored(server, tmp_path, case):
    base, engine, directory = server
    _, key = directory.create_app("bad-cards-" + case.replace(" ", "-"))
    body, field = _bad_cards(tmp_path)[case]
    with engine.store.engine.connect() as conn:
        before = conn.execute(text("SELECT count(*) FROM character_revisions")).scalar()
    with _client(base, key) as c:
        headers = {} if "files" in body else {"Content-Type": "application/json"}
        r = c.post("/v1/characters", headers=headers, **body)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["param"] == field
    with engine.store.engine.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM character_revisions")).scalar() == before


# -- isolation ---------------------------------------------------------------------------
def test_another_apps_or_another_users_character_is_a_404_like_an_unknown_id(server):
    base, _, directory = server
    _, key_a = directory.create_app("iso-a")
    _, key_b = directory.create_app("iso-b")
    with _client(base, key_a) as a, _client(base, key_b) as b:
        shared = a.post("/v1/characters", json=_card("Aria")).json()["id"]
        private = a.post("/v1/characters", params={"user_id": "ana"}, json=_card("Secret")).json()
        assert private["scope"] == "user" and private["user_id"] == "ana"
        mine = private["id"]
        guessed = "ch_" + "0" * 32
        unknown = b.get(f"/v1/characters/{guessed}")
        assert unknown.status_code == 404
        chat = {"user": "eve", "messages": [{"role": "user", "content": "hi"}]}
        for cid in (shared, mine, guessed):  # another app: every route answers as for an unknown id
            for r in (
                b.get(f"/v1/characters/{cid}"),
                b.put(f"/v1/characters/{cid}", json=_card("Taken")),
                b.delete(f"/v1/characters/{cid}"),
                b.get(f"/v1/characters/{cid}/card"),
                b.post("/v1/sessions", json={"user_id": "eve", "character_id": cid}),
                b.post("/v1/chat/completions", json={"model": cid, **chat}),
            ):
                assert r.status_code == 404, (cid, r.text)
                assert r.json()["error"]["code"] == "not_found" and cid in r.json()["error"]["message"]
        # the same app, another user, or no user named: the private character is not there
        assert a.get(f"/v1/characters/{mine}", params={"user_id": "bob"}).status_code == 404
        assert a.get(f"/v1/characters/{mine}").status_code == 404
        assert a.post("/v1/sessions", json={"user_id": "bob", "character_id": mine}).status_code == 404
        assert a.get(f"/v1/characters/{mine}", params={"user_id": "ana"}).status_code == 200
        assert a.post("/v1/sessions", json={"user_id": "ana", "character_id": mine}).status_code == 201
        names = {x["name"] for x in a.get("/v1/characters", params={"user_id": "bob"}).json()["data"]}
        assert "Aria" in names and "Secret" not in names and "Mira" in names
        assert "Aria" not in {x["name"] for x in b.get("/v1/characters").json()["data"]}
        # the deployment's characters are read-only to apps
        default = next(x for x in a.get("/v1/characters").json()["data"] if x["scope"] == "deployment")["id"]
        r = a.put(f"/v1/characters/{default}", json=_card("Mine now"))
        assert r.status_code == 409 and r.json()["error"]["code"] == "character_read_only"


# -- deletion ----------------------------------------------------------------------------
def test_deleting_a_character_with_sessions_is_refused_unless_they_go_too(server):
    base, engine, directory = server
    _, key = directory.create_app("deletion")
    with _client(base, key) as c:
        cid = c.post("/v1/characters", json=_card("Aria")).json()["id"]
        for user in ("ana", "ben"):
            sid = c.post("/v1/sessions", json={"user_id": user, "character_id": cid}).json()["id"]
            _talk(c, sid, "hello")
        r = c.delete(f"/v1/characters/{cid}")
        assert r.status_code == 409 and r.json()["error"]["code"] == "character_in_use"
        assert r.json()["error"]["sessions"] == 2
        assert c.get(f"/v1/characters/{cid}").status_code == 200
        r = c.delete(f"/v1/characters/{cid}", params={"cascade": "true"})
        assert r.status_code == 200 and r.json()["sessions_deleted"] == 2
        assert c.get(f"/v1/characters/{cid}").status_code == 404
    with engine.store.engine.connect() as conn:
        for table in ("characters", "character_revisions", "sessions"):
            column = "id" if table == "characters" else "character_id"
            assert conn.execute(text(f"SELECT count(*) FROM {table} WHERE {column} = :c"), {"c": cid}).scalar() == 0


# -- the OpenAI door -----------------------------------------------------------------------
def test_the_openai_sdk_lists_the_characters_and_talks_with_two_of_them(server, fake_llm):
    from openai import OpenAI

    base, _, directory = server
    _, key = directory.create_app("sdk")
    with _client(base, key) as c:
        ids = {
            n: c.post("/v1/characters", json=_card(n, system_prompt=f"You are {{{{char}}}}. ID-{n}.")).json()["id"]
            for n in ("Aria", "Bram")
        }
    sdk = OpenAI(base_url=f"{base}/v1", api_key=key)
    listed = {m.id for m in sdk.models.list().data}
    assert set(ids.values()) <= listed
    for name, model in (("Aria", ids["Aria"]), ("Bram", "character:Bram")):
        answer = sdk.chat.completions.create(model=model, user="ana", messages=[{"role": "user", "content": "hi"}])
        assert answer.choices[0].message.content
        system = [m["content"] for m in fake_llm.requests[-1]["messages"] if m["role"] == "system"]
        assert any(f"ID-{name}" in s for s in system), name
    with _client(base, key) as c:
        sessions = c.get("/v1/users/ana/sessions").json()
    assert {s["persona"] for s in sessions} == {"Aria", "Bram"}


# -- from Python -------------------------------------------------------------------------
def test_a_turn_names_the_character_a_new_session_talks_as(make_engine_for, store, fake_llm):
    from errors import InvalidFieldError, NotFoundError

    engine = make_engine_for(window=4096)
    aria = engine.characters.add(engine.characters.read(json.dumps(_card("Aria")).encode()))
    bram = engine.characters.add(engine.characters.read(json.dumps(_card("Bram")).encode()))

    engine.turn(user_id="ana", session_id="ana-aria", message="Hi!", character_id=aria.id)
    engine.turn(user_id="ana", session_id="ana-aria", message="Still there?", character_id=aria.id)
    assert store.sessions.get("ana-aria").character_id == aria.id
    system = fake_llm.requests[-1]["messages"][0]["content"]
    assert "You are Aria" in system and "You are Bram" not in system

    turns = len(store.turns.of_session("ana-aria"))
    with pytest.raises(InvalidFieldError) as wrong:
        engine.turn(user_id="ana", session_id="ana-aria", message="Bram?", character_id=bram.id)
    assert wrong.value.field == "character_id" and wrong.value.reason == "other_character"
    assert len(store.turns.of_session("ana-aria")) == turns  # nothing was stored

    with pytest.raises(NotFoundError) as unknown:
        engine.turn(user_id="ana", session_id="ana-nobody", message="Hi!", character_id="ch_missing")
    assert unknown.value.kind == "character"
    assert store.sessions.get("ana-nobody") is None  # no empty session left behind

    engine.turn(user_id="ana", session_id="ana-default", message="Hi!")  # no character: the default one
    assert store.sessions.get("ana-default").character_id not in {aria.id, bram.id}

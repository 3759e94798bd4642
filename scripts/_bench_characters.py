"""``bench_turn.py --characters N``: the turn with many characters in one database.

One database holds ``--catalogue`` characters (default 1,000) of one app, each a V2 card with a
small lorebook. One user talks with the deployment's default character in one session (the
single-character figure) and, in the same rounds, with ``N`` of the catalogue's characters, one
session each, round-robin, so that a busy moment of this machine hits both alike. Each turn is
:meth:`runtime.turn.Engine.turn` with the reply given (as ``bench_turn.py`` measures it), the real
all-MiniLM-L6-v2 embedder and the extractive summarizer.

Printed, in milliseconds: the median and p95 of a turn with the one character and with the ``N``,
their ratio (the goal: within 1.1×), and the first turn with each catalogue character apart (its
card is read and parsed then, once per revision and process), with the SQL statements per turn.
"""

from __future__ import annotations

import json
import statistics
import time
import uuid
from typing import Any

from sqlalchemy import event

ROUNDS = 25


def _card(i: int) -> dict[str, Any]:
    name = f"Character {i:04d}"
    return {
        "name": name,
        "description": f"{{{{char}}}} is {name}, who runs a small bookshop and remembers what {{{{user}}}} reads.",
        "personality": "warm, curious",
        "first_mes": f"Hello, I am {name}.",
        "system_prompt": "You are {{char}}. Stay in character.",
        "character_book": {
            "entries": [
                {
                    "keys": [f"shelf{i}", "poetry"],
                    "content": f"{name} keeps poetry on shelf {i}.",
                    "insertion_order": 1,
                },
                {"keys": ["rain"], "content": "The shop's roof leaks when it rains.", "insertion_order": 2},
            ]
        },
    }


def _pct(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


def run(*, characters: int, catalogue: int, rounds: int, window: int, url: str) -> dict[str, Any]:
    """Measure on the migrated database at ``url``; returns the figures (see the module docstring)."""
    from memory.apps import Directory
    from memory.database import make_engine
    from memory.embeddings import BatchingEmbedder, CachingEmbedder, SentenceTransformerEmbedder
    from memory.store import Store
    from persona import Persona, read_card
    from runtime.config import Settings
    from runtime.turn import Engine

    db = make_engine(url)
    store = Store(db)
    settings = Settings(context_window=window, database_url="unused")
    engine = Engine(
        settings=settings,
        store=store,
        embedder=CachingEmbedder(BatchingEmbedder(SentenceTransformerEmbedder("all-MiniLM-L6-v2"))),
        persona=Persona(name="Mira", system_prompt="You are Mira, a kind companion."),
    )
    app, _ = Directory(db).create_app("bench-characters-" + uuid.uuid4().hex[:6])
    started = time.perf_counter()
    ids = []
    for i in range(catalogue):
        card = read_card(json.dumps({"spec": "chara_card_v2", "spec_version": "2.0", "data": _card(i)}).encode())
        ids.append(engine.characters.add(card, app_id=app.id).id)
    print(f"  {catalogue:,} characters stored ({time.perf_counter() - started:.0f} s)", flush=True)
    user, _ = Directory(db).ensure_user(app.id, "reader")
    single = Directory(db).start_session(user_id=user.id, character_id=engine.cast.default.id).id
    chosen = ids[:: max(1, catalogue // characters)][:characters]
    many = [Directory(db).start_session(user_id=user.id, character_id=c).id for c in chosen]
    statements = [0]

    def count(*_: Any, **__: Any) -> None:
        statements[0] += 1

    event.listen(db, "before_cursor_execute", count)
    texts = [f"Do you have poetry on shelf {i}? It started to rain on my way here, {i} times." for i in range(10_000)]
    engine.turn(user_id=user.id, session_id=single, message="Hello!", reply="Hello!")  # warm: model, plans
    first: list[float] = []
    one: list[float] = []
    several: list[float] = []
    sql: dict[str, list[int]] = {"one": [], "several": []}
    k = 0
    for r in range(rounds):
        for label, session, into in [("one", single, one)] + [("several", s, several) for s in many]:
            k += 1
            before = statements[0]
            t = time.perf_counter()
            engine.turn(user_id=user.id, session_id=session, message=texts[k], reply="Let me look.")
            ms = 1000 * (time.perf_counter() - t)
            (first if r == 0 and label == "several" else into).append(ms)
            sql[label].append(statements[0] - before)
    event.remove(db, "before_cursor_execute", count)
    db.dispose()
    out = {
        "catalogue": catalogue,
        "characters": characters,
        "rounds": rounds,
        "one_median_ms": statistics.median(one),
        "one_p95_ms": _pct(one, 95),
        "several_median_ms": statistics.median(several),
        "several_p95_ms": _pct(several, 95),
        "first_turn_median_ms": statistics.median(first),
        "statements_one": statistics.median(sql["one"]),
        "statements_several": statistics.median(sql["several"]),
    }
    out["median_ratio"] = out["several_median_ms"] / out["one_median_ms"]
    out["p95_ratio"] = out["several_p95_ms"] / out["one_p95_ms"]
    return out


def report(out: dict[str, Any]) -> None:
    print(
        f"characters: {out['characters']} of {out['catalogue']:,} in the database, {out['rounds']} rounds\n"
        f"  one character:   median {out['one_median_ms']:.1f} ms, p95 {out['one_p95_ms']:.1f} ms, "
        f"{out['statements_one']:.0f} statements\n"
        f"  {out['characters']} characters:    median {out['several_median_ms']:.1f} ms, "
        f"p95 {out['several_p95_ms']:.1f} ms, {out['statements_several']:.0f} statements\n"
        f"  ratio:           median {out['median_ratio']:.2f}x, p95 {out['p95_ratio']:.2f}x (goal: within 1.10x)\n"
        f"  first turn with each character (its card parsed): median {out['first_turn_median_ms']:.1f} ms"
    )

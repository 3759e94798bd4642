"""A server for the context-view tests: an engine whose persona has a lorebook, a
1,024-token window so that turns roll out into the archive, and a helper that fills a
session with dated turns (replies given, no model call) until recall has something to find."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memory.apps import Directory
from memory.tables import User
from persona import Lorebook, LoreEntry, Persona
from runtime.config import Settings
from runtime.llm import LiteLLMReplier
from runtime.turn import Engine
from tests.conftest import serve

WINDOW = 1024

LORE = Persona(
    name="Mira",
    system_prompt="You are Mira, a kind companion.",
    character_book=Lorebook(
        entries=(
            LoreEntry(
                name="The old lighthouse",
                keys=("beacon", "lighthouse"),
                content="The lighthouse on the cape is closed.",
            ),
            LoreEntry(name="Never fires", keys=("submarine",), content="Unused."),
        )
    ),
)

TOPICS = [
    "my sister Ines moved to Lisbon for her new job at the aquarium",
    "I adopted a grey cat called Pistachio from the shelter last spring",
    "work has been busy, we are shipping the new billing system soon",
    "I started learning the cello, the teacher is very patient with me",
    "we went hiking near the waterfall and it rained the whole afternoon",
    "I tried baking sourdough bread but the crust came out far too hard",
    "my neighbour plays loud jazz every night until two in the morning",
    "I finally finished reading that long novel about the polar expedition",
]


@pytest.fixture
def lore_server(db_url, embedder, fake_llm, tmp_path):
    """``(base_url, key, engine)`` of a server whose engine has the lorebook persona and a 1,024-token window."""
    from memory.database import make_engine
    from memory.store import Store
    from runtime.files import open_file_services

    settings = Settings(context_window=WINDOW, database_url=db_url, files_dir=tmp_path / "files")
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    store = Store(make_engine(db_url))
    services = open_file_services(settings, store.engine)
    engine = Engine(
        settings=settings, store=store, embedder=embedder, persona=LORE, replier=replier, file_services=services
    )
    _, key = Directory(store.engine).create_app("playground-test")
    with serve(engine) as base:
        yield base, key, engine
    services.close()
    store.engine.dispose()


def fill_archive(engine: Engine, key: str, session_id: str) -> User:
    """Three rounds of :data:`TOPICS` in the app's session, dated 1 May 2024, then a message naming
    the cat and the lighthouse (recall and the lorebook both fire on it); returns the session's user."""
    directory = Directory(engine.store.engine)
    _, user = directory.session(directory.app_for_key(key).id, session_id)
    at = datetime(2024, 5, 1, tzinfo=UTC)
    for i in range(3):
        for j, topic in enumerate(TOPICS):
            at += timedelta(minutes=5)
            engine.turn(
                user_id=user.id,
                session_id=session_id,
                message=f"Day {i}: {topic}.",
                at=at,
                reply=f"That sounds like a lot, tell me more about it ({i}.{j}).",
            )
    engine.turn(
        user_id=user.id,
        session_id=session_id,
        message="Remember Pistachio? We walked to the lighthouse.",
        at=at + timedelta(minutes=5),
        reply="I do!",
    )
    return user

"""Fixtures for the attachment tests: an engine with the file services on
the test database, files stored and parsed by the real parsers, the model faked at HTTP."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from memory.files import FileStore
from runtime.config import Settings
from runtime.files import ParseService, open_file_services
from runtime.llm import LiteLLMReplier
from runtime.turn import Engine
from tests.conftest import PERSONA, estimate_as_we_do


@dataclass
class FilesEnv:
    build: Callable[..., Engine]
    """``build(**settings overrides) -> Engine`` with the file services."""
    files: FileStore
    parses: ParseService

    def upload(self, user_id: str, name: str, data: bytes, *, parse: bool = True, **kwargs: Any) -> str:
        """Store ``data`` for ``user_id``; parse it now unless ``parse`` is False. Returns the id."""
        stored = self.files.add(user_id=user_id, name=name, data=data, **kwargs)
        if parse:
            assert self.parses.wait(stored.id, 30) in ("ready", "empty", "needs_ocr", "failed")
        return stored.id


@pytest.fixture
def files_env(store, embedder, fake_llm, tmp_path):
    # the server is shared by the whole run: a reported usage another test left would calibrate these turns
    fake_llm.prompt_tokens, fake_llm.stream_delay = estimate_as_we_do, 0.0
    settings = Settings(database_url="unused", files_dir=tmp_path / "files")
    services = open_file_services(settings, store.engine)

    def build(**overrides: Any) -> Engine:
        replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
        return Engine(
            settings=settings.model_copy(update=overrides),
            store=store,
            embedder=embedder,
            persona=PERSONA,
            replier=replier,
            file_services=services,
        )

    yield FilesEnv(build=build, files=services.files, parses=services.parses)
    services.close()


def user_texts(request: dict[str, Any]) -> list[str]:
    """The contents of the user messages of one recorded request."""
    return [m.get("content") or "" for m in request["messages"] if m.get("role") == "user"]


def all_text(messages: list[dict[str, Any]]) -> str:
    """Every message's text content, joined (tool results and call arguments included)."""
    parts = []
    for m in messages:
        parts.append(str(m.get("content") or ""))
        for call in m.get("tool_calls") or []:
            parts.append(str(call.get("function", {}).get("arguments", "")))
    return "\n".join(parts)

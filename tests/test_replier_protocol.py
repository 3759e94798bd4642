"""The Replier protocol states what the engine uses: ``model``, and ``tools`` on ``reply``.
A replier written to the protocol alone runs a turn that carries a file."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any, get_type_hints

from runtime.llm import Replier, Reply, Tools
from runtime.messages import StablePrefix
from runtime.turn import Engine
from tests import file_fixtures as ff
from tests.attachment_env import files_env  # noqa: F401  (fixture)


class MinimalReplier:
    """Exactly what :class:`Replier` states, nothing more: an echo of the last user message."""

    model = "openai/minimal"

    def __init__(self) -> None:
        self.offered: list[Tools | None] = []

    def reply(
        self,
        messages: Sequence[dict[str, Any]],
        *,
        session_id: str,
        on_delta: Callable[[str], None] | None = None,
        tools: Tools | None = None,
        stable: StablePrefix | None = None,
    ) -> Reply:
        self.offered.append(tools)
        text = f"I read {len(messages)} messages."
        if on_delta is not None:
            on_delta(text)
        return Reply(content=text)


def test_the_protocol_states_model_and_the_tools_the_engine_passes():
    assert "model" in get_type_hints(Replier)
    stated = inspect.signature(Replier.reply).parameters
    assert "tools" in stated and stated["tools"].kind is inspect.Parameter.KEYWORD_ONLY
    assert list(stated) == list(inspect.signature(MinimalReplier.reply).parameters)


def test_a_replier_written_to_the_protocol_answers_a_turn_with_a_file(files_env):  # noqa: F811
    built = files_env.build()
    replier = MinimalReplier()
    replier_typed: Replier = replier  # a type checker holds MinimalReplier to the protocol here
    engine = Engine(
        settings=built.settings,
        store=built.store,
        embedder=built.embedder,
        persona=built.persona,
        replier=replier_typed,
        file_services=built.file_services,
    )
    pdf = files_env.upload("u1", "book.pdf", ff.book_pdf())
    result = engine.turn(user_id="u1", session_id="s1", message="Here is my book", attachments=[pdf])
    assert result.assistant_turn.content.startswith("I read ")
    [tools] = replier.offered
    assert tools is not None and tools.specs[0]["function"]["name"] == "file_read"

"""The ``file_read`` function tool as the model is offered it, and how its calls run.

The schema is the issue's signature, ``file_read(file_id, start_page?, max_pages?, focus?)``;
its description is ``prompts/tool_file_read.txt``. A call runs through
:class:`runtime.files.FileReader` (bounded window, readiness wait) as the turn's user,
so a model can never read another user's file: a missing or foreign id fails at once and
the error text is the tool result. Results are capped by the trim rules
(:func:`runtime.context.fit_messages` with ``tool_result_cap`` and ``tool_results_cap``) so a
follow-up request still fits the window.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from prompts import render
from runtime.accounting import TokenCounter
from runtime.context import fit_messages
from runtime.files._file_read import FileReader
from runtime.llm import Tools

TOOL_NAME = "file_read"

MIN_RESULT_TOKENS = 256
"""A tool result is never capped below this many tokens (a window with a header and a hint to read on)."""


def file_read_spec(*, max_pages: int, max_chars: int) -> dict[str, Any]:
    """The OpenAI-format schema of ``file_read`` (``max_pages`` pages, ``max_chars`` characters per window)."""
    return {
        "type": "function",
        "function": {
            "name": TOOL_NAME,
            "description": render("tool_file_read", max_pages=max_pages, max_chars=f"{max_chars:,}"),
            "parameters": {
                "type": "object",
                "properties": {
                    "file_id": {"type": "string", "description": "The file id, e.g. file_0123456789abcdef0123."},
                    "start_page": {
                        "type": "integer",
                        "minimum": 1,
                        "description": "First page to return (1-based). Give 1 to see the front matter or table of contents.",
                    },
                    "max_pages": {
                        "type": "integer",
                        "minimum": 1,
                        "maximum": max_pages,
                        "description": f"Most pages to return (at most {max_pages}).",
                    },
                    "focus": {
                        "type": "string",
                        "description": "A keyword: returns a window around the first page that contains it.",
                    },
                },
                "required": ["file_id"],
                "additionalProperties": False,
            },
        },
    }


def spec_tokens(spec: dict[str, Any], counter: TokenCounter) -> int:
    """Tokens the schema adds to a request (its JSON text; providers render it about as long)."""
    return counter.count_text(json.dumps(spec, ensure_ascii=False))


def file_tools(
    reader: FileReader,
    *,
    user_id: str,
    session_id: str,
    spec: dict[str, Any],
    counter: TokenCounter,
    limit: int,
    result_cap: int,
    max_rounds: int,
) -> Tools:
    """``file_read`` for one reply of ``user_id`` in ``session_id`` (another session's ephemeral ids are not found).

    Args:
        spec: :func:`file_read_spec`.
        limit: tokens a follow-up request's messages may take (window minus reply reserve,
            schema and provider overhead).
        result_cap: tokens all results of one tool round may take (never below
            :data:`MIN_RESULT_TOKENS`); one result gets the same cap.
        max_rounds: most tool rounds (``COMPANION_TOOL_ROUNDS``).
    """

    def run(name: str, arguments: dict[str, Any]) -> str:
        # the reader checks the arguments (FileInputError) before any wait
        file_id: Any = arguments.get("file_id")  # the model's JSON value; the reader checks it
        return reader.file_read(
            file_id,
            user_id,
            start_page=arguments.get("start_page"),
            max_pages=arguments.get("max_pages"),
            focus=arguments.get("focus"),
            session_id=session_id,
        )

    cap = max(MIN_RESULT_TOKENS, result_cap)

    def fit(messages: list[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
        return list(
            fit_messages(messages, limit=limit, counter=counter, tool_result_cap=cap, tool_results_cap=cap).messages
        )

    return Tools(specs=[spec], run=run, max_rounds=max_rounds, fit=fit)

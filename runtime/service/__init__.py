"""On top of the engine: bootstrap (open an engine on a database), the job queue (compaction
jobs and their workers), the close job and replay.

The HTTP API is the subpackage :mod:`runtime.service.api`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from runtime.service._bootstrap import api_embedder, open_embedder, open_engine, settings_for_model
    from runtime.service._database import Database, connect, supervise
    from runtime.service._jobs import close_idle_sessions, run_scheduler
    from runtime.service._parse_jobs import QueuedParses
    from runtime.service._queue import BLUEPRINTS, QueuedCompaction, QueueWorker, build_app, drain
    from runtime.service._replay import (
        CATEGORIES,
        Conversation,
        load_conversations,
        replay_conversation,
        user_turn_coverage,
    )

_HOMES = {
    "_bootstrap": ("api_embedder", "open_embedder", "open_engine", "settings_for_model"),
    "_database": ("Database", "connect", "supervise"),
    "_jobs": ("close_idle_sessions", "run_scheduler"),
    "_parse_jobs": ("QueuedParses",),
    "_queue": ("BLUEPRINTS", "QueuedCompaction", "QueueWorker", "build_app", "drain"),
    "_replay": ("CATEGORIES", "Conversation", "load_conversations", "replay_conversation", "user_turn_coverage"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> Any:
    """Each public name is imported from its module on first use (PEP 562), so a command that
    only connects (``breaker show``) does not import the engine's parts, the job queue,
    procrastinate or replay."""
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


__all__ = [
    "BLUEPRINTS",
    "CATEGORIES",
    "Conversation",
    "Database",
    "QueueWorker",
    "QueuedCompaction",
    "QueuedParses",
    "build_app",
    "close_idle_sessions",
    "connect",
    "supervise",
    "drain",
    "load_conversations",
    "api_embedder",
    "open_embedder",
    "open_engine",
    "replay_conversation",
    "run_scheduler",
    "settings_for_model",
    "user_turn_coverage",
]

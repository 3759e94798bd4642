"""On top of the engine: bootstrap (open an engine on a database), the close job and replay.

The HTTP API is the subpackage :mod:`runtime.service.api`.
"""

from runtime.service._bootstrap import Database, connect, open_embedder, open_engine, settings_for_model
from runtime.service._jobs import close_idle_sessions, run_scheduler
from runtime.service._replay import (
    CATEGORIES,
    Conversation,
    load_conversations,
    replay_conversation,
    user_turn_coverage,
)

__all__ = [
    "CATEGORIES",
    "Conversation",
    "Database",
    "close_idle_sessions",
    "connect",
    "load_conversations",
    "open_embedder",
    "open_engine",
    "replay_conversation",
    "run_scheduler",
    "settings_for_model",
    "user_turn_coverage",
]

"""On top of the engine: bootstrap (open an engine on a database), the job queue (compaction
jobs and their workers), the close job and replay.

The HTTP API is the subpackage :mod:`runtime.service.api`.
"""

from runtime.service._bootstrap import Database, connect, open_embedder, open_engine, settings_for_model
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
    "drain",
    "load_conversations",
    "open_embedder",
    "open_engine",
    "replay_conversation",
    "run_scheduler",
    "settings_for_model",
    "user_turn_coverage",
]

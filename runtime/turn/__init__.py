"""The turn: the only place that combines accounting, context, persona, storage and the model.

:class:`Engine` is the facade; :class:`TurnRunner` writes turns, :class:`ContextGatherer` reads
what a reply needs and assembles it, and :class:`TurnExtension` implementations (attachments,
images) add to every turn at the same points.
"""

from runtime.turn._attachments import AttachmentsExtension, check_attachments
from runtime.turn._backfill import Backfiller, BackfillScheduler, InlineBackfill
from runtime.turn._character_ops import AVATAR_TYPES, EXPORT_FORMATS, CharacterOps, Exported, scope_of
from runtime.turn._characters import Cast, SessionCharacter
from runtime.turn._claims import TurnClaim
from runtime.turn._compaction import CompactionRequest, CompactionScheduler, CompactNow, Due, InlineCompaction
from runtime.turn._engine import Engine
from runtime.turn._extensions import Gathered, TurnExtension
from runtime.turn._gather import ContextGatherer
from runtime.turn._images import TurnImages
from runtime.turn._memory_ops import Memory, MemoryOps, memory_id, segment_number
from runtime.turn._runner import TurnRunner
from runtime.turn._user_ops import Erased, UserOps
from runtime.turn._validate import validate_message
from runtime.turn._values import TurnResult

__all__ = [
    "BackfillScheduler",
    "Backfiller",
    "InlineBackfill",
    "AVATAR_TYPES",
    "EXPORT_FORMATS",
    "Erased",
    "Memory",
    "MemoryOps",
    "memory_id",
    "segment_number",
    "UserOps",
    "AttachmentsExtension",
    "Cast",
    "CharacterOps",
    "Exported",
    "SessionCharacter",
    "scope_of",
    "CompactNow",
    "CompactionRequest",
    "CompactionScheduler",
    "Due",
    "ContextGatherer",
    "Engine",
    "Gathered",
    "InlineCompaction",
    "TurnClaim",
    "TurnExtension",
    "TurnImages",
    "TurnResult",
    "TurnRunner",
    "check_attachments",
    "validate_message",
]

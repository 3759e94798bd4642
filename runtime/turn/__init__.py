"""The turn: the engine, the only place that combines accounting, context, persona, storage and the model.
"""

from runtime.turn._attachments import check_attachments
from runtime.turn._engine import Engine, TurnResult
from runtime.turn._validate import validate_message

__all__ = ['Engine', 'TurnResult', 'check_attachments', 'validate_message']

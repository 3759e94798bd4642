"""Turn extensions: one protocol for what attachments and images add to a turn.

The engine holds a list of extensions and calls each, in order, at the same points of
every turn and of every assembly, the overflow retry included:

1. :meth:`TurnExtension.stored`: after the user turn is stored with its files (start work
   the first reply will need, such as parsing);
2. :meth:`TurnExtension.prepare`: before a model reply (side work that writes caches,
   such as transcribing new images);
3. :meth:`TurnExtension.gather`: a read, before assembly: add blocks to turns, reserve
   tokens for what the messages will carry beyond text (pixels, tool schemas);
4. :meth:`TurnExtension.finish`: after assembly, rewrite the messages within what was
   reserved (image parts);
5. :meth:`TurnExtension.tools`: the function tools a reply to that context is offered.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from memory.files import StoredFile
from memory.tables import Turn
from runtime.context import AssembledContext, AttachedFile, TurnBlocks
from runtime.llm import Tools


@dataclass(frozen=True, kw_only=True)
class Gathered:
    """What the extensions add to a session's recent window before assembly."""

    turns: list[Turn]
    """The recent turns (state ``context``), oldest first; an extension may rewrite their text."""
    blocks: dict[int, TurnBlocks] = field(default_factory=dict)
    """User turn seq -> its attachment blocks (documents and images)."""
    earlier: list[AttachedFile] = field(default_factory=list)
    """Files of rolled-out turns not shown in ``blocks``, oldest first."""
    images: dict[int, list[AttachedFile]] = field(default_factory=dict)
    """Turn seq -> its image files (user and assistant turns), which ``blocks`` does not yet hold."""
    reserved_tokens: int = 0
    """Tokens reserved out of the room for ``recent`` for what the request carries beyond the
    messages' text: tool schemas, image pixels."""
    plans: dict[str, object] = field(default_factory=dict)
    """Extension name -> what its :meth:`TurnExtension.finish` needs from its ``gather``."""
    files: bool = True
    """Whether any turn of the session carries a file; ``False`` lets an extension skip reading
    the session's files (:attr:`memory.store.SessionReads.has_files`)."""


class TurnExtension(Protocol):
    """What an extension adds to turns (see the module docstring for when each is called)."""

    name: str
    """A stable name; the key of this extension's entry in :attr:`Gathered.plans`."""

    def stored(self, attached: Sequence[StoredFile]) -> None:
        """The user turn was stored carrying ``attached`` files."""
        ...

    def prepare(self, *, session_id: str) -> None:
        """A model reply is about to be asked for the session's newest user turn."""
        ...

    def gather(self, gathered: Gathered, *, user_id: str, session_id: str) -> Gathered:
        """``gathered`` with this extension's blocks and reservations added. A read."""
        ...

    def finish(self, context: AssembledContext, gathered: Gathered) -> AssembledContext:
        """The assembled context with this extension's parts in its messages."""
        ...

    def tools(
        self, tools: Tools | None, context: AssembledContext, *, user_id: str, session_id: str, window: int
    ) -> Tools | None:
        """``tools`` as offered to a reply to ``context`` in a ``window``-token window (``None``: none)."""
        ...

    def request_tokens(self, context: AssembledContext) -> int:
        """Tokens this extension adds to the request beyond ``context.messages`` (tool schemas), for
        the stored request estimate that calibration compares with the provider's usage."""
        ...

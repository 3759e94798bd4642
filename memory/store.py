"""The store: one holder of the storage rooms, each the only writer of its tables' SQL.

=================  =====================================  ==========================================
attribute          room                                   tables it writes
=================  =====================================  ==========================================
``sessions``       :class:`memory.sessions.Sessions`      ``sessions`` (and a new session's ``users``
                                                          and ``compaction_state`` rows)
``turns``          :class:`memory.turns.Turns`            ``turns``, ``turn_vectors``, ``turn_files``
``compaction``     :class:`memory.compaction.Compactions` ``summaries``, ``compaction_state``
``archive``        :class:`memory.segments.Archive`       ``archived_segments`` (recall reads it)
``assembly``       :class:`memory.assembly.AssemblyReads` none: the one-statement read of assembly
``profiles``       :class:`memory.profiles.Profiles`      ``user_profiles``, ``learned_facts``
``knowledge``      :class:`memory.knowledge.Knowledge`    ``knowledge_chunks``
``transcripts``    :class:`memory.images.Transcripts`     ``image_transcripts``
``apps``           :class:`memory.apps.Directory`         ``apps``, app-scoped ``users`` and sessions
``characters``     :class:`memory.characters.Characters`  ``characters``, ``character_revisions``,
                                                          ``character_avatars``
``erasure``        :class:`memory.erasure.Erasure`        ``users.erasing_at``; at an erasure's end the
                                                          user's last rows and queue jobs
``memories``       :class:`memory.memories.Memories`      forgetting: segments, turns, summaries and
                                                          learned facts, in one transaction
``backfill``       :class:`memory.backfill.Backfill`      the ``turn_vectors`` rows and archive keys the
                                                          embedder could not make in time, only while
                                                          the database records its model
=================  =====================================  ==========================================

Files and their blobs are :class:`memory.files.FileStore`'s, made with a blob store
(``runtime.files``). Reads never change state; every write is one transaction. The runtime is
handed the store and its rooms, never the SQLAlchemy engine behind them.
"""

from __future__ import annotations

from sqlalchemy import Engine, text

from errors import StorageError
from memory import compaction, segments, turns
from memory.apps import Directory
from memory.assembly import AssemblyReads, SessionReads
from memory.backfill import Backfill
from memory.characters import Characters
from memory.compaction import DEFAULT_LOCK_SLOTS, LOCK_SLOT_WAIT, Compactions, NewSummary, compaction_lock_key
from memory.database import send_binary_vectors, storage_errors
from memory.erasure import Erasure
from memory.images import Transcripts
from memory.knowledge import Knowledge
from memory.memories import Memories
from memory.profiles import Profiles
from memory.segments import SEGMENT_ROWS, Archive, NewSegment
from memory.sessions import ClaimedSession, Sessions
from memory.turns import RecallTail, RequestRecord, TurnFile, Turns

__all__ = [
    "DEFAULT_LOCK_SLOTS",
    "LOCK_SLOT_WAIT",
    "SEGMENT_ROWS",
    "ClaimedSession",
    "NewSegment",
    "NewSummary",
    "RecallTail",
    "RequestRecord",
    "SessionReads",
    "Store",
    "TurnFile",
    "compaction_lock_key",
]


class Store:
    """The storage rooms on one database.

    Args:
        engine: the runtime's engine (its pool serves every read and write); its connections
            are made to send vectors in binary (:func:`memory.database.send_binary_vectors`)
            if :func:`memory.database.make_engine` did not make it.
        lock_slots: session-level advisory locks held at once by the compaction room, each on its
            own connection outside ``engine``'s pool; ``None``: :data:`DEFAULT_LOCK_SLOTS`.
    """

    def __init__(self, engine: Engine, *, lock_slots: int | None = None) -> None:
        send_binary_vectors(engine)  # an engine not made by make_engine: its vectors too
        self.engine = engine
        """The engine behind the rooms: for ``memory``'s own use and the tests, never the runtime's."""
        self.sessions = Sessions(engine)
        self.turns = Turns(engine)
        self.compaction = Compactions(engine, lock_slots=lock_slots)
        self.archive = Archive(engine)
        self.assembly = AssemblyReads(engine)
        self.profiles = Profiles(engine)
        self.knowledge = Knowledge(engine)
        self.transcripts = Transcripts(engine)
        self.apps = Directory(engine)
        self.characters = Characters(engine)
        self.erasure = Erasure(engine)
        self.memories = Memories(engine)
        self.backfill = Backfill(engine)
        # a session's deletion: each room deletes its own rows, in this order, in one transaction
        self.sessions.session_rows.extend(
            [
                segments.delete_session_rows,
                compaction.delete_session_rows,
                turns.delete_session_rows,
            ]
        )

    def ready(self) -> bool:
        """Whether the database answers a trivial statement now (a readiness probe: never raises)."""
        try:
            with storage_errors(), self.engine.connect() as conn:
                conn.execute(text("SELECT 1"))
        except StorageError:
            return False
        return True

    def conninfo(self) -> str:
        """A libpq connection string for this store's database (password included), for a
        library that opens its own connections to it (the job queue)."""
        return self.engine.url.set(drivername="postgresql").render_as_string(hide_password=False)

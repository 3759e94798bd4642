"""Context assembly: the prompt the next reply gets, built within per-source budgets.

Pure: takes values, never storage rows; imports nothing from ``memory``.
"""

from runtime.context._assemble import (
    CONTEXT_LAYOUT,
    AssembledContext,
    ContextInputs,
    Layout,
    Section,
    assemble_context,
)
from runtime.context._attachments import (
    AttachedFile,
    compact_block,
    first_turn_block,
    folded_block,
    is_image_mime,
    is_placeholder,
    is_text_mime,
    placeholder,
    placeholder_file_id,
    placeholder_ids,
    safe_name,
    strip_placeholders,
)
from runtime.context._clock import local_date, user_zone
from runtime.context._image_markers import TRANSCRIPT_MARKERS, dedupe, marker, render_transcript, split_transcripts
from runtime.context._lorebook import Scan, key_matches, match_entries, scan_text
from runtime.context._persona import DEFAULT_USER_NAME, macro_context, render_persona
from runtime.context._pieces import TurnBlocks
from runtime.context._profile import render_profile, summary_profile_facts
from runtime.context._query_text import enrich_query, enrichment, named_speaker, without_names
from runtime.context._retrieval import RetrievalItem, fit_retrieval, insert_at_depth, retrieval_items
from runtime.context._stable_recall import (
    BACKGROUND_MESSAGES,
    FrozenTail,
    RecallSplit,
    StableRecall,
    split_recall,
    topic_background,
)
from runtime.context._trim import fit_messages
from runtime.context._values import KnowledgeItem, PinnedProfile, RecalledItem, RecentTurn, SummaryText

__all__ = [
    "local_date",
    "user_zone",
    "enrich_query",
    "enrichment",
    "named_speaker",
    "without_names",
    "AssembledContext",
    "CONTEXT_LAYOUT",
    "Layout",
    "RecallSplit",
    "FrozenTail",
    "StableRecall",
    "split_recall",
    "topic_background",
    "BACKGROUND_MESSAGES",
    "ContextInputs",
    "Section",
    "Scan",
    "insert_at_depth",
    "macro_context",
    "KnowledgeItem",
    "PinnedProfile",
    "RecalledItem",
    "RecentTurn",
    "SummaryText",
    "AttachedFile",
    "DEFAULT_USER_NAME",
    "RetrievalItem",
    "TRANSCRIPT_MARKERS",
    "TurnBlocks",
    "assemble_context",
    "compact_block",
    "dedupe",
    "first_turn_block",
    "fit_messages",
    "fit_retrieval",
    "folded_block",
    "is_image_mime",
    "is_placeholder",
    "is_text_mime",
    "key_matches",
    "marker",
    "match_entries",
    "placeholder",
    "placeholder_file_id",
    "placeholder_ids",
    "render_persona",
    "render_profile",
    "render_transcript",
    "retrieval_items",
    "safe_name",
    "scan_text",
    "split_transcripts",
    "strip_placeholders",
    "summary_profile_facts",
]

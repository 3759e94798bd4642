"""Compaction: rolling whole exchanges out of the recent window into the archive and the summary,
behind the circuit breaker; the summarizers.
"""

from runtime.compaction._compactor import CompactionOutcome, Compactor, exchanges, plan_rollout, reset_breaker
from runtime.compaction._model_summarizer import LiteLLMSummarizer, map_summarizer_error, summarizer_for
from runtime.compaction._summarizers import ExtractiveSummarizer, Summarizer, render_summary

__all__ = [
    "render_summary",
    "CompactionOutcome",
    "Compactor",
    "ExtractiveSummarizer",
    "LiteLLMSummarizer",
    "Summarizer",
    "exchanges",
    "map_summarizer_error",
    "plan_rollout",
    "reset_breaker",
    "summarizer_for",
]

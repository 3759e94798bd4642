"""Token budgets: one cap per prompt source, a reply reserve, and the window over them all.

All numbers are tokens. The defaults (persona 4000, memory 2000, retrieval 3000,
summary 2000, recent 12000, reply reserve 1000) are this project's design
figures, not borrowed from elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace

from errors import ConfigurationError

SOURCES: tuple[str, ...] = ("persona", "memory", "retrieval", "summary", "recent")
"""Prompt sources, in the order they appear in the assembled context."""


@dataclass(frozen=True, kw_only=True)
class Budgets:
    """Per-source token caps and the reply reserve. Construct with :meth:`create`.

    The context window these budgets fill is ``total`` tokens: the sum of the five
    source caps plus ``reply_reserve``.
    """

    persona: int = 4000
    """Tokens for the character (system prompt and card). Never squeezed by other sources."""
    memory: int = 2000
    """Tokens for recalled archive segments and pinned user facts."""
    retrieval: int = 3000
    """Tokens for knowledge-base and lorebook hits."""
    summary: int = 2000
    """Tokens for the session's one rolling summary."""
    recent: int = 12000
    """Tokens for the raw recent turns, the current user message included."""
    reply_reserve: int = 1000
    """Tokens kept free for the model's reply."""

    @classmethod
    def create(cls, **values: int) -> Budgets:
        """Build budgets, checking every value.

        Args:
            **values: any of ``persona``, ``memory``, ``retrieval``, ``summary``,
                ``recent``, ``reply_reserve``, in tokens; missing ones take the defaults.

        Raises:
            ConfigurationError: an unknown name, a non-integer, a negative cap, or a
                ``recent`` or ``reply_reserve`` below 1 token.
        """
        known = {f.name for f in fields(cls)}
        for name, value in values.items():
            if name not in known:
                raise ConfigurationError(f"Unknown budget {name!r}; the budgets are {sorted(known)}.", setting=name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigurationError(
                    f"Budget {name!r} must be a whole number of tokens, got {value!r}.", setting=name
                )
            if value < 0:
                raise ConfigurationError(f"Budget {name!r} must be >= 0 tokens, got {value}.", setting=name)
        budgets = cls(**values)
        for name in ("recent", "reply_reserve"):
            if getattr(budgets, name) < 1:
                raise ConfigurationError(
                    f"Budget {name!r} must be at least 1 token, got {getattr(budgets, name)}.",
                    setting=name,
                )
        return budgets

    @property
    def total(self) -> int:
        """The context window these budgets fill, in tokens (sources plus reply reserve)."""
        return sum(self.cap(s) for s in SOURCES) + self.reply_reserve

    def cap(self, source: str) -> int:
        """The cap of one source, in tokens. Raises ``ConfigurationError`` for an unknown source."""
        if source not in SOURCES:
            raise ConfigurationError(f"Unknown prompt source {source!r}; sources are {SOURCES}.")
        return int(getattr(self, source))

    def scaled_to(self, window: int) -> Budgets:
        """Scale every cap in proportion so that ``total`` equals ``window`` tokens.

        Each cap is rounded down, and what rounding leaves over goes to ``recent``,
        so the result's ``total`` is exactly ``window``.

        Raises:
            ConfigurationError: ``window`` is below 256 tokens, too small for any prompt.
        """
        if isinstance(window, bool) or not isinstance(window, int) or window < 256:
            raise ConfigurationError(
                f"The context window must be a whole number of at least 256 tokens, got {window!r}.",
                setting="window",
            )
        factor = window / self.total
        scaled = {name: int(getattr(self, name) * factor) for name in (*SOURCES, "reply_reserve")}
        scaled["recent"] += window - sum(scaled.values())
        return replace(self, **scaled)

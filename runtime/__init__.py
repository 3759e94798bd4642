"""companion-runtime's engine: context assembly, budgets, tokens, compaction, model calls, CLI.

Importing this package fills offline defaults for litellm and tiktoken (see
:func:`runtime.config.prepare_environment`) before either is imported.
"""

from runtime.config import prepare_environment as _prepare_environment

_prepare_environment()

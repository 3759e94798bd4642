"""companion-runtime's engine: context assembly, budgets, tokens, compaction, model calls, CLI.

Importing this package, or any of its subpackages, leaves ``os.environ`` as it was:
litellm and tiktoken are imported on first use through :mod:`runtime._offline`, which
fills their offline defaults then.
"""

"""Storage for companion-runtime: tables, the turn store, the archive, recall and embeddings.

``memory`` imports nothing from ``runtime`` or ``persona``.
"""

"""The one way this package imports litellm and tiktoken: offline defaults first, once.

Importing :mod:`runtime` changes nothing in ``os.environ``. The first call of
:func:`load_litellm` or :func:`load_tiktoken` fills two variables the caller has not
set, then imports the library:

- ``LITELLM_LOCAL_MODEL_COST_MAP=True``: litellm reads its bundled model map instead of
  fetching one at import (which retries for seconds on a machine with no internet).
- ``TIKTOKEN_CACHE_DIR``: the tiktoken files litellm bundles (cl100k_base, o200k_base),
  so tiktoken never downloads them.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from pathlib import Path
from typing import Any


@functools.cache
def _prepare() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    tokenizers = litellm_tokenizer_dir()
    if tokenizers is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))


def litellm_tokenizer_dir() -> Path | None:
    """The folder of tokenizer files litellm bundles, found without importing litellm; ``None`` if absent."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "litellm_core_utils" / "tokenizers"
    return folder if folder.is_dir() else None


def load_litellm() -> Any:
    """``litellm``, imported after the offline defaults are in place."""
    _prepare()
    import litellm

    return litellm


def load_tiktoken() -> Any:
    """``tiktoken``, imported after ``TIKTOKEN_CACHE_DIR`` points at litellm's bundled files."""
    _prepare()
    import tiktoken

    return tiktoken

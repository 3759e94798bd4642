"""The one way this package imports litellm and tiktoken: offline defaults first, once.

Importing :mod:`runtime` changes nothing in ``os.environ``. The first call of
:func:`load_litellm` or :func:`load_tiktoken` fills two variables the caller has not
set, then imports the library:

- ``LITELLM_LOCAL_MODEL_COST_MAP=True``: litellm reads its bundled model map instead of
  fetching one at import (which retries for seconds on a machine with no internet).
- ``TIKTOKEN_CACHE_DIR``: the tiktoken files litellm bundles (cl100k_base, o200k_base),
  so tiktoken never downloads them.

Importing litellm takes 3–6 s. :func:`bundled_model_entry` reads litellm's bundled model
map (the same file litellm reads under ``LITELLM_LOCAL_MODEL_COST_MAP``) without importing
it, so commands that only need a model's window or tokenizer (``companion inspect``) skip
that import.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

BUNDLED_MODEL_MAP = "model_prices_and_context_window_backup.json"
"""The model map litellm ships in its package and reads when ``LITELLM_LOCAL_MODEL_COST_MAP`` is true."""


@functools.cache
def _prepare() -> None:
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    tokenizers = litellm_tokenizer_dir()
    if tokenizers is not None:
        os.environ.setdefault("TIKTOKEN_CACHE_DIR", str(tokenizers))


def _litellm_dir() -> Path | None:
    """litellm's package folder, found without importing it; ``None`` if litellm is not installed."""
    spec = importlib.util.find_spec("litellm")
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def litellm_tokenizer_dir() -> Path | None:
    """The folder of tokenizer files litellm bundles, found without importing litellm; ``None`` if absent."""
    package = _litellm_dir()
    folder = package / "litellm_core_utils" / "tokenizers" if package is not None else None
    return folder if folder is not None and folder.is_dir() else None


@functools.cache
def _bundled_model_map() -> Mapping[str, Any]:
    package = _litellm_dir()
    try:
        loaded = json.loads((package / BUNDLED_MODEL_MAP).read_text(encoding="utf-8")) if package else {}
    except (OSError, ValueError):
        return {}
    return loaded if isinstance(loaded, dict) else {}


def bundled_model_entry(model: str) -> Mapping[str, Any] | None:
    """litellm's bundled model-map entry for exactly ``model`` (keys as in litellm's
    ``model_prices_and_context_window.json``: ``litellm_provider``, ``max_input_tokens``,
    ``max_tokens``, ...), read without importing litellm.

    ``None`` when litellm itself must be asked: the name is not a key of the bundled map
    (litellm also resolves provider prefixes and aliases), or ``LITELLM_LOCAL_MODEL_COST_MAP``
    is set to something other than true (litellm then loads a remote map). An entry wins
    over a model registered at run time under the same name (``litellm.register_model``);
    ``COMPANION_CONTEXT_WINDOW`` overrides the window in any case.
    """
    if os.environ.get("LITELLM_LOCAL_MODEL_COST_MAP", "true").strip().lower() != "true":
        return None
    entry = _bundled_model_map().get(model)
    return entry if isinstance(entry, Mapping) else None


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


_QUIET = threading.RLock()
"""Held while litellm's process-global ``suppress_debug_info`` is switched for one lookup, so that
two threads' lookups never restore each other's value."""


def quietly(call: Callable[[Any], T]) -> T:
    """``call(litellm)`` with litellm's debug printing off (it prints a provider list and a
    "Give Feedback" banner on a failed lookup), the flag restored after; raises what ``call`` raises."""
    litellm = load_litellm()
    with _QUIET:
        previous = litellm.suppress_debug_info
        litellm.suppress_debug_info = True
        try:
            return call(litellm)
        finally:
            litellm.suppress_debug_info = previous


def model_info(model: str) -> Mapping[str, Any] | None:
    """``litellm.get_model_info(model)``, quietly: litellm's model-map entry for ``model``, with the
    names it resolves (provider prefixes, aliases; ``key``) and its defaults filled in. ``None``:
    litellm does not know the model. The one place the runtime asks litellm about a model; callers
    that can read :func:`bundled_model_entry` first skip importing litellm."""
    try:
        return quietly(lambda litellm: litellm.get_model_info(model))
    except Exception:  # litellm raises ModelNotMappedError, or a bare Exception in older versions
        return None

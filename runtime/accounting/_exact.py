"""Exact counters for the tokenizers litellm bundles (cl100k_base, o200k_base, DeepSeek), and the
choice of counter for a model name (:func:`counter_for`)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from errors import UncountableContentError
from runtime._offline import bundled_model_entry, litellm_tokenizer_dir, load_tiktoken, model_info, quietly
from runtime.accounting._estimator import ConservativeEstimator
from runtime.accounting._framing import TokenCounter
from runtime.accounting._media import (
    IMAGE_LOW_DETAIL,
    IMAGE_UNKNOWN_SIZE,
    image_detail,
    openai_image_tokens,
    part_dimensions,
)
from runtime.accounting._walker import CachedCounter

_TIKTOKEN_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})
"""The tiktoken encodings litellm bundles (so they load offline)."""
DEEPSEEK = "deepseek"


def _litellm_tokenizer_dir() -> Path:
    """litellm's bundled tokenizer folder (``litellm/litellm_core_utils/tokenizers``), found without importing litellm."""
    folder = litellm_tokenizer_dir()
    if folder is None:
        raise UncountableContentError("litellm is not installed; it bundles the tokenizer files.")
    return folder


@functools.cache
def tiktoken_encoding(name: str) -> Any:
    """The tiktoken encoding ``name`` (``cl100k_base`` or ``o200k_base``), loaded once from
    litellm's bundled files.

    Raises:
        UncountableContentError: the encoding cannot be loaded offline.
    """
    tiktoken = load_tiktoken()

    try:
        return tiktoken.get_encoding(name)
    except Exception as error:  # a missing file makes tiktoken try the network
        raise UncountableContentError(f"Cannot load the tiktoken encoding {name!r} offline: {error}") from error


@functools.cache
def _hf_tokenizer(filename: str) -> Any:
    """A Hugging Face ``tokenizers.Tokenizer`` from litellm's bundled JSON file, loaded once."""
    from tokenizers import Tokenizer

    path = _litellm_tokenizer_dir() / filename
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:
        raise UncountableContentError(f"Cannot load the tokenizer file {path}: {error}") from error


class TiktokenCounter(CachedCounter):
    """Exact text counts with an OpenAI tiktoken encoding (``cl100k_base`` or ``o200k_base``).

    Text is encoded as ordinary text (special-token strings such as ``<|endoftext|>`` count as the
    text they are). Framing per OpenAI Cookbook, rounded up (:data:`MESSAGE_FRAMING`). Images follow
    OpenAI's tile rule (:func:`openai_image_tokens`); unknown size: :data:`IMAGE_UNKNOWN_SIZE`.
    """

    def __init__(self, encoding: str) -> None:
        if encoding not in _TIKTOKEN_ENCODINGS:
            raise UncountableContentError(
                f"The tiktoken encoding {encoding!r} is not bundled; use one of {sorted(_TIKTOKEN_ENCODINGS)}."
            )
        self.encoding = encoding
        self.name = f"tiktoken:{encoding}"
        self._encode: Callable[[str], list[int]] | None = None
        super().__init__()

    def _count(self, text: str) -> int:
        encode = self._encode
        if encode is None:
            encode = self._encode = tiktoken_encoding(self.encoding).encode_ordinary
        return len(encode(text))

    def _image(self, part: Mapping[str, Any]) -> int:
        """OpenAI's tile rule when the size is known, else :data:`IMAGE_UNKNOWN_SIZE` (85 for ``detail=low``)."""
        size = part_dimensions(part)
        detail = image_detail(part)
        if size is None:
            return IMAGE_LOW_DETAIL if detail == "low" else IMAGE_UNKNOWN_SIZE
        return openai_image_tokens(*size, detail=detail)


class HuggingFaceCounter(CachedCounter):
    """Exact text counts with a tokenizer JSON bundled by litellm (here: DeepSeek's).

    Counted without special tokens (``add_special_tokens=False``); framing as for OpenAI models,
    which covers DeepSeek's chat template (``<｜User｜>``/``<｜Assistant｜>``/end-of-sentence per turn).
    Images use the conservative rule of :class:`ConservativeEstimator`.
    """

    def __init__(self, kind: str, filename: str) -> None:
        self.kind = kind
        self.filename = filename
        self.name = f"tokenizers:{kind}"
        self._tokenizer: Any = None
        super().__init__()

    def _count(self, text: str) -> int:
        """Exact tokens of ``text`` under the tokenizer."""
        tokenizer = self._tokenizer
        if tokenizer is None:
            tokenizer = self._tokenizer = _hf_tokenizer(self.filename)
        return len(tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)


@functools.cache
def _exact_counter(kind: str) -> TokenCounter:
    if kind == DEEPSEEK:
        return HuggingFaceCounter(DEEPSEEK, "deepseek_tokenizer.json")
    return TiktokenCounter(kind)


@functools.cache
def _estimator() -> ConservativeEstimator:
    return ConservativeEstimator()


_OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai", "azure_text", "openai_like"})


_ASK_LITELLM = "ask litellm"


def _encoding_for_model_names(names: Sequence[str]) -> str | None:
    """tiktoken's encoding for the first of ``names`` it knows, if it is one litellm bundles."""
    tiktoken = load_tiktoken()
    for candidate in names:
        try:
            encoding = tiktoken.encoding_name_for_model(candidate)
        except KeyError:
            continue
        return encoding if encoding in _TIKTOKEN_ENCODINGS else None
    return None


def _bundled_tokenizer_kind(model: str) -> str | None:
    """:func:`tokenizer_kind` from the bundled map's entry, or :data:`_ASK_LITELLM` when only
    litellm can tell (no entry; another provider; a name litellm's
    ``huggingface_tokenizer_kind`` may count with the DeepSeek tokenizer)."""
    entry = bundled_model_entry(model)
    provider = entry.get("litellm_provider") if entry is not None else None
    if provider == "deepseek":
        return DEEPSEEK
    if provider in _OPENAI_PROVIDERS and "deepseek" not in model.lower():
        return _encoding_for_model_names((model.rsplit("/", 1)[-1],))
    return _ASK_LITELLM


@functools.lru_cache(maxsize=512)
def tokenizer_kind(model: str | None) -> str | None:
    """The bundled tokenizer for a litellm model name: ``cl100k_base``, ``o200k_base``, ``deepseek`` or ``None``.

    Decided through litellm's own knowledge of the model: ``litellm.get_model_info`` (its model map)
    gives the provider; for unmapped names ``litellm.get_llm_provider`` splits the provider prefix.
    OpenAI/Azure OpenAI models get tiktoken's encoding for the model name
    (``tiktoken.encoding_name_for_model``: gpt-4o, gpt-4.1, gpt-5, o-series -> o200k_base; gpt-4,
    gpt-3.5 -> cl100k_base). The ``deepseek`` provider, and names litellm itself counts with the
    DeepSeek tokenizer (``litellm.utils.huggingface_tokenizer_kind``), get the DeepSeek tokenizer.
    ``None`` means the estimator.

    A name that is a key of litellm's bundled model map with an OpenAI, Azure OpenAI or
    DeepSeek provider is decided from that entry without importing litellm
    (:func:`runtime._offline.bundled_model_entry`); the answer is the same
    (``tests/test_tokens.py`` compares both ways over the whole map).
    """
    if not model:
        return None
    bundled = _bundled_tokenizer_kind(model)
    if bundled is not _ASK_LITELLM:
        return bundled
    provider: str | None = None
    name = model
    info = model_info(model)
    if info is not None:
        provider = info.get("litellm_provider")
        name = info.get("key") or model
    else:
        try:
            name, provider, *_ = quietly(lambda litellm: litellm.get_llm_provider(model))
        except Exception:
            provider = None
    if provider == "deepseek":
        return DEEPSEEK
    huggingface_tokenizer_kind: Callable[[str], str | None] | None
    try:
        from litellm.utils import huggingface_tokenizer_kind
    except ImportError:  # older litellm: only the deepseek provider above
        huggingface_tokenizer_kind = None
    if huggingface_tokenizer_kind is not None and huggingface_tokenizer_kind(model) == DEEPSEEK:
        return DEEPSEEK
    if provider in _OPENAI_PROVIDERS:
        return _encoding_for_model_names((str(name).rsplit("/", 1)[-1], model.rsplit("/", 1)[-1]))
    return None


def counter_for(model: str | None) -> TokenCounter:
    """The token counter for a litellm model name: exact if its tokenizer is bundled, else the estimator.

    ``None`` or a model litellm does not map to a bundled tokenizer gets the
    :class:`ConservativeEstimator`. See :func:`tokenizer_kind` for the choice.
    """
    kind = tokenizer_kind(model)
    return _estimator() if kind is None else _exact_counter(kind)

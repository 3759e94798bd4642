"""Token accounting for prompts: exact where a tokenizer is available offline, never an undercount elsewhere.

All counts in this module are **tokens** unless a name or docstring says characters or bytes.

Two kinds of :class:`TokenCounter`, both chosen by :func:`counter_for` from a litellm model name:

- **Exact counters** for the tokenizers that ship with litellm and load offline: OpenAI's
  ``cl100k_base`` and ``o200k_base`` (through ``tiktoken``; litellm bundles the files and
  :func:`runtime._offline.load_tiktoken` points ``TIKTOKEN_CACHE_DIR`` at them) and DeepSeek's
  tokenizer (``deepseek_tokenizer.json``, loaded with the Hugging Face ``tokenizers`` library). They
  count text exactly and add a safe message framing (OpenAI Cookbook, "How to count tokens with
  tiktoken": 3 tokens per message plus the role, 1 per name, 3 to prime the reply; we charge more).
- **The conservative estimator** (:class:`ConservativeEstimator`) for every other model, including an
  unknown model or ``None``. It prices text by character class in pure Python (byte-class translation
  and ``bytes.count``, no per-character loop), with prices fitted so that it does not undercount the
  largest of the cl100k_base, o200k_base and DeepSeek counts (see the class docstring and
  ``scripts/bench_tokens.py`` for the measurements).

Everything a request sends is counted: each message's framing and role, text and non-text content
parts (images and documents by provider rules, see :func:`openai_image_tokens` and
:func:`anthropic_image_tokens`), names, tool calls (function name and arguments), tool results and
their ids, and the tool schemas. Content that cannot be counted raises
:class:`errors.ConfigurationError`; nothing is ever counted as zero by default.

Tokenizers load lazily on first use and are cached (``functools.lru_cache``), so importing this module
imports neither litellm, tiktoken nor tokenizers.
"""

from __future__ import annotations

import base64
import binascii
import functools
import io
import json
import math
import operator
import re
from pathlib import Path
from typing import Any, Callable, Mapping, Protocol, Sequence

from PIL import Image, UnidentifiedImageError

from errors import ConfigurationError
from runtime._offline import litellm_tokenizer_dir, load_litellm, load_tiktoken

MESSAGE_FRAMING = 4
"""Tokens charged per message for its delimiters, on top of the role's own tokens.

OpenAI Cookbook ("How to count tokens with tiktoken"): 3 per message for gpt-3.5/gpt-4/gpt-4o; we
round up to 4. DeepSeek's chat template uses at most 3 special tokens per turn."""
REPLY_PRIMING = 3
"""Tokens that prime the assistant's reply, once per request (OpenAI Cookbook: 3)."""
NAME_TOKENS = 1
"""Extra tokens for a message's ``name`` field beyond the name's own tokens (OpenAI Cookbook: 1)."""
TOOL_CALL_FRAMING = 10
"""Tokens per tool call beyond its function name and arguments (the call's wrapper in the chat
template, e.g. OpenAI's ``functions.<name>`` recipient header and delimiters, about 7; rounded up)."""
TOOLS_PREAMBLE = 20
"""Tokens charged once when a request carries tool schemas (the tool section's header in the system
turn; litellm's chat-template accounting uses a similar fixed preamble). Rounded up."""
TOOL_SCHEMA_FRAMING = 10
"""Tokens per tool schema beyond its compact JSON text (OpenAI renders schemas as a TypeScript-like
namespace, which is shorter than the JSON we count; the framing covers per-function headers)."""

IMAGE_UNKNOWN_SIZE = 1600
"""Tokens for an image whose size is not known: the largest of the published rules for a full-size
image (OpenAI tile rule at ``detail=high``: 85 + 170 * 8 tiles = 1445 for 768x2048; Anthropic:
about 1600 for the largest image it keeps unscaled, ~1.15 megapixels / 750)."""
IMAGE_LOW_DETAIL = 85
"""Tokens for an OpenAI image sent with ``detail="low"`` (OpenAI vision guide: a fixed 85)."""
DOCUMENT_PAGE_TOKENS = 4600
"""Tokens per document (PDF) page: Anthropic's PDF guide gives 1,500-3,000 text tokens per page plus
each page as an image (at most ~1,600, see :data:`IMAGE_UNKNOWN_SIZE`); OpenAI also sends the
extracted text and an image of each page. We take the upper ends: 3000 + 1600."""
DOCUMENT_UNKNOWN_SIZE = DOCUMENT_PAGE_TOKENS
"""Tokens for a document whose size (pages or text) is not known: one page's worth
(:data:`DOCUMENT_PAGE_TOKENS`). Pass the data (or ``pages``) to get a page-based count."""

_CJK = re.compile(
    "[\u1100-\u11ff\u3040-\u30ff\u3130-\u318f\u3400-\u4dbf\u4e00-\u9fff"
    "\uac00-\ud7af\uf900-\ufaff\U00020000-\U0002fa1f]"
)


class TokenCounter(Protocol):
    """Counts tokens of text and of chat messages for one model family.

    Every method returns a number of tokens. Implementations must never count content they do not
    understand as zero: they raise :class:`errors.ConfigurationError` instead.
    """

    name: str
    """A short name for logs, e.g. ``tiktoken:o200k_base`` or ``estimator``."""

    def count_text(self, text: str) -> int:
        """Tokens of a plain string (no framing)."""
        ...

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message (OpenAI format), framing and role included."""
        ...

    def count_messages(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Tokens of a whole request: every message, the reply priming and the tool schemas."""
        ...


# ---------------------------------------------------------------------------------------------
# Images and documents
# ---------------------------------------------------------------------------------------------


def openai_image_tokens(width: int, height: int, detail: str | None = "auto") -> int:
    """Tokens of an image under OpenAI's tile rule (OpenAI vision guide, "Calculating costs").

    ``detail="low"``: 85. Otherwise the image (``width`` x ``height`` pixels) is scaled to fit in
    2048x2048, then so that its shortest side is at most 768 pixels; each 512-pixel tile costs 170
    tokens, plus 85 base tokens.
    """
    if detail == "low":
        return IMAGE_LOW_DETAIL
    w, h = float(width), float(height)
    if w <= 0 or h <= 0:
        raise ConfigurationError(f"Image size must be positive, got {width}x{height} pixels.")
    scale = min(1.0, 2048 / max(w, h))
    w, h = w * scale, h * scale
    scale = min(1.0, 768 / min(w, h))
    w, h = w * scale, h * scale
    return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)


def anthropic_image_tokens(width: int, height: int) -> int:
    """Tokens of an image under Anthropic's rule (Anthropic vision guide): ``width * height / 750``.

    Images whose long edge exceeds 1568 pixels, or that exceed about 1.15 megapixels, are scaled
    down first (keeping the aspect ratio), so the result is at most about 1600 tokens.
    """
    w, h = float(width), float(height)
    if w <= 0 or h <= 0:
        raise ConfigurationError(f"Image size must be positive, got {width}x{height} pixels.")
    scale = min(1.0, 1568 / max(w, h), math.sqrt(1_150_000 / (w * h)))
    return math.ceil(w * scale * h * scale / 750)


_SIZED_FORMATS = ("PNG", "GIF", "JPEG", "WEBP")
"""Formats whose size :func:`_image_size` reads: the ones chat providers accept inline."""


def _image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) in pixels of PNG, GIF, JPEG or WebP bytes, else ``None``.

    Pillow reads the header only (``Image.open`` is lazy), so this costs no decoding.
    """
    try:
        with Image.open(io.BytesIO(data), formats=_SIZED_FORMATS) as image:
            return image.size
    except (UnidentifiedImageError, Image.DecompressionBombError, OSError, ValueError):
        return None


def _decode_data(data: str) -> bytes | None:
    """Bytes of a ``data:...;base64,`` URL or of bare base64 text; ``None`` if it is neither."""
    if data.startswith("data:"):
        head, _, payload = data.partition(",")
        if not head.endswith(";base64"):
            return None
        data = payload
    try:
        return base64.b64decode(data, validate=False)
    except (binascii.Error, ValueError):
        return None


_PDF_PAGE = re.compile(rb"/Type\s*/Page(?![a-zA-Z])")


def _part_dimensions(part: Mapping[str, Any]) -> tuple[int, int] | None:
    """An image part's size in pixels: explicit ``width``/``height`` keys, or read from inline data."""
    holders: list[Mapping[str, Any]] = [part]
    for key in ("image_url", "source", "file"):
        if isinstance(part.get(key), Mapping):
            holders.append(part[key])
    for holder in holders:
        if isinstance(holder.get("width"), int) and isinstance(holder.get("height"), int):
            return holder["width"], holder["height"]
    for holder in holders:
        for key in ("url", "data", "image_url", "file_data"):
            value = holder.get(key)
            if isinstance(value, str) and (value.startswith("data:") or key == "data"):
                raw = _decode_data(value)
                if raw:
                    size = _image_size(raw)
                    if size:
                        return size
    return None


def _image_detail(part: Mapping[str, Any]) -> str | None:
    image_url = part.get("image_url")
    if isinstance(image_url, Mapping) and isinstance(image_url.get("detail"), str):
        return str(image_url["detail"])
    detail = part.get("detail")
    return detail if isinstance(detail, str) else None


def _document_tokens(part: Mapping[str, Any], count_text: Callable[[str], int]) -> int:
    """Tokens of a document/file part: its text if inline, else pages * :data:`DOCUMENT_PAGE_TOKENS`."""
    holders: list[Mapping[str, Any]] = [part]
    for key in ("source", "file", "document"):
        if isinstance(part.get(key), Mapping):
            holders.append(part[key])
    total = 0
    for holder in holders:
        for key in ("title", "context", "filename"):
            if isinstance(holder.get(key), str):
                total += count_text(holder[key])
    for holder in holders:
        if isinstance(holder.get("pages"), int):
            return total + max(1, int(holder["pages"])) * DOCUMENT_PAGE_TOKENS
        if holder.get("type") == "text" and isinstance(holder.get("data"), str):
            return total + count_text(holder["data"])
        if isinstance(holder.get("text"), str) and holder is not part:
            return total + count_text(holder["text"])
        for key in ("file_data", "data"):
            value = holder.get(key)
            if isinstance(value, str):
                raw = _decode_data(value)
                if raw is None:
                    continue
                if raw[:5] == b"%PDF-":
                    pages = len(_PDF_PAGE.findall(raw))
                    return total + max(1, pages) * DOCUMENT_PAGE_TOKENS
                if _image_size(raw):
                    return total + IMAGE_UNKNOWN_SIZE
                try:
                    return total + count_text(raw.decode("utf-8"))
                except UnicodeDecodeError:
                    pass
    return total + DOCUMENT_UNKNOWN_SIZE


# ---------------------------------------------------------------------------------------------
# Message walking, shared by every counter
# ---------------------------------------------------------------------------------------------

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
_IMAGE_PARTS = frozenset({"image_url", "input_image", "image"})
_DOCUMENT_PARTS = frozenset({"file", "input_file", "document"})
_STRUCTURAL_KEYS = frozenset({"role", "content", "name", "tool_calls", "function_call", "type"})


class _MessageCounter:
    """Shared message/request accounting. Subclasses provide ``count_text`` and ``_image``."""

    name = "message-counter"

    def count_text(self, text: str) -> int:  # pragma: no cover - overridden
        raise NotImplementedError

    def _image(self, part: Mapping[str, Any]) -> int:
        """Tokens of an image part: the larger of the OpenAI and Anthropic rules when the size is known."""
        size = _part_dimensions(part)
        if size is None:
            return IMAGE_LOW_DETAIL if _image_detail(part) == "low" else IMAGE_UNKNOWN_SIZE
        return max(openai_image_tokens(*size, detail=_image_detail(part)), anthropic_image_tokens(*size))

    def _value(self, value: Any, where: str) -> int:
        """Tokens of an arbitrary field value: strings as text, anything else as compact JSON text."""
        if value is None:
            return 0
        if isinstance(value, str):
            return self.count_text(value)
        try:
            text = json.dumps(value, ensure_ascii=False, separators=(",", ":"))
        except (TypeError, ValueError) as error:
            raise ConfigurationError(f"Cannot count tokens of {where}: {type(value).__name__} is not JSON.") from error
        return self.count_text(text)

    def _part(self, part: Any) -> int:
        if isinstance(part, str):
            return self.count_text(part)
        if not isinstance(part, Mapping):
            raise ConfigurationError(f"Cannot count tokens of a content part of type {type(part).__name__!r}.")
        kind = part.get("type")
        if kind in _TEXT_PARTS:
            text = part.get(_TEXT_PARTS[kind])
            if not isinstance(text, str):
                raise ConfigurationError(f"The content part of type {kind!r} has no string {_TEXT_PARTS[kind]!r}.")
            return self.count_text(text)
        if kind in _IMAGE_PARTS:
            return self._image(part)
        if kind in _DOCUMENT_PARTS:
            return _document_tokens(part, self.count_text)
        raise ConfigurationError(
            f"Cannot count tokens of a content part of type {kind!r}; known types: "
            f"{sorted({*_TEXT_PARTS, *_IMAGE_PARTS, *_DOCUMENT_PARTS})}."
        )

    def _content(self, content: Any) -> int:
        if content is None:
            return 0
        if isinstance(content, str):
            return self.count_text(content)
        if isinstance(content, (list, tuple)):
            return sum(self._part(part) for part in content)
        raise ConfigurationError(f"Cannot count tokens of message content of type {type(content).__name__}.")

    def _call(self, call: Any) -> int:
        """Tokens of one tool call (or legacy ``function_call``): name, arguments, id, framing."""
        if not isinstance(call, Mapping):
            raise ConfigurationError(f"Cannot count tokens of a tool call of type {type(call).__name__}.")
        function = call.get("function", call)
        if not isinstance(function, Mapping):
            raise ConfigurationError("A tool call's 'function' must be a mapping with 'name' and 'arguments'.")
        total = TOOL_CALL_FRAMING + self._value(function.get("name"), "a tool call's name")
        total += self._value(function.get("arguments"), "a tool call's arguments")
        total += self._value(call.get("id"), "a tool call's id")
        return total

    def count_message(self, message: Mapping[str, Any]) -> int:
        """Tokens of one chat message: framing, role, content, name, tool calls and every other field."""
        if not isinstance(message, Mapping):
            raise ConfigurationError(f"A chat message must be a mapping, not {type(message).__name__}.")
        total = MESSAGE_FRAMING + self._value(message.get("role"), "a message's role")
        total += self._content(message.get("content"))
        if message.get("name"):
            total += NAME_TOKENS + self._value(message["name"], "a message's name")
        tool_calls = message.get("tool_calls")
        if tool_calls:
            if not isinstance(tool_calls, (list, tuple)):
                raise ConfigurationError("A message's 'tool_calls' must be a list.")
            total += sum(self._call(call) for call in tool_calls)
        if message.get("function_call"):
            total += self._call(message["function_call"])
        for key, value in message.items():
            if key not in _STRUCTURAL_KEYS:
                total += self._value(value, f"the message field {key!r}")
        return total

    def count_tools(self, tools: Sequence[Mapping[str, Any]]) -> int:
        """Tokens of the tool schemas: a preamble plus each schema's compact JSON text and framing."""
        if not tools:
            return 0
        return TOOLS_PREAMBLE + sum(TOOL_SCHEMA_FRAMING + self._value(tool, "a tool schema") for tool in tools)

    def count_messages(
        self, messages: Sequence[Mapping[str, Any]], *, tools: Sequence[Mapping[str, Any]] | None = None
    ) -> int:
        """Tokens of a whole request: every message, :data:`REPLY_PRIMING` and the tool schemas."""
        return sum(self.count_message(m) for m in messages) + REPLY_PRIMING + self.count_tools(tools or ())


# ---------------------------------------------------------------------------------------------
# The first estimator (a comparison baseline)
# ---------------------------------------------------------------------------------------------


class FirstEstimator(_MessageCounter):
    """The first estimator, kept as a comparison baseline for the benchmark.

    Each Han, Kana or Hangul character counts as one token and all other text as ``ceil(chars / 4)``
    tokens (the common "4 characters per token" rule of thumb for English, OpenAI's tokenizer guide).
    It undercounts Chinese on cl100k_base and code/JSON on every tokenizer; see ``scripts/bench_tokens.py``.
    """

    name = "first-estimator"

    def count_text(self, text: str) -> int:
        """Tokens: one per Han/Kana/Hangul character plus ``ceil(other characters / 4)``."""
        if not text:
            return 0
        cjk = len(_CJK.findall(text))
        return cjk + math.ceil((len(text) - cjk) / 4)


# ---------------------------------------------------------------------------------------------
# The conservative estimator
# ---------------------------------------------------------------------------------------------

_COMMON_HAN = (
    "一万三上下不与专业东两个中串为主么义之也书了事二于五些交产享京人亿今介从他付代以们件价任份企优会传但位体何余作你使例供"
    "価保信修倍值停像元先入全公共关其具内円册再写出击分列则初利别到制前力功加务动動包化北区十午华单南即历原去县参及友反发取变"
    "口只可台右号司合同名后向否含听启告员周命和品哈商問器四回因国图土在地场址型城基報場填增声处备复外多大天失头女好如始子字存"
    "学安宋完定实审客家容密对导将小少尔就局展山岁州工左已市布常平年并广序库应店度建开异式引张当录形影径待後得微心必志态思性总"
    "息您情意感成我或户所手打找技投报拉持指按换据排接推提播支收改放政效数整文料断新方族无日时明易星是時景更最月有服期木未本机"
    "权束条来板构析果查标样核格案检模次款止正此步歳段每比民気水求江汽没治法注活流海消清游源火点無然片版物特率环现球理生用由电"
    "男画界番登的监目直相省看県真知码确示社票私种科秒称移程稍税稿空立站章端笑符第等签简算管箱米类系素索约级线组经结给络统编网"
    "置美老考者而联能自至色节英藏行表装西要見见规视角解言計記話読计认议记论设证评试话询该详语误说请读调象责败账货购费资起超路"
    "身车转软载辑输达过运近还这进连述退送选通速造連道邮部都配释里重量金钟钮链销错键长開間関门闭问间队阳陆限院除雅集雷需非面音"
    "页项预频题额首验高黑"
)
"""The 549 CJK ideographs that cl100k_base encodes as one token each: in practice the most frequent
characters of modern Chinese (about 75% of the Han characters in MemoryBank-CN). Every other Han
character costs 2-3 tokens there, the most of the tokenizers measured."""
_COMMON_HAN_RE = re.compile("[" + _COMMON_HAN + "]")
_GENERAL_PUNCTUATION_RE = re.compile("[\u2000-\u206f]")


def _byte_class_table() -> bytes:
    """Maps each UTF-8 byte to a one-letter class; continuation bytes are deleted separately.

    ASCII: ``a`` lower-case letter, ``A`` upper-case, ``d`` digit, `` `` space, ``n`` newline,
    ``t`` other whitespace, ``q`` quote, ``b`` bracket, ``,`` comma/colon/semicolon, ``_``, ``.``,
    ``p`` other punctuation or control. Lead bytes of longer characters, by code point block:
    ``2`` U+0080-027F (Latin-1 supplement, Latin extended), ``c`` U+0280-04FF (IPA, combining
    diacritics, Greek, Cyrillic), ``3`` U+0500-07FF (Armenian,
    Hebrew, Arabic, Syriac, ...), ``I`` U+0800-1FFF (Indic, Thai, Georgian, Ethiopic, Hangul Jamo,
    Latin Extended Additional), ``S`` U+2000-2FFF (punctuation, symbols, arrows, dingbats), ``K``
    U+3000-3FFF (CJK punctuation, Kana, Han extension A), ``H`` U+4000-9FFF (Han), ``G``
    U+A000-DFFF (Hangul syllables, Yi), ``F`` U+E000-FFFF (private use, fullwidth forms, variation
    selectors), ``E`` astral planes (emoji, rare Han) and invalid bytes.
    """
    table = bytearray(b"p" * 256)
    for b in range(128):
        ch = chr(b)
        if "a" <= ch <= "z":
            table[b] = ord("a")
        elif "A" <= ch <= "Z":
            table[b] = ord("A")
        elif ch.isdigit():
            table[b] = ord("d")
        elif ch == " ":
            table[b] = ord(" ")
        elif ch == "\n":
            table[b] = ord("n")
        elif ch in "\t\r\x0b\x0c":
            table[b] = ord("t")
        elif ch in "\"'`":
            table[b] = ord("q")
        elif ch in "{}[]()<>":
            table[b] = ord("b")
        elif ch in ",:;":
            table[b] = ord(",")
        elif ch == "_":
            table[b] = ord("_")
        elif ch == ".":
            table[b] = ord(".")
    for lead, cls in ((range(0xC0, 0xCA), "2"), (range(0xCA, 0xD4), "c"), (range(0xD4, 0xE0), "3"), (range(0xE0, 0xE2), "I"),
                      ((0xE2,), "S"), ((0xE3,), "K"), (range(0xE4, 0xEA), "H"), (range(0xEA, 0xEE), "G"),
                      ((0xEE, 0xEF), "F"), (range(0xF0, 0x100), "E")):
        for b in lead:
            table[b] = ord(cls)
    return bytes(table)


def _fold_table(groups: Mapping[str, str]) -> bytes:
    """A second-level table mapping class letters to group letters (unlisted classes become ``x``)."""
    table = bytearray(b"x" * 256)
    for group, classes in groups.items():
        for cls in classes:
            table[ord(cls)] = ord(group)
    return bytes(table)


_CLASSES = _byte_class_table()
_CONTINUATION = bytes(range(0x80, 0xC0))
_DIGIT_RUNS = _fold_table({"y": "d"})
_PUNCT_RUNS = _fold_table({"y": "qb,_.p"})
_SPACE_RUNS = _fold_table({"y": " t"})
_FOLDED = _fold_table({"a": "aA", "d": "d", "p": "qb,_.p"})

FEATURES = (
    "text",  # 1 per non-empty text; the others are characters, runs or adjacent pairs
    "lower", "upper", "digit", "newline", "quote", "bracket", "comma", "underscore",
    "dot", "punct",
    "latin2", "greek_cyrillic", "script2", "script3", "symbol", "general_punct", "kana", "han_common", "han_rare", "hangul",
    "compat", "astral",
    "digit_runs", "punct_runs", "space_runs",
    "camel_humps", "upper_pairs", "double_spaces", "punct_letter", "digit_letter", "letter_digit",
)
"""Names of the counts :func:`text_features` returns, in order (characters, runs or adjacent pairs)."""


def text_features(text: str) -> tuple[int, ...]:
    """Counts of character classes, runs and adjacent pairs in ``text``, in :data:`FEATURES` order.

    Units: characters for the class counts (one per code point, found through its UTF-8 lead byte),
    runs for ``*_runs`` (maximal sequences of one class) and pairs for the adjacency counts. Computed
    with ``bytes.translate`` and ``bytes.count`` only, so the cost is a few C passes over the text.
    """
    if not text:
        return (0,) * len(FEATURES)
    m = text.encode("utf-8", "surrogatepass").translate(_CLASSES, _CONTINUATION)
    c = m.count
    symbol = c(b"S")
    general = len(_GENERAL_PUNCTUATION_RE.findall(text)) if symbol else 0
    han = c(b"H")
    han_common = len(_COMMON_HAN_RE.findall(text)) if han else 0
    runs = []
    for table in (_DIGIT_RUNS, _PUNCT_RUNS, _SPACE_RUNS):
        z = m.translate(table)
        runs.append(z.count(b"xy") + (z[0] == 0x79))
    f = m.translate(_FOLDED)
    return (
        1,
        c(b"a"), c(b"A"), c(b"d"), c(b"n"), c(b"q"), c(b"b"), c(b","), c(b"_"), c(b"."), c(b"p"),
        c(b"2"), c(b"c"), c(b"3"), c(b"I"), symbol - general, general, c(b"K"), han_common, han - han_common, c(b"G"),
        c(b"F"), c(b"E"),
        *runs,
        c(b"aA"), c(b"AA"), c(b"  "), f.count(b"pa"), f.count(b"da"), f.count(b"ad"),
    )


ESTIMATOR_PRICES: dict[str, float] = {
    "text": 3.100,  # per non-empty text: covers short messages whose rare words split more than the linear prices say
    "lower": 0.146,  # per a-z letter
    "upper": 0.199,  # per A-Z letter
    "digit": 0.259,  # per digit (with digit_runs: numbers split into 1-3 digit tokens)
    "newline": 1.363,  # per newline
    "quote": 0.368,  # per " ' `
    "bracket": 0.436,  # per ()[]{}<>
    "comma": 0.610,  # per , : ;
    "underscore": 0.179,  # per _
    "dot": 0.680,  # per .
    "punct": 0.500,  # per other ASCII punctuation or control character
    "latin2": 2.100,  # per accented Latin letter (U+0080-027F); floor 2.0 set by hand from German/Turkish/Polish sentences
    "greek_cyrillic": 1.260,  # per U+0280-04FF character; floor 1.2 set by hand (Greek ~1.1 tokens/char on cl100k_base)
    "script2": 2.625,  # per U+0500-07FF character (Armenian ~2.3, Hebrew/Arabic ~1-1.3 tokens/char); floor 2.5 set by hand
    "script3": 2.625,  # per U+0800-1FFF character (Indic, Thai, Georgian, Ethiopic ~1-3 tokens/char); floor 2.5 set by hand
    "symbol": 2.021,  # per U+2000-2FFF symbol outside General Punctuation (arrows, dingbats, box drawing)
    "general_punct": 1.877,  # per U+2000-206F character (curly quotes, dashes, ellipsis, ZWJ)
    "kana": 1.365,  # per U+3000-3FFF character (CJK punctuation, Kana); floor 1.3 set by hand from Japanese sentences
    "han_common": 0.916,  # per one of the 549 common Han characters (_COMMON_HAN)
    "han_rare": 2.468,  # per other Han character (2-3 tokens on cl100k_base)
    "hangul": 1.890,  # per U+A000-DFFF character (Hangul syllables); floor 1.8 set by hand (~1.7 tokens/syllable on cl100k_base)
    "compat": 1.375,  # per U+E000-FFFF character (fullwidth punctuation, variation selectors)
    "astral": 3.148,  # per astral character (emoji, skin tones, flags, rare Han); emoji are 1-4 tokens
    "digit_runs": 0.763,  # per run of digits
    "punct_runs": 0.583,  # per run of ASCII punctuation
    "space_runs": 0.519,  # per run of spaces/tabs: in prose one per word
    "camel_humps": 1.052,  # per lower-to-upper case change (camelCase identifiers)
    "upper_pairs": 0.614,  # per two upper-case letters in a row (acronyms, CONSTANTS)
    "double_spaces": 0.079,  # per two spaces (indentation)
    "punct_letter": 0.116,  # per letter that follows punctuation (code: obj.attr, snake_case, "key")
    "digit_letter": 0.879,  # per letter that follows a digit (ids, hex)
    "letter_digit": 0.065,  # per digit that follows a letter
}
"""Tokens per unit of each :data:`FEATURES` count, used by :class:`ConservativeEstimator`.

Where the numbers come from: a linear program (``scipy.optimize.linprog``) chose the prices that
minimise the summed estimate / actual ratio subject to estimate >= actual for (almost) every text,
where "actual" is the largest of the cl100k_base, o200k_base and DeepSeek counts. Training texts:
MemoryBank-CN and LoCoMo messages, the generated JSON, Python and emoji corpora of
``scripts/bench_tokens.py`` (seed 20240601), chunks of the CPython 3.11 standard library and of
installed packages' sources (litellm, rich), and litellm's model-price JSON. The fitted prices were
then multiplied by 1.05, 1 was added to ``text``, and each was rounded up to 0.001. Checked on
held-out texts (other seeds, other stdlib files, an OpenAPI schema, LoCoMo QA and summaries): no
undercount on chat or JSON, 0.3% of real-code chunks; sum ratios 1.16-1.30 (short QA answers: 1.47).
Scripts absent from those corpora (Greek/Cyrillic, Arabic/Hebrew/Armenian, Indic/Thai/Georgian,
Kana, Hangul, accented Latin) have hand-set floors from a few sentences per language measured on
the same three tokenizers; they overcount those languages (about 1.3-3x) rather than risk an
undercount. In prose an ASCII word costs about ``space_runs + letters * lower`` (0.52 + 0.15 per
letter); JSON and code are priced denser through the punctuation, adjacency and indentation counts,
so no separate detection is needed and mixed messages are priced part by part.
"""


class ConservativeEstimator(_MessageCounter):
    """Token estimate for models whose tokenizer is not available offline; meant never to undercount.

    ``count_text`` returns ``ceil(sum(price[f] * count[f]))`` over the character-class counts of
    :func:`text_features` with the prices in :data:`ESTIMATOR_PRICES`. See that table for each price
    and where it was measured.

    Images and documents: the larger of OpenAI's tile rule and Anthropic's pixels/750 rule when the
    image size is known (explicit ``width``/``height`` or inline PNG/GIF/JPEG/WebP data), else
    :data:`IMAGE_UNKNOWN_SIZE`; documents by pages (:data:`DOCUMENT_PAGE_TOKENS`) or inline text.
    """

    name = "estimator"

    def __init__(self, prices: Mapping[str, float] | None = None) -> None:
        table = dict(ESTIMATOR_PRICES if prices is None else prices)
        unknown = set(table) - set(FEATURES)
        if unknown:
            raise ConfigurationError(f"Unknown estimator price names: {sorted(unknown)}.")
        self._prices = tuple(float(table.get(name, 0.0)) for name in FEATURES)

    def count_text(self, text: str) -> int:
        """Estimated tokens of ``text`` (an upper bound by design, see :data:`ESTIMATOR_PRICES`)."""
        if not text:
            return 0
        return int(math.ceil(sum(map(operator.mul, self._prices, text_features(text)))))


# ---------------------------------------------------------------------------------------------
# Exact counters
# ---------------------------------------------------------------------------------------------

_TIKTOKEN_ENCODINGS = frozenset({"cl100k_base", "o200k_base"})
"""The tiktoken encodings litellm bundles (so they load offline)."""
DEEPSEEK = "deepseek"


def _litellm_tokenizer_dir() -> Path:
    """litellm's bundled tokenizer folder (``litellm/litellm_core_utils/tokenizers``), found without importing litellm."""
    folder = litellm_tokenizer_dir()
    if folder is None:
        raise ConfigurationError("litellm is not installed; it bundles the tokenizer files.")
    return folder


@functools.lru_cache(maxsize=None)
def _tiktoken_encoding(name: str) -> Any:
    """The tiktoken encoding ``name``, loaded once from litellm's bundled files."""
    tiktoken = load_tiktoken()

    try:
        return tiktoken.get_encoding(name)
    except Exception as error:  # a missing file makes tiktoken try the network
        raise ConfigurationError(f"Cannot load the tiktoken encoding {name!r} offline: {error}") from error


@functools.lru_cache(maxsize=None)
def _hf_tokenizer(filename: str) -> Any:
    """A Hugging Face ``tokenizers.Tokenizer`` from litellm's bundled JSON file, loaded once."""
    from tokenizers import Tokenizer

    path = _litellm_tokenizer_dir() / filename
    try:
        return Tokenizer.from_file(str(path))
    except Exception as error:
        raise ConfigurationError(f"Cannot load the tokenizer file {path}: {error}") from error


class TiktokenCounter(_MessageCounter):
    """Exact text counts with an OpenAI tiktoken encoding (``cl100k_base`` or ``o200k_base``).

    Text is encoded as ordinary text (special-token strings such as ``<|endoftext|>`` count as the
    text they are). Framing per OpenAI Cookbook, rounded up (:data:`MESSAGE_FRAMING`). Images follow
    OpenAI's tile rule (:func:`openai_image_tokens`); unknown size: :data:`IMAGE_UNKNOWN_SIZE`.
    """

    def __init__(self, encoding: str) -> None:
        if encoding not in _TIKTOKEN_ENCODINGS:
            raise ConfigurationError(f"The tiktoken encoding {encoding!r} is not bundled; use one of {sorted(_TIKTOKEN_ENCODINGS)}.")
        self.encoding = encoding
        self.name = f"tiktoken:{encoding}"
        self._encode: Callable[[str], list[int]] | None = None

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text`` under the encoding."""
        if not text:
            return 0
        encode = self._encode
        if encode is None:
            encode = self._encode = _tiktoken_encoding(self.encoding).encode_ordinary
        return len(encode(text))

    def _image(self, part: Mapping[str, Any]) -> int:
        """OpenAI's tile rule when the size is known, else :data:`IMAGE_UNKNOWN_SIZE` (85 for ``detail=low``)."""
        size = _part_dimensions(part)
        detail = _image_detail(part)
        if size is None:
            return IMAGE_LOW_DETAIL if detail == "low" else IMAGE_UNKNOWN_SIZE
        return openai_image_tokens(*size, detail=detail)


class HuggingFaceCounter(_MessageCounter):
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

    def count_text(self, text: str) -> int:
        """Exact tokens of ``text`` under the tokenizer."""
        if not text:
            return 0
        tokenizer = self._tokenizer
        if tokenizer is None:
            tokenizer = self._tokenizer = _hf_tokenizer(self.filename)
        return len(tokenizer.encode_batch_fast([text], add_special_tokens=False)[0].ids)


@functools.lru_cache(maxsize=None)
def _exact_counter(kind: str) -> TokenCounter:
    if kind == DEEPSEEK:
        return HuggingFaceCounter(DEEPSEEK, "deepseek_tokenizer.json")
    return TiktokenCounter(kind)


@functools.lru_cache(maxsize=None)
def _estimator() -> ConservativeEstimator:
    return ConservativeEstimator()


_OPENAI_PROVIDERS = frozenset({"openai", "azure", "text-completion-openai", "azure_text", "openai_like"})


def _quiet(call: Callable[[], Any]) -> Any:
    """Run a litellm lookup with its debug printing off (it prints a provider list on failure)."""
    litellm = load_litellm()

    previous = litellm.suppress_debug_info
    litellm.suppress_debug_info = True
    try:
        return call()
    finally:
        litellm.suppress_debug_info = previous


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
    """
    if not model:
        return None
    litellm = load_litellm()

    provider: str | None = None
    name = model
    try:
        info = _quiet(lambda: litellm.get_model_info(model))
        provider = info.get("litellm_provider")
        name = info.get("key") or model
    except Exception:
        try:
            name, provider, *_ = _quiet(lambda: litellm.get_llm_provider(model))
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
        tiktoken = load_tiktoken()

        for candidate in (str(name).rsplit("/", 1)[-1], model.rsplit("/", 1)[-1]):
            try:
                encoding = tiktoken.encoding_name_for_model(candidate)
            except KeyError:
                continue
            return encoding if encoding in _TIKTOKEN_ENCODINGS else None
    return None


def counter_for(model: str | None) -> TokenCounter:
    """The token counter for a litellm model name: exact if its tokenizer is bundled, else the estimator.

    ``None`` or a model litellm does not map to a bundled tokenizer gets the
    :class:`ConservativeEstimator`. See :func:`tokenizer_kind` for the choice.
    """
    kind = tokenizer_kind(model)
    return _estimator() if kind is None else _exact_counter(kind)

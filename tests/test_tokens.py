"""Token accounting: exact counters match their tokenizers, the estimator never undercounts, requests count fully."""

from __future__ import annotations

import base64
import io
import json
import os
import random
import string
import subprocess
import sys
from pathlib import Path

import pytest

from errors import UncountableContentError
from runtime._offline import load_litellm, load_tiktoken
from runtime.accounting import (
    MESSAGE_FRAMING,
    REPLY_PRIMING,
    _estimator,
    _exact,
    _tables,
    anthropic_image_tokens,
    counter_for,
    openai_image_tokens,
)
from runtime.accounting._estimator import ConservativeEstimator
from runtime.accounting._exact import HuggingFaceCounter, TiktokenCounter
from runtime.accounting._walker import COUNT_CACHE_CHARS, LONG_COUNT_CACHE_CHARS
from scripts.first_estimator import FirstEstimator

REPO = Path(__file__).resolve().parents[1]

CHINESE_PARAGRAPH = "今天下午我和朋友去了西湖边散步，湖面上有几只白鹭在低飞。我们聊起了小时候的梦想，她说想当一名画家，我想去远方旅行看一看。"

WEATHER_RESULT = {
    "location": {"city": "杭州", "country": "CN", "lat": 30.2741, "lon": 120.1551},
    "current": {"temp_c": 21.5, "feels_like_c": 20.9, "humidity": 68, "condition": "多云转晴 ☁️→☀️", "wind_kph": 11.2},
    "forecast": [
        {
            "date": "2024-06-01",
            "max_c": 26.1,
            "min_c": 18.4,
            "chance_of_rain": 0.35,
            "summary": "Light showers in the afternoon",
        },
        {
            "date": "2024-06-02",
            "max_c": 28.0,
            "min_c": 19.7,
            "chance_of_rain": 0.05,
            "summary": "Sunny, café terraces open",
        },
    ],
    "request_id": "7f3c2a9e-41b8-4d0e-9a65-0c2f5e8d1b77",
    "cached": False,
}


@pytest.fixture(scope="module")
def tokenizers_by_name():
    """Reference counts straight from each bundled tokenizer (not through runtime.accounting)."""
    tiktoken = load_tiktoken()
    from tokenizers import Tokenizer

    folder = Path(os.environ["TIKTOKEN_CACHE_DIR"])
    deepseek = Tokenizer.from_file(str(folder / "deepseek_tokenizer.json"))
    anthropic = Tokenizer.from_file(str(folder / "anthropic_tokenizer.json"))
    cl100k = tiktoken.get_encoding("cl100k_base")
    o200k = tiktoken.get_encoding("o200k_base")
    return {
        "cl100k_base": lambda text: len(cl100k.encode_ordinary(text)),
        "o200k_base": lambda text: len(o200k.encode_ordinary(text)),
        "deepseek": lambda text: len(deepseek.encode(text, add_special_tokens=False).ids),
        "anthropic": lambda text: len(anthropic.encode(text, add_special_tokens=False).ids),
    }


TOKENIZER_NAMES = ["cl100k_base", "o200k_base", "deepseek", "anthropic"]


def _png(width: int, height: int) -> str:
    """A data URL of a real (blank, 1-bit) PNG of ``width`` x ``height`` pixels."""
    from PIL import Image

    out = io.BytesIO()
    Image.new("1", (width, height)).save(out, format="PNG")
    return "data:image/png;base64," + base64.b64encode(out.getvalue()).decode()


# --- the estimator never undercounts ---------------------------------------------------------


def test_chinese_paragraph_is_sixty_characters():
    assert len(CHINESE_PARAGRAPH) == 60


@pytest.mark.parametrize("tokenizer", [pytest.param(name, id=name) for name in TOKENIZER_NAMES])
def test_estimator_does_not_undercount_chinese_paragraph(tokenizers_by_name, tokenizer):
    estimate = counter_for(None).count_text(CHINESE_PARAGRAPH)
    assert estimate >= tokenizers_by_name[tokenizer](CHINESE_PARAGRAPH)


@pytest.mark.parametrize("tokenizer", [pytest.param(name, id=name) for name in TOKENIZER_NAMES])
@pytest.mark.parametrize(
    "serialise",
    [
        pytest.param(lambda v: json.dumps(v, ensure_ascii=False), id="unicode"),
        pytest.param(lambda v: json.dumps(v, ensure_ascii=True), id="ascii-escaped"),
        pytest.param(lambda v: json.dumps(v, ensure_ascii=False, indent=2), id="indented"),
    ],
)
def test_estimator_does_not_undercount_json_tool_result(tokenizers_by_name, tokenizer, serialise):
    text = serialise(WEATHER_RESULT)
    assert counter_for(None).count_text(text) >= tokenizers_by_name[tokenizer](text)


def test_first_estimator_undercounts_chinese_on_cl100k(tokenizers_by_name):
    """The baseline the issue replaces: one token per Han character is too few for cl100k_base."""
    assert FirstEstimator().count_text(CHINESE_PARAGRAPH) < tokenizers_by_name["cl100k_base"](CHINESE_PARAGRAPH)


@pytest.mark.parametrize(
    "text", [pytest.param("a", id="one-letter"), pytest.param("😀", id="emoji"), pytest.param(" ", id="space")]
)
def test_estimator_counts_any_nonempty_text_as_at_least_one_token(text):
    assert counter_for(None).count_text(text) >= 1


def test_estimator_counts_empty_text_as_zero():
    assert counter_for(None).count_text("") == 0


# --- exact counters ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "encoding"),
    [pytest.param("gpt-4o", "o200k_base", id="gpt-4o"), pytest.param("gpt-4", "cl100k_base", id="gpt-4")],
)
@pytest.mark.parametrize(
    "text",
    [
        pytest.param("Hello there! How was your weekend?", id="english"),
        pytest.param(CHINESE_PARAGRAPH, id="chinese"),
        pytest.param(json.dumps(WEATHER_RESULT, ensure_ascii=False), id="json"),
        pytest.param("def f(x):\n    return x ** 2  # square\n", id="code"),
        pytest.param("special <|endoftext|> text 👨‍👩‍👧‍👦", id="special-token-and-zwj"),
    ],
)
def test_exact_counter_equals_tiktoken(model, encoding, text):
    tiktoken = load_tiktoken()

    assert counter_for(model).count_text(text) == len(tiktoken.get_encoding(encoding).encode_ordinary(text))


def test_exact_counter_encodes_a_repeated_text_once_and_a_very_long_text_each_time():
    """Assembling recounts the same turns on every turn, and a context's long blocks several
    times: a text counted again comes from the counter's cache, with the same count, a short one
    or a long one; a text over the longest cached length is encoded each time."""
    encode = load_tiktoken().get_encoding("cl100k_base").encode_ordinary
    encoded: list[str] = []
    counter = TiktokenCounter("cl100k_base")
    counter._encode = lambda text: encoded.append(text) or encode(text)
    short = "Hello there! How was your weekend?"
    long = "word " * (COUNT_CACHE_CHARS // 5 + 1)
    huge = "word " * (LONG_COUNT_CACHE_CHARS // 5 + 1)
    assert [counter.count_text(short) for _ in range(3)] == [len(encode(short))] * 3
    assert [counter.count_text(long) for _ in range(3)] == [len(encode(long))] * 3
    assert [counter.count_text(huge) for _ in range(2)] == [len(encode(huge))] * 2
    assert encoded == [short, long, huge, huge]


def test_estimator_and_deepseek_counter_also_count_a_repeated_text_once():
    """The conservative estimator (every unknown model) and the DeepSeek counter keep counts as
    the tiktoken counter does: the same answers, each short text worked out once."""
    estimated: list[str] = []

    class RecordingEstimator(ConservativeEstimator):
        def _count(self, text: str) -> int:
            estimated.append(text)
            return super()._count(text)

    short = "Hello there! 周末过得怎么样？"
    long = "word " * (COUNT_CACHE_CHARS // 5 + 1)
    huge = "word " * (LONG_COUNT_CACHE_CHARS // 5 + 1)
    estimator, plain = RecordingEstimator(), ConservativeEstimator()
    assert [estimator.count_text(short) for _ in range(3)] == [plain.count_text(short)] * 3
    assert [estimator.count_text(long) for _ in range(2)] == [plain.count_text(long)] * 2
    assert [estimator.count_text(huge) for _ in range(2)] == [plain.count_text(huge)] * 2
    assert estimated == [short, long, huge, huge]

    deepseek = HuggingFaceCounter("deepseek", "deepseek_tokenizer.json")
    expected = counter_for("deepseek/deepseek-chat").count_text(short)
    encoded: list[str] = []
    real = deepseek._tokenizer = counter_for("deepseek/deepseek-chat")._tokenizer

    class Recording:
        def encode_batch_fast(self, texts, **kwargs):
            encoded.extend(texts)
            return real.encode_batch_fast(texts, **kwargs)

    deepseek._tokenizer = Recording()
    assert [deepseek.count_text(short) for _ in range(3)] == [expected] * 3
    assert encoded == [short]


def test_deepseek_counter_equals_bundled_tokenizer(tokenizers_by_name):
    assert counter_for("deepseek/deepseek-chat").count_text(CHINESE_PARAGRAPH) == tokenizers_by_name["deepseek"](
        CHINESE_PARAGRAPH
    )


def test_exact_message_count_includes_at_least_cookbook_framing():
    """OpenAI Cookbook: 3 per message + role + content, and 3 to prime the reply."""
    tiktoken = load_tiktoken()

    enc = tiktoken.get_encoding("o200k_base")
    messages = [{"role": "system", "content": "Be kind."}, {"role": "user", "content": "Hi!"}]
    cookbook = sum(3 + len(enc.encode(m["role"])) + len(enc.encode(m["content"])) for m in messages) + 3
    assert counter_for("gpt-4o").count_messages(messages) >= cookbook


# --- choosing the counter ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("model", "name"),
    [
        pytest.param("gpt-4o", "tiktoken:o200k_base", id="gpt-4o"),
        pytest.param("gpt-4o-mini", "tiktoken:o200k_base", id="gpt-4o-mini"),
        pytest.param("gpt-4.1", "tiktoken:o200k_base", id="gpt-4.1"),
        pytest.param("o3-mini", "tiktoken:o200k_base", id="o-series"),
        pytest.param("azure/gpt-4o", "tiktoken:o200k_base", id="azure-gpt-4o"),
        pytest.param("gpt-4", "tiktoken:cl100k_base", id="gpt-4"),
        pytest.param("gpt-3.5-turbo", "tiktoken:cl100k_base", id="gpt-3.5-turbo"),
        pytest.param("deepseek/deepseek-chat", "tokenizers:deepseek", id="deepseek-chat"),
        pytest.param("deepseek/deepseek-reasoner", "tokenizers:deepseek", id="deepseek-reasoner"),
        pytest.param("totally-unknown-model-xyz", "estimator", id="unknown"),
        pytest.param("claude-sonnet-4-20250514", "estimator", id="known-but-not-bundled"),
        pytest.param(None, "estimator", id="none"),
    ],
)
def test_counter_for_picks_tokenizer_from_litellm_model_name(model, name):
    assert counter_for(model).name == name


def test_importing_tokens_does_not_load_tokenizer_libraries():
    code = "import sys, runtime.accounting; print(any(m in sys.modules for m in ('litellm', 'tiktoken', 'tokenizers')))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_window_and_tokenizer_of_a_mapped_model_need_no_litellm_import():
    """``companion inspect`` and the other commands that count tokens but call no model stay
    clear of litellm's 3-6 s import for a model that is a key of its bundled map."""
    code = (
        "import sys\n"
        "from runtime.accounting import counter_for\n"
        "from runtime.llm import model_window\n"
        "print(model_window('gpt-4o-mini'), counter_for('gpt-4o-mini').name, counter_for('deepseek-chat').name,"
        " 'litellm' in sys.modules)"
    )
    env = {k: v for k, v in os.environ.items() if k != "LITELLM_LOCAL_MODEL_COST_MAP"}
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split() == ["128000", "tiktoken:o200k_base", "tokenizers:deepseek", "False"]


def test_bundled_model_map_gives_litellms_own_answers(monkeypatch):
    """Over every key of litellm's bundled map: the tokenizer read without litellm equals
    the litellm path of :func:`tokenizer_kind`, a stated ``supports_vision`` equals
    litellm's, and the window equals
    ``litellm.get_model_info``'s wherever litellm gives one (for a few keys its lookup
    fails or drops the window the map states; the map's value is used there)."""
    import runtime._offline as offline
    from runtime.llm import _replier
    from runtime.llm._vision import catalog_says

    litellm = load_litellm()
    models = sorted(offline._bundled_model_map())
    assert len(models) > 1000
    litellm_kinds, litellm_windows, litellm_vision = {}, {}, {}
    with monkeypatch.context() as patched:
        patched.setattr(_exact, "_bundled_tokenizer_kind", lambda model: _exact._ASK_LITELLM)
        for m in models:
            litellm_kinds[m] = _exact.tokenizer_kind.__wrapped__(m)
            try:
                info = litellm.get_model_info(m)
            except Exception:
                continue
            litellm_windows[m] = info.get("max_input_tokens") or info.get("max_tokens")
            litellm_vision[m] = info.get("supports_vision")
    monkeypatch.setattr(litellm, "get_model_info", None)  # the bundled path must not call litellm
    monkeypatch.setattr(litellm, "get_llm_provider", None)
    kinds = windows = visions = 0
    for m in models:
        entry = offline.bundled_model_entry(m)
        if isinstance(entry.get("supports_vision"), bool):
            visions += 1
            assert catalog_says(m) is litellm_vision.get(m), m
        bundled = _exact._bundled_tokenizer_kind(m)
        if bundled != _exact._ASK_LITELLM:
            kinds += 1
            assert bundled == litellm_kinds[m], m
        stated = entry.get("max_input_tokens") or entry.get("max_tokens")
        if isinstance(stated, int) and stated > 0 and litellm_windows.get(m):
            windows += 1
            assert _replier.model_window(m) == litellm_windows[m], m
    assert kinds > 100 and windows > 1000 and visions > 1000


# --- content parts ----------------------------------------------------------------------------


@pytest.mark.parametrize("model", [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="exact")])
def test_unknown_content_part_type_raises_naming_the_type(model):
    message = {"role": "user", "content": [{"type": "hologram", "data": "..."}]}
    with pytest.raises(UncountableContentError, match="hologram"):
        counter_for(model).count_message(message)


@pytest.mark.parametrize("model", [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="exact")])
def test_non_text_message_content_raises(model):
    with pytest.raises(UncountableContentError):
        counter_for(model).count_message({"role": "user", "content": 42})


def _image_cost(counter, part) -> int:
    text_only = {"role": "user", "content": [{"type": "text", "text": "Look:"}]}
    with_image = {"role": "user", "content": [{"type": "text", "text": "Look:"}, part]}
    return counter.count_message(with_image) - counter.count_message(text_only)


@pytest.mark.parametrize(
    ("width", "height", "tokens"),
    [
        pytest.param(1024, 1024, 765, id="1024x1024-4-tiles"),
        pytest.param(2048, 4096, 1105, id="2048x4096-6-tiles"),
        pytest.param(512, 512, 255, id="512x512-1-tile"),
    ],
)
def test_openai_tile_rule_matches_published_examples(width, height, tokens):
    assert openai_image_tokens(width, height) == tokens


def test_image_with_known_size_uses_openai_tile_rule_on_gpt_4o():
    part = {"type": "image_url", "image_url": {"url": _png(1024, 1024)}}
    assert _image_cost(counter_for("gpt-4o"), part) == openai_image_tokens(1024, 1024) == 765


def test_image_with_low_detail_costs_85_on_gpt_4o():
    part = {"type": "image_url", "image_url": {"url": _png(4000, 3000), "detail": "low"}}
    assert _image_cost(counter_for("gpt-4o"), part) == 85


@pytest.mark.parametrize(
    "part",
    [
        pytest.param({"type": "image_url", "image_url": {"url": _png(1024, 1024)}}, id="openai-data-url"),
        pytest.param(
            {
                "type": "image",
                "source": {"type": "base64", "media_type": "image/png", "data": _png(1024, 1024).split(",")[1]},
            },
            id="anthropic-base64",
        ),
        pytest.param(
            {"type": "input_image", "image_url": "https://example.com/a.png", "width": 1024, "height": 1024},
            id="explicit-size",
        ),
    ],
)
def test_estimator_prices_known_size_image_by_the_larger_provider_rule(part):
    expected = max(openai_image_tokens(1024, 1024), anthropic_image_tokens(1024, 1024))
    assert expected == anthropic_image_tokens(1024, 1024) == 1399
    assert _image_cost(counter_for(None), part) == expected


def test_image_of_unknown_size_gets_a_fixed_nonzero_cost():
    part = {"type": "image_url", "image_url": {"url": "https://example.com/cat.jpg"}}
    assert _image_cost(counter_for(None), part) >= openai_image_tokens(768, 2048)


def test_pdf_document_is_priced_per_page():
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Pages /Count 2 >>\n2 0 obj << /Type /Page >>\n3 0 obj << /Type /Page >>\n"
    one_page = pdf.replace(b"3 0 obj << /Type /Page >>\n", b"")
    counter = counter_for(None)

    def cost(data: bytes) -> int:
        part = {"type": "file", "file": {"file_data": "data:application/pdf;base64," + base64.b64encode(data).decode()}}
        return _image_cost(counter, part)

    assert cost(pdf) > cost(one_page) > 0


# --- tool calls, tool results, tool schemas ---------------------------------------------------

TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather and a two-day forecast for a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}


def _call(arguments: str) -> dict:
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}
        ],
    }


@pytest.mark.parametrize(
    "model",
    [
        pytest.param(None, id="estimator"),
        pytest.param("gpt-4o", id="o200k"),
        pytest.param("deepseek/deepseek-chat", id="deepseek"),
    ],
)
def test_tool_call_counts_name_and_arguments(model):
    counter = counter_for(model)
    short = counter.count_message(_call('{"city":"Paris"}'))
    long = counter.count_message(_call('{"city":"Paris","units":"metric","days":2}'))
    bare = counter.count_message({"role": "assistant", "content": None})
    assert bare < short < long
    assert short - bare >= counter.count_text("get_weather") + counter.count_text('{"city":"Paris"}')


@pytest.mark.parametrize("model", [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="o200k")])
def test_tool_result_counts_its_content(model):
    counter = counter_for(model)
    result = json.dumps(WEATHER_RESULT, ensure_ascii=False)
    message = {"role": "tool", "tool_call_id": "call_1", "content": result}
    assert counter.count_message(message) >= MESSAGE_FRAMING + counter.count_text(result)


@pytest.mark.parametrize(
    "model",
    [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="o200k"), pytest.param("gpt-4", id="cl100k")],
)
def test_adding_a_tool_schema_increases_request_count(model):
    counter = counter_for(model)
    messages = [{"role": "system", "content": "You are a companion."}, {"role": "user", "content": "Weather in Paris?"}]
    without = counter.count_messages(messages)
    with_tool = counter.count_messages(messages, tools=[TOOL])
    assert with_tool > without
    assert with_tool - without >= counter.count_text(json.dumps(TOOL, separators=(",", ":")))


@pytest.mark.parametrize("model", [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="o200k")])
def test_request_count_is_sum_of_messages_plus_reply_priming(model):
    counter = counter_for(model)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "你好", "name": "mei"}]
    assert counter.count_messages(messages) == sum(counter.count_message(m) for m in messages) + REPLY_PRIMING


@pytest.mark.parametrize("model", [pytest.param(None, id="estimator"), pytest.param("gpt-4o", id="o200k")])
def test_request_count_is_at_least_litellm_token_counter(model):
    litellm = load_litellm()

    messages = [
        {"role": "system", "content": "You are a warm companion."},
        {"role": "user", "content": CHINESE_PARAGRAPH},
        _call('{"city":"杭州"}'),
        {"role": "tool", "tool_call_id": "call_1", "content": json.dumps(WEATHER_RESULT, ensure_ascii=False)},
    ]
    reference = litellm.token_counter(model=model or "gpt-4o", messages=messages, tools=[TOOL])
    assert counter_for(model).count_messages(messages, tools=[TOOL]) >= reference


@pytest.mark.parametrize("fmt", [pytest.param(f, id=f.lower()) for f in ("PNG", "JPEG", "GIF", "WEBP")])
def test_inline_image_size_is_read_from_each_format_providers_accept(fmt):
    from PIL import Image

    out = io.BytesIO()
    Image.new("RGB", (1000, 500)).save(out, format=fmt)
    url = f"data:image/{fmt.lower()};base64," + base64.b64encode(out.getvalue()).decode()
    part = {"type": "image_url", "image_url": {"url": url}}
    assert _image_cost(counter_for(None), part) == max(
        openai_image_tokens(1000, 500), anthropic_image_tokens(1000, 500)
    )


# --- the estimator's bound on text the fit never saw ------------------------------------------

THREE = ["cl100k_base", "o200k_base", "deepseek"]
"""The tokenizers the estimator must never undercount: the largest of their counts is the reference."""


def _random_chars(seed: int, low: int, high: int, n: int = 1000) -> str:
    rng = random.Random(seed)
    return "".join(chr(rng.randint(low, high)) for _ in range(n))


def _stacked(seed: int) -> str:
    rng = random.Random(seed)
    return "".join("aeiou"[i % 5] + "".join(chr(rng.randint(0x300, 0x36F)) for _ in range(5)) for i in range(170))[
        :1000
    ]


UNSEEN_CLASSES = {
    # the classes measured as undercounted (estimate / largest real count 0.46-0.79)
    "digit-runs": "".join(random.Random(1).choices(string.digits, k=1000)),
    "spaced-han": " ".join("哈" * 500)[:1000],
    "cjk-extension-a": _random_chars(2, 0x3400, 0x4DBF),
    "cjk-extension-b": _random_chars(3, 0x20000, 0x2A6DF),
    "fullwidth-latin": _random_chars(4, 0xFF21, 0xFF5A),
    "stacked-combining-marks": _stacked(5),
    "private-use": _random_chars(6, 0xE000, 0xF8FF),
    # more classes of the same kind: scripts, blocks and shapes the fit never saw
    "random-han": _random_chars(7, 0x4E00, 0x9FFF),
    "random-hangul": _random_chars(8, 0xAC00, 0xD7A3),
    "random-cyrillic": _random_chars(9, 0x400, 0x4FF),
    "random-greek": _random_chars(10, 0x370, 0x3FF),
    "braille": _random_chars(11, 0x2800, 0x28FF),
    "symbols-and-arrows": _random_chars(12, 0x2000, 0x2BFF),
    "math-alphanumerics": _random_chars(13, 0x1D400, 0x1D7FF),
    "tag-characters": _random_chars(14, 0xE0020, 0xE007F),
    "variation-selectors": "a" + _random_chars(15, 0xFE00, 0xFE0F, 999),
    "control-characters": _random_chars(16, 0, 31),
    "random-lowercase": "".join(random.Random(17).choices(string.ascii_lowercase, k=1000)),
    "random-ascii-words": " ".join(
        "".join(random.Random(18 + i).choices(string.ascii_lowercase, k=1 + i % 9)) for i in range(200)
    )[:1000],
    "repeated-letters": " ".join(letter * (2 + i % 9) for i, letter in enumerate(string.ascii_lowercase * 8))[:1000],
    "repeated-brackets-and-quotes": "".join(mark * 50 for mark in "\"'`[]{}()<>" * 2)[:1000],
    "random-printable-ascii": "".join(random.Random(19).choices(string.printable[:94], k=1000)),
    "base64": base64.b64encode(random.Random(20).randbytes(750)).decode("ascii"),
    "punctuation-soup": "".join(random.Random(21).choices(string.punctuation, k=1000)),
    # digits after spaces: the space is a token of its own (0.81 of the largest count before)
    "spaced-digits": " ".join(random.Random(23).choices(string.digits, k=500))[:1000],
    "aligned-number-columns": "\n".join(
        "".join(str(random.Random(24 + row).randint(0, 999)).rjust(2 + (row + col) % 7) for col in range(10))
        for row in range(40)
    )[:1000],
}


@pytest.mark.parametrize("name", [pytest.param(name, id=name) for name in UNSEEN_CLASSES])
def test_estimator_does_not_undercount_text_the_fit_never_saw(tokenizers_by_name, name):
    text = UNSEEN_CLASSES[name]
    largest = max(tokenizers_by_name[t](text) for t in THREE)
    assert counter_for(None).count_text(text) >= largest


def test_estimator_never_exceeds_the_byte_bound_by_more_than_the_ascii_fit():
    """Outside ASCII the price is at most the bytes: a text of non-ASCII letters costs no more than its UTF-8 length + 3."""
    text = _random_chars(22, 0x4E00, 0x9FFF)
    assert counter_for(None).count_text(text) <= len(text.encode("utf-8")) + 4


def _text_pieces():
    from hypothesis import strategies as st

    tabled = st.sampled_from(sorted(_estimator._SAVING))
    return st.one_of(
        st.text(max_size=40),  # any code point outside the surrogates
        st.text(alphabet=st.characters(max_codepoint=127), max_size=40),
        st.text(alphabet=string.ascii_letters + string.digits + " ", max_size=60),
        st.text(alphabet=tabled, max_size=40),
        st.text(alphabet=st.characters(min_codepoint=0x4E00, max_codepoint=0x9FFF), max_size=40),
        st.text(alphabet=st.characters(min_codepoint=0x300, max_codepoint=0x36F), max_size=20),
        st.text(alphabet=" \t\n\r", max_size=20),
        st.text(alphabet=st.characters(min_codepoint=0x1F300, max_codepoint=0x1FAFF), max_size=20),
    )


def _never_undercounts(tokenizers_by_name, text: str) -> None:
    estimate = counter_for(None).count_text(text)
    largest = max(tokenizers_by_name[t](text) for t in THREE)
    assert estimate >= largest, (text, estimate, largest)


def test_estimator_never_undercounts_random_unicode(tokenizers_by_name):
    """Property: for random strings over all of Unicode the estimate is at least the largest bundled
    count. The draw is fixed (``derandomize``), so a run is repeatable; searches with many more
    random examples are how the estimator's known limits were found (see ``ESTIMATOR_PRICES``)."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(st.text(max_size=300))
    def check(text):
        _never_undercounts(tokenizers_by_name, text)

    check()


def test_estimator_never_undercounts_random_mixtures_of_classes(tokenizers_by_name):
    """Property: concatenations of pieces from many classes (ASCII soup, letters and digits, runs of
    table characters, Han, combining marks, whitespace, emoji) are never undercounted, boundaries included.
    A fixed draw (``derandomize``), so a run is repeatable, plus the texts random draws found: short
    letter runs between marks (``letters_between_marks``)."""
    from hypothesis import example, given, settings
    from hypothesis import strategies as st

    @settings(max_examples=300, deadline=None, database=None, derandomize=True)
    @given(st.lists(_text_pieces(), max_size=10).map("".join))
    @example('Xa"B`Xa"B')
    @example('Xa"B`Xa"B`Xa"B')
    @example("T}M;h{" * 4)
    def check(text):
        _never_undercounts(tokenizers_by_name, text)

    check()


def test_table_characters_cost_at_most_their_table_count_in_every_tokenizer(tokenizers_by_name):
    """The tables the bound trusts: each character alone costs at most (UTF-8 bytes - saving) tokens."""
    wrong = [
        (char, name)
        for char, saving in _estimator._SAVING.items()
        for name in THREE
        if tokenizers_by_name[name](char) > len(char.encode("utf-8")) - saving
    ]
    assert not wrong[:10]


def test_spaces_before_digits_are_one_token_or_two_in_every_tokenizer(tokenizers_by_name):
    """The premise of ``space_digit`` and ``spaces_digit``: no pre-tokenizer joins a space to a
    digit; one space is one token, a run of 2-16 spaces at most two."""
    groups = ["0", "7", "42", "999"]
    for name in THREE:
        count = tokenizers_by_name[name]
        assert all(count(" " + group) == 2 for group in groups)
        assert all(count(" " * k + group) <= 3 for k in range(2, 17) for group in groups)
    assert tokenizers_by_name["cl100k_base"]("  5") == 3  # the run ends one space early


def test_digit_groups_and_common_punctuation_pairs_are_one_token_in_every_tokenizer(tokenizers_by_name):
    groups = [str(i) for i in range(10)] + [f"{i:02d}" for i in range(100)] + [f"{i:03d}" for i in range(1000)]
    pairs = sorted(_estimator.COMMON_PUNCTUATION_PAIRS)
    assert all(tokenizers_by_name[name](text) == 1 for name in THREE for text in groups + pairs)


def _pair_counts_by_definition(text: str) -> tuple[int, ...]:
    """The adjacency counts of :func:`text_features`, counted pair by pair from their definitions."""
    marks = set(string.punctuation)
    rare = {a + b for group in _estimator.RARE_LETTER_PAIRS.split("|") for a in group[0] for b in group[2:-1]}
    pairs = list(zip(text, text[1:], strict=False))
    triples = list(zip(text, text[1:], text[2:], strict=False))
    return (
        sum((a + b).lower() in rare and (a + b).isascii() and (a + b).isalpha() for a, b in pairs),
        sum(a in marks and b in marks and a + b not in _estimator.COMMON_PUNCTUATION_PAIRS for a, b in pairs),
        sum(a == b == c and a.isascii() and a.isalpha() for a, b, c in triples),
        sum(a == b and a in marks for a, b in pairs),
        sum(a == " " and b in string.digits for a, b in pairs),
        sum(a == b == " " and c in string.digits for a, b, c in triples),
    )


def test_pair_features_count_every_overlapping_pair():
    """Property: rare letter pairs, rare mark pairs, letter triples, mark repeats and spaces before a
    digit, counted from bigram strings, equal a pair-by-pair count, next to any non-ASCII or control
    character too."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    names = (
        "rare_letter_pairs",
        "rare_punctuation_pairs",
        "letter_triples",
        "punctuation_repeats",
        "space_digit",
        "spaces_digit",
    )
    where = [_estimator.FEATURES.index(name) for name in names]

    @settings(max_examples=400, deadline=None, database=None)
    @given(
        st.text(
            alphabet=st.sampled_from("zZqQjJxXkKaa" + "]]}}@@;;=<.\"'" + "  05\t" + " \n\x00\x7f\x80é哈😀\ud7ff\ue000"),
            max_size=60,
        )
    )
    def check(text):
        features = _estimator.text_features(text)
        assert tuple(features[i] for i in where) == _pair_counts_by_definition(text), text

    check()


@pytest.mark.parametrize(
    "tokens, table",
    [
        pytest.param(1, "SINGLE_TOKEN_CHARS", id="one"),
        pytest.param(2, "TWO_TOKEN_CHARS", id="two"),
        pytest.param(3, "THREE_TOKEN_CHARS", id="three"),
    ],
)
def test_the_generated_character_tables_are_what_their_script_generates(tokens, table):
    """``runtime/accounting/_tables.py`` is generated by ``scripts/single_token_chars.py``: running
    it again on the bundled tokenizers gives the same ranges."""
    sys.path.insert(0, str(REPO / "scripts"))
    try:
        import single_token_chars
    finally:
        sys.path.remove(str(REPO / "scripts"))
    generated = single_token_chars.ranges(single_token_chars.chars_costing(tokens))
    assert generated.encode("ascii").decode("unicode_escape") == getattr(_tables, table)

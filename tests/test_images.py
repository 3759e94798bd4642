"""Images: vision routing, the transcript cache and its markers, batching, the
fallback chain, OCR, the re-encoding matrix, token cost, the generated-image relay.

Real database and real litellm client; the models are the loopback fake server, answering
transcription requests by model name (a scripted queue per model) and replies with a fixed text.
"""

from __future__ import annotations

import shutil
import socket
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import pytest

from runtime.accounting import anthropic_image_tokens, openai_image_tokens
from runtime.config import Settings
from runtime.context import TRANSCRIPT_MARKERS, marker, split_transcripts
from runtime.files import open_file_services
from runtime.llm import (
    EDGES,
    QUALITIES,
    ImageInput,
    LiteLLMReplier,
    Transcriber,
    batch_timeout,
    catalog_says,
    family,
    fit_image,
    heuristic_says,
    image_tokens,
    sees_images,
    split_reply,
    tesseract_text,
)
from runtime.turn import Engine
from tests import image_fixtures as img
from tests.conftest import PERSONA, estimate_as_we_do
from tests.fake_llm import Hang, HTTPError, ToolCalls

VISION, BACKUP = "fake-vision", "fake-backup"
DOWN = HTTPError(503, "The server is overloaded.", type="server_error")


def _dead_base() -> str:
    """An api_base nothing listens on (connection refused): a gateway that is down."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return f"http://127.0.0.1:{port}/v1"


def image_parts(message: dict[str, Any]) -> list[dict[str, Any]]:
    content = message.get("content")
    return [p for p in content if p.get("type") == "image_url"] if isinstance(content, list) else []


def text_of(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):
        return "\n".join(p.get("text", "") for p in content if p.get("type") == "text")
    return content or ""


@dataclass
class ImagesEnv:
    fake: Any
    build: Callable[..., Engine]
    upload: Callable[..., str]
    vision_steps: dict[str, deque] = field(default_factory=dict)

    def script(self, model: str, *steps: Any) -> None:
        self.vision_steps.setdefault(model, deque()).extend(steps)

    def calls(self, model: str | None = None) -> list[dict[str, Any]]:
        """Transcription requests (to ``model``, or to any vision model)."""
        names = {model} if model else {VISION, BACKUP}
        return [r for r in self.fake.requests if r.get("model") in names]

    def replies(self) -> list[dict[str, Any]]:
        return [r for r in self.fake.requests if r.get("model") not in (VISION, BACKUP)]


@pytest.fixture
def images_env(store, embedder, fake_llm, tmp_path):
    fake_llm.prompt_tokens, fake_llm.stream_delay = estimate_as_we_do, 0.0
    base = Settings(
        database_url="unused",
        files_dir=tmp_path / "files",
        vision_model=f"openai/{VISION}",
        vision_api_base=fake_llm.api_base,
        ocr_languages="",
    )
    services = open_file_services(base, store.engine)
    env = ImagesEnv(fake=fake_llm, build=lambda **kw: None, upload=lambda *a, **k: "")

    def route(body: dict[str, Any]) -> Any:
        queue = env.vision_steps.get(body.get("model"))
        if queue:
            return queue.popleft()
        return "A picture." if body.get("model") in (VISION, BACKUP) else "I see."

    fake_llm.responder = route

    def build(*, model: str = "openai/fake-model", ocr=None, **overrides: Any) -> Engine:
        settings = base.model_copy(update={"model": model, **overrides})
        replier = LiteLLMReplier(model=model, api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
        return Engine(
            settings=settings,
            store=store,
            embedder=embedder,
            persona=PERSONA,
            replier=replier,
            file_services=services,
            transcriber=Transcriber(settings.vision, ocr=ocr, api_key="sk-test"),
        )

    def upload(user_id: str, name: str, data: bytes) -> str:
        return services.files.add(user_id=user_id, name=name, data=data).id

    env.build, env.upload = build, upload
    yield env
    services.close()


# -- which models see --------------------------------------------------------------------
@pytest.mark.parametrize(
    "model, sees",
    [
        ("gpt-4o-mini", True),  # litellm's catalog
        ("claude-3-5-sonnet-20240620", True),
        ("gpt-3.5-turbo", False),
        ("deepseek-chat", False),
        ("openai/acme-vl-13b-instruct", True),  # unknown "*-vl-*": the heuristic
        ("ollama/qwen2.5-vl:7b", True),
        ("openai/my-omni-model", True),
        ("openai/fake-model", False),
    ],
)
def test_vision_capability_catalog_then_heuristics(model, sees):
    assert sees_images(model) is sees


VISION_MODELS = [
    "gpt-4o",
    "gpt-4o-mini",
    "gpt-4.1-nano",
    "gpt-5",
    "o1",
    "o3",
    "o4-mini",
    "anthropic/claude-3-haiku-20240307",
    "claude-sonnet-4-20250514",
    "gemini/gemini-2.0-flash",
    "gemini/gemini-1.5-pro",
    "gemini/gemma-3-27b-it",
    "ollama/gemma3:4b",
    "ollama/gemma3",
    "gemma-3-12b-it",
    "ollama/gemma3n:e4b",
    "ollama/llava",
    "ollama/llama3.2-vision",
    "groq/llama-3.2-11b-vision-preview",
    "meta-llama/llama-4-scout-17b-16e-instruct",
    "mistral/pixtral-12b-2409",
    "openrouter/qwen/qwen-2.5-vl-72b-instruct",
    "ollama/qwen2.5vl:7b",
    "qwen/qwen2.5-omni-7b",
    "ollama/minicpm-v",
    "ollama/moondream",
    "xai/grok-2-vision-1212",
]
TEXT_ONLY_MODELS = [
    # text-only members of vision families
    "ollama/gemma3:1b",
    "gemma-3-1b-it",
    "openrouter/google/gemma-3-1b-it",
    "ollama/gemma3:270m",
    "o1-preview",
    "o1-preview-2024-09-12",
    "o1-mini",
    "o3-mini",
    "gpt-4o-realtime-preview",
    "gpt-4o-mini-tts",
    "gpt-4o-transcribe",
    "gemini-pro",
    "vertex_ai/gemini-1.0-pro-002",
    "mistral/mistral-small-2501",
    # the catalog's explicit supports_vision: false, for names the heuristics would call vision
    "azure/gpt-4o-audio-preview-2024-12-17",
    "watsonx/meta-llama/llama-4-maverick-17b",
    "gemini/lyria-3-pro-preview",
    # plainly text-only
    "gpt-3.5-turbo",
    "gpt-4",
    "deepseek/deepseek-chat",
    "deepseek/deepseek-reasoner",
    "text-embedding-3-small",
    "ollama/llama3",
    "groq/llama-3.3-70b-versatile",
    "claude-2.1",
    "ollama/phi3",
    "mistral/codestral-latest",
]


@pytest.mark.parametrize(
    "model, sees",
    [pytest.param(m, True, id=f"vision:{m}") for m in VISION_MODELS]
    + [pytest.param(m, False, id=f"text:{m}") for m in TEXT_ONLY_MODELS],
)
def test_vision_routing_table(model, sees):
    assert sees_images(model) is sees


@pytest.mark.parametrize("model", ["watsonx/meta-llama/llama-4-maverick-17b", "gemini/lyria-3-pro-preview"])
def test_the_catalogs_explicit_no_beats_a_name_that_looks_like_vision(model):
    assert catalog_says(model) is False
    assert heuristic_says(model)  # the name alone would route pixels
    assert not sees_images(model)


def test_an_operators_listed_model_sees_images_even_against_the_catalog():
    assert sees_images("ollama/gemma3:1b", ("ollama/gemma3:1b",))


def test_configured_vision_models_count():
    assert not sees_images("openai/house-model")
    assert sees_images("openai/house-model", ("openai/house-model",))


def test_routing_vision_sends_pixels_text_sends_transcript(images_env):
    photo = images_env.upload("u1", "cat.png", img.small_png((10, 200, 10)))
    vision = images_env.build(model="openai/acme-vl-13b")  # unknown to litellm, a vision name
    vision.turn(user_id="u1", session_id="sv", message="Look!", attachments=[photo])
    assert images_env.calls() == []  # the vision path never transcribes
    last_user = [m for m in images_env.replies()[-1]["messages"] if m["role"] == "user"][-1]
    assert len(image_parts(last_user)) == 1
    assert image_parts(last_user)[0]["image_url"]["url"].startswith("data:image/")
    assert "Look!" in text_of(last_user)

    images_env.script(VISION, "A green rectangle.")
    text = images_env.build()
    text.turn(user_id="u1", session_id="st", message="Look!", attachments=[photo])
    assert len(images_env.calls(VISION)) == 1
    sent = images_env.replies()[-1]["messages"]
    assert all(not image_parts(m) for m in sent)
    assert f"{marker(photo)}\nA green rectangle." in text_of([m for m in sent if m["role"] == "user"][-1])


# -- transcribed once ------------------------------------------------------------------------
def test_exactly_one_transcription_call_per_image_across_five_turns(images_env):
    a = images_env.upload("u1", "a.png", img.small_png((255, 0, 0)))
    b = images_env.upload("u1", "b.png", img.small_png((0, 0, 255)))
    images_env.script(VISION, "A red square.", "A blue square.")
    engine = images_env.build()
    plan = [("one", [a]), ("two", []), ("three", [b]), ("four", []), ("five", [])]
    for message, attachments in plan:
        engine.turn(user_id="u1", session_id="s5", message=message, attachments=attachments)
    calls = images_env.calls()
    assert len(calls) == 2
    assert [len(image_parts(c["messages"][0])) for c in calls] == [1, 1]
    final = "\n".join(text_of(m) for m in images_env.replies()[-1]["messages"])
    assert "A red square." in final and "A blue square." in final  # the cache, folded under older turns


def test_a_doubled_transcript_keeps_the_first(images_env):
    photo = images_env.upload("u1", "p.png", img.small_png((1, 2, 3)))
    message = f"see\n{marker(photo)}\nFIRST description.\n{marker(photo)}\nSECOND description."
    assert split_transcripts(message)[1] == {photo: "FIRST description."}
    images_env.build().turn(user_id="u1", session_id="sd", message=message, attachments=[photo])
    assert images_env.calls() == []  # the turn's own transcript counts
    sent = "\n".join(text_of(m) for m in images_env.replies()[-1]["messages"])
    assert "FIRST description." in sent and "SECOND description." not in sent


def test_an_old_wording_marker_is_recognised(images_env):
    photo = images_env.upload("u1", "old.png", img.small_png((9, 9, 9)))
    old = TRANSCRIPT_MARKERS[1].format(file_id=photo)
    assert old != TRANSCRIPT_MARKERS[0].format(file_id=photo)
    images_env.build().turn(
        user_id="u1", session_id="so", message=f"from last year\n{old} A grey square.", attachments=[photo]
    )
    assert images_env.calls() == []
    assert "A grey square." in "\n".join(text_of(m) for m in images_env.replies()[-1]["messages"])


def test_switch_text_to_vision_and_back(images_env):
    photo = images_env.upload("u1", "s.png", img.small_png((50, 60, 70)))
    images_env.script(VISION, "A slate square.")
    text = images_env.build()
    text.turn(user_id="u1", session_id="sw", message="here", attachments=[photo])
    assert len(images_env.calls()) == 1

    vision = images_env.build(model="openai/fake-model", vision_models=("openai/fake-model",))
    seq = vision.store.turns.of_session("sw")[0].seq  # regenerate the text model's turn with the vision model
    context = vision.edit_turn(user_id="u1", session_id="sw", seq=seq, message="here", attachments=[photo]).context
    users = [m for m in context.messages if m["role"] == "user"]
    assert len(image_parts(users[-1])) == 1  # pixels again, although a transcript is cached
    assert len(images_env.calls()) == 1
    assert context.total_tokens >= vision.counter.count_messages(context.messages)

    text.turn(user_id="u1", session_id="sw", message="and now?")
    assert len(images_env.calls()) == 1  # reused, no new call
    assert "A slate square." in "\n".join(text_of(m) for m in images_env.replies()[-1]["messages"])


def test_old_untranscribed_image_is_a_reference_image_read_can_resolve(images_env):
    photo = images_env.upload("u1", "v.png", img.small_png((120, 0, 120)))
    images_env.build(model="openai/acme-vl-13b").turn(
        user_id="u1", session_id="sr", message="look", attachments=[photo]
    )
    assert images_env.calls() == []  # seen as pixels, never transcribed
    images_env.script("fake-model", ToolCalls([("image_read", {"file_id": photo})]), "It was purple.")
    images_env.script(VISION, "A purple square.")
    text = images_env.build()
    result = text.turn(user_id="u1", session_id="sr", message="what did I send?")
    first, follow_up = images_env.replies()[-2:]
    assert [t["function"]["name"] for t in first["tools"]] == ["image_read"]  # file_read cannot read pixels
    history = "\n".join(text_of(m) for m in first["messages"])
    assert f'[[image_read file_id={photo} name="v.png"]]' in history and "call image_read" in history
    tool_result = [m for m in follow_up["messages"] if m["role"] == "tool"][-1]["content"]
    assert f"{marker(photo)}\nA purple square." == tool_result
    assert result.assistant_turn.content == "It was purple."
    text.turn(user_id="u1", session_id="sr", message="and again?")
    assert len(images_env.calls()) == 1  # cached by the tool call
    assert "A purple square." in "\n".join(text_of(m) for m in images_env.replies()[-1]["messages"])


# -- batching --------------------------------------------------------------------------------
def test_split_reply_with_and_without_markers():
    assert split_reply("【图1】一只猫\n【图2】一条狗", 2) == ["一只猫", "一条狗"]
    assert split_reply("[Image 1]\nA cat.\n[Image 2]\nA dog.", 2) == ["A cat.", "A dog."]
    assert split_reply("Image 1: A cat.\nImage 2: A dog.", 2) == ["A cat.", "A dog."]
    assert split_reply("A cat and a dog.", 2) == ["A cat and a dog.", "A cat and a dog."]
    assert split_reply("[Image 2] A dog.", 2) == ["[Image 2] A dog.", "A dog."]  # a lost section: the whole text


def test_batch_timeout_grows_linearly_and_is_capped():
    s = Settings(database_url="unused")
    assert [batch_timeout(n, s.vision) for n in (1, 2, 3, 4, 5)] == [45, 60, 75, 90, 90]


def test_several_new_images_go_in_one_call_split_by_markers(images_env):
    ids = [images_env.upload("u1", f"{i}.png", img.small_png((i * 40, 10, 10))) for i in range(3)]
    images_env.script(VISION, "[Image 1]\nFirst.\n[Image 2]\nSecond.\n[Image 3]\nThird.")
    images_env.build().turn(user_id="u1", session_id="sb", message="three", attachments=ids)
    calls = images_env.calls()
    assert len(calls) == 1 and len(image_parts(calls[0]["messages"][0])) == 3
    sent = text_of([m for m in images_env.replies()[-1]["messages"] if m["role"] == "user"][-1])
    for fid, word in zip(ids, ["First.", "Second.", "Third."], strict=False):
        assert f"{marker(fid)}\n{word}" in sent


# -- the fallback chain ----------------------------------------------------------------------
def _inputs(*datas: bytes) -> list[ImageInput]:
    return [ImageInput(file_id=f"file_{i:020d}", name=f"{i}.png", data=d) for i, d in enumerate(datas)]


def _settings(images_env, **kw: Any) -> Settings:
    return Settings(
        database_url="unused",
        vision_model=f"openai/{VISION}",
        vision_api_base=images_env.fake.api_base,
        ocr_languages="",
        **kw,
    )


def test_chain_primary(images_env):
    images_env.script(VISION, "Primary says a square.")
    [t] = Transcriber(_settings(images_env).vision, api_key="sk").transcribe(_inputs(img.small_png()))
    assert (t.method, t.text) == ("primary", "Primary says a square.")


def test_chain_backup_after_a_failure_and_after_a_timeout(images_env):
    settings = _settings(images_env, vision_backup_model=f"openai/{BACKUP}", vision_timeout=0.5)
    images_env.script(VISION, DOWN, Hang(3.0))
    images_env.script(BACKUP, "Backup one.", "Backup two.")
    chain = Transcriber(settings.vision, api_key="sk")
    assert [t.method for t in chain.transcribe(_inputs(img.small_png()))] == ["backup"]
    [t] = chain.transcribe(_inputs(img.small_png()))  # the primary hangs past its timeout
    assert (t.method, t.text) == ("backup", "Backup two.")


def test_chain_direct_bypasses_a_dead_gateway(images_env):
    settings = _settings(images_env, vision_backup_model=f"openai/{BACKUP}").model_copy(
        update={"vision_api_base": _dead_base(), "vision_direct_api_base": images_env.fake.api_base}
    )
    images_env.script(VISION, "Direct route.")
    [t] = Transcriber(settings.vision, api_key="sk").transcribe(_inputs(img.small_png()))
    assert (t.method, t.text) == ("direct", "Direct route.")


NEEDS_TESSERACT = pytest.mark.skipif(
    shutil.which("tesseract") is None, reason="Tesseract is not installed (CI installs it; see README)"
)
"""The local OCR step needs the ``tesseract`` binary; a non-root user without it skips these."""


@NEEDS_TESSERACT
def test_chain_local_ocr_then_ocr_only_prompt(images_env):
    settings = _settings(images_env).model_copy(update={"ocr_languages": "eng"})
    images_env.script(VISION, DOWN)  # describing fails ...
    [t] = Transcriber(settings.vision, api_key="sk").transcribe(_inputs(img.screenshot()))
    assert t.method == "ocr" and "Invoice 4471" in t.text  # ... local Tesseract reads the text

    images_env.script(VISION, DOWN, "Total due 5 EUR")  # no text for OCR: the model's OCR-only prompt
    [t] = Transcriber(settings.vision, api_key="sk", ocr=lambda data, langs: "").transcribe(_inputs(img.small_png()))
    assert t.method == "ocr_model" and "Total due 5 EUR" in t.text
    ocr_request = images_env.calls(VISION)[-1]["messages"][0]["content"][0]["text"]
    assert "Transcribe the text visible" in ocr_request


def test_chain_failed_batch_retries_each_image_alone(images_env):
    images_env.script(VISION, DOWN, "Alone one.", "Alone two.")
    out = Transcriber(_settings(images_env).vision, api_key="sk").transcribe(
        _inputs(img.small_png((1, 1, 1)), img.small_png((2, 2, 2)))
    )
    assert [(t.method, t.text) for t in out] == [("primary", "Alone one."), ("primary", "Alone two.")]
    assert [len(image_parts(c["messages"][0])) for c in images_env.calls()] == [2, 1, 1]


def test_total_failure_is_a_clear_placeholder_never_empty(images_env):
    images_env.script(VISION, *[DOWN] * 4)
    [t] = Transcriber(_settings(images_env).vision, api_key="sk").transcribe(_inputs(img.small_png()))
    assert t.method == "failed" and "could not be read" in t.text and "file_00000000000000000000" in t.text
    # in a turn: the placeholder is shown, nothing cached, so a later image_read may try again
    photo = images_env.upload("u1", "bad.png", img.small_png((4, 4, 4)))
    images_env.script(VISION, *[DOWN] * 4)
    images_env.build().turn(user_id="u1", session_id="sf", message="what is it?", attachments=[photo])
    sent = text_of([m for m in images_env.replies()[-1]["messages"] if m["role"] == "user"][-1])
    assert "could not be read" in sent


@NEEDS_TESSERACT
def test_ocr_on_the_screenshot_returns_its_text():
    found = tesseract_text(img.screenshot(), "eng")
    for line in img.SCREENSHOT_TEXT:
        assert line in found


# -- the re-encoding matrix and token cost -----------------------------------------------------
def test_matrix_fits_every_image_under_1mb_and_the_screenshot_keeps_the_largest_edge():
    budget = 1_000_000
    shot, noisy, huge = (fit_image(d, budget=budget) for d in (img.screenshot(), img.noisy_photo(), img.huge()))
    for encoded in (shot, noisy, huge):
        assert encoded.fits and len(encoded.data) <= budget
        assert max(encoded.width, encoded.height) <= EDGES[0]
    assert max(shot.width, shot.height) == EDGES[0]
    assert huge.width == EDGES[0]  # 6000x4000 scaled to the first edge

    def rank(e):  # position in the matrix: (edge index, quality index)
        return (EDGES.index(max(e.width, e.height)), QUALITIES.index(e.quality) if e.quality else -1)

    assert rank(noisy) > rank(shot)  # the noisy photo shrinks more
    tight = fit_image(img.noisy_photo(), budget=150_000)
    assert tight.fits and rank(tight) > rank(noisy)


def test_image_tokens_follow_the_provider_family():
    assert family("gpt-4o") == "openai" and family("claude-3-5-sonnet") == "anthropic" and family("llava") == "other"
    assert image_tokens("gpt-4o", 1568, 882) == openai_image_tokens(1568, 882) == 85 + 170 * 6
    assert image_tokens("claude-3-5-sonnet", 1568, 882) == anthropic_image_tokens(1568, 882) > 1500
    assert image_tokens("ollama/llava", 1568, 882) == max(
        openai_image_tokens(1568, 882), anthropic_image_tokens(1568, 882)
    )


def test_pixels_count_against_the_budgets(images_env):
    shot = images_env.upload("u1", "shot.png", img.screenshot())
    engine = images_env.build(model="openai/acme-vl-13b")
    result = engine.turn(user_id="u1", session_id="sp", message="read this", attachments=[shot])
    context = result.context
    users = [m for m in context.messages if m["role"] == "user"]
    [part] = image_parts(users[-1])
    assert len(part["image_url"]["url"]) < 1_400_000  # 1 MB of bytes, base64
    pixel = image_tokens("openai/acme-vl-13b", 1568, 882)
    assert context.sources["recent"].tokens >= pixel
    assert context.total_tokens >= engine.counter.count_messages(context.messages)


# -- generated images ------------------------------------------------------------------------
@pytest.mark.parametrize("model, relayed", [("openai/acme-vl-13b", True), ("openai/fake-model", False)])
def test_generated_image_relay_only_for_vision_models(images_env, model, relayed):
    drawn = images_env.upload("u1", "drawn.png", img.small_png((255, 200, 0)))
    engine = images_env.build(model=model)
    session = f"sg-{relayed}"
    engine.turn(user_id="u1", session_id=session, message="draw me a sun", reply="Here it is.")
    engine.add_turn(user_id="u1", session_id=session, role="assistant", content="(image)", attachments=[drawn])
    engine.turn(user_id="u1", session_id=session, message="nice!")
    sent = images_env.replies()[-1]["messages"]
    assert all(not image_parts(m) for m in sent if m["role"] == "assistant")
    last = [m for m in sent if m["role"] == "user"][-1]
    if relayed:
        content = last["content"]
        assert content[0]["type"] == "text" and "generated earlier" in content[0]["text"]
        assert content[1]["type"] == "image_url"
        assert content[2] == {"type": "text", "text": "nice!"}
    else:
        assert isinstance(last["content"], str) and "generated earlier" not in last["content"]
    assert images_env.calls() == []


def test_too_many_images_for_the_window_keep_the_message_and_say_what_is_not_shown(images_env):
    photos = [images_env.upload("u1", f"p{i}.png", img.noisy_photo(1600, 1200, seed=i)) for i in range(10)]
    engine = images_env.build(model="openai/acme-vl-13b", context_window=4096)
    result = engine.turn(user_id="u1", session_id="many", message="ten images, small window", attachments=photos)
    sent = images_env.replies()[-1]["messages"]
    last_user = [m for m in sent if m["role"] == "user"][-1]
    text = text_of(last_user)
    assert "ten images, small window" in text  # the message being answered is never dropped
    shown = len(image_parts(last_user))
    assert 1 <= shown < 10
    assert text.count("shown below.") == shown
    assert text.count("is not shown: the images of this message would exceed") == 10 - shown
    context = result.context
    assert context.total_tokens + context.reply_reserve <= context.window


def test_an_undecodable_image_on_the_vision_path_is_named_not_promised(images_env):
    good = images_env.upload("u1", "good.png", img.small_png())
    bad = images_env.upload("u1", "broken.jpg", b"\xff\xd8\xff\xe0 this is not really a JPEG")
    engine = images_env.build(model="openai/acme-vl-13b")
    engine.turn(user_id="u1", session_id="bad", message="two pictures", attachments=[bad, good])
    last_user = [m for m in images_env.replies()[-1]["messages"] if m["role"] == "user"][-1]
    text = text_of(last_user)
    assert len(image_parts(last_user)) == 1 and text.count("shown below.") == 1
    assert 'Attached image 1: "good.png"' in text
    assert f'"broken.jpg" ({bad}) is not shown: it could not be decoded as an image' in text

"""Image transcription for text-only reply models: batched calls and the fallback chain.

:meth:`Transcriber.transcribe` describes new images in one batched call through litellm and
returns one never-empty text per image. Each step of the chain exists for a named failure
mode and is logged (``image.transcribe_step``, with ``step``, ``ok``, ``images``; no image text):

1. ``primary``: ``COMPANION_VISION_MODEL`` at ``COMPANION_VISION_API_BASE`` (else ``COMPANION_API_BASE``);
2. ``backup``: ``COMPANION_VISION_BACKUP_MODEL`` (the primary model is down or refuses);
3. ``direct``: the primary model at ``COMPANION_VISION_DIRECT_API_BASE``, bypassing a gateway
   (the gateway is down or strips image parts);
4. text extraction, per image: ``ocr``, local Tesseract OCR (``COMPANION_OCR_LANGUAGES``, by
   default ``eng+chi_sim``; the Debian packages ``tesseract-ocr`` and ``tesseract-ocr-chi-sim``),
   then ``ocr_model``, a vision model asked for the text only (a model whose policy refuses
   descriptions may still transcribe text);
5. ``alone``: when a batch of several images fails steps 1-3, each image goes through
   steps 1-4 alone (one bad image, or a batch too large, does not sink the others).

A total failure yields the placeholder ``prompts/image_unreadable.txt`` (``method="failed"``):
it says the image could not be read, never an empty or invented description.

Timeouts (``COMPANION_VISION_TIMEOUT*``): 45 s for one image plus 15 s per extra image,
at most 90 s. A batch reply is split per image by numbered markers (【图1】, [Image 1],
``Image 1:``); without markers every image gets the whole text (a duplicate beats a loss).

Images are re-encoded to the byte budget first (:func:`runtime.llm.fit_image`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import structlog

from errors import FileParseError, ModelCallError
from prompts import render
from runtime.config import VisionSettings
from runtime.llm._image_encode import fit_image, open_image
from runtime.llm._replier import LiteLLMReplier, RetryPolicy
from runtime.messages import ImagePart, Message, Part, TextPart

log = structlog.get_logger("companion.images")

SECTION = re.compile(
    r"【\s*图\s*(\d+)\s*】|\[\s*(?:Image|图)\s*(\d+)\s*\]|^\s*\**Image\s+(\d+)\s*\**\s*:", re.IGNORECASE | re.MULTILINE
)
"""The numbered per-image markers a batched reply may use: 【图1】, [Image 1], ``Image 1:``."""


@dataclass(frozen=True, kw_only=True)
class ImageInput:
    """One image to transcribe."""

    file_id: str
    name: str
    data: bytes
    """The stored bytes, as uploaded."""


@dataclass(frozen=True, kw_only=True)
class Transcript:
    """One image's description and where it came from."""

    file_id: str
    text: str
    """Never empty."""
    method: str
    """``primary``, ``backup``, ``direct``, ``ocr``, ``ocr_model`` or ``failed`` (the placeholder)."""
    model: str | None = None

    @property
    def ok(self) -> bool:
        return self.method != "failed"


def batch_timeout(count: int, settings: VisionSettings) -> float:
    """Seconds for a call with ``count`` images: base + per-image x (count - 1), capped."""
    return min(settings.timeout_max, settings.timeout + settings.timeout_per_image * max(count - 1, 0))


def split_reply(text: str, count: int) -> list[str]:
    """``count`` texts from a batched reply: the section after each numbered marker; an image
    the reply has no section for (or every image, without markers) gets the whole text."""
    whole = text.strip()
    hits = list(SECTION.finditer(text))
    sections: dict[int, str] = {}
    for i, hit in enumerate(hits):
        number = int(next(g for g in hit.groups() if g))
        end = hits[i + 1].start() if i + 1 < len(hits) else len(text)
        body = text[hit.end() : end].strip()
        if body and 1 <= number <= count and number not in sections:
            sections[number] = body
    if count == 1 and sections.get(1):
        return [sections[1]]
    return [sections.get(n + 1) or whole for n in range(count)]


class Transcriber:
    """Runs the fallback chain (module docstring).

    Args:
        settings: the ``COMPANION_VISION_*``, ``COMPANION_IMAGE_BYTES`` and OCR settings.
        ocr: ``(image bytes, languages) -> text``; default Tesseract via pytesseract (tests may replace it).
        extra: more keyword arguments for ``litellm.completion`` (e.g. ``api_key``).
    """

    def __init__(
        self, settings: VisionSettings, *, ocr: Callable[[bytes, str], str] | None = None, **extra: Any
    ) -> None:
        self.settings = settings
        self.ocr = ocr or tesseract_text
        self.extra = extra

    # -- the steps ------------------------------------------------------------------------
    def _routes(self) -> list[tuple[str, str, str | None]]:
        """``(step, model, api_base)`` of steps 1-3 that are configured."""
        s = self.settings
        routes: list[tuple[str, str, str | None]] = []
        if s.model:
            routes.append(("primary", s.model, s.api_base))
        if s.backup_model:
            routes.append(("backup", s.backup_model, s.api_base))
        if s.model and s.direct_api_base:
            routes.append(("direct", s.model, s.direct_api_base))
        return routes

    def _ask(
        self, model: str, api_base: str | None, prompt: str, urls: Sequence[str], timeout: float, session_id: str
    ) -> str:
        """One vision call; the reply text, stripped.

        Raises:
            ModelCallError: the call failed, or the reply was empty.
        """
        replier = LiteLLMReplier(
            model=model, api_base=api_base, timeout=timeout, retry=RetryPolicy(retries=0), **self.extra
        )
        parts: list[Part] = [TextPart(text=prompt), *(ImagePart(url=url, detail="high") for url in urls)]
        reply = replier.reply([Message(role="user", content=tuple(parts))], session_id=session_id)
        text = reply.content.strip()
        if not text:
            raise ModelCallError(
                f"The vision model {model!r} returned an empty description.", model=model, session_id=session_id
            )
        return text

    def _models(self, images: Sequence[ImageInput], urls: Sequence[str], session_id: str) -> list[Transcript] | None:
        """Steps 1-3 on ``images`` together; ``None`` when every step failed."""
        count = len(images)
        prompt = render("image_transcribe") if count == 1 else render("image_transcribe_batch", count=count)
        for step, model, api_base in self._routes():
            try:
                text = self._ask(model, api_base, prompt, urls, batch_timeout(count, self.settings), session_id)
            except ModelCallError as exc:
                log.warning(
                    "image.transcribe_step",
                    step=step,
                    ok=False,
                    images=count,
                    model=model,
                    error=type(exc).__name__,
                    session_id=session_id,
                )
                continue
            log.info("image.transcribe_step", step=step, ok=True, images=count, model=model, session_id=session_id)
            texts = split_reply(text, count)
            return [
                Transcript(file_id=img.file_id, text=t, method=step, model=model)
                for img, t in zip(images, texts, strict=False)
            ]
        return None

    def _text_only(self, image: ImageInput, url: str, session_id: str) -> Transcript | None:
        """Step 4 for one image: local OCR, then a vision model with the OCR-only prompt."""
        langs = self.settings.ocr_languages
        if langs:
            try:
                found = self.ocr(image.data, langs).strip()
            except Exception as exc:  # no tesseract binary, a missing language, an undecodable image
                found = ""
                log.warning(
                    "image.transcribe_step",
                    step="ocr",
                    ok=False,
                    images=1,
                    error=type(exc).__name__,
                    session_id=session_id,
                )
            else:
                log.info("image.transcribe_step", step="ocr", ok=bool(found), images=1, session_id=session_id)
            if found:
                return Transcript(file_id=image.file_id, text=render("image_ocr_transcript", text=found), method="ocr")
        for _, model, api_base in self._routes()[:1] + [r for r in self._routes() if r[0] == "backup"]:
            try:
                text = self._ask(
                    model, api_base, render("image_ocr_only"), [url], batch_timeout(1, self.settings), session_id
                )
            except ModelCallError as exc:
                log.warning(
                    "image.transcribe_step",
                    step="ocr_model",
                    ok=False,
                    images=1,
                    model=model,
                    error=type(exc).__name__,
                    session_id=session_id,
                )
                continue
            log.info("image.transcribe_step", step="ocr_model", ok=True, images=1, model=model, session_id=session_id)
            return Transcript(
                file_id=image.file_id, text=render("image_ocr_transcript", text=text), method="ocr_model", model=model
            )
        return None

    # -- the chain ------------------------------------------------------------------------
    def transcribe(self, images: Sequence[ImageInput], *, session_id: str = "") -> list[Transcript]:
        """One transcript per image, in order (module docstring). Never raises for a model or
        OCR failure: an image no step could read gets the placeholder (``method="failed"``)."""
        if not images:
            return []
        urls: dict[str, str | None] = {}
        for image in images:
            try:
                urls[image.file_id] = fit_image(
                    image.data, budget=self.settings.image_bytes, name=image.name
                ).data_url()
            except FileParseError:
                urls[image.file_id] = None
                log.warning("image.undecodable", file_id=image.file_id, session_id=session_id)
        readable = [img for img in images if urls[img.file_id]]
        done: dict[str, Transcript] = {}
        if readable:
            batch = self._models(readable, [urls[i.file_id] or "" for i in readable], session_id)
            if batch is not None:
                done.update((t.file_id, t) for t in batch)
            else:
                if len(readable) > 1:
                    log.warning(
                        "image.transcribe_step", step="alone", ok=True, images=len(readable), session_id=session_id
                    )
                for img in readable:
                    url = urls[img.file_id] or ""
                    alone = self._models([img], [url], session_id) if len(readable) > 1 else None
                    single = alone[0] if alone else self._text_only(img, url, session_id)
                    if single is not None:
                        done[img.file_id] = single
        out = []
        for image in images:
            if image.file_id not in done:
                log.warning("image.unreadable", file_id=image.file_id, session_id=session_id)
                done[image.file_id] = Transcript(
                    file_id=image.file_id,
                    text=render("image_unreadable", file_name=image.name, file_id=image.file_id),
                    method="failed",
                )
            out.append(done[image.file_id])
        return out


def tesseract_text(data: bytes, languages: str) -> str:
    """Text Tesseract finds in the image (pytesseract; the ``tesseract`` binary must be installed).

    Raises:
        pytesseract.TesseractNotFoundError, pytesseract.TesseractError, FileParseError.
    """
    import pytesseract

    image = open_image(data).convert("L")
    try:
        return pytesseract.image_to_string(image, lang=languages, timeout=30)
    except pytesseract.TesseractError:
        first = languages.split("+")[0]
        if first == languages:
            raise
        log.warning("image.ocr_languages_missing", languages=languages, retry=first)  # e.g. chi_sim not installed
        return pytesseract.image_to_string(image, lang=first, timeout=30)

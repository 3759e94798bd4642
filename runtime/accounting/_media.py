"""What images and documents cost (tokens), by the providers' published rules."""

from __future__ import annotations

import base64
import binascii
import io
import math
import re
from collections.abc import Callable, Mapping
from typing import Any

from errors import UncountableContentError

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
        raise UncountableContentError(f"Image size must be positive, got {width}x{height} pixels.")
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
        raise UncountableContentError(f"Image size must be positive, got {width}x{height} pixels.")
    scale = min(1.0, 1568 / max(w, h), math.sqrt(1_150_000 / (w * h)))
    return math.ceil(w * scale * h * scale / 750)


_SIZED_FORMATS = ("PNG", "GIF", "JPEG", "WEBP")
"""Formats whose size :func:`_image_size` reads: the ones chat providers accept inline."""


def _image_size(data: bytes) -> tuple[int, int] | None:
    """(width, height) in pixels of PNG, GIF, JPEG or WebP bytes, else ``None``.

    Pillow reads the header only (``Image.open`` is lazy), so this costs no decoding; it is
    imported here, by the first count of an image.
    """
    from PIL import Image, UnidentifiedImageError

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


def part_dimensions(part: Mapping[str, Any]) -> tuple[int, int] | None:
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


def image_detail(part: Mapping[str, Any]) -> str | None:
    image_url = part.get("image_url")
    if isinstance(image_url, Mapping) and isinstance(image_url.get("detail"), str):
        return str(image_url["detail"])
    detail = part.get("detail")
    return detail if isinstance(detail, str) else None


def document_tokens(part: Mapping[str, Any], count_text: Callable[[str], int]) -> int:
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

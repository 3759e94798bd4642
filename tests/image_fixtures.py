"""Images the image tests write with Pillow: a text screenshot, a noisy photo, a 6000x4000 image."""

from __future__ import annotations

import io
import random

FONT = "/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf"
SCREENSHOT_TEXT = ["Invoice 4471", "Total due 128 EUR", "Pay before March"]
"""The lines the screenshot shows (OCR must find them)."""


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.truetype(FONT, size)
    except OSError:  # no DejaVu: Pillow's own scalable default font
        return ImageFont.load_default(size=size)


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG")
    return out.getvalue()


def screenshot(width: int = 1600, height: int = 900) -> bytes:
    """A PNG of black text on white (large, clear) with a few grey UI bars."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    draw.rectangle([0, 0, width, 60], fill=(230, 230, 230))
    font = _font(72)
    for i, line in enumerate(SCREENSHOT_TEXT):
        draw.text((80, 140 + i * 140), line, fill="black", font=font)
    return _png(image)


def noisy_photo(width: int = 3000, height: int = 2000, seed: int = 7) -> bytes:
    """A JPEG of random noise over a gradient: the worst case for compression."""
    from PIL import Image

    rng = random.Random(seed)
    noise = Image.frombytes("RGB", (width, height), rng.randbytes(width * height * 3))
    gradient = Image.linear_gradient("L").resize((width, height)).convert("RGB")
    photo = Image.blend(gradient, noise, 0.98)
    out = io.BytesIO()
    photo.save(out, format="JPEG", quality=95)
    return out.getvalue()


def huge(width: int = 6000, height: int = 4000) -> bytes:
    """A large PNG (6000x4000) of coloured blocks with some noise."""
    from PIL import Image, ImageDraw

    image = Image.new("RGB", (width, height), (40, 90, 160))
    draw = ImageDraw.Draw(image)
    rng = random.Random(3)
    for _ in range(300):
        x, y = rng.randrange(width), rng.randrange(height)
        draw.rectangle(
            [x, y, x + rng.randrange(50, 800), y + rng.randrange(50, 800)],
            fill=(rng.randrange(256), rng.randrange(256), rng.randrange(256)),
        )
    return _png(image)


def small_png(colour=(200, 30, 30), size=(64, 48)) -> bytes:
    """A tiny one-colour PNG (distinct bytes per colour, so distinct files)."""
    from PIL import Image

    return _png(Image.new("RGB", size, colour))

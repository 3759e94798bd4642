"""Re-encoding an image to fit a byte budget before it goes to a model (Pillow).

The budget (``COMPANION_IMAGE_BYTES``, default 1,000,000 bytes) is a soft target reached
through a progressive matrix: the longest edge starts at 1568 px (Anthropic's largest
unscaled edge; OpenAI scales a high-detail image to 768 px on its short side anyway), and the
edges :data:`EDGES` are combined with the JPEG qualities :data:`QUALITIES`, from large and
high quality down to small and low: ``(1568, 90), (1568, 80), ... (1568, 40), (1280, 90), ...``.
The first encoding that fits wins, so a text screenshot (few colours, compresses well) keeps
the largest edge while a noisy photo shrinks more. An image is never upscaled: an edge larger
than the image's own longest edge means its own size.

PNG: when the source is lossless (PNG, GIF, BMP, WebP lossless...) the PNG at the current
edge is tried first and kept if it fits and is no larger than the JPEG at the top quality
(small screenshots and diagrams stay crisp at no extra cost). Transparency is flattened on
white for JPEG. EXIF orientation is applied first.

If nothing fits (an absurdly small budget), the smallest, lowest-quality encoding is
returned with ``fits=False``: a 20 MB upload never fails on the model's size limit because
the matrix always ends at 512 px.
"""

from __future__ import annotations

import io
from dataclasses import dataclass

from errors import FileParseError

EDGES = (1568, 1280, 1024, 768, 512)
"""Longest-edge sizes tried, pixels, largest first."""
QUALITIES = (90, 80, 70, 55, 40)
"""JPEG qualities tried at each edge, highest first."""
DEFAULT_IMAGE_BYTES = 1_000_000
"""Default soft byte target of one encoded image (``COMPANION_IMAGE_BYTES``)."""


@dataclass(frozen=True, kw_only=True)
class EncodedImage:
    """One image as it will be sent."""

    data: bytes
    mime: str
    """``image/jpeg`` or ``image/png``."""
    width: int
    height: int
    """Pixels after resizing."""
    quality: int | None
    """JPEG quality, ``None`` for PNG."""
    fits: bool
    """False when even the smallest encoding is over the budget."""

    def data_url(self) -> str:
        """A ``data:`` URL of the bytes (base64), for an OpenAI ``image_url`` part."""
        import base64

        return f"data:{self.mime};base64,{base64.b64encode(self.data).decode('ascii')}"


def open_image(data: bytes, *, name: str = "image"):
    """A decoded, orientation-corrected Pillow image.

    Raises:
        FileParseError: ``corrupt``: the bytes are no image Pillow can decode.
    """
    from PIL import Image, ImageOps, UnidentifiedImageError

    try:
        image: Image.Image = Image.open(io.BytesIO(data))
        image.load()
    except (UnidentifiedImageError, OSError, ValueError, Image.DecompressionBombError) as exc:
        raise FileParseError(f"{name!r} is not an image that can be decoded: {exc}", reason="corrupt") from None
    fmt, lossless_webp = image.format, bool(image.info.get("lossless", False))
    image = ImageOps.exif_transpose(image)
    image.format = fmt  # exif_transpose may return a copy without it
    image.info.setdefault("lossless", lossless_webp)
    return image


def _lossless(image) -> bool:
    return (image.format or "").upper() in ("PNG", "GIF", "BMP", "TIFF") or (
        (image.format or "").upper() == "WEBP" and image.info.get("lossless", False)
    )


def _rgb(image):
    from PIL import Image

    if image.mode in ("RGBA", "LA") or (image.mode == "P" and "transparency" in image.info):
        rgba = image.convert("RGBA")
        flat = Image.new("RGB", rgba.size, (255, 255, 255))
        flat.paste(rgba, mask=rgba.split()[-1])
        return flat
    return image.convert("RGB") if image.mode != "RGB" else image


def _scaled(image, edge: int):
    from PIL import Image

    w, h = image.size
    longest = max(w, h)
    if longest <= edge:
        return image
    scale = edge / longest
    return image.resize((max(1, round(w * scale)), max(1, round(h * scale))), Image.Resampling.LANCZOS)


def _jpeg(image, quality: int) -> bytes:
    out = io.BytesIO()
    image.save(out, format="JPEG", quality=quality, optimize=True)
    return out.getvalue()


def _png(image) -> bytes:
    out = io.BytesIO()
    image.save(out, format="PNG", optimize=True)
    return out.getvalue()


def fit_image(data: bytes, *, budget: int = DEFAULT_IMAGE_BYTES, name: str = "image") -> EncodedImage:
    """``data`` re-encoded through the matrix (module docstring) to at most ``budget`` bytes.

    Raises:
        FileParseError: the bytes are no decodable image.
    """
    source = open_image(data, name=name)
    lossless = _lossless(source)
    rgb = _rgb(source)
    last: EncodedImage | None = None
    seen: set[tuple[int, int]] = set()
    for edge in EDGES:
        scaled = _scaled(rgb, edge)
        if scaled.size in seen:  # a small image: the same size again at a smaller edge
            continue
        seen.add(scaled.size)
        top = None
        if lossless:
            png = _png(_scaled(source.convert("RGBA") if source.mode in ("RGBA", "LA", "P") else rgb, edge))
            top = _jpeg(scaled, QUALITIES[0])
            if len(png) <= budget and len(png) <= len(top):
                return EncodedImage(
                    data=png, mime="image/png", width=scaled.width, height=scaled.height, quality=None, fits=True
                )
        for quality in QUALITIES:
            jpeg = top if (quality == QUALITIES[0] and top is not None) else _jpeg(scaled, quality)
            last = EncodedImage(
                data=jpeg,
                mime="image/jpeg",
                width=scaled.width,
                height=scaled.height,
                quality=quality,
                fits=len(jpeg) <= budget,
            )
            if last.fits:
                return last
    assert last is not None
    return last

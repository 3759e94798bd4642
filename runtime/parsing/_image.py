"""Images: one page with no text layer, like a scanned PDF page (state ``needs_ocr``).

Their text comes from the image path (transcription or OCR, ``runtime/transcribe.py``);
``file_read`` says so. Decoding is checked here so that a corrupt image is a parse error,
not a file that looks fine until a model is asked about it.
"""

from __future__ import annotations

import io

from errors import FileParseError
from runtime.parsing._extract import Extract


def parse_image(data: bytes, *, name: str) -> Extract:
    """One empty page marked ``needs_ocr`` for an image Pillow can decode.

    Raises:
        FileParseError: ``reason="corrupt"`` when Pillow cannot decode it.
    """
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as image:
            image.verify()
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise FileParseError(
            f"{name}: the image is corrupt or in a format Pillow cannot decode.", reason="corrupt"
        ) from exc
    return Extract(pages=[""], needs_ocr=True)

"""Which models see images, and what an image costs them in tokens.

**Capability** (:func:`sees_images`), decided in two layers; the answer routes the whole
request (pixels for a vision model, transcripts for a text-only one):

0. the names listed in ``COMPANION_VISION_MODELS`` (the operator's word) are vision models;
1. the catalog: litellm's bundled model map (``litellm.get_model_info``), when its entry
   states ``supports_vision`` either way. An explicit ``false`` is final: no name heuristic
   overrides it (e.g. ``azure/gpt-4o-audio-preview-2024-12-17``, a text-and-audio model of a
   vision family);
2. family heuristics for names the catalog does not know or states nothing about, so that a
   new vision model is not downgraded: names containing ``vision``, ``omni``, ``-vl`` /
   ``_vl`` / ``vl-`` (Qwen-VL, InternVL, "*-vl-*"), or of a known multimodal family
   (:data:`VISION_FAMILIES`: gpt-4o, gpt-4.1, gpt-5, o1/o3/o4, claude-3 and later, gemini,
   llava, pixtral, llama-3.2 vision sizes, llama-4, gemma-3, minicpm-v, moondream, glm-4v,
   ...). :data:`TEXT_ONLY` names the text-only members of those families and other
   text-only models (``gpt-3.5``, ``o1-mini``, ``o1-preview``, ``o3-mini``, the 1B and 270M
   Gemma 3, Gemini 1.0 Pro, Mistral Small 3.0, audio/realtime/speech variants of gpt-4o,
   ``deepseek-chat``, embedding models); they never match a heuristic.

**Cost** (:func:`image_tokens`): by the provider family of the model:

- OpenAI (``gpt-*``, ``o1/o3/o4``, ``openai/``, ``azure/``): the tile rule at ``detail=high``
  (OpenAI vision guide, "Calculating costs": fit in 2048x2048, shortest side to 768, 170 per
  512-px tile + 85), :func:`runtime.accounting.openai_image_tokens`;
- Anthropic (``claude``, ``anthropic/``): about ``w * h / 750`` after its resize to a long
  edge of at most 1568 px (Anthropic vision guide, "Calculate image costs"),
  :func:`runtime.accounting.anthropic_image_tokens`;
- any other family: the larger of the two (conservative; never a flat 85).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

from runtime._offline import bundled_model_entry, model_info
from runtime.accounting import anthropic_image_tokens, openai_image_tokens

VISION_FAMILIES = (
    r"gpt-4o",
    r"gpt-4\.1",
    r"gpt-4\.5",
    r"gpt-5",
    r"gpt-4-turbo",
    r"(?:^|/)o[134](?:-|$)",
    r"claude-(?:3|sonnet-4|opus-4|haiku-4|4)",
    r"claude-[a-z]+-[4-9]",
    r"gemini",
    r"llava",
    r"bakllava",
    r"pixtral",
    r"llama-?3\.2-(?:11|90)b",
    r"llama-?4",
    r"gemma-?3",
    r"minicpm-?v",
    r"moondream",
    r"glm-4v",
    r"glm-4\.\dv",
    r"qwen2?\.?5?-?vl",
    r"qvq",
    r"internvl",
    r"idefics",
    r"phi-?[34]\.?5?-(?:multimodal|vision)",
    r"grok-(?:2-)?vision",
    r"mistral-(?:small|medium)-3",
    r"kimi-vl",
    r"step-1v",
)
"""Known multimodal families (regular expressions searched in the lower-cased model name)."""
VISION_WORDS = re.compile(r"vision|omni|[-_/]vl(?:[-_.:]|$)|\bvl[-_]")
"""Name parts that mark a vision model: vision, omni, -vl (an unknown ``*-vl-*`` counts)."""
TEXT_ONLY = re.compile(
    r"gpt-3\.5"
    r"|(?:^|/)o1-(?:mini|preview)|(?:^|/)o3-mini"  # OpenAI: the first o1 releases and o3-mini take text only
    r"|gpt-4o(?:-mini)?-(?:audio|realtime|transcribe|tts)"  # gpt-4o speech variants: audio, no images
    r"|gemma-?3[-:_]?(?:1b|270m)"  # Gemma 3: the 1B and 270M sizes are text-only (Gemma 3 model card)
    r"|gemini(?:-1\.0)?-pro(?:-\d{3})?(?:$|[-:@](?!vision))"  # Gemini 1.0 Pro (gemini-pro-vision was separate)
    r"|mistral-small-(?:3\.0|2501|24b-instruct-2501)"  # Mistral Small 3.0 (vision from 3.1)
    r"|deepseek-(?:chat|reasoner|coder|r1|v[23])|text-embedding|embed|whisper|tts|transcribe"
)
"""Names no heuristic may call a vision model: text-only members of vision families and
text-only models whose names carry a vision word. Searched in the lower-cased name."""

_FAMILY = re.compile("|".join(VISION_FAMILIES))


def catalog_says(model: str) -> bool | None:
    """Layer 1: what litellm's model map states about ``model`` seeing images.

    ``True`` or ``False`` when the model's entry sets ``supports_vision``; ``None`` when the
    model is not in the map or its entry says nothing (then the heuristics decide). An entry
    of litellm's bundled map that sets ``supports_vision`` is read without importing litellm
    (:func:`runtime._offline.bundled_model_entry`); litellm is asked about the others, as it
    may resolve a name to another entry."""
    entry = bundled_model_entry(model)
    bundled = entry.get("supports_vision") if entry is not None else None
    if isinstance(bundled, bool):
        return bundled
    info = model_info(model)  # None: an unmapped model, the catalog does not know it
    stated = info.get("supports_vision") if info is not None else None
    return stated if isinstance(stated, bool) else None


def heuristic_says(model: str) -> bool:
    """Layer 2: the name looks like a vision model (module docstring)."""
    name = model.lower()
    if TEXT_ONLY.search(name):
        return False
    return bool(VISION_WORDS.search(name) or _FAMILY.search(name))


def sees_images(model: str, configured: Iterable[str] = ()) -> bool:
    """True if replies from ``model`` may carry pixels: the configured list
    (``COMPANION_VISION_MODELS``, exact names), then what litellm's catalog states (its
    explicit ``false`` included), then the name heuristics."""
    if model in set(configured):
        return True
    stated = catalog_says(model)
    return heuristic_says(model) if stated is None else stated


def family(model: str) -> str:
    """``openai``, ``anthropic`` or ``other``: which token rule prices an image for ``model``."""
    name = model.lower()
    if "claude" in name or name.startswith(("anthropic/", "bedrock/anthropic")):
        return "anthropic"
    if re.search(r"(?:^|/)(?:gpt-|o[134](?:-|$)|chatgpt)", name) or name.startswith(("openai/gpt", "azure/")):
        return "openai"
    return "other"


def image_tokens(model: str, width: int, height: int) -> int:
    """Tokens an image of ``width`` x ``height`` pixels costs ``model`` (module docstring's rules).

    Raises:
        ConfigurationError: a non-positive size.
    """
    kind = family(model)
    if kind == "openai":
        return openai_image_tokens(width, height, detail="high")
    if kind == "anthropic":
        return anthropic_image_tokens(width, height)
    return max(openai_image_tokens(width, height, detail="high"), anthropic_image_tokens(width, height))

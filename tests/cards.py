"""Character cards for tests: V2/V3 dicts and a PNG writer (Pillow ``PngInfo``)."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any


def v2_card(**data: Any) -> dict[str, Any]:
    """A Character Card V2 with every field we read; ``data`` overrides fields of ``data``."""
    body = {
        "name": "Aria",
        "description": "{{char}} is a lighthouse keeper on a northern island who talks with {{user}}.",
        "personality": "calm, dry humour, notices weather",
        "scenario": "{{user}} visits the lighthouse in autumn.",
        "first_mes": "Welcome, {{user}}. Mind the stairs; {{char}} just waxed them.",
        "mes_example": "<START>\n{{user}}: Is it cold up there?\n{{char}}: Colder than the tea.\n"
        "<START>\n{{user}}: Do you sleep?\n{{char}}: Between ships.",
        "creator_notes": "SECRET-CREATOR-NOTE: tested on model X",
        "system_prompt": "You are {{char}}. Stay in character.",
        "post_history_instructions": "POST-HISTORY: reply in under 80 words as {{char}}.",
        "tags": ["lighthouse", "slice of life"],
        "creator": "tests",
        "character_version": "1",
        "alternate_greetings": [],
        "extensions": {},
        "character_book": {
            "name": "Island lore",
            "extensions": {},
            "entries": [
                {
                    "keys": ["lamp", "lens"],
                    "content": "The lamp of {{char}}'s lighthouse is a Fresnel lens from 1890.",
                    "extensions": {},
                    "enabled": True,
                    "insertion_order": 10,
                    "name": "lamp",
                },
                {
                    "keys": ["灯塔"],
                    "secondary_keys": ["岛"],
                    "selective": True,
                    "content": "灯塔建于1890年。",
                    "extensions": {"selectiveLogic": 0},
                    "enabled": True,
                    "insertion_order": 5,
                    "priority": 3,
                },
            ],
        },
    }
    body.update(data)
    return {"spec": "chara_card_v2", "spec_version": "2.0", "data": body}


def v3_card(**data: Any) -> dict[str, Any]:
    card = v2_card(**data)
    card["spec"], card["spec_version"] = "chara_card_v3", "3.0"
    card["data"].update({"assets": [], "nickname": "", "group_only_greetings": []})
    return card


def encode(card: dict[str, Any]) -> str:
    return base64.b64encode(json.dumps(card, ensure_ascii=False).encode("utf-8")).decode("ascii")


def write_card_png(path: Path, chunks: dict[str, str]) -> Path:
    """A small PNG with ``chunks`` (keyword → text) as tEXt chunks, as card tools write them."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    info = PngInfo()
    for keyword, value in chunks.items():
        info.add_text(keyword, value)
    Image.new("RGB", (4, 4), (200, 120, 40)).save(path, pnginfo=info)
    return path

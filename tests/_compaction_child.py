"""A child process for ``tests/test_breaker_kill.py``: one compaction that stops where told,
so the test can SIGKILL it there.

    python -m tests._compaction_child DATABASE_URL SESSION USER MODE [API_BASE]

MODE ``model-hangs``: the model summarizer calls API_BASE, whose fake server never answers.
MODE ``inside-commit``: the extractive summarizer succeeds, and the process sleeps inside
the compaction's transaction, after its writes were sent and before COMMIT.
Prints ``ready`` before compacting and ``in-commit`` once inside the transaction.
"""

from __future__ import annotations

import sys
import time

import runtime  # noqa: F401  (offline defaults for litellm)
from memory.database import make_engine
from memory.store import Store
from runtime.accounting import counter_for
from runtime.compaction import Compactor, ExtractiveSummarizer, LiteLLMSummarizer


class ConstantEmbedder:
    """384 dimensions, no model to load: the child is killed before recall would matter."""

    name = "constant"
    dimension = 384

    def embed(self, texts):
        return [[1.0] + [0.0] * 383 for _ in texts]


def main(url: str, session: str, user: str, mode: str, api_base: str | None = None) -> None:
    if mode == "model-hangs":
        summarizer = LiteLLMSummarizer(model="openai/fake-summary", api_base=api_base, api_key="sk-test", timeout=300)
    else:
        from sqlalchemy import event
        from sqlmodel import Session

        @event.listens_for(Session, "before_commit")
        def pause(db):  # only the compaction's own transaction commits through a Session here
            db.flush()
            print("in-commit", flush=True)
            time.sleep(300)

        summarizer = ExtractiveSummarizer()
    compactor = Compactor(
        store=Store(make_engine(url)),
        embedder=ConstantEmbedder(),
        summarizer=summarizer,
        counter=counter_for("gpt-4o-mini"),
        keep_exchanges=2,
        target=0.6,
        breaker_threshold=3,
    )
    print("ready", flush=True)
    compactor.maybe_compact(session_id=session, user_id=user, recent_cap=300, summary_cap=400, assistant_name="Mira")
    print("finished", flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])

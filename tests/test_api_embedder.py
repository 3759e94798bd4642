"""Embedders and rerankers behind an API, against a loopback server speaking OpenAI's embeddings
and Cohere's/Jina's rerank wire formats (``tests/fake_embeddings.py``): the wiring, batching,
retries, a dimension that changes, the fallback while the API is down and the backfill after.

No figure of recall quality comes from here: the fake's vectors are word hashes."""

from __future__ import annotations

import time
from datetime import UTC, datetime
from pathlib import Path

import pytest
import structlog

from errors import EmbedderUnavailableError, EmbeddingDimensionMismatch
from memory.backfill import missing
from memory.recall import RecallQuery
from runtime.config import Settings
from runtime.llm import LiteLLMEmbedder, LiteLLMReplier, LiteLLMReranker, RetryPolicy, is_api_model, rerank_within
from runtime.turn import Engine, InlineBackfill
from tests.conftest import PERSONA
from tests.fake_embeddings import FakeEmbeddings, hash_vector

FILLER = " ".join(f"word{i}" for i in range(80))
"""About 100 tokens of padding, so that a few turns fill a small window's recent cap."""
DIM = 384
"""The fake's vector length: the tests' databases hold vector(384)."""


@pytest.fixture(scope="module")
def fake_api():
    with FakeEmbeddings(dimension=DIM) as fake:
        yield fake


@pytest.fixture(autouse=True)
def _reset(fake_api):
    fake_api.fail, fake_api.fail_next, fake_api.stall, fake_api.dimension = None, 0, 0.0, DIM
    fake_api.requests.clear()
    fake_api.rerank_requests.clear()
    yield


def api_embedder(fake, **kwargs) -> LiteLLMEmbedder:
    options = {
        "api_base": fake.api_base,
        "api_key": "sk-test",
        "timeout": 2.0,
        "retry": RetryPolicy(retries=2, total_seconds=1.0, base_delay=0.05),
        "down_seconds": 0.0,
    }
    return LiteLLMEmbedder("openai/text-embedding-3-small", **{**options, **kwargs})


def engine_with(store, fake_llm, embedder, *, reranker=None, window: int = 2048, **overrides) -> Engine:
    settings = Settings(context_window=window, database_url="unused", **overrides)
    replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
    engine = Engine(settings=settings, store=store, embedder=embedder, persona=PERSONA, replier=replier)
    return engine.use(reranker=reranker, backfill=engine.backfill)


# -- the embedder ---------------------------------------------------------------------------------


def test_names_tell_api_models_from_local_ones(tmp_path):
    assert is_api_model("openai/text-embedding-3-small")
    assert is_api_model("dashscope/text-embedding-v4")
    assert is_api_model("ollama/bge-m3")
    assert not is_api_model("all-MiniLM-L6-v2")
    assert not is_api_model("BAAI/bge-m3")  # a Hugging Face hub name
    folder = tmp_path / "openai" / "mine"
    folder.mkdir(parents=True)
    assert not is_api_model(str(folder))


def test_the_dimension_is_learned_and_vectors_are_the_servers_scaled_to_unit_length(fake_api):
    embedder = api_embedder(fake_api)
    assert embedder.dimension == DIM
    [vector] = embedder.embed(["Hello, world"])
    assert vector == pytest.approx(hash_vector("Hello, world", DIM))
    assert sum(x * x for x in vector) == pytest.approx(1.0)


def test_a_configured_dimension_is_sent_and_no_probe_is_made(fake_api):
    embedder = api_embedder(fake_api, dimension=256, send_dimension=True)
    assert fake_api.requests == []
    [vector] = embedder.embed(["short"])
    assert len(vector) == 256
    assert fake_api.requests[-1]["dimensions"] == 256


def test_texts_go_in_requests_of_at_most_batch_texts_in_order(fake_api):
    embedder = api_embedder(fake_api, dimension=DIM, batch=3)
    texts = [f"text number {i}" for i in range(7)]
    vectors = embedder.embed(texts)
    assert [len(r["input"]) for r in fake_api.requests] == [3, 3, 1]
    assert [t for r in fake_api.requests for t in r["input"]] == texts
    assert vectors == [pytest.approx(hash_vector(t, DIM)) for t in texts]


def test_a_brief_outage_is_retried_within_the_budget(fake_api):
    embedder = api_embedder(fake_api, dimension=DIM)
    fake_api.fail_next = 2
    assert embedder.embed(["after two failures"])[0] == pytest.approx(hash_vector("after two failures", DIM))
    assert len(fake_api.requests) == 3


def test_an_api_that_stays_down_raises_once_the_budget_is_spent_then_at_once(fake_api):
    embedder = api_embedder(fake_api, dimension=DIM, down_seconds=60.0)
    fake_api.fail = 503
    with pytest.raises(EmbedderUnavailableError, match="HTTP 503"):
        embedder.embed(["nobody answers"])
    sent = len(fake_api.requests)
    assert sent == 3  # the first and two retries
    with pytest.raises(EmbedderUnavailableError, match="not asked again"):
        embedder.embed(["still down"])
    assert len(fake_api.requests) == sent


def test_vectors_of_another_length_are_refused_with_both_lengths_named(fake_api):
    embedder = api_embedder(fake_api, dimension=DIM)
    fake_api.dimension = 128
    with pytest.raises(EmbedderUnavailableError, match=r"128 dimensions where the stored ones have 384"):
        embedder.embed(["a model swapped behind the same name"])


def test_a_database_of_another_dimension_refuses_the_api_model_at_open(fake_api, tmp_path, monkeypatch, db_url):
    from runtime.service import open_engine

    fake_api.dimension = 256
    settings = Settings(
        database_url=db_url,
        context_window=4096,
        embedding_model="openai/text-embedding-3-small",
        embedding_api_base=fake_api.api_base,
        embedding_api_key="sk-test",
        files_dir=tmp_path / "files",
    )
    with pytest.raises(EmbeddingDimensionMismatch, match="vector\\(384\\).*256 dimensions"):
        open_engine(settings, with_model=False)


# -- turns ----------------------------------------------------------------------------------------


def test_a_turn_embeds_through_the_api_reranks_and_prices_both(store, fake_llm, fake_api):
    embedder = api_embedder(fake_api)
    reranker = LiteLLMReranker("cohere/rerank-english-v3.0", api_base=fake_api.api_base, api_key="sk-test")
    engine = engine_with(store, fake_llm, embedder, reranker=reranker, window=1024)
    for i in range(12):
        engine.turn(user_id="u", session_id="s", message=f"My sister Ada plays the cello, story {i}. " + FILLER)
    fake_api.requests.clear()
    result = engine.turn(user_id="u", session_id="s", message="Who plays the cello?")
    assert result.assistant_turn.content == "I hear you."
    assert fake_api.requests  # the message was embedded by the API
    assert fake_api.rerank_requests, "recall's candidates were reranked"
    asked = fake_api.rerank_requests[-1]
    assert asked["query"] == "Who plays the cello?"
    assert len(asked["documents"]) <= engine.settings.rerank_candidates
    assert result.context.recalled
    stored = store.turns.window("s", usage_limit=1)[1][0]
    assert stored.usage_retrieval_cost_usd is not None and stored.usage_retrieval_cost_usd > 0


def test_the_rerank_order_is_the_rerankers_within_its_candidates(store, fake_llm, fake_api):
    embedder = api_embedder(fake_api)
    reranker = LiteLLMReranker(
        "jina_ai/jina-reranker-v2-base-multilingual", api_base=fake_api.api_base, api_key="sk-test"
    )
    engine = engine_with(store, fake_llm, embedder, reranker=reranker, window=1024)
    for topic in ("the garden", "a red kite", "the cello", "my old bicycle", "the bakery", "the harbour") * 2:
        engine.turn(user_id="u", session_id="s", message=f"Yesterday I talked about {topic}. " + FILLER)
    query = engine.gatherer.query(
        [],
        "red kite garden",
        stored=[],
        known=None,
        profile=None,
        asked_at=datetime.now(UTC),
        persona=PERSONA,
    )
    assert query is not None
    fused = store.archive.recall(
        engine.gatherer.recall_preset.query(
            user_id="u", query_embedding=query.recall_vector, query_text=query.recall_text
        )
    )
    reordered = engine.gatherer.reranked(query.text, fused)
    n = engine.settings.rerank_candidates
    top = reordered[: min(n, len(reordered))]
    assert len(top) >= 3, "the archive holds the rolled-out turns"
    scores = [len({"red", "kite", "garden"} & set(s.content.lower().replace(".", "").split())) / 3 for s in top]
    assert scores == sorted(scores, reverse=True)
    assert "kite" in top[0].content
    assert {s.id for s in reordered} == {s.id for s in fused}


def test_a_reranker_past_its_budget_leaves_the_fused_order_and_says_so(fake_api):
    reranker = LiteLLMReranker("cohere/rerank-english-v3.0", api_base=fake_api.api_base, api_key="sk-test", timeout=5)
    fake_api.stall = 1.0
    with structlog.testing.capture_logs() as logs:
        started = time.monotonic()
        assert rerank_within(reranker, "query", ["a", "b"], seconds=0.2) is None
        waited = time.monotonic() - started
    assert waited < 0.9  # it did not wait for the stalled answer
    assert any(e["event"] == "recall.rerank_skipped" and e["reason"] == "budget" for e in logs)


def test_a_failing_reranker_leaves_the_fused_order(fake_api):
    reranker = LiteLLMReranker("cohere/rerank-english-v3.0", api_base=fake_api.api_base, api_key="sk-test")
    fake_api.fail = 500
    with structlog.testing.capture_logs() as logs:
        assert rerank_within(reranker, "query", ["a", "b"], seconds=5) is None
    assert any(e["event"] == "recall.rerank_skipped" and e["reason"] == "error" for e in logs)


def test_a_turn_answers_while_the_api_is_down_and_its_vector_arrives_later(store, fake_llm, fake_api):
    embedder = api_embedder(fake_api)
    engine = engine_with(store, fake_llm, embedder, window=1024)
    backfill = InlineBackfill(engine.backfiller, waits=(0.05,))
    engine.use(reranker=None, backfill=backfill)
    engine.turn(user_id="u", session_id="s", message="I keep bees on the roof of the old mill.")
    fake_api.fail = 503
    with structlog.testing.capture_logs() as logs:
        for i in range(12):
            result = engine.turn(user_id="u", session_id="s", message=f"The bees made honey in week {i}. " + FILLER)
            assert result.assistant_turn.content == "I hear you."
    assert any(e["event"] == "embedder.unavailable" for e in logs)
    down = missing(store.engine)
    assert down.turn_vectors == 12
    assert down.archive_keys > 0  # a compaction archived turns while the API was down
    # while down, recall still finds the archive by its words
    found = store.archive.recall(RecallQuery(user_id="u", query_embedding=None, query_text="bees mill roof", limit=5))
    assert any("mill" in s.content for s in found)
    fake_api.fail = None
    backfill.request()
    assert backfill.join(timeout=20)
    assert missing(store.engine).total == 0


# -- measuring a pairing --------------------------------------------------------------------------


def tiny_locomo() -> list[dict]:
    """A LoCoMo-layout conversation of one session and two questions (made up here)."""
    lines = [
        ("Ann", "I adopted a grey cat named Pebble last spring."),
        ("Bob", "Pebble is a lovely name for a cat!"),
        ("Ann", "My brother Carl builds wooden boats in his garage."),
        ("Bob", "Boats take patience to build."),
        ("Ann", "We are flying to Lisbon in June for a wedding."),
        ("Bob", "Enjoy Lisbon and the wedding!"),
    ]
    session = [{"speaker": who, "dia_id": f"D1:{i + 1}", "text": said} for i, (who, said) in enumerate(lines)]
    return [
        {
            "sample_id": "tiny-1",
            "conversation": {
                "speaker_a": "Ann",
                "speaker_b": "Bob",
                "session_1_date_time": "1:56 pm on 8 May, 2023",
                "session_1": session,
            },
            "qa": [
                {"question": "What is the name of Ann's cat?", "answer": "Pebble", "evidence": ["D1:1"], "category": 4},
                {"question": "Who builds wooden boats?", "answer": "Carl", "evidence": ["D1:3"], "category": 4},
            ],
        }
    ]


def test_eval_recall_measures_an_api_embedder_with_an_api_reranker(fake_api, admin_url, tmp_path, monkeypatch, capsys):
    """The script's wiring only: the fake's word-hash vectors say nothing of any model's quality."""
    import json
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import eval_recall

    data = tmp_path / "tiny.json"
    data.write_text(json.dumps(tiny_locomo()), encoding="utf-8")
    monkeypatch.setenv("DATABASE_URL", admin_url)
    monkeypatch.setenv("COMPANION_EMBEDDING_API_BASE", fake_api.api_base)
    monkeypatch.setenv("COMPANION_EMBEDDING_API_KEY", "sk-test")
    monkeypatch.setenv("COMPANION_RERANK_API_BASE", fake_api.api_base)
    monkeypatch.setenv("COMPANION_RERANK_API_KEY", "sk-test")
    out = tmp_path / "out.json"

    status = eval_recall.main(
        [
            "--data", str(data), "--split", "all", "--budgets", "100",
            "--embedder", "openai/text-embedding-3-small", "--reranker", "cohere/rerank-english-v3.0",
            "--json", str(out),
        ]
    )  # fmt: skip

    assert status == 0
    printed = capsys.readouterr().out
    assert "embedder openai/text-embedding-3-small" in printed and "reranker cohere/rerank-english-v3.0" in printed
    assert len(fake_api.rerank_requests) == 2  # one per question
    assert {r["query"] for r in fake_api.rerank_requests} == {q["question"] for q in tiny_locomo()[0]["qa"]}
    assert json.loads(out.read_text())["retrieval_only"]


# -- a local CrossEncoder -------------------------------------------------------------------------


@pytest.fixture(scope="module")
def cross_encoder_folder(tmp_path_factory):
    """A CrossEncoder folder made here from the bundled MiniLM's encoder with a new, untrained
    scoring head: the architecture of ms-marco-MiniLM-L-6-v2, none of its training (its scores
    mean nothing; only the wiring is tested)."""
    import torch
    from transformers import AutoTokenizer, BertForSequenceClassification

    from memory.embeddings import model_path

    torch.manual_seed(0)
    source = model_path("all-MiniLM-L6-v2")
    folder = tmp_path_factory.mktemp("cross-encoder")
    BertForSequenceClassification.from_pretrained(source, num_labels=1).save_pretrained(folder)
    AutoTokenizer.from_pretrained(source).save_pretrained(folder)
    return folder


def test_a_local_cross_encoder_folder_is_a_reranker(cross_encoder_folder):
    from runtime.llm import CrossEncoderReranker, open_reranker

    reranker = open_reranker(str(cross_encoder_folder))
    assert isinstance(reranker, CrossEncoderReranker)
    scores = reranker.scores("Who plays the cello?", ["Ada plays the cello.", "The bakery opens at nine."])
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    again = reranker.scores("Who plays the cello?", ["Ada plays the cello.", "The bakery opens at nine."])
    assert again == pytest.approx(scores)


def test_a_name_that_is_neither_a_folder_nor_a_rerank_model_is_refused():
    from errors import ConfigurationError
    from runtime.llm import open_reranker

    with pytest.raises(ConfigurationError, match="COMPANION_RERANK_MODEL|neither a litellm rerank model"):
        open_reranker("no-such-folder-or-provider")


# -- the service: the backfill as a queued job ----------------------------------------------------


def test_a_queued_backfill_job_makes_the_missing_vectors_once_the_api_is_back(store, fake_llm, fake_api):
    from sqlalchemy import text

    from runtime.service import QueuedCompaction, drain
    from runtime.service._backfill_jobs import QueuedBackfill

    scheduler = QueuedCompaction(store.engine)
    try:
        settings = Settings(context_window=1024, database_url="unused")
        replier = LiteLLMReplier(model="openai/fake-model", api_base=fake_llm.api_base, api_key="sk-test", timeout=10)
        engine = Engine(
            settings=settings,
            store=store,
            embedder=api_embedder(fake_api),
            persona=PERSONA,
            replier=replier,
            compaction=scheduler,
        )
        engine.use(reranker=None, backfill=QueuedBackfill(scheduler.app))
        fake_api.fail = 503
        for i in range(3):
            engine.turn(user_id="u", session_id="s", message=f"Rain on day {i}. " + FILLER)
        with store.engine.connect() as conn:
            waiting = conn.execute(
                text(
                    "SELECT count(*) FROM procrastinate_jobs WHERE task_name = 'embeddings:backfill' AND status = 'todo'"
                )
            ).scalar_one()
        assert waiting == 1  # one job covers every turn stored without its vector
        assert missing(store.engine).turn_vectors == 3

        fake_api.fail = None
        drain(engine)

        assert missing(store.engine).total == 0
    finally:
        scheduler.close()


def test_a_long_text_is_cut_and_an_empty_one_is_sent_as_a_space(fake_api):
    from runtime.llm._embedder import MAX_CHARS

    embedder = api_embedder(fake_api, dimension=DIM)
    embedder.embed(["x" * (MAX_CHARS + 500), ""])
    assert [len(t) for t in fake_api.requests[-1]["input"]] == [MAX_CHARS, 1]


def test_a_stalled_api_fails_at_the_request_timeout_not_at_its_answer(fake_api):
    embedder = api_embedder(
        fake_api, dimension=DIM, timeout=0.3, retry=RetryPolicy(retries=1, total_seconds=0.2, base_delay=0.05)
    )
    fake_api.stall = 2.0
    started = time.monotonic()
    with pytest.raises(EmbedderUnavailableError, match="Timeout"):
        embedder.embed(["anyone there?"])
    assert time.monotonic() - started < 1.5

"""The embedder's layers: micro-batching of concurrent calls, the per-text cache, a replay
that embeds its turns ahead in batches instead of one call per turn (on a thread of its own,
while the turns run), and an embedder that starts loading its model at once."""

from __future__ import annotations

import gc
import itertools
import threading
import time
from collections.abc import Sequence

import pytest

from errors import ConfigurationError
from memory.embeddings import (
    BatchingEmbedder,
    CachingEmbedder,
    SentenceTransformerEmbedder,
    declared_dimension,
    model_path,
)
from runtime.config import Settings
from runtime.context import without_names
from runtime.service import CATEGORIES, load_conversations, open_embedder, replay_conversation
from tests.conftest import SAMPLE


class Counting:
    """Wraps an embedder; records the size of each call (and can make each call slow)."""

    def __init__(self, inner, *, delay: float = 0.0) -> None:
        self.inner, self.delay = inner, delay
        self.name, self.dimension = inner.name, inner.dimension
        self.calls: list[int] = []
        self.batches: list[list[str]] = []
        self.active = 0
        self.most_active = 0
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        with self._lock:
            self.calls.append(len(texts))
            self.batches.append(list(texts))
            self.active += 1
            self.most_active = max(self.most_active, self.active)
        try:
            time.sleep(self.delay)
            return self.inner.embed(texts)
        finally:
            with self._lock:
                self.active -= 1


def test_concurrent_callers_share_model_calls_and_each_gets_its_own_vectors(embedder):
    counting = Counting(embedder, delay=0.05)
    batching = BatchingEmbedder(counting)
    texts = [f"message number {i} about a trip to the lake" for i in range(12)]
    expected = embedder.embed(texts)
    results: dict[int, list[list[float]]] = {}
    start = threading.Barrier(len(texts))

    def call(i: int) -> None:
        start.wait(10)
        results[i] = batching.embed([texts[i]])

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(texts))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert sum(counting.calls) == len(texts)
    assert len(counting.calls) < len(texts)  # several callers shared one call
    assert counting.most_active == 1  # the model is never called concurrently
    for i, text_vectors in results.items():
        assert text_vectors[0] == pytest.approx(expected[i], abs=1e-5)


def test_a_query_waits_for_one_slice_of_a_large_request_not_for_all_of_it(embedder):
    """A turn's query that arrives while a compaction embeds its archive keys is embedded
    in the next call, ahead of the keys still queued; both get their own vectors."""
    counting = Counting(embedder, delay=0.5)  # the query is queued well within the first call
    batching = BatchingEmbedder(counting, max_texts=8)
    keys = [f"archived turn {i} about the lake house and the boat" for i in range(40)]
    query = "what did I say about the boat?"
    expected = embedder.embed([*keys, query])
    out: dict[str, object] = {}
    finished: list[str] = []

    def bulk() -> None:
        out["keys"] = batching.embed(keys)
        finished.append("keys")

    worker = threading.Thread(target=bulk)
    worker.start()
    deadline = time.monotonic() + 30
    while not counting.calls and time.monotonic() < deadline:  # the first slice of keys is in the model
        time.sleep(0.005)
    out["query"] = batching.embed([query])
    finished.append("query")
    worker.join(60)
    assert finished == ["query", "keys"]
    assert query in counting.batches[1]  # one slice of keys, then the query (and keys to fill the pass)
    assert sum(counting.calls) == 41 and max(counting.calls) <= 8
    assert out["query"][0] == pytest.approx(expected[-1], abs=1e-5)
    for got, want in zip(out["keys"], expected[:-1], strict=True):
        assert got == pytest.approx(want, abs=1e-5)


def test_a_failed_batch_raises_in_every_caller_and_the_batcher_keeps_working(embedder):
    class Flaky:
        name, dimension = embedder.name, embedder.dimension
        fail = True

        def embed(self, texts):
            if self.fail:
                raise RuntimeError("model broke")
            return embedder.embed(texts)

    flaky = Flaky()
    batching = BatchingEmbedder(flaky)
    with pytest.raises(RuntimeError, match="model broke"):
        batching.embed(["one"])
    flaky.fail = False
    assert len(batching.embed(["two"])[0]) == embedder.dimension


def test_the_cache_embeds_each_distinct_text_once(embedder):
    counting = Counting(embedder)
    cache = CachingEmbedder(counting, size=3)
    first = cache.embed(["a cat", "a dog", "a cat"])
    assert counting.calls == [2]
    assert first[0] == first[2]
    assert cache.embed(["a dog"]) == [first[1]] and counting.calls == [2]
    cache.embed(["a bird", "a fish"])  # size 3: "a cat", the least recently used, goes
    cache.embed(["a cat"])
    assert counting.calls == [2, 2, 1]
    assert (cache.hits, cache.misses) == (2, 5)


def test_the_bundled_models_dimension_is_read_from_its_files():
    assert declared_dimension(model_path("all-MiniLM-L6-v2")) == 384
    assert declared_dimension("no/such/model") is None


def test_a_loaded_model_is_out_of_the_garbage_collectors_walks():
    """Loading the model freezes the heap: the model's objects (and everything else alive then)
    are in the permanent generation, so a full collection in a later turn does not walk them."""
    embedder = SentenceTransformerEmbedder("all-MiniLM-L6-v2")  # its own model, loaded here
    frozen = gc.get_freeze_count()
    model = embedder.load()
    assert gc.is_tracked(model)
    assert gc.get_freeze_count() > frozen
    assert not any(o is model for o in gc.get_objects())  # in no generation a collection walks
    embedded = embedder.embed(["still works"])
    assert len(embedded[0]) == 384


def test_a_replay_embeds_its_turns_ahead_in_a_few_calls(make_engine_for, store, embedder):
    counting = Counting(embedder)
    engine = make_engine_for(window=1024)
    engine.embedder = CachingEmbedder(counting)
    engine = engine.derive(window=1024)
    conv = load_conversations(SAMPLE)[0]
    report = replay_conversation(engine, conv, run_id="t")
    users = sum(1 for t in conv.turns if t.role == "user")
    assert report.compactions >= 1 and report.archived_segments >= 1
    # one call per turn and one per compaction before; now a few batches, and a few stragglers
    assert len(counting.calls) <= report.compactions + 4 < users


def test_a_replay_embeds_each_text_once_shortest_first_within_each_call(make_engine_for, store, embedder):
    """Each turn's text and each question reach the model once, in the replay's calls ahead
    (none from a turn), sorted by length within a call so that a forward pass pads little."""
    counting = Counting(embedder)
    engine = make_engine_for(window=1024)
    engine.embedder = CachingEmbedder(counting)
    engine = engine.derive(window=1024)
    conv = load_conversations(SAMPLE)[0]
    replay_conversation(engine, conv, run_id="t")
    names = [conv.companion_name, conv.user_name]  # a user's message is embedded without them
    assert any(without_names(t.text, names) != t.text for t in conv.turns if t.role == "user")
    wanted = {without_names(t.text, names) if t.role == "user" else t.text for t in conv.turns} | {
        without_names(qa.question, names) for qa in conv.qa if qa.category in CATEGORIES
    }
    embedded = [text for batch in counting.batches for text in batch]
    assert sorted(embedded) == sorted(wanted)
    assert len(counting.calls) == 2  # the sample's 41 turns are one block; then its questions
    for batch in counting.batches:
        assert [len(t) for t in batch] == sorted(len(t) for t in batch)


def test_a_replay_embeds_ahead_while_its_turns_run(make_engine_for, store, embedder):
    """The questions (the last texts a replay embeds) go to the model while the first turns are
    stored, not after the last turn."""
    conv = load_conversations(SAMPLE)[0]
    questions = {without_names(qa.question, [conv.companion_name, conv.user_name]) for qa in conv.qa}
    asked = threading.Event()

    class Watching(Counting):
        def embed(self, texts: Sequence[str]) -> list[list[float]]:
            if questions & set(texts):
                asked.set()
            return super().embed(texts)

    engine = make_engine_for(window=1024)
    engine.embedder = CachingEmbedder(Watching(embedder))
    engine = engine.derive(window=1024)
    during_turns: list[bool] = []

    def on_turn() -> None:
        if not during_turns:  # the first turn waits until the questions are being embedded
            during_turns.append(asked.wait(20))

    report = replay_conversation(engine, conv, on_turn=on_turn, run_id="t")
    assert during_turns == [True]
    assert report.turns == len(conv.turns) and report.evidence_total


def test_a_replay_whose_embedder_fails_raises_and_stores_no_turn(make_engine_for, store, embedder):
    class Broken:
        name, dimension = embedder.name, embedder.dimension

        def embed(self, texts):
            raise RuntimeError("model broke")

    engine = make_engine_for(window=1024)
    engine.embedder = CachingEmbedder(Broken())
    engine = engine.derive(window=1024)
    conv = load_conversations(SAMPLE)[0]
    with pytest.raises(RuntimeError, match="model broke"):
        replay_conversation(engine, conv, run_id="t")
    assert store.turns.of_session(f"replay:{conv.id}:t:session") == []


def test_a_replays_timeline_reads_the_stored_state_only_after_a_compaction(
    make_engine_for, store, embedder, monkeypatch
):
    """With compaction inline, a step that compacted nothing leaves the archive, the summary and the
    breaker as the step before saw them: the timeline reads them again only after a compaction."""
    reads: list[str] = []
    count = store.archive.count

    def counted(**kwargs):
        reads.append(kwargs["user_id"])
        return count(**kwargs)

    monkeypatch.setattr(store.archive, "count", counted)
    engine = make_engine_for(window=1024)
    engine.embedder = CachingEmbedder(embedder)
    engine = engine.derive(window=1024)
    conv = load_conversations(SAMPLE)[0]
    report = replay_conversation(engine, conv, run_id="t")
    steps = len(report.timeline)
    changes = sum(1 for a, b in itertools.pairwise(report.timeline) if a.compactions != b.compactions)
    assert report.compactions >= 1
    assert len(reads) < steps  # one read per step before
    assert len(reads) <= report.compactions + (steps - sum(1 for p in report.timeline if p.sources)) + 2
    last = report.timeline[-1]
    assert (last.compactions, last.archived_segments, last.summary_tokens) == (
        report.compactions,
        report.archived_segments,
        report.summary_tokens,
    )
    for a, b in itertools.pairwise(report.timeline):
        if a.compactions == b.compactions:  # no compaction between them: the same stored figures
            assert (a.archived_segments, a.summary_tokens) == (b.archived_segments, b.summary_tokens)
    assert changes == report.compactions


def test_a_preloading_embedder_loads_its_model_before_the_first_embedding(tmp_path):
    settings = Settings(database_url="unused")
    embedder = open_embedder(settings, preload=True)
    model = embedder.inner.inner  # the caching and batching layers, then the model
    deadline = time.monotonic() + 120
    while not model.loaded and time.monotonic() < deadline:
        time.sleep(0.05)
    assert model.loaded
    assert len(embedder.embed(["hello"])[0]) == embedder.dimension


PRELOAD_THEN_EXIT = """
import sys, time
from memory.onnx_embedder import OnnxEmbedder
from runtime.config import Settings
from runtime.service import open_embedder

loading = OnnxEmbedder.load

def slow_load(self):
    time.sleep(1.0)  # the process ends meanwhile
    loaded = loading(self)
    print("loaded", flush=True)
    return loaded

OnnxEmbedder.load = slow_load
open_embedder(Settings(database_url="unused"), preload=True)
sys.exit(2)  # a command that fails before its first embedding
"""


def test_a_process_that_ends_while_the_model_preloads_waits_for_the_load():
    """Ended in the middle of creating its session, ONNX Runtime aborts the process (status 134
    instead of the command's own); the exit waits for the preload instead."""
    import subprocess
    import sys

    result = subprocess.run(
        [sys.executable, "-c", PRELOAD_THEN_EXIT], capture_output=True, text=True, timeout=180, check=False
    )
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stdout.split() == ["loaded"]


def test_a_preload_that_fails_raises_at_the_first_embedding(tmp_path):
    """A model whose dimension its files declare but which cannot load (no transformer weights)."""
    folder = tmp_path / "broken-model"
    (folder / "1_Pooling").mkdir(parents=True)
    (folder / "modules.json").write_text(
        '[{"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},'
        ' {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]'
    )
    (folder / "1_Pooling" / "config.json").write_text(
        '{"word_embedding_dimension": 4, "pooling_mode_mean_tokens": true}'
    )
    embedder = open_embedder(Settings(database_url="unused", embedding_model=str(folder)), preload=True)
    assert embedder.dimension == 4
    with pytest.raises(ConfigurationError, match="Cannot load the embedding model"):
        embedder.embed(["hello"])

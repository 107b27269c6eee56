"""``phrasescore represent``: phrase vectors, word vectors, neighbours and maps (Cho et al. Fig. 4-5)."""

from __future__ import annotations

import gzip
import logging

import numpy as np
import pytest
from click.testing import CliRunner

from phrasescore.bundle import load_model
from phrasescore.cli import cli
from phrasescore.jobs.analysis.represent import (
    RepresentOptions,
    frequent_table_phrases,
    nearest_neighbours,
    represent,
)

from .conftest import DATA, write_lines

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
TABLE = DATA / "moses" / "multi30k.head300.phrase-table.gz"
PHRASES = ["a man", "two dogs are playing", "a man", "in the water", "a young girl", "the street"]


def invoke(*args: str):
    return CliRunner().invoke(cli, ["-q", *args], catch_exceptions=False)


@pytest.fixture(scope="module")
def phrase_file(tmp_path_factory):
    return write_lines(tmp_path_factory.mktemp("phrases") / "phrases.en", PHRASES)


def test_one_vector_of_the_model_dimension_per_phrase(tiny_model_path, phrase_file, tmp_path):
    prefix = str(tmp_path / "out" / "phrases")
    result = invoke(
        "represent", phrase_file, "-m", tiny_model_path, "-o", prefix, "--device", "cpu"
    )
    assert result.exit_code == 0, result.output
    vectors = np.load(prefix + ".npy")
    hidden = load_model(tiny_model_path).config.hidden_dim
    assert vectors.dtype == np.float32 and vectors.shape == (len(PHRASES), hidden)
    labels = open(prefix + ".tsv", encoding="utf-8").read().splitlines()
    assert labels == PHRASES
    assert np.array_equal(vectors[0], vectors[2])  # the same phrase twice, the same vector
    assert not np.array_equal(vectors[0], vectors[1])
    assert np.all(np.abs(vectors) <= 1.0)  # c = tanh(V h_T)


def test_neighbours_list_the_phrase_itself_first(tiny_model_path, phrase_file, tmp_path):
    prefix = str(tmp_path / "p")
    result = invoke(
        "represent", phrase_file, "-m", tiny_model_path, "-o", prefix, "--neighbours", "3"
    )
    assert result.exit_code == 0, result.output
    rows = [line.split("\t") for line in result.output.splitlines()]
    queries = list(dict.fromkeys(PHRASES))
    assert len(rows) == 3 * len(queries)  # "a man" given twice is listed once
    for q, query in enumerate(queries):
        block = rows[3 * q : 3 * q + 3]
        assert [r[0] for r in block] == [query] * 3
        assert [r[1] for r in block] == ["0", "1", "2"]
        assert block[0][3] == query and float(block[0][2]) == pytest.approx(1.0, abs=1e-4)
        assert len({r[3] for r in block}) == 3


def test_nearest_neighbours_puts_the_query_first_even_among_equal_vectors():
    matrix = np.array([[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.7, 0.7]])
    assert nearest_neighbours(matrix, [1, 2], 3) == [[1, 0, 3], [2, 3, 0]]


def test_map_and_word_vectors(tiny_model_path, phrase_file, tmp_path):
    prefix = str(tmp_path / "p")
    result = invoke(
        "represent",
        phrase_file,
        "-m",
        tiny_model_path,
        "-o",
        prefix,
        "--map",
        str(tmp_path / "map.png"),
        "--words",
        "40",
        "--word-map",
        str(tmp_path / "words.png"),
    )
    assert result.exit_code == 0, result.output
    for png in ("map.png", "words.png"):
        assert (tmp_path / png).read_bytes()[:8] == PNG_MAGIC
    model = load_model(tiny_model_path)
    for tag, vocab in (("src", model.src_vocab), ("tgt", model.tgt_vocab)):
        matrix = np.load(f"{prefix}.{tag}-words.npy")
        words = open(f"{prefix}.{tag}-words.tsv", encoding="utf-8").read().splitlines()
        assert matrix.shape == (40, model.config.embedding_dim)
        assert words == vocab.words[:40]  # the most frequent words, in frequency order


def test_map_without_scikit_learn_is_pca_with_a_message(
    tiny_model_path, phrase_file, tmp_path, monkeypatch, caplog
):
    monkeypatch.setattr("phrasescore.jobs.analysis.represent.sklearn_available", lambda: False)
    options = RepresentOptions(map_path=str(tmp_path / "m.png"))
    with caplog.at_level(logging.WARNING, logger="phrasescore"):
        result = represent(phrase_file, tiny_model_path, str(tmp_path / "p"), options)
    assert result.method == "PCA"
    assert "scikit-learn is not installed" in caplog.text
    assert (tmp_path / "m.png").read_bytes()[:8] == PNG_MAGIC


def _table_counts(side_index: int) -> dict[str, float]:
    counts: dict[str, float] = {}
    for line in gzip.open(TABLE, "rt", encoding="utf-8"):
        fields = [f.strip() for f in line.split("|||")]
        phrase = fields[0] if side_index == 1 else fields[1]
        counts[phrase] = max(counts.get(phrase, 0.0), float(fields[4].split()[side_index]))
    return counts


@pytest.mark.parametrize("side,index", [("source", 1), ("target", 0)])
def test_phrase_table_gives_the_most_frequent_phrases_of_a_side(side, index):
    ranked = frequent_table_phrases(str(TABLE), side, 10)
    counts = _table_counts(index)
    assert len(ranked) == 10
    assert [c for _, c in ranked] == sorted(counts.values(), reverse=True)[:10]
    assert all(counts[p] == c for p, c in ranked)


def test_phrase_table_input_writes_one_row_per_kept_phrase(tiny_model_path, tmp_path):
    prefix = str(tmp_path / "t")
    result = invoke(
        "represent",
        "-m",
        tiny_model_path,
        "--phrase-table",
        str(TABLE),
        "--limit",
        "7",
        "-o",
        prefix,
    )
    assert result.exit_code == 0, result.output
    assert np.load(prefix + ".npy").shape[0] == 7
    assert len(open(prefix + ".tsv", encoding="utf-8").read().splitlines()) == 7


def test_no_input_is_a_clean_error(tiny_model_path, tmp_path):
    result = CliRunner().invoke(
        cli, ["represent", "-m", tiny_model_path, "-o", str(tmp_path / "x")]
    )
    assert result.exit_code == 1
    assert "give PHRASES" in result.output


def test_phrase_table_min_words():
    ranked = frequent_table_phrases(str(TABLE), "source", 5, min_words=3)
    assert len(ranked) == 5 and all(len(p.split()) >= 3 for p, _ in ranked)

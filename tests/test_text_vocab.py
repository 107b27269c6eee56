"""Word and subword vocabularies: ids, unknown words, state round trips, determinism."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from phrasescore.errors import InputError, ModelFileError
from phrasescore.text.vocab import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SubwordVocabulary,
    WordVocabulary,
    vocabulary_from_state,
)

TEXT_DATA = Path(__file__).parent / "data" / "text"


@pytest.fixture(scope="module")
def english() -> list[list[str]]:
    path = TEXT_DATA / "multi30k-sample.tok.lc.en.gz"
    with gzip.open(path, "rt", encoding="utf-8") as handle:
        return [line.split() for line in handle]


@pytest.fixture(scope="module")
def subwords(english) -> SubwordVocabulary:
    return SubwordVocabulary.build(english, 300)


def test_special_ids():
    assert (PAD_ID, UNK_ID, BOS_ID, EOS_ID) == (0, 1, 2, 3)


def test_word_vocabulary_keeps_top_k_with_ties_broken_by_word():
    sentences = [["b", "a", "c", "d"], ["a", "b", "c"], ["a", "e"]]
    # counts: a 3, b 2, c 2, d 1, e 1 -> a, then b/c by string, then d before e
    vocabulary = WordVocabulary.build(sentences, max_size=4)
    assert vocabulary.words == ["a", "b", "c", "d"]
    assert len(vocabulary) == 8
    assert vocabulary.encode(["a", "d", "e", "c"]) == [4, 7, UNK_ID, 6]
    assert WordVocabulary.build(reversed(sentences), max_size=4).words == vocabulary.words


def test_word_vocabulary_unknown_words_decode_and_coverage():
    vocabulary = WordVocabulary.build([["x", "y", "x"]], max_size=1)
    assert vocabulary.count_unknown(["x", "y", "z", "x"]) == 2
    assert vocabulary.coverage([["x", "y"], ["x", "x"]]) == 0.75
    assert vocabulary.coverage([]) == 1.0
    assert vocabulary.decode([BOS_ID, 4, UNK_ID, PAD_ID, EOS_ID, 4]) == ["x", "<unk>", "x"]
    assert vocabulary.encode_batch([["x"], [], ["q", "x"]]) == [[4], [], [UNK_ID, 4]]


def test_word_that_looks_like_a_special_symbol_is_an_ordinary_word():
    vocabulary = WordVocabulary.build([["<unk>", "</s>", "a"]], max_size=10)
    assert UNK_ID not in vocabulary.encode(["<unk>"])
    assert EOS_ID not in vocabulary.encode(["</s>"])


def test_word_vocabulary_state_round_trip_on_real_text(english):
    vocabulary = WordVocabulary.build(english, max_size=500)
    assert len(vocabulary) == 504
    state = json.loads(json.dumps(vocabulary.to_state()))
    again = vocabulary_from_state(state)
    assert isinstance(again, WordVocabulary)
    assert again == vocabulary
    assert again.encode_batch(english) == vocabulary.encode_batch(english)
    assert 0.9 < vocabulary.coverage(english) < 1.0
    assert vocabulary.encode(english[0]) == [vocabulary.encode([w])[0] for w in english[0]]


def test_subword_vocabulary_trains_and_round_trips_known_text(english, subwords):
    assert len(subwords) == 300
    assert subwords.pieces[:4] == ["<pad>", "<unk>", "<s>", "</s>"]
    ids = subwords.encode_batch(english)
    assert ids == [subwords.encode(sentence) for sentence in english]
    assert all(subwords.decode(i) == sentence for i, sentence in zip(ids, english, strict=True))
    assert all(min(i) > EOS_ID for i in ids)  # no specials inside an encoding
    assert subwords.coverage(english) == 1.0
    escaped = ["&quot;", "hello", "&apos;s", "&amp;"]
    assert subwords.decode([BOS_ID, *subwords.encode(escaped), EOS_ID, PAD_ID]) == escaped


def test_subword_unknown_characters_are_counted_per_word(subwords):
    words = ["a", "man", "☃", "x☃y", "dog"]
    assert subwords.count_unknown(words) == 2
    assert UNK_ID in subwords.encode(words)
    assert subwords.count_unknown([]) == 0


def test_subword_state_round_trip_and_determinism(english, subwords):
    state = json.loads(json.dumps(subwords.to_state()))
    assert state["kind"] == "subword"
    again = vocabulary_from_state(state)
    assert isinstance(again, SubwordVocabulary)
    assert again.encode_batch(english) == subwords.encode_batch(english)
    rebuilt = SubwordVocabulary.build(english, 300)
    assert rebuilt.model_proto == subwords.model_proto
    assert rebuilt.encode_batch(english) == subwords.encode_batch(english)


def test_subword_size_too_small_for_the_alphabet_is_an_input_error(english):
    with pytest.raises(InputError, match="subword vocabulary of 10 pieces"):
        SubwordVocabulary.build(english, 10)


def test_bad_states_are_model_file_errors():
    with pytest.raises(ModelFileError):
        vocabulary_from_state({"kind": "characters"})
    with pytest.raises(ModelFileError):
        vocabulary_from_state({"kind": "subword", "model": "bm90IGEgbW9kZWw="})
    with pytest.raises(ModelFileError):
        vocabulary_from_state({"kind": "word", "words": ["a", "a"]})

"""Ids of phrases as arrays, from the phrases' bytes in one pass.

A chunk of a phrase table gives its phrases as one ``bytes``, each phrase followed by ``"\\n"``
(:meth:`~phrasescore.moses.columnar.TableChunk.phrase_text`). :meth:`PhraseIds.encode` turns
that text into the ids of every phrase laid end to end, their offsets and each phrase's
unknown-word count (:class:`PhraseArrays`): for a word vocabulary, one decode, one split on
spaces and one C loop of dict lookups for the whole chunk, the phrase boundaries found by numpy
over the bytes (the separators before each ``"\\n"``), a right-to-left model's order by one
gather; no Python object per phrase.

This is the one home of phrases to ids: the engine's text half
(:class:`~phrasescore.engine.scoring.PhraseEncoder`, what ``nbest`` and the analyses score
through) and ``rescore``'s table path both encode here. The ids are the phrase's tokens
(:meth:`~phrasescore.text.tokenize.TextNormalizer.normalize_tokenized`: spaces and tabs, the
model's lowercasing), in the model's reading order for a target (``reverse_target``), then the
vocabulary's ids (words or subword pieces): those of the vocabulary's ``encode_batch`` of the
tokens (tests/test_engine_arrays.py); the unknown-word count is the vocabulary's
``count_unknown`` of the tokens. Phrases that the one-pass split would read differently (a tab
or a run of spaces inside a phrase, an empty phrase, lowercasing beyond ASCII) and subword
vocabularies go phrase by phrase, each distinct phrase of the chunk once.

No cache across chunks: a dict of the phrases seen cost twice as much per line as encoding each
chunk's targets in one pass (docs/benchmarks.md, "Ids as arrays"); a sorted table's source is
encoded once per run of lines by the caller.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import NamedTuple

import numpy as np

from phrasescore.text.corpus import flatten_ids, gather_sequences, offsets_from_lengths
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import UNK_ID, WordVocabulary

_LF, _SP = 10, 32


class PhraseArrays(NamedTuple):
    """Id sequences (phrases) laid end to end, the one ragged array of the package's scoring
    path: phrase ``i`` is ``ids[offsets[i]:offsets[i + 1]]``, with ``unknown[i]`` unknown words
    (None: not counted). A pair of them is the engine's input
    (:class:`~phrasescore.engine.batching.IdPairs`)."""

    ids: np.ndarray  # int32 (int64 from lists) [tokens]
    offsets: np.ndarray  # int64 [n + 1], offsets[0] == 0
    unknown: np.ndarray | None = None  # int64 [n]

    @classmethod
    def from_lists(cls, id_lists: Sequence[Sequence[int]]) -> PhraseArrays:
        """The phrases of id lists (int64 ids), unknown words not counted."""
        flat, lengths = flatten_ids(id_lists, np.int64)
        return cls(flat, offsets_from_lengths(lengths))

    def lengths(self) -> np.ndarray:
        """The number of ids of each phrase."""
        return np.diff(self.offsets)

    def take(self, index: np.ndarray) -> PhraseArrays:
        """The phrases ``index``, in that order (a phrase may come several times)."""
        ids, offsets = gather_sequences(self.ids, self.offsets, index)
        return PhraseArrays(ids, offsets, None if self.unknown is None else self.unknown[index])

    def to_lists(self) -> list[list[int]]:
        """The phrases as id lists."""
        return [a.tolist() for a in np.split(self.ids, self.offsets[1:-1])]


class PhraseIds:
    """The ids and unknown-word counts of phrases in one vocabulary (a model's side)."""

    def __init__(
        self,
        vocab,
        normalizer: TextNormalizer,
        order: Callable[[list[str]], list[str]] | None = None,
    ):
        self.vocab = vocab
        self.normalizer = normalizer
        self.order = order

    def encode(self, text: bytes) -> PhraseArrays:
        """The ids of the phrases of ``text`` (UTF-8, each phrase followed by ``"\\n"``)."""
        if not text:
            return PhraseArrays(
                np.zeros(0, dtype=np.int32), np.zeros(1, dtype=np.int64), np.zeros(0, np.int64)
            )
        return self._encode_words(text) or self._encode_each(text)

    def encode_list(self, phrases: list[bytes]) -> PhraseArrays:
        """:meth:`encode` of phrases given one by one."""
        return self.encode(b"".join(p + b"\n" for p in phrases))

    def _encode_words(self, text: bytes) -> PhraseArrays | None:
        """:meth:`encode` for a word vocabulary, the whole text at once (None: phrases that
        need the tokeniser one by one, or a subword vocabulary)."""
        if not isinstance(self.vocab, WordVocabulary):
            return None
        if b"\t" in text or b"  " in text or b"\n " in text or b" \n" in text:
            return None
        if text[:1] in (b" ", b"\n") or b"\n\n" in text:
            return None
        string = text.decode("utf-8")
        if self.normalizer.lowercase:
            if not string.isascii():
                return None
            string = string.lower()
        ids = self.vocab.ids_array(string[:-1].replace("\n", " ").split(" "))
        raw = np.frombuffer(text, dtype=np.uint8)
        # a token ends at each separator; a phrase at its "\n": the tokens up to it
        separators = np.flatnonzero((raw == _SP) | (raw == _LF))
        offsets = np.zeros(1, dtype=np.int64)
        offsets = np.concatenate((offsets, np.flatnonzero(raw[separators] == _LF) + 1))
        if self.order is not None:  # the model's reading order: each phrase reversed
            lengths = np.diff(offsets)
            last = np.repeat(offsets[:-1] + offsets[1:] - 1, lengths)  # s + e - 1 - position
            ids = ids[last - np.arange(len(ids), dtype=np.int64)]
        unknown = np.add.reduceat((ids == UNK_ID).astype(np.int64), offsets[:-1])
        return PhraseArrays(ids, offsets, unknown)

    def _encode_each(self, text: bytes) -> PhraseArrays:
        """:meth:`encode` phrase by phrase: the tokeniser's split and lowercasing, the model's
        order, the vocabulary's batch encoding; each distinct phrase once."""
        phrases = text.split(b"\n")
        phrases.pop()
        distinct = list(dict.fromkeys(phrases))
        normalize = self.normalizer.normalize_tokenized
        tokens = [normalize(p.decode("utf-8")) for p in distinct]
        order = self.order
        encoded = self.vocab.encode_batch(tokens if order is None else [order(t) for t in tokens])
        count = self.vocab.count_unknown
        where = dict(zip(distinct, range(len(distinct)), strict=True))
        index = np.fromiter(map(where.__getitem__, phrases), dtype=np.int64, count=len(phrases))
        lengths = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))[index]
        offsets = offsets_from_lengths(lengths)
        ids = np.fromiter(
            (i for k in index.tolist() for i in encoded[k]), dtype=np.int32, count=int(offsets[-1])
        )
        unknown = np.fromiter(map(count, tokens), dtype=np.int64, count=len(tokens))[index]
        return PhraseArrays(ids, offsets, unknown)

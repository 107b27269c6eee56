"""Ids of phrases as arrays, each distinct phrase looked up once.

A phrase table repeats each source on consecutive lines (a sorted table) and each target across
sources; the ids of a phrase depend only on its text and the model. :class:`PhraseIds` keeps the
ids of the phrases it has seen (UTF-8 bytes, as the table holds them) in one flat array, so that
the ids of a chunk's phrases are a dict lookup per phrase and one numpy gather, not a
tokenisation and a vocabulary lookup per line and token.

The ids are those of :meth:`~phrasescore.engine.scoring.PhraseEncoder.encode_phrases`: the
phrase's tokens (:func:`~phrasescore.engine.scoring.phrase_tokens`: spaces and tabs, the model's
lowercasing), in the model's reading order for a target (``reverse_target``), then the
vocabulary's ids (words or subword pieces); the unknown-word count is the vocabulary's
``count_unknown`` of the tokens. At ``max_phrases`` phrases the cache starts again (memory stays
bounded on any table).
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable

import numpy as np

from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import UNK_ID, WordVocabulary


class PhraseIds:
    """The ids and unknown-word counts of phrases in one vocabulary, cached."""

    def __init__(
        self,
        vocab,
        normalizer: TextNormalizer,
        order: Callable[[list[str]], list[str]] | None = None,
        max_phrases: int = 1 << 20,
    ):
        self.vocab = vocab
        self.normalizer = normalizer
        self.order = order
        self.max_phrases = max_phrases
        self.clear()

    def clear(self) -> None:
        self._index: dict[bytes, int] = {}
        self._ids = np.empty(1 << 16, dtype=np.int32)
        self._used = 0
        self._start = np.empty(1 << 12, dtype=np.int64)
        self._length = np.empty(1 << 12, dtype=np.int64)
        self._unknown = np.empty(1 << 12, dtype=np.int64)

    def __len__(self) -> int:
        return len(self._index)

    def lookup(self, phrases: list[bytes]) -> np.ndarray:
        """The index of each phrase in the cache (int64), the phrases not seen yet added."""
        get = self._index.get
        found = list(map(get, phrases))
        if None in found:  # the phrases not seen yet, each once (C loops)
            missing = map(operator.is_, found, itertools.repeat(None))
            new = list(dict.fromkeys(itertools.compress(phrases, missing)))
            if len(self._index) + len(new) > self.max_phrases:
                self.clear()
                new = list(dict.fromkeys(phrases))
            self._add(new)
            found = list(map(get, phrases))
        return np.fromiter(found, dtype=np.int64, count=len(found))

    def lookup_runs(self, phrases: list[bytes], runs: np.ndarray) -> np.ndarray:
        """:meth:`lookup` of phrases that come in runs of equal ones (``runs``: the index of
        each run's first phrase): one lookup per run."""
        if not len(phrases):
            return np.zeros(0, dtype=np.int64)
        firsts = [phrases[i] for i in runs.tolist()]
        index = self.lookup(firsts)
        lengths = np.diff(np.concatenate((runs, [len(phrases)])))
        return np.repeat(index, lengths)

    def _add(self, phrases: list[bytes]) -> None:
        if not self._add_words(phrases):
            self._add_each(phrases)

    def _add_words(self, phrases: list[bytes]) -> bool:
        """:meth:`_add` for a word vocabulary read left to right, all phrases at once: one
        text, one split on spaces, one C loop of dict lookups (False: not such phrases, where
        a tab, a run of spaces or a lowercasing beyond ASCII needs the tokeniser per phrase)."""
        if not isinstance(self.vocab, WordVocabulary) or self.order is not None or not phrases:
            return False
        joined = b"\n".join(phrases)
        if b"\t" in joined or b"  " in joined or b"\n " in joined or b" \n" in joined:
            return False
        text = joined.decode("utf-8")
        if self.normalizer.lowercase:
            if not text.isascii():
                return False
            text = text.lower()
        if text[:1] == " " or text[-1:] == " ":
            return False
        ids = self.vocab.ids_array(text.replace("\n", " ").split(" "))
        raw = np.frombuffer(joined, dtype=np.uint8)
        ends = np.concatenate((np.flatnonzero(raw == 10), [len(raw)]))
        spaces = np.concatenate(([0], np.cumsum(raw == 32)))
        starts = np.concatenate(([0], ends[:-1] + 1))
        lengths = spaces[ends] - spaces[starts] + 1
        offsets = np.concatenate(([0], np.cumsum(lengths)))
        unknown = np.add.reduceat((ids == UNK_ID).astype(np.int64), offsets[:-1])
        self._append(phrases, ids, lengths, unknown)
        return True

    def _append(self, phrases, ids: np.ndarray, lengths: np.ndarray, unknown) -> None:
        first = len(self._index)
        total = first + len(phrases)
        needed = self._used + len(ids)
        if needed > len(self._ids):
            self._ids = np.resize(self._ids, max(needed, 2 * len(self._ids)))
        if total > len(self._start):
            size = max(total, 2 * len(self._start))
            self._start = np.resize(self._start, size)
            self._length = np.resize(self._length, size)
            self._unknown = np.resize(self._unknown, size)
        self._ids[self._used : needed] = ids
        self._start[first:total] = self._used + np.cumsum(lengths) - lengths
        self._length[first:total] = lengths
        self._unknown[first:total] = unknown
        self._used = needed
        self._index.update(zip(phrases, range(first, total), strict=True))

    def _add_each(self, phrases: list[bytes]) -> None:
        texts = [p.decode("utf-8") for p in phrases]
        normalize = self.normalizer.normalize_tokenized
        tokens = [normalize(t) for t in texts]
        order = self.order
        ids = self.vocab.encode_batch(tokens if order is None else [order(t) for t in tokens])
        count = self.vocab.count_unknown
        lengths = np.fromiter(map(len, ids), dtype=np.int64, count=len(ids))
        flat = np.fromiter(
            itertools.chain.from_iterable(ids), dtype=np.int32, count=int(lengths.sum())
        )
        self._append(phrases, flat, lengths, [count(t) for t in tokens])

    def gather(self, index: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The ids of phrases ``index`` laid end to end, and their offsets (``[n + 1]``)."""
        lengths = self._length[index]
        offsets = np.zeros(len(index) + 1, dtype=np.int64)
        np.cumsum(lengths, out=offsets[1:])
        positions = np.repeat(self._start[index] - offsets[:-1], lengths) + np.arange(
            offsets[-1], dtype=np.int64
        )
        return self._ids[positions], offsets

    def lengths(self, index: np.ndarray) -> np.ndarray:
        """The number of ids of each phrase."""
        return self._length[index]

    def unknown(self, index: np.ndarray) -> np.ndarray:
        """The unknown words of each phrase (``count_unknown`` of its tokens)."""
        return self._unknown[index]

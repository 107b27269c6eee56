"""Vocabularies: tokens to integer ids and back.

Two kinds share one interface and the same special ids (:data:`PAD_ID`, :data:`UNK_ID`,
:data:`BOS_ID`, :data:`EOS_ID` = 0, 1, 2, 3, of :mod:`phrasescore.special_ids`, the networks'):

* :class:`WordVocabulary` -- Cho et al. (2014, §4.1): the K most frequent words of one
  language side (15,000 in the paper, 93% coverage); every other word maps to one unknown-word
  symbol.
* :class:`SubwordVocabulary` -- a SentencePiece model (Kudo & Richardson 2018) trained on the
  same tokenised, Moses-escaped words, so that rare words are spelled with pieces instead of
  becoming unknown (``--subwords N``).

Both are saved inside the model file as a JSON-serialisable dict (``to_state``) and rebuilt with
:func:`vocabulary_from_state`. Sequences are encoded without BOS/EOS; :mod:`phrasescore.text.corpus`
adds them when it builds batches.
"""

from __future__ import annotations

import base64
import io
import itertools
import logging
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from typing import Any, ClassVar

import numpy as np
import sentencepiece

from phrasescore.errors import InputError, ModelFileError
from phrasescore.special_ids import BOS_ID, EOS_ID, PAD_ID, UNK_ID

logger = logging.getLogger(__name__)


PAD_TOKEN = "<pad>"
UNK_TOKEN = "<unk>"
BOS_TOKEN = "<s>"
EOS_TOKEN = "</s>"
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)
_NOT_WORDS = frozenset((PAD_ID, BOS_ID, EOS_ID))


def _known_fraction(known: int, total: int) -> float:
    return 1.0 if total == 0 else known / total


class WordVocabulary:
    """The ``max_size`` most frequent words of a side plus the 4 special symbols.

    Ids 0-3 are the specials; words follow in decreasing frequency, ties broken by the word
    string (code-point order) so that the same text always gives the same ids. A word of the
    text that happens to be spelled like a special symbol (``<unk>`` in untokenised text) is an
    ordinary word: encoding never produces a special id for it.
    """

    kind: ClassVar[str] = "word"

    def __init__(self, words: Sequence[str]):
        """``words``: the vocabulary's words in id order, ids 4, 5, ... (specials excluded)."""
        if len(set(words)) != len(words):
            raise ValueError("a word vocabulary must not list a word twice")
        self.words: list[str] = list(words)
        self._id_of_word: dict[str, int] = {
            word: index for index, word in enumerate(self.words, len(SPECIAL_TOKENS))
        }
        self._token_of_id: list[str] = list(SPECIAL_TOKENS) + self.words

    @classmethod
    def build(cls, sentences: Iterable[list[str]], max_size: int = 15_000) -> WordVocabulary:
        """The ``max_size`` most frequent words of ``sentences`` (ties by word)."""
        if max_size < 0:
            raise ValueError(f"max_size must be >= 0, got {max_size}")
        counts: Counter[str] = Counter()
        for tokens in sentences:
            counts.update(tokens)
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
        vocabulary = cls([word for word, _ in ranked[:max_size]])
        total = sum(counts.values())
        known = sum(count for _, count in ranked[:max_size])
        logger.info(
            "word vocabulary: %d of %d distinct words kept, %.2f%% of %d tokens covered",
            len(vocabulary.words),
            len(counts),
            100.0 * _known_fraction(known, total),
            total,
        )
        return vocabulary

    def __len__(self) -> int:
        """Number of ids, specials included."""
        return len(self._token_of_id)

    def encode(self, tokens: list[str]) -> list[int]:
        """The ids of ``tokens`` (unknown words -> :data:`UNK_ID`; no BOS/EOS added)."""
        get = self._id_of_word.get
        return [get(token, UNK_ID) for token in tokens]

    def encode_batch(self, token_lists: Iterable[list[str]]) -> list[list[int]]:
        """:meth:`encode` of each list."""
        get = self._id_of_word.get
        return [[get(token, UNK_ID) for token in tokens] for tokens in token_lists]

    def ids_array(self, tokens: list[str]) -> np.ndarray:
        """:meth:`encode` of ``tokens`` as an int32 array, from a C loop (the ids of
        many phrases' tokens laid end to end in one call)."""
        return np.fromiter(
            map(self._id_of_word.get, tokens, itertools.repeat(UNK_ID)),
            dtype=np.int32,
            count=len(tokens),
        )

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The words of ``ids``; PAD/BOS/EOS are skipped (not stopped at), UNK gives ``<unk>``."""
        token_of_id = self._token_of_id
        return [token_of_id[int(i)] for i in ids if int(i) not in _NOT_WORDS]

    def count_unknown(self, tokens: Iterable[str]) -> int:
        """How many of ``tokens`` map to :data:`UNK_ID`."""
        tokens = tokens if isinstance(tokens, list) else list(tokens)
        return len(tokens) - sum(map(self._id_of_word.__contains__, tokens))

    def coverage(self, sentences: Iterable[list[str]]) -> float:
        """Fraction of the tokens of ``sentences`` that are known (1.0 for no tokens); the
        tokens counted in C loops (``rescore`` checks the direction on a whole chunk)."""
        tokens = list(itertools.chain.from_iterable(sentences))
        known = sum(map(self._id_of_word.__contains__, tokens))
        return _known_fraction(known, len(tokens))

    def to_state(self) -> dict[str, Any]:
        """JSON-serialisable description: ``{"kind": "word", "words": [...]}`` (ids 4, 5, ...)."""
        return {"kind": self.kind, "words": list(self.words)}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> WordVocabulary:
        """The vocabulary :meth:`to_state` described."""
        if state.get("kind") != cls.kind or not isinstance(state.get("words"), list):
            raise ModelFileError(f"not a word vocabulary (kind {state.get('kind')!r})")
        try:
            return cls(state["words"])
        except ValueError as exc:
            raise ModelFileError(f"corrupt word vocabulary: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, WordVocabulary) and self.words == other.words

    __hash__ = None  # type: ignore[assignment]

    def __repr__(self) -> str:
        return f"WordVocabulary({len(self.words)} words + {len(SPECIAL_TOKENS)} specials)"


class SubwordVocabulary:
    """A SentencePiece BPE model over the tokenised (Moses-escaped) words of one side.

    Training (:meth:`build`): ``model_type=bpe`` -- merges are learnt greedily from pair counts,
    so the model depends only on the (sampled) input and training is deterministic with one thread;
    encoding is deterministic too and every word made of seen characters is spelled without
    ``<unk>`` (the unigram model's EM is what ``random_seed`` would be for, and it is not needed).
    ``vocab_size`` counts the 4 specials (``len(vocab) == size``); ``character_coverage=1.0``
    keeps every character seen (small alphabets, SentencePiece's advice for en/fr/de);
    ``normalization_rule_name=identity`` so that text is not NFKC-rewritten and
    ``decode(encode(words)) == words``; pieces never cross a space (``split_by_whitespace``);
    at most ``max_sentences`` lines are used, sampled by SentencePiece itself
    (``input_sentence_size``, ``shuffle_input_sentence``), which is deterministic.

    A sequence of words is encoded as the pieces of ``" ".join(words)``. Characters not seen in
    training become ``<unk>`` pieces; a word containing one is an unknown word
    (:meth:`count_unknown`). The text must not contain ``▁`` (U+2581), SentencePiece's
    space marker, if words are to be decoded back unchanged.
    """

    kind: ClassVar[str] = "subword"
    DEFAULT_MAX_SENTENCES: ClassVar[int] = 5_000_000
    UNKNOWN_CACHE_SIZE: ClassVar[int] = 1_000_000

    def __init__(self, model_proto: bytes):
        """``model_proto``: a serialized SentencePiece model with PAD/UNK/BOS/EOS at ids 0-3."""
        self.model_proto = bytes(model_proto)
        processor = sentencepiece.SentencePieceProcessor()
        processor.LoadFromSerializedProto(self.model_proto)
        for expected, actual in (
            (PAD_ID, processor.pad_id()),
            (UNK_ID, processor.unk_id()),
            (BOS_ID, processor.bos_id()),
            (EOS_ID, processor.eos_id()),
        ):
            if expected != actual:
                raise ValueError(
                    "SentencePiece model has special ids pad/unk/bos/eos = "
                    f"{processor.pad_id()}/{processor.unk_id()}/{processor.bos_id()}/"
                    f"{processor.eos_id()}, expected 0/1/2/3"
                )
        self._processor = processor
        self._word_is_unknown: dict[str, bool] = {}

    @classmethod
    def build(
        cls,
        sentences: Iterable[list[str]],
        size: int,
        max_sentences: int = DEFAULT_MAX_SENTENCES,
    ) -> SubwordVocabulary:
        """Train a ``size``-piece BPE model on ``sentences`` (lists of words).

        A size the text cannot support (too small for its characters, or more pieces than it
        can make) is an :class:`InputError`.
        """

        def lines() -> Iterator[str]:
            for tokens in sentences:
                if tokens:
                    yield " ".join(tokens)

        model = io.BytesIO()
        sentencepiece.set_random_generator_seed(1)  # BPE uses none; pinned for sampling anyway
        try:
            sentencepiece.SentencePieceTrainer.train(
                sentence_iterator=lines(),
                model_writer=model,
                model_type="bpe",
                vocab_size=size,
                pad_id=PAD_ID,
                unk_id=UNK_ID,
                bos_id=BOS_ID,
                eos_id=EOS_ID,
                pad_piece=PAD_TOKEN,
                unk_piece=UNK_TOKEN,
                bos_piece=BOS_TOKEN,
                eos_piece=EOS_TOKEN,
                unk_surface=UNK_TOKEN,
                character_coverage=1.0,
                normalization_rule_name="identity",
                num_threads=1,
                input_sentence_size=max_sentences,
                shuffle_input_sentence=True,
                minloglevel=2,
            )
        except RuntimeError as exc:
            raise InputError(f"cannot train a subword vocabulary of {size} pieces: {exc}") from None
        vocabulary = cls(model.getvalue())
        logger.info("subword vocabulary: %d pieces (BPE)", len(vocabulary))
        return vocabulary

    def __len__(self) -> int:
        """Number of ids (pieces), specials included."""
        return self._processor.get_piece_size()

    @property
    def pieces(self) -> list[str]:
        """The pieces in id order (``▁`` marks the start of a word)."""
        return [self._processor.id_to_piece(i) for i in range(len(self))]

    def encode(self, tokens: list[str]) -> list[int]:
        """The piece ids of ``" ".join(tokens)`` (no BOS/EOS)."""
        return self._processor.encode(" ".join(tokens), out_type=int)

    def encode_batch(self, token_lists: Iterable[list[str]]) -> list[list[int]]:
        """:meth:`encode` of each list, in one SentencePiece batch call."""
        texts = [" ".join(tokens) for tokens in token_lists]
        if not texts:
            return []
        return self._processor.encode(texts, out_type=int)

    def decode(self, ids: Iterable[int]) -> list[str]:
        """The words of ``ids``; PAD/BOS/EOS are skipped, ``<unk>`` pieces read ``<unk>``."""
        kept = [int(i) for i in ids if int(i) not in _NOT_WORDS]
        if not kept:
            return []
        return self._processor.decode(kept).split()

    def count_unknown(self, tokens: Iterable[str]) -> int:
        """How many of ``tokens`` (words) contain an ``<unk>`` piece.

        Pieces never cross a space, so a word's pieces are those it has alone; the answer per
        word is cached (up to ``UNKNOWN_CACHE_SIZE`` words), which makes counting per phrase
        about as fast as for a word vocabulary.
        """
        cache = self._word_is_unknown
        if len(cache) >= self.UNKNOWN_CACHE_SIZE:
            cache.clear()
        count = 0
        for word in tokens:
            unknown = cache.get(word)
            if unknown is None:
                unknown = UNK_ID in self._processor.encode(word, out_type=int)
                cache[word] = unknown
            count += unknown
        return count

    def coverage(self, sentences: Iterable[list[str]]) -> float:
        """Fraction of the words of ``sentences`` with no ``<unk>`` piece (1.0 for no words)."""
        total = unknown = 0
        for tokens in sentences:
            total += len(tokens)
            unknown += self.count_unknown(tokens)
        return _known_fraction(total - unknown, total)

    def to_state(self) -> dict[str, Any]:
        """``{"kind": "subword", "model": base64 of the serialized SentencePiece model}``."""
        return {"kind": self.kind, "model": base64.b64encode(self.model_proto).decode("ascii")}

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> SubwordVocabulary:
        """The vocabulary :meth:`to_state` described."""
        if state.get("kind") != cls.kind or not isinstance(state.get("model"), str):
            raise ModelFileError(f"not a subword vocabulary (kind {state.get('kind')!r})")
        try:
            return cls(base64.b64decode(state["model"], validate=True))
        except (ValueError, RuntimeError, OSError) as exc:
            raise ModelFileError(f"corrupt subword vocabulary: {exc}") from None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, SubwordVocabulary) and self.model_proto == other.model_proto

    __hash__ = None  # type: ignore[assignment]

    def __getstate__(self) -> dict[str, Any]:
        return {"model_proto": self.model_proto}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["model_proto"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"SubwordVocabulary({len(self)} pieces)"


Vocabulary = WordVocabulary | SubwordVocabulary
_KINDS: dict[str, type[WordVocabulary] | type[SubwordVocabulary]] = {
    WordVocabulary.kind: WordVocabulary,
    SubwordVocabulary.kind: SubwordVocabulary,
}


def vocabulary_from_state(state: dict[str, Any]) -> Vocabulary:
    """The vocabulary of either kind that ``to_state`` described (dispatch on ``"kind"``)."""
    kind = state.get("kind")
    if kind not in _KINDS:
        raise ModelFileError(f"unknown vocabulary kind {kind!r} (expected 'word' or 'subword')")
    return _KINDS[kind].from_state(state)

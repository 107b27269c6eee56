"""Text handling: Moses-compatible tokenisation, vocabularies, corpora and batches.

* :mod:`~phrasescore.text.tokenize` -- :class:`TextNormalizer` (``tokenizer.perl`` /
  ``lowercase.perl``-compatible tokens);
* :mod:`~phrasescore.text.vocab` -- :class:`WordVocabulary` (top-K words, Cho et al. 2014) and
  :class:`SubwordVocabulary` (SentencePiece BPE), special ids PAD/UNK/BOS/EOS = 0/1/2/3;
* :mod:`~phrasescore.text.corpus` -- parallel text and distinct phrase pairs (Cho et al. 2014,
  §3.1), :class:`ParallelDataset`, :class:`TokenBudgetBatcher`, :class:`Batch`.
"""

from phrasescore.text.corpus import (
    Batch,
    CorpusStats,
    PairReader,
    ParallelDataset,
    TokenBudgetBatcher,
    collate,
    make_batch,
    read_parallel,
    read_phrase_pairs,
)
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import (
    BOS_ID,
    EOS_ID,
    PAD_ID,
    UNK_ID,
    SubwordVocabulary,
    Vocabulary,
    WordVocabulary,
    vocabulary_from_state,
)

__all__ = [
    "BOS_ID",
    "EOS_ID",
    "PAD_ID",
    "UNK_ID",
    "Batch",
    "CorpusStats",
    "PairReader",
    "ParallelDataset",
    "SubwordVocabulary",
    "TextNormalizer",
    "TokenBudgetBatcher",
    "Vocabulary",
    "WordVocabulary",
    "collate",
    "make_batch",
    "read_parallel",
    "read_phrase_pairs",
    "vocabulary_from_state",
]

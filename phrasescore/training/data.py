"""Where a training's pairs come from and what they become: the data files (or a phrase table),
the vocabularies built on them, the encoded training and validation sets, and the unigram
baseline a model must beat."""

from __future__ import annotations

import logging
import math
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from phrasescore.errors import InputError
from phrasescore.files import is_pipe
from phrasescore.model.config import ModelConfig, TrainConfig
from phrasescore.text.corpus import (
    ParallelDataset,
    TokenPair,
    read_parallel,
    read_phrase_pairs,
)
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import (
    EOS_ID,
    SubwordVocabulary,
    WordVocabulary,
    vocabulary_from_state,
)
from phrasescore.training.validation import perplexity

log = logging.getLogger(__name__)


@dataclass
class TrainingData:
    """Where the pairs come from: two parallel files, or the distinct pairs of a phrase table."""

    src_path: str | None = None
    tgt_path: str | None = None
    phrase_table: str | None = None
    inverse: bool = False
    """With ``phrase_table``: each pair reversed, (target phrase, source phrase)."""
    valid_src: str | None = None
    valid_tgt: str | None = None
    src_lang: str = "en"
    tgt_lang: str = "fr"
    tokenize: bool = False
    lowercase: bool = False

    def describe(self) -> dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    def files(self) -> list[tuple[str, str | None]]:
        """(role, path) of every data file, as the recipe names them (None: not given)."""
        if self.phrase_table:
            roles = [("--phrase-table", self.phrase_table)]
        else:
            roles = [("SOURCE", self.src_path), ("TARGET", self.tgt_path)]
        return roles + [("--valid SRC", self.valid_src), ("--valid TGT", self.valid_tgt)]

    def flags(self) -> dict[str, Any]:
        """The flags that say how the data is read, for the recipe."""
        return {
            "--src-lang": self.src_lang,
            "--tgt-lang": self.tgt_lang,
            "--tokenize": self.tokenize,
            "--lowercase": self.lowercase,
            "--inverse": self.inverse,
        }


def _pairs(data: TrainingData, src_text, tgt_text, max_length):
    if data.phrase_table:
        return read_phrase_pairs(
            data.phrase_table, src_text, tgt_text, max_length, inverse=data.inverse
        )
    return read_parallel(data.src_path, data.tgt_path, src_text, tgt_text, max_length)


def _pair_source(data: TrainingData, src_text, tgt_text, max_length):
    """A callable giving the training pairs, read anew each time from files; from a pipe
    (``<(zcat c.gz)``, a FIFO, stdin), which can be read only once, the pairs are read once
    into memory (the training set is held in memory anyway)."""
    paths = [data.phrase_table] if data.phrase_table else [data.src_path, data.tgt_path]
    if not any(is_pipe(path) for path in paths):
        return lambda: _pairs(data, src_text, tgt_text, max_length)
    pairs = list(_pairs(data, src_text, tgt_text, max_length))
    return lambda: iter(pairs)


def _build_vocab(sentences, tcfg: TrainConfig):
    if tcfg.subwords:
        return SubwordVocabulary.build(sentences, tcfg.subwords)
    return WordVocabulary.build(sentences, tcfg.vocab_size)


def _in_model_order(pairs: Iterable[TokenPair], mcfg: ModelConfig) -> Iterator[TokenPair]:
    """Each pair with its target words in the order the decoder predicts them
    (:meth:`~phrasescore.model.config.ModelConfig.target_order`)."""
    for src, tgt in pairs:
        yield src, mcfg.target_order(tgt)


def prepare_data(
    data: TrainingData, tcfg: TrainConfig, vocab_states=None, mcfg: ModelConfig | None = None
):
    """Vocabularies (built on the training text unless given) and encoded datasets, the targets
    in ``mcfg``'s order (right to left for ``reverse_target``)."""
    mcfg = mcfg or ModelConfig()
    src_text = TextNormalizer(data.src_lang, tokenize=data.tokenize, lowercase=data.lowercase)
    tgt_text = TextNormalizer(data.tgt_lang, tokenize=data.tokenize, lowercase=data.lowercase)
    pairs = _pair_source(data, src_text, tgt_text, tcfg.max_length)
    if vocab_states is None:
        log.info("building vocabularies")
        src_vocab = _build_vocab((s for s, _ in pairs()), tcfg)
        tgt_vocab = _build_vocab((t for _, t in pairs()), tcfg)
    else:
        src_vocab = vocabulary_from_state(vocab_states[0])
        tgt_vocab = vocabulary_from_state(vocab_states[1])
    log.info("vocabularies: source %d, target %d entries", len(src_vocab), len(tgt_vocab))
    train = ParallelDataset.from_pairs(_in_model_order(pairs(), mcfg), src_vocab, tgt_vocab)
    if len(train) == 0:
        raise InputError("no training pairs left after filtering (empty input or --max-length)")
    if data.valid_src and data.valid_tgt:
        valid = ParallelDataset.from_pairs(
            _in_model_order(
                read_parallel(data.valid_src, data.valid_tgt, src_text, tgt_text, None), mcfg
            ),
            src_vocab,
            tgt_vocab,
        )
    else:
        n_valid = min(tcfg.valid_max_pairs, max(1, int(len(train) * tcfg.valid_fraction)))
        train, valid = train.split_off(n_valid, tcfg.seed)
        log.info("held out %d training pairs for validation", len(valid))
    return src_text, tgt_text, src_vocab, tgt_vocab, train, valid


def unigram_perplexity(train: ParallelDataset, valid: ParallelDataset, vocab_size: int) -> float:
    """Perplexity of the validation targets (EOS included) under add-one unigram counts of the
    training targets: the baseline a model must beat."""
    counts = Counter()
    for i in range(len(train)):
        counts.update(train.tgt(i).tolist())
    counts[EOS_ID] += len(train)
    total = sum(counts.values()) + vocab_size
    nll, n = 0.0, 0
    for i in range(len(valid)):
        for tok in list(valid.tgt(i).tolist()) + [EOS_ID]:
            nll -= math.log((counts.get(tok, 0) + 1) / total)
            n += 1
    return perplexity(nll / max(n, 1))

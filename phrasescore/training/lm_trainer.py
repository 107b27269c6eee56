"""The trainer of the CSLM target language model (``phrasescore train-lm``).

The loop is the encoder-decoder's (:class:`phrasescore.training.trainer.Trainer`): the same
token-budget batches of sentences, optimiser, validation perplexity, early stopping,
``MODEL.checkpoint`` with exact ``--resume``, ``MODEL.log``, ``MODEL.curve.png`` and progress bar.
:class:`LMTrainer` overrides only what differs -- the data (one monolingual file; each sentence
is a "pair" with an empty source), the network (:class:`~phrasescore.model.cslm.FeedForwardLM`,
whose ``loss`` has the encoder-decoder's signature) and the model file
(:func:`~phrasescore.bundle.save_lm`).

Perplexity is per token over the words and the ``</s>`` of each sentence (``<s>`` is context,
never predicted), with words outside the vocabulary scored as ``<unk>``; ``tools/bench-lm`` compares
it with a count-based Kneser-Ney model on the same tokens and vocabulary.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from phrasescore.bundle import TrainedLM, read_lm_metadata, save_lm
from phrasescore.errors import InputError
from phrasescore.files.reading import iter_lines
from phrasescore.model.config import TrainConfig
from phrasescore.model.cslm import FeedForwardLM, LMConfig
from phrasescore.text.corpus import ParallelDataset
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import WordVocabulary, vocabulary_from_state
from phrasescore.training.data import TrainingData
from phrasescore.training.trainer import Trainer

log = logging.getLogger(__name__)


@dataclass
class LMData(TrainingData):
    """Where the sentences come from: ``tgt_path`` (training) and ``valid_tgt`` (validation)."""

    def describe(self) -> dict[str, Any]:
        return {
            "corpus": self.tgt_path,
            "valid": self.valid_tgt,
            "lang": self.tgt_lang,
            "tokenize": self.tokenize,
            "lowercase": self.lowercase,
        }

    def files(self) -> list[tuple[str, str | None]]:
        return [("CORPUS", self.tgt_path), ("--valid", self.valid_tgt)]

    def flags(self) -> dict[str, Any]:
        return {"--lang": self.tgt_lang, "--tokenize": self.tokenize, "--lowercase": self.lowercase}


def read_sentences(path: str, text: TextNormalizer, max_length: int | None) -> Iterator[list[str]]:
    """The token lists of the non-empty lines of ``path`` with at most ``max_length`` tokens."""
    skipped = 0
    for line in iter_lines(path):
        tokens = text(line)
        if not tokens:
            continue
        if max_length is not None and len(tokens) > max_length:
            skipped += 1
            continue
        yield tokens
    if skipped:
        log.info("%s: skipped %d sentences longer than %d tokens", path, skipped, max_length)


def sentence_dataset(sentences, vocab) -> ParallelDataset:
    """Sentences as a dataset of (empty source, sentence) pairs, the trainer's format."""
    return ParallelDataset.from_pairs((([], tokens) for tokens in sentences), vocab, vocab)


class LMTrainer(Trainer):
    """:class:`Trainer` for a CSLM (see the module docstring)."""

    config_class = LMConfig

    def prepare(self, tcfg: TrainConfig, vocab_states):
        data = self.data
        text = TextNormalizer(data.tgt_lang, tokenize=data.tokenize, lowercase=data.lowercase)
        if vocab_states is None:
            log.info("building the vocabulary")
            vocab = WordVocabulary.build(
                read_sentences(data.tgt_path, text, tcfg.max_length), tcfg.vocab_size
            )
        else:
            vocab = vocabulary_from_state(vocab_states[1])
        log.info("vocabulary: %d entries", len(vocab))
        train = sentence_dataset(read_sentences(data.tgt_path, text, tcfg.max_length), vocab)
        if len(train) == 0:
            raise InputError("no training sentences (empty input or --max-length)", data.tgt_path)
        if data.valid_tgt:
            valid = sentence_dataset(read_sentences(data.valid_tgt, text, None), vocab)
            if len(valid) == 0:
                raise InputError("no validation sentences", data.valid_tgt)
        else:
            n_valid = min(tcfg.valid_max_pairs, max(1, int(len(train) * tcfg.valid_fraction)))
            train, valid = train.split_off(n_valid, tcfg.seed)
            log.info("held out %d training sentences for validation", len(valid))
        return text, text, vocab, vocab, train, valid

    def new_network(self, src_vocab, tgt_vocab) -> FeedForwardLM:
        self.mcfg.vocab_size = len(tgt_vocab)
        return FeedForwardLM(self.mcfg)

    def write_model(self, network, texts, vocabs, info: dict[str, Any]) -> str:
        return save_lm(self.best_path, TrainedLM(network, vocabs[1], texts[1], info))

    def read_signature(self) -> str:
        return read_lm_metadata(self.model_path)["signature"]

"""Scoring token sequences with the CSLM (Schwenk 2007), and the two features it gives Moses.

:class:`LMScorer` computes log p of many sequences at once. A feed-forward n-gram model sees each
position independently, so the n-grams of all sequences of a block are pooled: each *distinct*
context is run through the network once (phrases of a table share most of their contexts), the
softmax is computed over row chunks, and the log-probabilities are summed back per sequence.

Two modes (see :mod:`phrasescore.model.cslm` for why):

``sentence``  log p(w_1 .. w_n </s> | <s>): the context before the first word is ``<s>``, and
              ``</s>`` is predicted at the end. Used for n-best hypotheses (``CSLM0=``) and for
              perplexity.
``phrase``    log p(w_1 .. w_n) with sentence-boundary context off: the context before the first
              word is NULL (unknown preceding words), and no ``</s>``. Used for the phrase-table
              column: a target phrase is a piece of a sentence, not a sentence.

Words outside the vocabulary are scored as ``<unk>`` (the usual closed-vocabulary convention);
``unknown`` counts them.

Features:

* ``phrasescore nbest --lm`` (:mod:`phrasescore.jobs.nbest.nbest`) adds ``CSLM0= log p(hypothesis)``
  (sentence mode) to every line of a Moses n-best list, every other byte unchanged
  (docs/moses.md "The Moses files phrasescore reads");
* ``phrasescore rescore --lm`` (``LMPhraseColumn`` of the rescore job) gives p(target phrase) =
  exp(max(log p, -100)) (phrase mode) as a phrase-table column: a probability, since Moses takes
  ln of every column (docs/moses.md "The Moses files phrasescore reads"). This module scores
  ids and strings; it knows no Moses file.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from phrasescore.bundle import TrainedLM
from phrasescore.text.vocab import BOS_ID, EOS_ID, PAD_ID

log = logging.getLogger(__name__)

DEFAULT_LM_FEATURE = "CSLM0"


@dataclass
class ScoredSequences:
    """LM scores of a block of sequences, in input order."""

    logprob: np.ndarray  # float64 [N]
    n_tokens: np.ndarray  # int64 [N]: tokens predicted (</s> included in sentence mode)
    unknown: np.ndarray  # int64 [N]: words the vocabulary does not know


class LMScorer:
    """Scores token sequences with one resident CSLM on one device."""

    def __init__(self, lm: TrainedLM, device: str | torch.device = "cpu", chunk_rows: int = 1024):
        self.lm = lm
        self.device = torch.device(device)
        self.chunk_rows = chunk_rows
        self.network = lm.network.to(self.device).eval()
        self.context_size = lm.config.context_size

    # ------------------------------------------------------------------ text level
    def score_sentences(self, texts: Sequence[str]) -> ScoredSequences:
        """log p(text </s> | <s>) of already-tokenised sentences (n-best hypotheses)."""
        return self.score_tokens([self.lm.text.normalize_tokenized(t) for t in texts], True)

    def sentence_ids(self, texts: Sequence[str]) -> list[list[int]]:
        """The ids of already-tokenised sentences, what :meth:`score_ids` takes (the text half
        of :meth:`score_sentences`)."""
        return self.lm.vocab.encode_batch([self.lm.text.normalize_tokenized(t) for t in texts])

    def score_phrases(self, texts: Sequence[str]) -> ScoredSequences:
        """log p(text) of already-tokenised phrases, sentence-boundary context off."""
        return self.score_tokens([self.lm.text.normalize_tokenized(t) for t in texts], False)

    def score_tokens(self, token_lists: Sequence[list[str]], sentence: bool) -> ScoredSequences:
        vocab = self.lm.vocab
        ids = vocab.encode_batch(list(token_lists))
        unknown = np.array([vocab.count_unknown(t) for t in token_lists], dtype=np.int64)
        logprob, n_tokens = self.score_ids(ids, sentence)
        return ScoredSequences(logprob, n_tokens, unknown)

    # ------------------------------------------------------------------ id level
    def ngrams(
        self, id_lists: Sequence[Sequence[int]], sentence: bool
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(contexts [M, n-1], predicted words [M], sequence of each n-gram [M])."""
        n_ctx = self.context_size
        fill = BOS_ID if sentence else PAD_ID
        histories: list[np.ndarray] = []
        targets: list[np.ndarray] = []
        for ids in id_lists:
            body = np.asarray(ids, dtype=np.int64)
            histories.append(np.concatenate([np.full(n_ctx, fill, dtype=np.int64), body]))
            targets.append(np.append(body, EOS_ID) if sentence else body)
        lengths = np.fromiter((len(t) for t in targets), dtype=np.int64, count=len(targets))
        if lengths.sum() == 0:
            empty = np.zeros(0, dtype=np.int64)
            return np.zeros((0, n_ctx), dtype=np.int64), empty, empty
        flat = np.concatenate(histories)
        starts_of_history = np.concatenate([[0], np.cumsum([len(h) for h in histories])[:-1]])
        sequence = np.repeat(np.arange(len(targets)), lengths)
        position = np.arange(len(sequence)) - np.repeat(np.cumsum(lengths) - lengths, lengths)
        window_start = starts_of_history[sequence] + position
        # the context of target t of a sequence is history[t : t + n_ctx] (its last entry is the
        # word before t, or the fill before the first word); the last one, of </s> in sentence
        # mode, ends with the last word, so every window lies inside its own history
        windows = np.lib.stride_tricks.sliding_window_view(flat, n_ctx)
        return windows[window_start], np.concatenate(targets), sequence

    @torch.inference_mode()
    def token_logprobs(self, contexts: np.ndarray, words: np.ndarray) -> np.ndarray:
        """log p(word | context) for each row, each distinct context run once."""
        if len(words) == 0:
            return np.zeros(0, dtype=np.float64)
        distinct, inverse = np.unique(contexts, axis=0, return_inverse=True)
        inverse = inverse.reshape(-1)
        order = np.argsort(inverse, kind="stable")
        sorted_inverse = inverse[order]
        out = np.empty(len(words), dtype=np.float64)
        for begin in range(0, len(distinct), self.chunk_rows):
            end = min(begin + self.chunk_rows, len(distinct))
            lo, hi = np.searchsorted(sorted_inverse, [begin, end])
            rows = order[lo:hi]
            ctx = torch.from_numpy(distinct[begin:end]).to(self.device)
            logp = torch.log_softmax(self.network(ctx).float(), dim=-1)
            local = torch.from_numpy(inverse[rows] - begin).to(self.device)
            word = torch.from_numpy(words[rows]).to(self.device)
            out[rows] = logp[local, word].double().cpu().numpy()
        return out

    def score_ids(
        self, id_lists: Sequence[Sequence[int]], sentence: bool
    ) -> tuple[np.ndarray, np.ndarray]:
        """(log p [N] float64, tokens predicted [N]) of id lists (no BOS/EOS in them)."""
        contexts, words, sequence = self.ngrams(id_lists, sentence)
        values = self.token_logprobs(contexts, words)
        logprob = np.bincount(sequence, weights=values, minlength=len(id_lists))
        n_tokens = np.bincount(sequence, minlength=len(id_lists)).astype(np.int64)
        return logprob.astype(np.float64), n_tokens


def perplexity(scorer: LMScorer, sentences: Sequence[list[str]]) -> float:
    """Per-token perplexity of tokenised sentences (</s> counted, <s> not)."""
    scored = scorer.score_tokens(sentences, sentence=True)
    return float(np.exp(-scored.logprob.sum() / max(int(scored.n_tokens.sum()), 1)))

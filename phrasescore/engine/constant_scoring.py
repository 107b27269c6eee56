"""A scorer that costs nothing: the same log p for every pair, the network never run.

``tools/bench-io`` runs ``rescore``'s whole table path (reading, decompression, parsing, token
ids, formatting, compression, writing, resume state) with it, so that what it measures is the
path and not the model (docs/benchmarks.md "Table I/O"). It implements the scorer protocol
(:class:`~phrasescore.engine.protocol.IdScorer`) with the engine's text half
(:class:`~phrasescore.engine.scoring.PhraseEncoder`): the pairs are tokenised and looked up in
the model's vocabularies as for scoring, the unknown-word and token counts are the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import IdPairs
from phrasescore.engine.scoring import EXACT, EncodedPairs, PhraseEncoder, ScoredPairs


class ConstantScorer:
    """An :class:`~phrasescore.engine.protocol.IdScorer` whose scores are all ``logprob``."""

    def __init__(self, model: TrainedModel, logprob: float = -1.0, include_eos: bool = True):
        if not logprob <= 0.0:
            raise ValueError(f"a log-probability must be <= 0, got {logprob!r}")
        self.model = model
        self.logprob = float(logprob)
        self.include_eos = include_eos
        self.scoring = EXACT
        self.self_normalized = False
        self.clamped = 0
        self.encoder = PhraseEncoder(model, include_eos)

    def warm_up(self) -> None:
        """Nothing to compile."""

    def encode_phrases(
        self, sources: Sequence[str], targets: Sequence[str], counts: bool = True
    ) -> EncodedPairs:
        return self.encoder.encode_phrases(sources, targets, counts)

    def score_phrases(
        self, sources: Sequence[str], targets: Sequence[str], per_token: bool = False
    ) -> ScoredPairs:
        pairs = self.encode_phrases(sources, targets)
        logprob, _ = self.score_ids(pairs.src_ids, pairs.tgt_ids, per_token)
        return ScoredPairs(logprob, pairs.n_tokens, pairs.src_unknown, pairs.tgt_unknown)

    def score_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        per_token: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        """:meth:`score_arrays` of the lists laid end to end (as :class:`~phrasescore.engine.scoring.BlockScorer` does)."""
        return self.score_arrays(IdPairs.from_lists(src_ids, tgt_ids), per_token)

    def score_arrays(
        self, pairs: IdPairs, per_token: bool = False
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        if per_token:
            raise ValueError("a ConstantScorer has no per-token values")
        return np.full(len(pairs), self.logprob), None

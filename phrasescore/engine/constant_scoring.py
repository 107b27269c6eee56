"""A scorer that costs nothing: the same log p for every pair, the network never run.

``tools/bench-io`` runs ``rescore``'s whole table path (reading, decompression, parsing, token
ids, formatting, compression, writing, resume state) with it, so that what it measures is the
path and not the model (docs/benchmarks.md "Table I/O"). It is a real :class:`PairScorer` in every other
respect: the pairs are tokenised and looked up in the model's vocabularies as for scoring
(:meth:`~PairScorer.encode_phrases`), the unknown-word and token counts are the real ones.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from phrasescore.bundle import TrainedModel
from phrasescore.engine.scoring import EXACT, PairScorer


class ConstantScorer(PairScorer):
    """:class:`PairScorer` whose :meth:`score_ids` gives ``logprob`` for every pair."""

    def __init__(self, model: TrainedModel, logprob: float = -1.0, include_eos: bool = True):
        if not logprob <= 0.0:
            raise ValueError(f"a log-probability must be <= 0, got {logprob!r}")
        self.model = model
        self.logprob = float(logprob)
        self.include_eos = include_eos
        self.scoring = EXACT
        self.self_normalized = False
        self.clamped = 0

    def warm_up(self) -> None:
        """Nothing to compile."""

    def score_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        per_token: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]:
        if len(src_ids) != len(tgt_ids):
            raise ValueError("src_ids and tgt_ids differ in length")
        if per_token:
            raise ValueError("a ConstantScorer has no per-token values")
        return np.full(len(src_ids), self.logprob), None

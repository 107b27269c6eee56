"""The one scorer protocol of the engine and the one factory that builds a scorer.

Every job that scores pairs (``rescore``, ``nbest`` with any architecture, ``compare``, the
analyses, the benchmarks) asks :func:`build_scorer` for a scorer of a model on a device in a
dtype, and uses it through :class:`Scorer` alone (:class:`IdScorer` where it hands ids across
processes, as ``rescore --io-workers`` does). A new engine (a GPU engine, say) is registered in
:data:`ENGINES` for its device type and every job gets it; nothing else changes.

* :class:`~phrasescore.engine.scoring.CpuScorer`: the CPU's engine, one resident model.
* :class:`~phrasescore.engine.graph_scoring.CudaGraphScorer`: the GPU engine (fixed-shape
  batches captured in CUDA graphs, no host sync inside a block); on a device that is neither
  CPU nor CUDA, the same fixed-shape plan without graphs.

Both are :class:`~phrasescore.engine.scoring.BlockScorer`'s one plan with their own batch
kernel.
* :class:`~phrasescore.engine.scoring.EnsembleScorer`: several models averaged (phrase level).
* :class:`~phrasescore.engine.constant_scoring.ConstantScorer`: the same log p for every pair,
  no network (``tools/bench-io``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from phrasescore.bundle import TrainedModel
from phrasescore.engine.batching import IdPairs
from phrasescore.engine.graph_scoring import CudaGraphScorer
from phrasescore.engine.scoring import (
    CpuScorer,
    EncodedPairs,
    EnsembleScorer,
    ScoredPairs,
)


@runtime_checkable
class Scorer(Protocol):
    """log p(target | source) of phrase pairs: what every scoring job uses."""

    model: TrainedModel
    include_eos: bool
    clamped: int

    def warm_up(self) -> None:
        """Build compiled kernels now (before worker processes are forked)."""

    def score_phrases(
        self, sources: Sequence[str], targets: Sequence[str], per_token: bool = False
    ) -> ScoredPairs:
        """Scores of already-tokenised phrase pairs, in input order."""


@runtime_checkable
class IdScorer(Scorer, Protocol):
    """A :class:`Scorer` whose text half (ids) and network half (scores) can run in different
    processes: ``encode_phrases`` where the text is, ``score_arrays`` where the model is."""

    scoring: str
    self_normalized: bool

    def encode_phrases(
        self, sources: Sequence[str], targets: Sequence[str], counts: bool = True
    ) -> EncodedPairs: ...

    def score_ids(
        self,
        src_ids: Sequence[Sequence[int]],
        tgt_ids: Sequence[Sequence[int]],
        per_token: bool = False,
    ) -> tuple[np.ndarray, list[np.ndarray] | None]: ...

    def score_arrays(
        self, pairs: IdPairs, per_token: bool = False
    ) -> tuple[np.ndarray, list[np.ndarray] | None]: ...


ENGINES: dict[str, Callable[..., IdScorer]] = {"cpu": CpuScorer, "cuda": CudaGraphScorer}
"""The scorer class per device type (``torch.device.type``); other types (e.g. ``mps``) take
:class:`CudaGraphScorer`'s fixed-shape plan, which captures nothing off CUDA."""


def build_scorer(model: TrainedModel, device="cpu", dtype: str = "float32", **options) -> IdScorer:
    """The scorer of ``model`` on ``device`` in ``dtype`` (the engine registered for the
    device's type in :data:`ENGINES`); ``options`` are the engine's own, passed as they are
    (:class:`CpuScorer`'s: ``batch_tokens``, ``chunk_rows``, ``include_eos``, ``scoring``,
    ``model_path``, ``buckets``: the batch policy, default the engine's; :class:`CudaGraphScorer`
    adds ``graphs`` and ``batch_pairs``)."""
    return engine_for(device)(model, device=device, dtype=dtype, **options)


def engine_for(device) -> Callable[..., IdScorer]:
    """The engine class of ``device``'s type (:data:`ENGINES`; the fixed-shape plan elsewhere)."""
    import torch

    return ENGINES.get(torch.device(device).type, CudaGraphScorer)


def build_ensemble(scorers: Sequence[IdScorer]) -> Scorer:
    """One scorer of several (:class:`EnsembleScorer`), or the one given alone."""
    return scorers[0] if len(scorers) == 1 else EnsembleScorer(scorers)

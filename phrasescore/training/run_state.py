"""The state of a run between steps: its resumable :class:`Position` (saved in every checkpoint)
and the rest (:class:`RunState`: network, optimiser, data, the window of training loss)."""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from phrasescore.text.corpus import ParallelDataset, TokenBudgetBatcher


@dataclass
class Position:
    """Where a run is: the resumable part of its state between steps.

    Saved in every checkpoint as a dict (:meth:`to_dict`, read back by :meth:`from_dict`, where
    a field that an older checkpoint lacks takes its default), and under torchrun taken by every
    rank from rank 0 after each validation.
    """

    epoch: int = 0
    """Epochs done."""
    batch: int = 0
    """Steps done in the current epoch."""
    step: int = 0
    """Steps done in all (the ``max_steps`` budget)."""
    best: float = math.inf
    """The lowest validation perplexity so far, that of the model saved."""
    bad: int = 0
    """Scheduled validations since the last new best (early stopping's count)."""
    history: list[dict[str, Any]] = field(default_factory=list)
    """One entry per validation: step, train_ppl, valid_ppl, elapsed (and valid_abs_log_z)."""
    schedule_best: float = math.inf
    """The lowest *scheduled* validation perplexity (:meth:`~phrasescore.training.validation.Validating._count_plateau`)."""
    elapsed: float = 0.0
    """Seconds the run has taken, over all its resumes (the ``max_minutes`` budget)."""
    tokens: int = 0
    """Target tokens trained on (this rank)."""
    valid_seconds: float = 0.0
    """Seconds spent validating, left out of the training rate."""
    lr_scale: float | None = None
    """The plateau factor of the learning rate (``lr_plateau_factor`` once per scheduled
    validation without a new best); None before the first."""

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's form: every field (``lr_scale`` only once it is set)."""
        saved = asdict(self)
        if self.lr_scale is None:
            del saved["lr_scale"]
        return saved

    @classmethod
    def from_dict(cls, saved: dict[str, Any]) -> Position:
        """The position of a checkpoint (:meth:`to_dict`, or an older checkpoint's dict)."""
        position = cls()
        position.update(saved)
        return position

    def update(self, saved: dict[str, Any]) -> None:
        """The fields that ``saved`` (a :meth:`to_dict`) holds set from it; keys that are no
        field are ignored."""
        for name in self.__dataclass_fields__:
            if name in saved:
                setattr(self, name, saved[name])


@dataclass
class RunState:
    """The state of one run between steps (the resumable part is ``position``, a
    :class:`Position`)."""

    loss: Any  # network.loss_terms, or its DistributedDataParallel wrapper under torchrun
    network: torch.nn.Module
    params: list
    """The network's parameters, listed once (each step clips their gradients)."""
    optimizer: torch.optim.Optimizer
    train: ParallelDataset
    valid: ParallelDataset
    batcher: TokenBudgetBatcher
    texts: tuple
    vocabs: tuple
    vocab_states: list
    unigram: float
    position: Position
    started: float
    tick: float
    window_nll: float = 0.0
    """The summed training NLL since the last validation, of the steps read already
    (:func:`window_nll` adds the others)."""
    pending_nll: list = field(default_factory=list)
    """Each later step's summed NLL, a tensor still on the device: a step does not wait for its
    loss (on a GPU the host launches the next step while this one runs)."""
    window_tokens: int = 0
    tokens_since: int = 0
    current_lr: float | None = None
    signature: str = ""
    captured_step: Any = None
    """The step's forward and backward in CUDA graphs (``--graphs``, a
    :class:`~phrasescore.training.captured_step.CapturedTrainingStep`), or None: eager."""
    prefetched: tuple | None = None
    """(indices, batch on the device) of the next step, made ahead (:meth:`~phrasescore.training.loop.TrainingLoop._prefetch`)."""


def window_nll(run: RunState) -> float:
    """``run.window_nll`` with the pending steps' NLLs added in their order: one wait for the
    device here instead of one per step, the same float as adding each step's value as it came
    (float32 values widened exactly, summed in float64 one by one)."""
    if run.pending_nll:
        for value in torch.stack(run.pending_nll).double().tolist():
            run.window_nll += value
        run.pending_nll.clear()
    return run.window_nll

"""The training step's forward and backward in one CUDA graph per batch shape (``train --graphs``,
with ``--bucket``): one launch a step where the written recurrences launch thousands of small
kernels, each costing the host more than the GPU (docs/benchmarks.md, "On an H200").

A step is the loop's (:meth:`~phrasescore.training.loop.TrainingLoop._step`) in a form whose
shapes and kernels do not depend on the batch's values, as a graph replays them:

1. the loss over every position of the fixed-shape batch (``--bucket`` pads widths and rows),
   each weighted by w_t = 1 at a real target token and 0 at padding: Σ_t w_t (-log p(y_t | y_<t,
   x)), the summed NLL of Cho et al. 2014 eq. 3 over the real tokens (:func:`~phrasescore.model.
   output_layer.token_nll` with row weights), where the eager step gathers the real positions;
2. divided by the batch's target tokens Σ_t w_t (or its pairs with ``loss_per_sentence``),
   counted on the device;
3. the gradients of all the parameters (``torch.autograd.grad``) copied into ``.grad``
   tensors made once before any capture (fixed addresses the optimiser reads), then clipped
   (:func:`~phrasescore.training.loop.clip_gradients`, Pascanu et al. 2013: no host wait);
4. the optimiser's update after the replay, eagerly (Adam's fused kernel: one launch).

Dropout draws the same masks as the eager step: the capture's warm-up restores the CUDA
generator it drew from, and a replay advances the generator as the eager kernels do, so
``--resume`` continues exactly. The values equal the eager step's up to the order of float
sums (tests/test_captured_step.py). Elsewhere than CUDA, or after a failed capture (logged;
:attr:`CapturedTrainingStep.failure`), the same function runs uncaptured.
"""

from __future__ import annotations

import torch

from phrasescore.cuda_graphs import CapturedShapes
from phrasescore.special_ids import PAD_ID
from phrasescore.text.corpus import Batch
from phrasescore.training.loop import amp_loss, clip_gradients


class CapturedTrainingStep:
    """Forward, backward and clipping of a batch (module docstring), captured per batch shape
    on CUDA (:class:`~phrasescore.cuda_graphs.CapturedShapes`, ``keep_rng``).

    ``network``: an :class:`~phrasescore.model.base.EncoderDecoder` whose ``loss_terms`` takes
    position weights; ``amp``: bf16 autocast as the eager step
    (:func:`~phrasescore.training.loop.amp_loss`); ``clip_norm``: 0 for none; ``per_sentence``: the mean over
    pairs instead of target tokens."""

    def __init__(
        self,
        network: torch.nn.Module,
        device: torch.device,
        amp: bool,
        clip_norm: float,
        per_sentence: bool = False,
        enabled: bool = True,
    ):
        self.network = network
        self.device = device
        self.amp = amp
        self.clip_norm = clip_norm
        self.per_sentence = per_sentence
        self.params = [p for p in network.parameters() if p.requires_grad]
        for p in self.params:  # the fixed addresses the graphs write and the optimiser reads
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        self.captured = CapturedShapes(device, enabled, keep_rng=True)

    @property
    def failure(self) -> str | None:
        """Why capture was switched off (the steps then run uncaptured), None otherwise."""
        return self.captured.failure

    def __call__(self, batch: Batch) -> torch.Tensor:
        """The gradients of ``batch`` (on the device) in the parameters' ``.grad``, clipped;
        returns the batch's summed NLL (a device scalar, no wait)."""
        inputs = (batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out)
        key = ("train", *((tuple(x.shape), x.dtype) for x in inputs))
        (nll,) = self.captured.run(key, self._gradients, inputs)
        return nll

    def _gradients(
        self, src: torch.Tensor, src_lengths: torch.Tensor, tgt_in: torch.Tensor,
        tgt_out: torch.Tensor,
    ) -> tuple[torch.Tensor]:  # fmt: skip
        """The captured work (module docstring, 1-3): nothing here reads a value back."""
        weights = (tgt_out != PAD_ID).float()
        inputs = src, src_lengths, tgt_in, tgt_out
        terms = amp_loss(
            self.network.loss_terms, inputs, weights, self.device, self.amp, cache=False
        )
        if self.per_sentence:
            denominator = (weights.sum(1) > 0).sum()
        else:
            denominator = weights.sum()
        grads = torch.autograd.grad(terms.objective / denominator, self.params, allow_unused=True)
        for param, grad in zip(self.params, grads, strict=True):
            if grad is None:  # a parameter this batch does not reach
                param.grad.zero_()
            else:
                param.grad.copy_(grad)
        if self.clip_norm:
            clip_gradients(self.params, self.clip_norm)
        return (terms.nll,)

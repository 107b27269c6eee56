"""The update: the optimiser, one step's loss, gradient and weights, the learning-rate schedule,
the batches of an epoch (token budget, ranks, ``--bucket``, the next one prefetched on a GPU)
and the budgets that end a run.

A step minimises the summed token NLL (plus the self-normalisation penalty) divided by the
batch's target tokens (Cho et al. 2014, eq. 3), or by its pairs with ``loss_per_sentence``.
"""

from __future__ import annotations

import logging
import time

import torch

from phrasescore.errors import InputError
from phrasescore.model.base import bf16_autocast
from phrasescore.model.config import TrainConfig
from phrasescore.runners import distributed
from phrasescore.text.corpus import Batch, collate
from phrasescore.text.vocab import BOS_ID, EOS_ID
from phrasescore.training.run_state import Position, RunState, window_nll

log = logging.getLogger(__name__)


def make_optimizer(network: torch.nn.Module, tcfg: TrainConfig) -> torch.optim.Optimizer:
    """The optimiser of ``tcfg``, each update one pass over all the parameters rather than a
    loop of small operations per parameter: Adam's fused kernel (CPU and CUDA), Adadelta
    (Zeiler 2012, Algorithm 1) and SGD as foreach operations (one call per operation for all the
    parameters: the arithmetic of the loop, to the bit; docs/benchmarks.md "The training
    step's host time")."""
    params = list(network.parameters())
    if tcfg.optimizer == "adadelta":
        return torch.optim.Adadelta(
            params,
            lr=tcfg.learning_rate,
            rho=tcfg.adadelta_rho,
            eps=tcfg.adadelta_eps,
            foreach=True,
        )
    if tcfg.optimizer == "adam":
        try:
            return torch.optim.Adam(params, lr=tcfg.learning_rate, fused=True)
        except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/version
            return torch.optim.Adam(params, lr=tcfg.learning_rate, foreach=True)
    if tcfg.optimizer == "sgd":
        return torch.optim.SGD(params, lr=tcfg.learning_rate, foreach=True)
    raise InputError(f"unknown optimiser {tcfg.optimizer!r} (adam, adadelta or sgd)")


def clip_gradients(params: list[torch.Tensor], max_norm: float) -> None:
    """Scale the gradients of ``params`` so that their global L2 norm is at most ``max_norm``:
    g <- g min(1, max_norm / (||g||_2 + 1e-6)) (Pascanu et al. 2013, Algorithm 1, as
    ``torch.nn.utils.clip_grad_norm_``). The norms and the scaling are each one foreach
    operation over all the gradients, and the factor stays a tensor: the host never waits for
    the norm (on a GPU the step goes on being launched)."""
    foreach = True if params and params[0].device.type in ("cpu", "cuda") else None
    torch.nn.utils.clip_grad_norm_(params, max_norm, foreach=foreach)


def batch_loss(loss, batch, mask: torch.Tensor, device: torch.device, amp: bool):
    """``loss`` (``network.loss_terms`` or its DistributedDataParallel wrapper) of a collated
    batch in ``--amp``'s precision (:func:`amp_loss`)."""
    inputs = batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out
    return amp_loss(loss, inputs, mask, device, amp)


def amp_loss(loss, inputs, mask: torch.Tensor, device: torch.device, amp: bool, cache=True):
    """``loss(src, src_lengths, tgt_in, tgt_out, mask)`` of ``inputs`` in ``--amp``'s precision:
    bf16 autocast of the whole network on a GPU; on the CPU of the output layer alone
    (``bf16_output``), where bf16 matrix products are fast and bf16 elementwise recurrences are
    not. ``cache`` False: autocast keeps no bf16 copies of the weights (a CUDA graph capture,
    :func:`~phrasescore.model.base.bf16_autocast`)."""
    whole = amp and device.type != "cpu"
    with bf16_autocast(device, whole, cache=cache):
        return loss(*inputs, mask, bf16_output=amp and not whole)


def bucketed(batch: Batch, multiple: int) -> Batch:
    """``batch`` padded so that its source and target widths and its row count are multiples of
    ``multiple`` (``train --bucket``): the shapes of a run repeat, so a compiled step
    (``--compile``) or a captured CUDA graph is reused instead of made again. The added rows
    are one-token sources (EOS) with no target token; the added positions are padding. Neither
    enters the loss (its mask is ``tgt_out != PAD``), the annotations or the attention (masked
    by the source lengths): the loss is the unpadded batch's, up to the order of float sums."""
    if multiple <= 1:
        return batch
    rows, src_w = batch.src.shape
    tgt_w = batch.tgt_in.shape[1]

    def up(n: int) -> int:
        return -(-n // multiple) * multiple

    more_rows = up(rows) - rows

    def grow(t: torch.Tensor, width: int, fill_first: int | None = None) -> torch.Tensor:
        out = t.new_zeros((rows + more_rows, width))
        out[:rows, : t.shape[1]] = t
        if fill_first is not None and more_rows:
            out[rows:, 0] = fill_first
        return out

    extra_lengths = torch.ones(more_rows, dtype=batch.src_lengths.dtype)
    return Batch(
        src=grow(batch.src, up(src_w), EOS_ID),
        src_lengths=torch.cat([batch.src_lengths, extra_lengths.to(batch.src_lengths.device)]),
        tgt_in=grow(batch.tgt_in, up(tgt_w), BOS_ID),
        tgt_out=grow(batch.tgt_out, up(tgt_w)),
        tgt_lengths=torch.cat(
            [batch.tgt_lengths, torch.zeros_like(extra_lengths).to(batch.tgt_lengths.device)]
        ),
        n_tgt_tokens=batch.n_tgt_tokens,
    )


def learning_rate_at(tcfg: TrainConfig, epoch_position: float) -> float:
    """The learning rate at ``epoch_position`` (epochs done, fractional) of the schedule.

    Constant unless ``lr_halve_after_epochs`` is set; then (Sutskever et al. 2014, §3.4: "after
    5 epochs, we begun halving the learning rate every half epoch") it is halved once when
    ``lr_halve_after_epochs`` epochs are done and again every ``lr_halve_every_epochs`` epochs
    after that: 0.7 for epochs [0, 5), 0.35 for [5, 5.5), 0.175 for [5.5, 6), ... A function of
    the position only, so a resumed run follows it exactly.
    """
    after = tcfg.lr_halve_after_epochs
    if after is None or epoch_position < after:
        return tcfg.learning_rate
    halvings = 1 + int((epoch_position - after) / tcfg.lr_halve_every_epochs + 1e-9)
    return tcfg.learning_rate * 0.5**halvings


class TrainingLoop:
    """The steps of a run, a part of :class:`~phrasescore.training.trainer.Trainer` (which
    provides ``tcfg``, ``launch``, ``world``, ``device``, ``amp``, validation and checkpoints)."""

    def _steps_per_epoch(self, batcher, epoch: int) -> int:
        return -(-len(batcher.batches(epoch)) // self.world)

    def _rank_batch(self, batches, step: int):
        """This rank's batch of the epoch's ``step``-th step and its weight (0: a repeat that
        only keeps the ranks in step; see the module docstring)."""
        if self.launch is None:
            return batches[step], 1.0
        index = step * self.world + self.launch.rank
        if index < len(batches):
            return batches[index], 1.0
        return batches[step * self.world], 0.0

    def _train(self, run: RunState, bar) -> str:
        """Steps until a budget or early stopping ends the run; returns why it stopped."""
        position, tcfg = run.position, self.tcfg
        while position.epoch < tcfg.epochs:
            batches = run.batcher.batches(position.epoch)
            steps = self._steps_per_epoch(run.batcher, position.epoch)
            while position.batch < steps:
                epoch_position = position.epoch + position.batch / steps
                if epoch_position >= tcfg.epochs:  # a fractional number of epochs
                    return "epochs"
                spent = self._budget_spent(position)  # a resumed run that has reached it
                if spent:
                    return spent
                self._schedule_learning_rate(run, epoch_position)
                upcoming = None
                if position.batch + 1 < steps:
                    upcoming = self._rank_batch(batches, position.batch + 1)[0]
                self._step(run, *self._rank_batch(batches, position.batch), bar, upcoming)
                stopped = self._after_step(run)
                if stopped:
                    return stopped
            position.epoch += 1
            position.batch = 0
        return "epochs"

    def _schedule_learning_rate(self, run: RunState, epoch_position: float) -> None:
        """The learning rate of this step: the epoch schedule (:func:`learning_rate_at`) times
        the plateau factor of every validation without a new best (``lr_scale``, kept in the
        position so that ``--resume`` continues with it)."""
        scale = run.position.lr_scale
        if self.tcfg.lr_halve_after_epochs is None and scale is None:
            return
        lr = learning_rate_at(self.tcfg, epoch_position) * (1.0 if scale is None else scale)
        if lr != run.current_lr:
            for group in run.optimizer.param_groups:
                group["lr"] = lr
            if run.current_lr is not None:
                log.info("epoch %.2f: learning rate %g", epoch_position, lr)
            run.current_lr = lr

    def _batch(self, run: RunState, idx) -> Batch:
        """The batch of pair indices ``idx`` on the device (padded to ``--bucket``'s shapes):
        the one :meth:`_prefetch` moved there ahead of the step, else made now."""
        ready = run.prefetched
        run.prefetched = None
        if ready is not None and ready[0] is idx:
            return ready[1]
        return self._make_batch(run, idx, non_blocking=False)

    def _make_batch(self, run: RunState, idx, non_blocking: bool) -> Batch:
        batch = collate(run.train, idx)
        if self.tcfg.bucket:
            batch = bucketed(batch, self.tcfg.bucket)
        if self.device.type != "cuda":
            return batch.to(self.device)
        if run.captured_step is None:
            # the loss's real target positions made here, on the host: selected by them, the
            # step does not wait for a mask (Batch.tgt_positions); a captured step weighs
            # every position instead
            batch = batch.with_positions()
        return batch.pin_memory().to(self.device, non_blocking=non_blocking)

    def _prefetch(self, run: RunState, upcoming) -> None:
        """On a GPU, the next step's batch made and copied to the device (pinned memory, an
        asynchronous copy) while this step's kernels run; on the CPU nothing is done ahead."""
        if upcoming is not None and self.device.type == "cuda":
            run.prefetched = (upcoming, self._make_batch(run, upcoming, non_blocking=True))

    def _step(self, run: RunState, idx, weight: float, bar, upcoming=None) -> None:
        """One update on the batch of pair indices ``idx`` (``weight`` 0: see _rank_batch);
        ``upcoming``: the next step's indices, prefetched on a GPU."""
        position = run.position
        batch = self._batch(run, idx)
        n_tok = int(batch.n_tgt_tokens)
        if run.captured_step is not None:  # forward, backward and clipping in one graph
            nll = run.captured_step(batch)
        else:
            nll, n_tok = self._gradients(run, batch, len(idx), n_tok, weight)
        run.optimizer.step()
        self._prefetch(run, upcoming)
        position.batch += 1
        position.step += 1
        run.pending_nll.append(nll.detach())  # read at a log or a validation: no wait a step
        run.window_tokens += n_tok
        position.tokens += n_tok
        run.tokens_since += n_tok
        now = time.monotonic()
        if now - run.tick >= 1.0:
            bar.set_postfix(
                epoch=position.epoch + 1,
                loss=f"{window_nll(run) / max(run.window_tokens, 1):.3f}",
                tok_s=f"{run.tokens_since / (now - run.tick):.0f}",
                refresh=False,  # drawn by the bar's own clock: a line per 30 s into a log
            )
            run.tick, run.tokens_since = now, 0
        bar.update(1)

    def _gradients(self, run: RunState, batch: Batch, pairs: int, n_tok: int, weight: float):
        """The clipped gradients of ``batch`` (``pairs`` pairs, ``n_tok`` target tokens) in
        the parameters' ``.grad``, eagerly; returns (its summed NLL, its target tokens), both
        0 for a rank's repeat of weight 0."""
        tcfg = self.tcfg
        mask = batch.tgt_out != 0 if batch.tgt_positions is None else batch.tgt_positions
        terms = batch_loss(run.loss, batch, mask, self.device, self.amp)
        objective, nll = terms.objective, terms.nll  # nll: for the perplexity (no penalty)
        run.optimizer.zero_grad(set_to_none=True)
        # mean over target tokens, or over pairs (Sutskever et al. divide the summed gradient by
        # the batch's 128 sentences); the self-normalisation penalty is averaged the same way
        denominator = pairs if tcfg.loss_per_sentence else n_tok
        if self.launch is None:
            (objective / denominator).backward()
        else:
            # DDP averages the W ranks' gradients: scaled by W / (global denominator), the
            # average is the gradient of the summed objective over the global batch
            total = distributed.all_sum(denominator if weight else 0)
            (objective * (weight * self.world / total)).backward()
            if not weight:
                nll, n_tok = nll * 0.0, 0
        if tcfg.clip_norm:
            clip_gradients(run.params, tcfg.clip_norm)
        return nll, n_tok

    def _after_step(self, run: RunState) -> str | None:
        """Validate and checkpoint when due; why the run stops now, or None to go on."""
        tcfg, position = self.tcfg, run.position
        step = position.step
        if step % tcfg.valid_every == 0:
            run.signature = self._validate(run)
            if position.bad >= tcfg.patience:
                return "early stopping"
        position.elapsed = time.monotonic() - run.started
        if self.launch is not None and tcfg.max_minutes is not None:
            position.elapsed = distributed.from_main(position.elapsed)
        if step % tcfg.checkpoint_every == 0:
            self._save_checkpoint(run.network, run.optimizer, position, run.vocab_states)
        return self._budget_spent(position)

    def _budget_spent(self, position: Position) -> str | None:
        """Why the run stops now (a budget reached), or None. Checked after each step, and
        before one: a resumed run that has reached its budget makes no step."""
        tcfg = self.tcfg
        if tcfg.max_steps is not None and position.step >= tcfg.max_steps:
            return "max steps"
        if tcfg.max_minutes is not None and position.elapsed >= 60 * tcfg.max_minutes:
            return "time limit"
        if position.bad >= tcfg.patience:
            return "early stopping"
        return None

"""Validation: the perplexity (and mean |log Z|) of the held-out pairs, the best model saved,
early stopping's count and the plateau learning rate, the training curve.

Perplexity is per target token, EOS included: exp of the mean NLL, never the self-normalisation
penalty (Devlin et al. 2014, §2.1: the mean |log Z| is logged beside it).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass
from typing import Any

import torch

from phrasescore import __version__
from phrasescore.figures import new_figure, save_figure
from phrasescore.files import disk_errors
from phrasescore.runners import distributed
from phrasescore.text.corpus import ParallelDataset, TokenBudgetBatcher, collate
from phrasescore.training.run_state import Position, RunState, window_nll

log = logging.getLogger(__name__)


def perplexity(mean_nll: float) -> float:
    """exp(mean NLL per token); inf where that overflows (a diverging run must not crash)."""
    return math.exp(mean_nll) if mean_nll < 709.0 else math.inf


@dataclass
class Validation:
    """What one validation measures."""

    perplexity: float
    """Per-token perplexity (EOS included): exp of the mean NLL, never the penalty."""
    mean_abs_log_z: float | None
    """Mean |log Z| per target token (Devlin et al. 2014: 0 for a self-normalised softmax);
    None for networks that compute none (the CSLM)."""


@torch.no_grad()
def evaluate(network, dataset: ParallelDataset, device, batch_tokens: int) -> Validation:
    """Perplexity and mean |log Z| of ``dataset`` under ``network``."""
    was_training = network.training
    network.eval()
    batcher = TokenBudgetBatcher(dataset, batch_tokens, shuffle=False, seed=0)
    nll, abs_log_z, tokens = 0.0, 0.0, 0
    have_log_z = True
    for idx in batcher.batches(0):
        batch = collate(dataset, idx, device)
        mask = batch.tgt_out != 0
        terms = network.loss_terms(
            batch.src, batch.src_lengths, batch.tgt_in, batch.tgt_out, mask, log_z=True
        )
        nll += float(terms.nll)
        if terms.abs_log_z is None:
            have_log_z = False
        else:
            abs_log_z += float(terms.abs_log_z)
        tokens += int(batch.n_tgt_tokens)
    network.train(was_training)
    n = max(tokens, 1)
    return Validation(perplexity(nll / n), abs_log_z / n if have_log_z else None)


def plot_curve(path: str, history: list[dict[str, Any]]) -> None:
    steps = [h["step"] for h in history]
    fig, ax = new_figure(6, 4)
    ax.plot(steps, [h["train_ppl"] for h in history], label="train")
    ax.plot(steps, [h["valid_ppl"] for h in history], label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("perplexity per target token")
    ax.set_yscale("log")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    save_figure(fig, path, dpi=100)


class Validating:
    """The validations of a run, a part of :class:`~phrasescore.training.trainer.Trainer` (which
    provides ``tcfg``, ``launch``, ``device``, the model's paths and ``write_model``)."""

    def _window_tokens(self, run: RunState) -> int:
        if self.launch is None:
            return run.window_tokens
        return distributed.all_sum(run.window_tokens)

    def _validate(self, run: RunState, scheduled: bool = True) -> str:
        """Validation perplexity; saves the model when it is the best so far (its signature,
        else ""). Starts a new window of training loss.

        Under torchrun every rank calls this; rank 0 validates and saves while the others wait,
        then all take rank 0's position (best, patience count, history)."""
        if self.launch is None:
            return self._validate_here(run, scheduled)
        window = distributed.sum_floats([window_nll(run), float(run.window_tokens)])
        run.window_nll, run.window_tokens = window[0], int(window[1])
        signature = self._validate_here(run, scheduled) if self.is_main else ""
        run.window_nll, run.window_tokens = 0.0, 0
        synced = distributed.from_main({"position": run.position.to_dict(), "signature": signature})
        run.position.update(synced["position"])
        return synced["signature"]

    def _validate_here(self, run: RunState, scheduled: bool = True) -> str:
        position = run.position
        began = time.monotonic()
        validation = evaluate(
            run.network, run.valid, self.device, max(self.tcfg.batch_tokens, 2000)
        )
        position.valid_seconds = position.valid_seconds + time.monotonic() - began
        ppl = validation.perplexity
        window, window_tokens = window_nll(run), run.window_tokens
        run.window_nll, run.window_tokens = 0.0, 0
        train_ppl = perplexity(window / window_tokens) if window_tokens else float("nan")
        position.history.append(
            {
                "step": position.step,
                "train_ppl": train_ppl,
                "valid_ppl": ppl,
                "elapsed": round(time.monotonic() - run.started, 1),
            }
        )
        if validation.mean_abs_log_z is not None:
            position.history[-1]["valid_abs_log_z"] = validation.mean_abs_log_z
        signature, notes = "", []
        if ppl < position.best:
            position.best = ppl
            signature = self._save_best(run)
            notes.append("best so far, saved")
        if scheduled:
            notes.append(self._count_plateau(position, ppl))
        notes.append(f"{time.monotonic() - run.started:.0f} s")
        notes.append(f"{self._training_rate(run):.0f} target tokens/s")
        log.info(
            "step %s: train perplexity %.2f, validation perplexity %.2f%s (%s)",
            f"{position.step:,}",
            train_ppl,
            ppl,
            ""
            if validation.mean_abs_log_z is None
            else f", mean |log Z| {validation.mean_abs_log_z:.3f}",
            "; ".join(n for n in notes if n),
        )
        try:
            plot_curve(self.curve_path, position.history)
        except Exception as exc:  # noqa: BLE001 - a plot must never stop training
            log.warning("could not draw %s: %s", self.curve_path, exc)
        return signature

    def _count_plateau(self, position: Position, ppl: float) -> str:
        """Early stopping's count and the plateau learning rate, after a scheduled validation.

        They compare with the best *scheduled* validation (``schedule_best``): the extra one
        at the end of a run (:meth:`~phrasescore.training.trainer.Trainer._finish`) changes neither, so a run stopped and resumed takes
        the same decisions, hence the same weights, as one that never stopped."""
        if ppl < position.schedule_best:
            position.schedule_best = ppl
            position.bad = 0
            return ""
        position.bad += 1
        note = f"no improvement ({position.bad}/{self.tcfg.patience})"
        factor = self.tcfg.lr_plateau_factor
        if factor and factor < 1:
            scale = position.lr_scale
            position.lr_scale = (1.0 if scale is None else scale) * factor
            note += f"; learning rate x{factor:g}"
        return note

    def _training_rate(self, run: RunState) -> float:
        """Target tokens per second of training so far (validation time left out), this rank."""
        position = run.position
        seconds = time.monotonic() - run.started - position.valid_seconds
        return position.tokens / max(seconds, 1e-9)

    def _save_best(self, run: RunState) -> str:
        info = {
            "preset": self.preset,
            "train_config": self.tcfg.to_dict(),
            "data": self.data.describe(),
            "steps": run.position.step,
            "valid_ppl": run.position.best,
            "unigram_valid_ppl": run.unigram,
            "phrasescore_version": __version__,
        }
        last = run.position.history[-1] if run.position.history else {}
        if "valid_abs_log_z" in last:
            info["valid_mean_abs_log_z"] = round(last["valid_abs_log_z"], 6)
        with disk_errors(self.best_path):
            return self.write_model(run.network, run.texts, run.vocabs, info=info)

"""The training loop both ``train`` and ``train-lm`` run: data, optimiser, validation, early
stopping, checkpoints, exact resume.

Objective (Cho et al. 2014, eq. 3): maximise the mean conditional log-likelihood of the target
tokens (EOS included), i.e. minimise the summed token NLL divided by the number of target tokens
of the batch. With ``--self-normalize α`` (``ModelConfig.self_normalize``) every target token also
adds α (log Z)², log Z being the log of the softmax's normaliser at that step (Devlin et al. 2014,
§2.1), divided by the same number; perplexities (train and validation) are those of the NLL alone,
and validation also logs the mean |log Z|. Batches hold pairs of similar length within a token
budget (or a fixed number of pairs for ``--preset paper``, as the paper's minibatches of 64).

Files written next to the model ``MODEL``:

``MODEL``              the model: the best of the run (lowest validation perplexity), a
                       safetensors file, put there when the run ends or is interrupted
``MODEL.best``         the best model so far while the run goes on (renamed to ``MODEL`` at the
                       end; kept with the checkpoint when a run fails, for ``--resume``)
``MODEL.checkpoint``   the full training state (weights, optimiser, RNG, position in the epoch)
                       with the run's identity and a checksum (:mod:`.checkpoint_file`,
                       :mod:`.run_identity`), written every ``checkpoint_every`` steps, on Ctrl-C and
                       at the end; ``--resume`` continues from it exactly (same weights as an
                       uninterrupted run), and only the same run: other data or flags are
                       refused in one line
``MODEL.log``          the training log
``MODEL.curve.png``    train/validation perplexity against steps

A run that fails (a full disk, bad data) leaves nothing under ``MODEL``; what it wrote beside it
is removed unless it saved a checkpoint to ``--resume`` from.

Under torchrun (``WORLD_SIZE`` = W > 1) one model is trained with DistributedDataParallel. Every
rank builds the same seeded epoch plan of token-budget batches and takes every W-th batch from
its rank on (rank r: batches r, r+W, r+2W, ...), so an epoch's pairs are each seen once; all
ranks make ceil(batches / W) steps, and a rank whose last round has no batch left repeats one
with weight 0. A step's gradient is that of the W batches together (token NLL summed over the
ranks, divided by the global number of target tokens), so ``--batch-tokens`` is per rank and a
step sees about W times as many. Rank 0 alone validates, logs, writes the model and
checkpoints; the others wait. A checkpoint records W and every rank's random state, and
``--resume`` needs the same W.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
import time
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from phrasescore import __version__
from phrasescore.bundle import TrainedModel, save_model
from phrasescore.errors import InputError
from phrasescore.figures import new_figure, save_figure
from phrasescore.files.disk import disk_errors
from phrasescore.files.kinds import is_pipe
from phrasescore.files.locks import output_lock
from phrasescore.hardware import deterministic_kernels
from phrasescore.model import build_network
from phrasescore.model.base import bf16_autocast
from phrasescore.model.config import (
    ModelConfig,
    TrainConfig,
)
from phrasescore.progress import progress_bar
from phrasescore.runners import distributed
from phrasescore.text.corpus import (
    Batch,
    ParallelDataset,
    TokenBudgetBatcher,
    TokenPair,
    collate,
    read_parallel,
    read_phrase_pairs,
)
from phrasescore.text.tokenize import TextNormalizer
from phrasescore.text.vocab import (
    BOS_ID,
    EOS_ID,
    SubwordVocabulary,
    WordVocabulary,
    vocabulary_from_state,
)
from phrasescore.training import checkpoint_file
from phrasescore.training.run_identity import BUDGETS, identity_difference, make_run_identity

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


@dataclass
class TrainResult:
    model_path: str
    signature: str
    steps: int
    epochs_done: float
    best_valid_ppl: float
    unigram_valid_ppl: float
    stopped: str
    history: list[dict[str, Any]] = field(default_factory=list)

    def lines(self) -> list[str]:
        """What ``train`` and ``train-lm`` print on standard output: one tab-separated line."""
        return [
            f"{self.model_path}\tvalid_ppl={self.best_valid_ppl:.2f}\t"
            f"unigram_ppl={self.unigram_valid_ppl:.1f}\tsteps={self.steps}\t"
            f"signature={self.signature}"
        ]


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


def perplexity(mean_nll: float) -> float:
    """exp(mean NLL per token); inf where that overflows (a diverging run must not crash)."""
    return math.exp(mean_nll) if mean_nll < 709.0 else math.inf


def make_optimizer(network: torch.nn.Module, tcfg: TrainConfig) -> torch.optim.Optimizer:
    if tcfg.optimizer == "adadelta":
        return torch.optim.Adadelta(
            network.parameters(),
            lr=tcfg.learning_rate,
            rho=tcfg.adadelta_rho,
            eps=tcfg.adadelta_eps,
        )
    if tcfg.optimizer == "adam":
        # the fused kernel (one pass over all parameters; on the CPU from PyTorch 2.4): 9.5 ms a
        # step instead of 41-44 ms for the 7.4M parameters of the attention default (1 thread)
        params = list(network.parameters())
        try:
            return torch.optim.Adam(params, lr=tcfg.learning_rate, fused=True)
        except (RuntimeError, TypeError, ValueError):  # no fused kernel for this device/version
            return torch.optim.Adam(params, lr=tcfg.learning_rate)
    if tcfg.optimizer == "sgd":
        return torch.optim.SGD(network.parameters(), lr=tcfg.learning_rate)
    raise InputError(f"unknown optimiser {tcfg.optimizer!r} (adam, adadelta or sgd)")


def batch_loss(loss, batch, mask: torch.Tensor, device: torch.device, amp: bool):
    """``loss`` (``network.loss_terms`` or its DistributedDataParallel wrapper) of a collated
    batch, in ``--amp``'s precision: bf16 autocast of the whole network on a GPU; on the CPU of
    the output layer alone (``bf16_output``), where bf16 matrix products are fast and bf16
    elementwise recurrences are not."""
    whole = amp and device.type != "cpu"
    with bf16_autocast(device, whole):
        return loss(
            batch.src,
            batch.src_lengths,
            batch.tgt_in,
            batch.tgt_out,
            mask,
            bf16_output=amp and not whole,
        )


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


@dataclass
class Validation:
    """What one validation measures."""

    perplexity: float
    """Per-token perplexity (EOS included): exp of the mean NLL, never the penalty."""
    mean_abs_log_z: float | None
    """Mean |log Z| per target token (Devlin et al. 2014: 0 for a self-normalised softmax);
    None for networks that compute none (the CSLM)."""


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
    """The lowest *scheduled* validation perplexity (:meth:`Trainer._count_plateau`)."""
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


def _plot_curve(path: str, history: list[dict[str, Any]]) -> None:
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


class Trainer:
    """Runs (or resumes) one training run; see the module docstring for the files it writes."""

    def __init__(
        self,
        model_path: str,
        data: TrainingData,
        mcfg: ModelConfig,
        tcfg: TrainConfig,
        device: torch.device,
        preset: str = "default",
        amp: bool = False,
        progress: bool = True,
        launch: distributed.Launch | None = None,
    ):
        self.launch = launch
        self.world = launch.world_size if launch else 1
        self.is_main = launch is None or launch.is_main
        self.model_path = model_path
        self.data = data
        self.mcfg = mcfg
        self.tcfg = tcfg
        self.device = device
        self.preset = preset
        self.amp = amp
        self.progress = progress and self.is_main
        self.checkpoint_path = model_path + ".checkpoint"
        self.best_path = model_path + ".best"
        self.log_path = model_path + ".log"
        self.curve_path = model_path + ".curve.png"
        self.recipe: dict[str, Any] = {}
        self.checkpointed = False
        """Whether this run saved a checkpoint (a failed run then keeps its files)."""

    # ------------------------------------------------------------------ what is trained
    # Hooks that a trainer of another kind of network overrides (training.lm_trainer.LMTrainer).
    config_class = ModelConfig

    def prepare(self, tcfg: TrainConfig, vocab_states):
        """(src_text, tgt_text, src_vocab, tgt_vocab, train, valid); see :func:`prepare_data`."""
        return prepare_data(self.data, tcfg, vocab_states, self.mcfg)

    def new_network(self, src_vocab, tgt_vocab) -> torch.nn.Module:
        self.mcfg.src_vocab_size = len(src_vocab)
        self.mcfg.tgt_vocab_size = len(tgt_vocab)
        return build_network(self.mcfg)

    def write_model(self, network, texts, vocabs, info: dict[str, Any]) -> str:
        """Save the best network so far to ``best_path``; returns its signature."""
        return save_model(
            self.best_path,
            TrainedModel(
                network=network,
                src_vocab=vocabs[0],
                tgt_vocab=vocabs[1],
                src_text=texts[0],
                tgt_text=texts[1],
                info=info,
            ),
        )

    def read_signature(self) -> str:
        """The signature of the model file saved earlier (e.g. by the run resumed)."""
        from phrasescore.bundle import read_metadata

        return read_metadata(self.model_path)["signature"]

    def make_recipe(self) -> dict[str, Any]:
        """What this run is made of (:mod:`.run_identity`), before any resume."""
        return make_run_identity(
            self.data.files(),
            self.data.flags(),
            self.preset,
            self.mcfg.to_dict(),
            self.tcfg.to_dict(),
        )

    # ------------------------------------------------------------------ state
    def _checkpoint_state(self, network, optimizer, position, vocab_states) -> dict[str, Any]:
        meta = {
            "position": position.to_dict(),
            "model_config": self.mcfg.to_dict(),
            "train_config": self.tcfg.to_dict(),
            "data": self.data.describe(),
            "preset": self.preset,
            "vocab": vocab_states,
            "version": __version__,
            "recipe": self.recipe,
        }
        state = {
            "network": network.state_dict(),
            "optimizer": optimizer.state_dict(),
            "torch_rng": torch.get_rng_state(),
        }
        if self.device.type == "cuda" and self.launch is None:
            state["cuda_rng"] = torch.cuda.get_rng_state(self.device)  # dropout's on the GPU
        if self.launch is not None:
            meta["world_size"] = self.world
            state["rank_rng"] = torch.stack(distributed.all_gather_rng_states())
        state["meta"] = json.dumps(meta)
        return state

    def _save_checkpoint(self, network, optimizer, position, vocab_states) -> None:
        """Every rank calls this (the random states are gathered); rank 0 writes."""
        state = self._checkpoint_state(network, optimizer, position, vocab_states)
        if not self.is_main:
            return
        checkpoint_file.write_checkpoint(self.checkpoint_path, state)
        self.checkpointed = True

    @staticmethod
    def read_checkpoint(path: str) -> dict[str, Any]:
        """The checkpoint at ``path``, checked (:func:`.checkpoint_file.read_checkpoint`)."""
        if not os.path.exists(path):
            raise InputError("no checkpoint to resume from", path)
        return checkpoint_file.read_checkpoint(path)

    def _publish(self) -> None:
        """The best model of the run under its final name (rank 0)."""
        if self.is_main and os.path.exists(self.best_path):
            os.replace(self.best_path, self.model_path)

    def _remove_failed_run(self, resume: bool) -> None:
        """After a failure, what this fresh run wrote beside the model, unless it saved a
        checkpoint to resume from (then all is kept for ``--resume``)."""
        if resume or self.checkpointed or not self.is_main:
            if self.checkpointed:
                log.warning(
                    "the last checkpoint is kept: rerun with --resume once the cause is fixed"
                )
            return
        for path in (self.best_path, self.curve_path, self.log_path):
            if os.path.isfile(path):
                os.unlink(path)

    # ------------------------------------------------------------------ run
    def run(self, resume: bool = False) -> TrainResult:
        if not self.is_main:  # rank 0 alone logs
            quiet = logging.getLogger("phrasescore")
            level = quiet.level
            quiet.setLevel(logging.WARNING)
            try:
                return self._run(resume)
            finally:
                quiet.setLevel(level)
        # made at its first record (a resume refused at once leaves none)
        file_log = _TrainingLog(self.log_path, mode="a" if resume else "w", delay=True)
        file_log.setFormatter(logging.Formatter("%(asctime)s %(message)s"))
        root = logging.getLogger("phrasescore")
        root.addHandler(file_log)
        failed = True
        try:
            with _quiet_handlers(root):
                result = self._run(resume)
            failed = False
            return result
        except KeyboardInterrupt:
            failed = False  # the checkpoint is saved: --resume goes on
            raise
        finally:
            root.removeHandler(file_log)
            file_log.close()
            if failed:
                self._remove_failed_run(resume)

    def _run(self, resume: bool) -> TrainResult:
        self.recipe = self.make_recipe()
        if resume and not os.path.exists(self.checkpoint_path):
            log.info(
                "nothing to resume: no checkpoint %s yet; training from the beginning",
                self.checkpoint_path,
            )
            resume = False
        ckpt = self.read_checkpoint(self.checkpoint_path) if resume else None
        if ckpt is not None:
            saved_world = ckpt["meta"].get("world_size", 1)
            if saved_world != self.world:
                how = "without torchrun" if saved_world == 1 else f"with {saved_world} processes"
                raise InputError(
                    f"cannot resume with {self.world} process(es): the checkpoint was written "
                    f"{how} (resume with the same torchrun --nproc-per-node x --nnodes)",
                    self.checkpoint_path,
                )
            self._check_recipe(ckpt["meta"])
            self._restore_configs(ckpt["meta"])
        run = self._start(ckpt)
        bar = progress_bar(
            self.progress, total=self.tcfg.max_steps, initial=run.position.step, unit="step"
        )
        try:
            stopped = self._train(run, bar)
        except KeyboardInterrupt:
            if self.launch is not None:  # other ranks may be gone: no collective now
                log.warning("interrupted; continue from the last checkpoint with --resume")
                raise
            run.position.elapsed = time.monotonic() - run.started
            self._save_checkpoint(run.network, run.optimizer, run.position, run.vocab_states)
            self._publish()
            log.warning(
                "interrupted at step %s; checkpoint saved, continue with --resume",
                f"{run.position.step:,}",
            )
            raise
        finally:
            bar.close()
        return self._finish(run, stopped)

    def _check_recipe(self, meta: dict[str, Any]) -> None:
        """Refuse to resume a checkpoint of other data or flags (:func:`identity_difference`)."""
        saved = meta.get("recipe")
        if saved is None:
            log.warning(
                "%s was written before checkpoints recorded their data and flags: they cannot "
                "be checked against this run's",
                self.checkpoint_path,
            )
            return
        difference = identity_difference(saved, self.recipe, self.checkpoint_path)
        if difference:
            raise InputError(
                f"{difference} (resume with the data and flags of the run, or train without "
                "--resume to start again)"
            )

    def _restore_configs(self, meta: dict[str, Any]) -> None:
        """The configuration of the run resumed; only the budgets may be changed on resume."""
        self.mcfg = self.config_class.from_dict(meta["model_config"])
        saved = TrainConfig.from_dict(meta["train_config"])
        for key in BUDGETS:
            setattr(saved, key, getattr(self.tcfg, key))
        self.tcfg = saved
        self.preset = meta["preset"]
        position = Position.from_dict(meta["position"])
        best = position.best
        log.info(
            "resuming at step %s of %s (epoch %d%s)",
            f"{position.step:,}",
            self.checkpoint_path,
            position.epoch + 1,
            f", best validation perplexity {best:.2f}" if math.isfinite(best) else "",
        )

    def _start(self, ckpt: dict[str, Any] | None) -> _Run:
        """Data, network, optimiser and position: fresh, or those of the checkpoint."""
        tcfg = self.tcfg
        deterministic_kernels(self.device)
        torch.manual_seed(tcfg.seed)
        src_text, tgt_text, src_vocab, tgt_vocab, train, valid = self.prepare(
            tcfg, ckpt["meta"]["vocab"] if ckpt else None
        )
        network = self.new_network(src_vocab, tgt_vocab).to(self.device)
        if tcfg.compile:
            network.compile_steps()
        network.chunked_output = tcfg.chunked_output
        optimizer = make_optimizer(network, tcfg)
        position = Position()
        if self.launch is not None and self.launch.rank:
            torch.manual_seed(tcfg.seed + self.launch.rank)  # other dropout masks on each rank
        if ckpt is not None:
            try:
                network.load_state_dict(ckpt["network"])
                optimizer.load_state_dict(ckpt["optimizer"])
            except (RuntimeError, ValueError, KeyError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise InputError(
                    f"the checkpoint does not fit this run's network ({first})",
                    self.checkpoint_path,
                ) from None
            if self.launch is not None:
                torch.set_rng_state(ckpt["rank_rng"][self.launch.rank].clone())  # no view
            else:
                torch.set_rng_state(ckpt["torch_rng"])
                if "cuda_rng" in ckpt and self.device.type == "cuda":
                    torch.cuda.set_rng_state(ckpt["cuda_rng"], self.device)
            position.update(ckpt["meta"]["position"])
        unigram = unigram_perplexity(train, valid, len(tgt_vocab))
        log.info(
            "training %s (%s preset, %d parameters) on %d pairs, validating on %d; "
            "unigram validation perplexity %.1f",
            self.mcfg.arch,
            self.preset,
            sum(p.numel() for p in network.parameters()),
            len(train),
            len(valid),
            unigram,
        )
        batcher = TokenBudgetBatcher(
            train, tcfg.batch_tokens, shuffle=True, seed=tcfg.seed, max_pairs=tcfg.batch_pairs
        )
        network.train()
        loss = network.loss_terms
        if self.launch is not None:
            loss = distributed.data_parallel_loss(network, self.device)
            log.info(
                "torchrun: %d processes, each --batch-tokens %d: a step sees about %d target "
                "tokens (the global batch), %d steps per epoch",
                self.world,
                tcfg.batch_tokens,
                self.world * tcfg.batch_tokens,
                self._steps_per_epoch(batcher, 0),
            )
        return _Run(
            loss=loss,
            network=network,
            optimizer=optimizer,
            train=train,
            valid=valid,
            batcher=batcher,
            texts=(src_text, tgt_text),
            vocabs=(src_vocab, tgt_vocab),
            vocab_states=[src_vocab.to_state(), tgt_vocab.to_state()],
            unigram=unigram,
            position=position,
            started=time.monotonic() - position.elapsed,
            tick=time.monotonic(),
        )

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

    def _train(self, run: _Run, bar) -> str:
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

    def _schedule_learning_rate(self, run: _Run, epoch_position: float) -> None:
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

    def _batch(self, run: _Run, idx) -> Batch:
        """The batch of pair indices ``idx`` on the device (padded to ``--bucket``'s shapes):
        the one :meth:`_prefetch` moved there ahead of the step, else made now."""
        ready = run.prefetched
        run.prefetched = None
        if ready is not None and ready[0] is idx:
            return ready[1]
        return self._make_batch(run, idx, non_blocking=False)

    def _make_batch(self, run: _Run, idx, non_blocking: bool) -> Batch:
        batch = collate(run.train, idx)
        if self.tcfg.bucket:
            batch = bucketed(batch, self.tcfg.bucket)
        if self.device.type != "cuda":
            return batch.to(self.device)
        # the loss's real target positions made here, on the host: selected by them, the
        # step does not wait for a mask (Batch.tgt_positions)
        batch = batch.with_positions()
        pinned = Batch(
            *(t.pin_memory() for t in (batch.src, batch.src_lengths, batch.tgt_in,
                                       batch.tgt_out, batch.tgt_lengths)),
            n_tgt_tokens=batch.n_tgt_tokens, tgt_positions=batch.tgt_positions.pin_memory(),
        )  # fmt: skip
        return Batch(
            *(t.to(self.device, non_blocking=non_blocking) for t in (pinned.src,
              pinned.src_lengths, pinned.tgt_in, pinned.tgt_out, pinned.tgt_lengths)),
            n_tgt_tokens=batch.n_tgt_tokens,
            tgt_positions=pinned.tgt_positions.to(self.device, non_blocking=non_blocking),
        )  # fmt: skip

    def _prefetch(self, run: _Run, upcoming) -> None:
        """On a GPU, the next step's batch made and copied to the device (pinned memory, an
        asynchronous copy) while this step's kernels run; on the CPU nothing is done ahead."""
        if upcoming is not None and self.device.type == "cuda":
            run.prefetched = (upcoming, self._make_batch(run, upcoming, non_blocking=True))

    def _step(self, run: _Run, idx, weight: float, bar, upcoming=None) -> None:
        """One update on the batch of pair indices ``idx`` (``weight`` 0: see _rank_batch);
        ``upcoming``: the next step's indices, prefetched on a GPU."""
        tcfg, network, position = self.tcfg, run.network, run.position
        batch = self._batch(run, idx)
        mask = batch.tgt_out != 0 if batch.tgt_positions is None else batch.tgt_positions
        terms = batch_loss(run.loss, batch, mask, self.device, self.amp)
        objective, nll = terms.objective, terms.nll  # nll: for the perplexity (no penalty)
        n_tok = int(batch.n_tgt_tokens)
        run.optimizer.zero_grad(set_to_none=True)
        # mean over target tokens, or over pairs (Sutskever et al. divide the summed gradient by
        # the batch's 128 sentences); the self-normalisation penalty is averaged the same way
        denominator = len(idx) if tcfg.loss_per_sentence else n_tok
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
            torch.nn.utils.clip_grad_norm_(network.parameters(), tcfg.clip_norm)
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

    def _after_step(self, run: _Run) -> str | None:
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

    def _finish(self, run: _Run, stopped: str) -> TrainResult:
        """The last validation and checkpoint, and the result."""
        position = run.position
        position.elapsed = time.monotonic() - run.started
        if self._window_tokens(run) or not position.history:
            run.signature = self._validate(run, scheduled=False)
        nothing = not (os.path.exists(self.best_path) or os.path.exists(self.model_path))
        if self.launch is not None:
            nothing = distributed.from_main(nothing)
        if nothing:  # e.g. --lr 1e10: no checkpoint of it either
            raise InputError(
                "no validation perplexity was finite (the training diverged): no model written; "
                "try a smaller --lr",
                self.model_path,
            )
        self._save_checkpoint(run.network, run.optimizer, position, run.vocab_states)
        self._publish()
        distributed.barrier()
        signature = run.signature or self.read_signature()
        steps = max(self._steps_per_epoch(run.batcher, 0), 1)
        epochs_done = position.epoch + position.batch / steps
        log.info(
            "stopped (%s) after %d steps, %.2f epochs, %.0f s; best validation perplexity %.2f "
            "(unigram %.1f); model %s (signature %s)",
            stopped,
            position.step,
            epochs_done,
            position.elapsed,
            position.best,
            run.unigram,
            self.model_path,
            signature,
        )
        return TrainResult(
            model_path=self.model_path,
            signature=signature,
            steps=position.step,
            epochs_done=epochs_done,
            best_valid_ppl=position.best,
            unigram_valid_ppl=run.unigram,
            stopped=stopped,
            history=position.history,
        )

    def _window_tokens(self, run: _Run) -> int:
        if self.launch is None:
            return run.window_tokens
        return distributed.all_sum(run.window_tokens)

    def _validate(self, run: _Run, scheduled: bool = True) -> str:
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

    def _validate_here(self, run: _Run, scheduled: bool = True) -> str:
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
            _plot_curve(self.curve_path, position.history)
        except Exception as exc:  # noqa: BLE001 - a plot must never stop training
            log.warning("could not draw %s: %s", self.curve_path, exc)
        return signature

    def _count_plateau(self, position: Position, ppl: float) -> str:
        """Early stopping's count and the plateau learning rate, after a scheduled validation.

        They compare with the best *scheduled* validation (``schedule_best``): the extra one
        at the end of a run (:meth:`_finish`) changes neither, so a run stopped and resumed takes
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

    def _training_rate(self, run: _Run) -> float:
        """Target tokens per second of training so far (validation time left out), this rank."""
        position = run.position
        seconds = time.monotonic() - run.started - position.valid_seconds
        return position.tokens / max(seconds, 1e-9)

    def _save_best(self, run: _Run) -> str:
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


@contextlib.contextmanager
def _quiet_handlers(logger: logging.Logger):
    """While the block runs, ``logger`` passes INFO records, and the handlers above it (standard
    error) keep the level they had: ``train -q`` (warnings only on stderr) still writes the
    whole training log to ``MODEL.log`` (it is made at its first record)."""
    effective = logger.getEffectiveLevel()
    if effective <= logging.INFO:
        yield
        return
    raised = [(h, h.level) for h in logging.getLogger().handlers if h.level < effective]
    for handler, _ in raised:
        handler.setLevel(effective)
    level = logger.level
    logger.setLevel(logging.INFO)
    try:
        yield
    finally:
        logger.setLevel(level)
        for handler, old in raised:
            handler.setLevel(old)


class _TrainingLog(logging.FileHandler):
    """``MODEL.log``. A write that fails (a full disk) ends the file's part of the log quietly:
    logging's own handler prints a traceback for each record it cannot write, and the run's
    one-line error comes from the checkpoint or model it cannot write."""

    failed = False

    def emit(self, record: logging.LogRecord) -> None:
        if not self.failed:
            super().emit(record)

    def handleError(self, record: logging.LogRecord) -> None:  # noqa: N802 - logging's name
        self.failed = True


@dataclass
class _Run:
    """The state of one run between steps (the resumable part is ``position``, a
    :class:`Position`)."""

    loss: Any  # network.loss_terms, or its DistributedDataParallel wrapper under torchrun
    network: torch.nn.Module
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
    prefetched: tuple | None = None
    """(indices, batch on the device) of the next step, made ahead (:meth:`Trainer._prefetch`)."""


def window_nll(run: _Run) -> float:
    """``run.window_nll`` with the pending steps' NLLs added in their order: one wait for the
    device here instead of one per step, the same float as adding each step's value as it came
    (float32 values widened exactly, summed in float64 one by one)."""
    if run.pending_nll:
        for value in torch.stack(run.pending_nll).double().tolist():
            run.window_nll += value
        run.pending_nll.clear()
    return run.window_nll


def training_outputs(model_path: str) -> dict[str, str]:
    """The files a training writes, by option: the model and, beside it, the best model so far
    (renamed onto the model at the end), its checkpoint, log and curve (:class:`Trainer`; the
    lock, :func:`~phrasescore.files.with_locks`)."""
    return {
        "-o": model_path,
        "-o's best model": model_path + ".best",
        "-o's checkpoint": model_path + ".checkpoint",
        "-o's log": model_path + ".log",
        "-o's curve": model_path + ".curve.png",
    }


def training_lock(model_path: str):
    """:func:`~phrasescore.files.output_lock` of the model, taken by the one process that
    writes it (rank 0 under torchrun): a second training onto the same model at the same time
    is refused in one line naming the process that holds it."""
    launch = distributed.from_env()
    if launch is not None and not launch.is_main:
        return contextlib.nullcontext()
    return output_lock(model_path)


def train_to_end(
    trainer_class, model_path, data, mcfg, tcfg, dev, *, preset, amp, progress, launch, resume
) -> TrainResult:
    """Build ``trainer_class`` (:class:`Trainer` or a subclass), run it to the end (from its
    checkpoint with ``resume``) and leave the torchrun process group, whatever happens."""
    use_amp = dev.type == "cuda" if amp is None else amp
    trainer = trainer_class(
        model_path,
        data,
        mcfg,
        tcfg,
        dev,
        preset=preset,
        amp=use_amp,
        progress=progress,
        launch=launch,
    )
    try:
        return trainer.run(resume=resume)
    finally:
        distributed.shutdown()


def apply_overrides(tcfg: TrainConfig, overrides: dict | None) -> None:
    """Set the :class:`TrainConfig` fields of ``overrides`` that are not None."""
    for key, value in (overrides or {}).items():
        if value is not None:
            setattr(tcfg, key, value)
